"""Time-series panels beside the particles, growing with the video.

energy            total `energy` (black) and per head `energy_h{h}`
radial_dominance  `radial_dominance_h{h}` with the dashed line rho = 1 (log scale once the
                  data span two decades)
entropy           `entropy_mean_h{h}` with the dashed ceiling ln n

The time axis is fixed to the run's span when t_end is known, so the curves grow from left
to right; y-limits only ever widen (the whole history is always shown), with headroom so the
static background is redrawn rarely.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from .colors import head_color
from .config import RunInfo

MAX_POINTS = 4000          # longer series are thinned (every k-th point, the last kept)
COINCIDENT_DASH = (0, (4, 3))   # a head's curve drawn over an equal earlier one: dashed, both show


COINCIDENT_TOL = 1e-5          # of the drawn span: far below a pixel, far above round-off


def coincident_with(curves, log_scale: bool | None = None) -> list[int | None]:
    """For each curve, the position of the first earlier curve it equals, else None: the one
    judgement of the film's panels and the summary's subplots.

    Equal means point by point on the scale the panel draws (log10 of the values on a log
    axis, where a non-positive value is not drawn), within ``COINCIDENT_TOL`` of the drawn
    span of the two curves, NaN where the other is NaN: round-off in a linear curve's tail at
    1e-8 of its peak does not part two curves drawn one over the other, while on a log axis
    curves a factor 1000 apart stay two. ``log_scale`` None: the summary's rule, a log axis
    where every finite value is positive and they span more than three decades. A curve with
    nothing drawn equals none: there is nothing of it to hide."""
    ys = [np.asarray(y, dtype=float).ravel() for y in curves]
    if log_scale is None:
        fin = np.concatenate([y[np.isfinite(y)] for y in ys]) if ys else np.array([])
        log_scale = bool(fin.size and fin.min() > 0 and fin.max() / fin.min() > 1e3)
    if log_scale:
        with np.errstate(divide="ignore", invalid="ignore"):
            ys = [np.where(y > 0, np.log10(np.where(y > 0, y, 1.0)), np.nan) for y in ys]
    out: list[int | None] = []
    for i, y in enumerate(ys):
        same = None
        if np.isfinite(y).any():
            same = next((j for j in range(i) if out[j] is None and _drawn_alike(y, ys[j])), None)
        out.append(same)
    return out


def _drawn_alike(a: np.ndarray, b: np.ndarray) -> bool:
    """Two curves in the drawn coordinate: the same NaNs, and every pair of points within
    COINCIDENT_TOL of the span they are drawn over."""
    if a.shape != b.shape:
        return False
    fa, fb = np.isfinite(a), np.isfinite(b)
    if not np.array_equal(fa, fb):
        return False
    both = np.concatenate([a[fa], b[fb]])
    if not both.size:
        return True
    span = float(both.max() - both.min())
    scale = span if span > 0 else max(float(np.abs(both).max()), 1.0)
    return bool(np.all(np.abs(a[fa] - b[fb]) <= COINCIDENT_TOL * scale))


def panel_columns(name: str, keys, n_heads: int) -> list[tuple[str, str]]:
    """[(column, label)] of a panel present in the log keys."""
    keys = set(keys)
    cols = []
    if name == "energy":
        if "energy" in keys:
            cols.append(("energy", "total"))
        cols += [(f"energy_h{h}", f"head {h}") for h in range(n_heads) if f"energy_h{h}" in keys]
    elif name == "radial_dominance":
        cols += [(f"radial_dominance_h{h}", f"head {h}") for h in range(n_heads)
                 if f"radial_dominance_h{h}" in keys]
    elif name == "entropy":
        cols += [(f"entropy_mean_h{h}", f"head {h}") for h in range(n_heads)
                 if f"entropy_mean_h{h}" in keys]
    return cols


def available_panels(wanted, keys, n_heads: int) -> list[str]:
    return [p for p in wanted if panel_columns(p, keys, n_heads)]


def thin(x: np.ndarray, max_points: int = MAX_POINTS) -> np.ndarray:
    """Every k-th point of a long series (the last one kept), at most about max_points."""
    if x.size <= max_points:
        return x
    k = int(math.ceil(x.size / max_points))
    return np.concatenate([x[::k], x[-1:]])


class Panel:
    TITLES = {"energy": "energy  $E$, $E_h$",
              "radial_dominance": r"radial dominance  $\rho_h$",
              "entropy": "mean attention entropy  $\\bar H_h$"}

    def __init__(self, ax, name: str, columns, info: RunInfo, xlim, show_xlabel: bool, legend: bool):
        self.ax = ax
        self.name = name
        self.columns = columns
        self.info = info
        self.log_scale = False
        self.ylim = None
        self.xlim = list(xlim) if xlim is not None else None
        self.lines, self.heads = [], []
        ax.tick_params(labelsize=8, length=3)
        ax.grid(True, color="0.92", lw=0.6)
        ax.set_axisbelow(True)
        ax.set_title(self.TITLES[name], fontsize=10, loc="left", pad=3)
        if show_xlabel:
            ax.set_xlabel("time $t$", fontsize=9, labelpad=2)
        else:
            ax.tick_params(labelbottom=True)
        self.refs = []
        self.note = None   # says why a panel stays empty (an energy that is NaN throughout)
        if name == "radial_dominance":
            self.refs.append(1.0)
            ax.axhline(1.0, color="0.3", ls="--", lw=1.0, zorder=1)
            ax.text(1.0, 1.0, r" $\rho=1$", transform=ax.get_yaxis_transform(), fontsize=8,
                    va="center", ha="left", color="0.3", clip_on=False)
        if name == "entropy" and info.n > 1:
            self.refs.append(info.log_n)
            ax.axhline(info.log_n, color="0.3", ls="--", lw=1.0, zorder=1)
            ax.text(1.0, info.log_n, r" $\ln n$", transform=ax.get_yaxis_transform(), fontsize=8,
                    va="center", ha="left", color="0.3", clip_on=False)
        for col, label in columns:
            color = "black" if col == "energy" else head_color(int(col.rsplit("_h", 1)[1]))
            lw = 1.8 if col == "energy" else 1.3
            (line,) = ax.plot([], [], color=color, lw=lw, label=label, zorder=3)
            (dot,) = ax.plot([], [], "o", color=color, ms=3.5, zorder=4)
            self.lines.append(line)
            self.heads.append(dot)
        self.short = ["total" if c == "energy" else "h" + c.rsplit("_h", 1)[1] for c, _ in columns]
        self.legend = None
        if legend and len(columns) > 1 and info.n_heads <= 10:
            # one row in the title band, right of the title: 'total  h0  h1 ...'
            many = len(self.short) > 5
            if many:                                   # make room: short title, tighter legend
                ax.set_title(self.TITLES[name].split("  ")[0], fontsize=10, loc="left", pad=3)
            self.legend = ax.legend(self.lines, self.short, loc="lower right", bbox_to_anchor=(1.0, 1.0),
                                    ncol=len(self.short), frameon=False, fontsize=6.5 if many else 7,
                                    handlelength=0.9 if many else 1.0, handletextpad=0.3 if many else 0.4,
                                    columnspacing=0.6 if many else 0.8, borderaxespad=0.0, borderpad=0.1)
        self.twin_of = [None] * len(columns)   # per column: the earlier head column it coincides with
        for a in self.lines + self.heads:     # animated only now: legend handles copy the flag
            a.set_animated(True)
        if self.xlim is not None:
            ax.set_xlim(*self.xlim)

    def dynamic_artists(self):
        return self.lines + self.heads

    def _update_ylim(self, lo: float, hi: float) -> bool:
        changed = False
        if (self.name == "radial_dominance" and not self.log_scale and lo > 0 and hi / lo > 100.0):
            self.log_scale = True
            self.ax.set_yscale("log")
            self.ylim = None
            changed = True
        if self.log_scale:
            lo_t, hi_t = math.log10(max(lo, 1e-300)), math.log10(max(hi, 1e-300))
        else:
            lo_t, hi_t = lo, hi
        if self.ylim is not None and lo_t >= self.ylim[0] and hi_t <= self.ylim[1]:
            return changed
        span = hi_t - lo_t
        if span <= 1e-12 * max(1.0, abs(hi_t)):
            span = max(abs(hi_t) * 0.1, 1e-6) if not self.log_scale else 0.5
        pad = 0.08 * span
        new_lo, new_hi = lo_t - pad, hi_t + pad
        if self.ylim is not None:          # widen only, with extra headroom toward the growth
            if lo_t < self.ylim[0]:
                new_lo = lo_t - 0.3 * span
            else:
                new_lo = min(self.ylim[0], new_lo)
            if hi_t > self.ylim[1]:
                new_hi = hi_t + 0.3 * span
            else:
                new_hi = max(self.ylim[1], new_hi)
        self.ylim = (new_lo, new_hi)
        if self.log_scale:
            self.ax.set_ylim(10 ** new_lo, 10 ** new_hi)
        else:
            self.ax.set_ylim(new_lo, new_hi)
        return True

    def _mark_coincident(self, log: Mapping) -> bool:
        """Dash a head's curve that equals an earlier head's so far (the one drawn under it
        shows), and say so in the legend ('h1=h0'); True if the legend changed."""
        heads = [i for i, (col, _) in enumerate(self.columns) if col != "energy"]
        same = coincident_with([np.asarray(log[self.columns[i][0]], dtype=float).ravel() for i in heads],
                              log_scale=self.log_scale)
        twin_of = [None] * len(self.columns)
        for i, j in zip(heads, same):
            twin_of[i] = None if j is None else heads[j]
        if twin_of == self.twin_of:
            return False
        self.twin_of = twin_of
        for i, j in enumerate(twin_of):
            self.lines[i].set_linestyle("-" if j is None else COINCIDENT_DASH)
        if self.legend is None:
            return False
        for i, (handle, text) in enumerate(zip(self.legend.get_lines(), self.legend.get_texts())):
            j = twin_of[i]
            handle.set_linestyle("-" if j is None else COINCIDENT_DASH)
            text.set_text(self.short[i] if j is None else f"{self.short[i]}={self.short[j]}")
        return True

    def update(self, t: np.ndarray, log: Mapping) -> bool:
        lo, hi = math.inf, -math.inf
        tt = thin(t)
        for (col, _), line, dot in zip(self.columns, self.lines, self.heads):
            y = np.asarray(log[col], dtype=float).ravel()
            if y.size != t.size:
                raise ValueError(f"log column {col!r} has {y.size} rows but 'time' has {t.size}")
            if self.log_scale or self.name == "radial_dominance":
                y = np.where(np.isfinite(y), y, np.nan)
            fin = y[np.isfinite(y)]
            if self.log_scale:
                fin = fin[fin > 0]
            if fin.size:
                lo, hi = min(lo, float(fin.min())), max(hi, float(fin.max()))
            line.set_data(tt, thin(y))
            if y.size:
                dot.set_data([t[-1]], [y[-1]])
        dirty = self._mark_coincident(log)
        if math.isfinite(lo):
            for r in self.refs:
                lo, hi = min(lo, r), max(hi, r)
            dirty |= self._update_ylim(lo, hi)
        elif self.ylim is None:
            dirty |= self._update_ylim(*(min(self.refs), max(self.refs)) if self.refs else (0.0, 1.0))
        if self.name == "energy" and not math.isfinite(lo) and t.size and self.note is None:
            self.note = self.ax.text(0.5, 0.5, "no energy: these heads have no potential\n"
                                     "(masked, biased or scheduled; docs/LOG.md)",
                                     transform=self.ax.transAxes, ha="center", va="center",
                                     fontsize=8, color="0.35")
            dirty = True
        if t.size:
            t0, t1 = float(t[0]), float(t[-1])
            if self.xlim is None:
                self.xlim = [t0, t0 + max(t1 - t0, 1e-9) * 1.5 if t1 > t0 else t0 + 1.0]
                self.ax.set_xlim(*self.xlim)
                dirty = True
            elif t1 > self.xlim[1] or t0 < self.xlim[0]:
                lo_x = min(self.xlim[0], t0)
                self.xlim = [lo_x, lo_x + (t1 - lo_x) * 1.5]
                self.ax.set_xlim(*self.xlim)
                dirty = True
        return dirty


class PanelSet:
    """The stacked panels; `update(log)` returns True if the static background changed."""

    def __init__(self, axes, names, keys, info: RunInfo, t_span):
        self.panels = []
        for i, (ax, name) in enumerate(zip(axes, names)):
            cols = panel_columns(name, keys, info.n_heads)
            self.panels.append(Panel(ax, name, cols, info, t_span, show_xlabel=(i == len(names) - 1),
                                     legend=(i == 0)))

    def dynamic_artists(self):
        return [a for p in self.panels for a in p.dynamic_artists()]

    def update(self, log: Mapping) -> list[int]:
        """Update the curves; returns the indices of panels whose static part changed."""
        if not self.panels:
            return []
        if "time" not in log:
            raise ValueError("the log passed to add_frame needs a 'time' column for the panels")
        t = np.asarray(log["time"], dtype=float).ravel()
        return [i for i, p in enumerate(self.panels) if p.update(t, log)]
