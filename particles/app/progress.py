"""Progress reporting: a tqdm bar on a terminal, a notebook widget in Jupyter (``tqdm.auto``),
plain periodic lines otherwise."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, initial: int = 0, enabled: bool = True, stream=None):
        self.stream = stream or sys.stderr
        self.total, self.done = total, initial
        self.enabled = enabled
        self._bar = None
        self._last_line = 0.0
        self._start = time.perf_counter()
        self._start_step = initial
        if enabled and stream is None and in_notebook():
            from tqdm.auto import tqdm   # the widget bar in Jupyter (text where ipywidgets is absent)
            self._bar = tqdm(total=total, initial=initial, unit="step", smoothing=0.05)
        elif enabled and getattr(self.stream, "isatty", lambda: False)():
            from tqdm import tqdm
            self._bar = tqdm(total=total, initial=initial, unit="step", file=self.stream,
                             dynamic_ncols=True, smoothing=0.05)

    def update(self, steps: int, energy: float | None = None, entropy: float | None = None) -> None:
        self.done += steps
        if not self.enabled:
            return
        info = {}
        if energy is not None:
            info["E"] = f"{energy:.5g}"
        if entropy is not None:
            info["H"] = f"{entropy:.4g}"
        if self._bar is not None:
            self._bar.update(steps)
            if info:
                self._bar.set_postfix(info, refresh=False)
            return
        now = time.perf_counter()
        if now - self._last_line >= 5.0 or self.done >= self.total:
            self._last_line = now
            rate = (self.done - self._start_step) / max(now - self._start, 1e-9)
            eta = f"{(self.total - self.done) / rate:.0f} s" if rate > 0 else "?"
            extra = "".join(f" {k}={v}" for k, v in info.items())
            print(f"step {self.done}/{self.total} ({100 * self.done / max(self.total, 1):.0f}%) "
                  f"{rate:.1f} steps/s, ETA {eta}{extra}", file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where stderr is no terminal, yet a bar can be drawn)."""
    if "IPython" not in sys.modules:
        return False
    try:
        ip = sys.modules["IPython"].get_ipython()
    except Exception:
        return False
    return ip is not None and "IPKernelApp" in getattr(ip, "config", {})
