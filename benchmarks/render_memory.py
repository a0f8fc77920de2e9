"""Memory while rendering: 2,000 small frames; RSS must stay flat (frames are streamed).

    python benchmarks/render_memory.py [--frames 2000] [--format mp4|gif]

Prints, at frames 100, 1000 and 2000, the current resident set size (/proc/self/statm) and
the peak RSS (resource.getrusage); with --trace also the Python heap traced by tracemalloc
(current, peak; tracing slows rendering about fivefold). The fake log is preallocated and
passed as growing views, so the benchmark's own data do not grow either.

The traced heap creeps up by ~1 KiB a frame at first: matplotlib's text-metrics cache
(functools.lru_cache, 4096 entries) remembers each new "t = ..." string; it is bounded.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from render import Animation, RenderConfig, RunInfo


def current_rss_mib() -> float:
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return float("nan")


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0      # KiB on Linux


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=2000)
    ap.add_argument("--format", choices=("mp4", "gif"), default="mp4")
    ap.add_argument("--trace", action="store_true", help="also report tracemalloc (slow)")
    args = ap.parse_args()
    n, d, heads, frames = 64, 3, 2, args.frames
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    t = np.linspace(0.0, 20.0, frames)
    log = {"step": np.arange(frames), "time": t, "energy": 1 + np.tanh(t)}
    for h in range(heads):
        log[f"energy_h{h}"] = (1 + np.tanh(t)) / heads
        log[f"radial_dominance_h{h}"] = 0.2 + 0.05 * t * (1 + h)
        log[f"entropy_mean_h{h}"] = np.log(n) * (1 - 0.5 * np.exp(-t))
    info = RunInfo("memory", 1.0, "exp", heads, n, d, "sphere")
    cfg = RenderConfig(width=320, height=180, fps=30, rotate=True, trails=5)
    checkpoints = {100, 1000, 2000, 4000, 6000, 8000, frames}
    if args.trace:
        tracemalloc.start()
    rows = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        with Animation(Path(tmp) / f"mem.{args.format}", cfg, info, t_end=float(t[-1])) as anim:
            for i in range(frames):
                angle = 0.002 * i
                rot = np.array([[np.cos(angle), -np.sin(angle), 0], [np.sin(angle), np.cos(angle), 0], [0, 0, 1]])
                anim.add_frame(x @ rot.T, t[i], {k: v[: i + 1] for k, v in log.items()})
                if i + 1 in checkpoints:
                    cur, peak = tracemalloc.get_traced_memory() if args.trace else (np.nan, np.nan)
                    rows.append((i + 1, current_rss_mib(), peak_rss_mib(), cur / 2**20, peak / 2**20))
        size = (Path(tmp) / f"mem.{args.format}").stat().st_size
    elapsed = time.perf_counter() - start
    print(f"{frames} frames {cfg.width}x{cfg.height} {args.format}, n={n}, d={d}, rotate, trails=5: "
          f"file {size / 2**20:.1f} MiB, {frames / elapsed:.0f} frames/s")
    print(f"{'frame':>6} {'RSS now MiB':>12} {'peak RSS MiB':>13} {'traced MiB':>11} {'traced peak':>12}")
    for r in rows:
        print(f"{r[0]:6d} {r[1]:12.1f} {r[2]:13.1f} {r[3]:11.2f} {r[4]:12.2f}")


if __name__ == "__main__":
    main()
