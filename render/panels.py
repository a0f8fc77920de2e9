"""Time-series panels beside the particles, growing with the video; which are drawn follows
from what the run has (`available_panels`).

energy            total `energy` (black) and per head `energy_h{h}` (one head: the total only);
                  energies of size > 1e6 (a trained model's heads at beta = 100) as the
                  relative change (E - E(0)) / |E(0)|, decided at the first frame
energy_rate       where Theorem 11's identity holds (RunInfo.gradient_flow): dE/dt of the
                  logged energy (finite differences) over the `kinetic` column on one log axis
radial_dominance  `radial_dominance_h{h}` on a log axis from the first frame, with rho = 1 and
                  c*(H) (RunInfo.c_star); two or more heads on the sphere only
entropy           `entropy_mean_h{h}` with the dashed ceiling ln n
gamma_bar         the mean pairwise cosine with the theory's curves (RunInfo.theory), drawn whole

Layer switches (the log's `layer` column) are marked in every panel. The time axis is fixed
to the run's span when t_end is known, so the curves grow from left to right; y-limits only
ever widen (the whole history is always shown), with headroom so the static background is
redrawn rarely.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
from matplotlib.ticker import FuncFormatter, LogFormatterSciNotation, LogLocator, NullFormatter

from .colors import head_color
from .config import RunInfo

MAX_PANELS = 4            # more would leave each too short to read at 720 pixels
RELATIVE_ENERGY = 1e6     # energies larger than this: a log axis (positive) or their relative change
FLOAT32_EPS, ROUND_OFF_ULPS = 2.0 ** -23, 64   # dE/dt drawn only where E's step exceeds its round-off
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


PANEL_SCALARS = ("time", "energy", "kinetic", "gamma_bar", "layer")
# tangent_power_h: not drawn, it decides where rho_h stops meaning anything (RunInfo.tangent_floor)
PANEL_PER_HEAD = ("energy_h", "radial_dominance_h", "entropy_mean_h", "tangent_power_h")


def is_panel_column(key: str) -> bool:
    """Is a log column one the film's panels draw (the live video keeps only these)?"""
    return key in PANEL_SCALARS or key.startswith(PANEL_PER_HEAD)


def panel_columns(name: str, keys, n_heads: int) -> list[tuple[str, str]]:
    """[(column, label)] of a panel present in the log keys."""
    keys = set(keys)
    cols = []
    if name == "energy":
        if "energy" in keys:
            cols.append(("energy", "total"))
        if n_heads > 1 or "energy" not in keys:     # one head: its energy is the total
            cols += [(f"energy_h{h}", f"head {h}") for h in range(n_heads) if f"energy_h{h}" in keys]
    elif name == "energy_rate":
        if {"energy", "kinetic"} <= keys:
            cols = [("kinetic", "kinetic"), ("energy", "rate")]
    elif name == "radial_dominance":
        cols += [(f"radial_dominance_h{h}", f"head {h}") for h in range(n_heads)
                 if f"radial_dominance_h{h}" in keys]
    elif name == "entropy":
        cols += [(f"entropy_mean_h{h}", f"head {h}") for h in range(n_heads)
                 if f"entropy_mean_h{h}" in keys]
    elif name == "gamma_bar":
        if "gamma_bar" in keys:
            cols = [("gamma_bar", "measured")]
    return cols


def _all_nan(log, col) -> bool:
    y = np.asarray(log.get(col, []), dtype=float)
    return y.size > 0 and not np.isfinite(y).any()


def available_panels(wanted, log, info: RunInfo) -> list[str]:
    """The panels of a film, from those wanted, that show something in this run: energy_rate
    only where the identity holds, radial dominance only for two or more heads on the sphere
    (one head, or flat space, has no radial shadow between heads: the panel would be 0); an
    energy that is NaN from the first row (no potential) goes last. At most MAX_PANELS."""
    keys = list(log.keys()) if isinstance(log, Mapping) else list(log)
    out = []
    for p in wanted:
        if not panel_columns(p, keys, info.n_heads):
            continue
        if p == "energy_rate" and not info.gradient_flow:
            continue
        if p == "radial_dominance" and (info.n_heads < 2 or info.geometry != "sphere"):
            continue
        out.append(p)
    if isinstance(log, Mapping) and "energy" in out and _all_nan(log, "energy"):
        out = [p for p in out if p != "energy"] + ["energy"]
    return out[:MAX_PANELS]


def thin(x: np.ndarray, max_points: int = MAX_POINTS) -> np.ndarray:
    """Every k-th point of a long series (the last one kept), at most about max_points."""
    if x.size <= max_points:
        return x
    k = int(math.ceil(x.size / max_points))
    return np.concatenate([x[::k], x[-1:]])


def _short(col: str) -> str:
    return "total" if col == "energy" else "h" + col.rsplit("_h", 1)[1]


class Panel:
    TITLES = {"energy": "energy  $E$, $E_h$",
              "energy_rate": "Theorem 11",
              "radial_dominance": r"radial dominance  $\rho_h$",
              "entropy": "mean attention entropy  $\\bar H_h$",
              "gamma_bar": r"mean pairwise cosine  $\bar\gamma$"}
    RELATIVE_TITLE = "energy change  $(E-E(0))\\,/\\,|E(0)|$"
    LOG_SCALE = ("radial_dominance", "energy_rate")   # quantities that span decades: log from frame one

    def __init__(self, ax, name: str, columns, info: RunInfo, xlim, show_xlabel: bool, legend: bool,
                 first_log: Mapping | None = None):
        self.ax = ax
        self.name = name
        self.columns = columns
        self.info = info
        self.log_scale = name in self.LOG_SCALE
        self.ylim = None
        self.xlim = list(xlim) if xlim is not None else None
        self.lines, self.heads = [], []
        self.energy0 = None         # per column: E(0), where energies are drawn as relative change
        if name == "energy" and first_log is not None:
            # decided at the first frame, kept for the film: positive energies that span decades
            # or exceed 1e6 (a trained model's heads at beta = 100: 0.007 to 5e14, later 1e246)
            # on a log axis; huge energies of either sign as each curve's relative change
            first = [np.asarray(first_log[c], dtype=float).ravel()[:1] for c, _ in columns]
            e0 = np.array([float(f[0]) if f.size else np.nan for f in first])
            fin = e0[np.isfinite(e0)]
            if fin.size and fin.min() > 0 and (fin.max() > RELATIVE_ENERGY or fin.max() / fin.min() > 1e3):
                self.log_scale = True
            elif fin.size and np.abs(fin).max() > RELATIVE_ENERGY and np.all(fin != 0):
                self.energy0 = e0
        if self.log_scale:
            ax.set_yscale("log")
        ax.tick_params(labelsize=8, length=3)
        if not self.log_scale:                # no '+1.5e15' offset: a panel's numbers read as they are
            ax.ticklabel_format(axis="y", useOffset=False)
        ax.grid(True, color="0.92", lw=0.6)
        ax.set_axisbelow(True)
        title = self.RELATIVE_TITLE if self.energy0 is not None else self.TITLES[name]
        if name == "energy" and self.log_scale:
            title += "  (log)"
        ax.set_title(title, fontsize=10, loc="left", pad=3, y=1.0)   # y given: not moved between redraws
        if show_xlabel:
            ax.set_xlabel("time $t$", fontsize=9, labelpad=2)
        else:
            ax.tick_params(labelbottom=True)
        self.refs = []
        self.note = None   # says why a panel stays empty (an energy that is NaN throughout)
        self.note_drawn = False
        if name == "radial_dominance":
            below = info.c_star is not None      # two labels 0.2 decades apart: one above, one below
            self._reference(1.0, r" $\rho=1$", va="bottom" if below else "center")
            if info.c_star is not None:
                self._reference(info.c_star, f" $c^*({info.n_heads})$",
                                color="tab:red", ls=":", va="top")
        if name == "entropy" and info.n > 1:
            self._reference(info.log_n, r" $\ln n$")
        self.theory = []
        for t, y, label in (info.theory or {}).get(self._theory_column(), []):
            style = ("--", "tab:red") if not self.theory else (":", "tab:purple")   # over the measured curve
            (line,) = ax.plot(t, y, ls=style[0], color=style[1], lw=1.3, zorder=5, label=label)
            self.theory.append(line)
            fin = y[np.isfinite(y)]
            if fin.size:
                self.refs += [float(fin.min()), float(fin.max())]
        for col, label in columns:
            color, lw, ls = self._style(col)
            (line,) = ax.plot([], [], color=color, lw=lw, ls=ls, label=label, zorder=3)
            (dot,) = ax.plot([], [], "o", color=color, ms=3.5, zorder=4)
            self.lines.append(line)
            self.heads.append(dot)
        self.short = [_short(c) if name not in ("energy_rate", "gamma_bar") else label for c, label in columns]
        self.legend = None
        if name == "energy_rate":
            # in the title band: a rate that climbs or falls crosses any corner inside
            self.legend = ax.legend(self.lines, [r"$(1/n)\,\sum_i|\dot x_i|^2$", "$dE/dt$ of the logged $E$"],
                                    loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, fontsize=7,
                                    frameon=False, handlelength=1.6, borderaxespad=0.0, borderpad=0.1,
                                    columnspacing=0.8)
        elif name == "gamma_bar" and self.theory:
            self.legend = ax.legend(self.lines + self.theory, ["measured"] + [ln.get_label() for ln in self.theory],
                                    loc="lower right", fontsize=6.5, frameon=False, handlelength=1.6)
        elif legend and len(columns) > 1:
            self._head_legend(name)
        self.twin_of = [None] * len(columns)   # per column: the earlier head column it coincides with
        for a in self.lines + self.heads:     # animated only now: legend handles copy the flag
            a.set_animated(True)
        self.layer_marks: list[float] = []
        if self.xlim is not None:
            ax.set_xlim(*self.xlim)

    def _theory_column(self) -> str:
        return self.columns[0][0] if self.name == "gamma_bar" and self.columns else ""

    def _reference(self, value: float, label: str, color="0.3", ls="--", va="center") -> None:
        self.refs.append(value)
        self.ax.axhline(value, color=color, ls=ls, lw=1.0, zorder=1)
        self.ax.text(1.0, value, label, transform=self.ax.get_yaxis_transform(), fontsize=8,
                     va=va, ha="left", color=color, clip_on=False)

    def _style(self, col: str):
        if self.name == "energy_rate":
            return ("black", 1.3, "-") if col == "kinetic" else ("tab:orange", 1.8, (0, (3, 2)))
        if col == "gamma_bar":
            return "black", 2.4 if self.theory else 1.8, "-"
        if col == "energy":
            return "black", 1.8, "-"
        return head_color(int(col.rsplit("_h", 1)[1]), self.info.n_heads), 1.3, "-"

    def _head_legend(self, name: str) -> None:
        """'total  h0  h1 ...' in the title band, right of the title: one row up to 7 entries,
        two rows beyond (12 heads), the title shortened to make room."""
        many = len(self.short) > 3                 # four heads named 'h1=h0' fill the band
        rows = 1 if len(self.short) <= 7 else 2
        if many:                                   # make room: short title, tighter legend
            short = r"$\Delta E\,/\,|E(0)|$" if self.energy0 is not None else self.TITLES[name].split("  ")[0]
            if name == "energy" and self.log_scale:
                short += " (log)"
            self.ax.set_title(short, fontsize=10, loc="left", pad=3, y=1.0)
        self.legend = self.ax.legend(self.lines, self.short, loc="lower right", bbox_to_anchor=(1.0, 1.0),
                                     ncol=math.ceil(len(self.short) / rows), frameon=False,
                                     fontsize=6 if rows > 1 else 6.5 if many else 7,
                                     handlelength=0.9 if many else 1.0, handletextpad=0.3 if many else 0.4,
                                     columnspacing=0.5 if many else 0.8, borderaxespad=0.0, borderpad=0.1,
                                     labelspacing=0.1)

    def dynamic_artists(self):
        return self.lines + self.heads

    def _update_ylim(self, lo: float, hi: float) -> bool:
        if self.log_scale:
            lo_t, hi_t = math.log10(max(lo, 1e-300)), math.log10(max(hi, 1e-300))
        else:
            lo_t, hi_t = lo, hi
        if self.ylim is not None and lo_t >= self.ylim[0] and hi_t <= self.ylim[1]:
            return False
        span = hi_t - lo_t
        if span <= 1e-12 * max(1.0, abs(hi_t)):
            span = max(abs(hi_t) * 0.1, 1e-6) if not self.log_scale else 0.5
        # dimensionless quantities get an axis of a readable width from the first frame (a cosine,
        # a relative change: all 0 at t = 0 gave a 1e-8-wide axis whose '1e-8' covered the title)
        least = 0.2 if self.name == "gamma_bar" else 0.02 if self.energy0 is not None else 0.0
        if not self.log_scale and span < least:
            mid = 0.5 * (lo_t + hi_t)
            lo_t, hi_t, span = mid - 0.5 * least, mid + 0.5 * least, least
        pad, room = 0.08 * span, 0.3 * span
        if self.log_scale:                 # 250 decades (MiniLM's energies) need no 75 of headroom
            pad, room = min(pad, 0.5), min(room, 3.0)
        new_lo, new_hi = lo_t - pad, hi_t + pad
        if self.ylim is not None:          # widen only, with extra headroom toward the growth
            if lo_t < self.ylim[0]:
                new_lo = lo_t - room
            else:
                new_lo = min(self.ylim[0], new_lo)
            if hi_t > self.ylim[1]:
                new_hi = hi_t + room
            else:
                new_hi = max(self.ylim[1], new_hi)
        if self.log_scale:                 # inside float64: 10 ** 321 is inf
            new_lo, new_hi = max(new_lo, -300.0), min(new_hi, 300.0)
        self.ylim = (new_lo, new_hi)
        if self.log_scale:
            self.ax.set_ylim(10 ** new_lo, 10 ** new_hi)
            self._log_ticks(new_hi - new_lo)
        else:
            self.ax.set_ylim(new_lo, new_hi)
        return True

    def _log_ticks(self, decades: float) -> None:
        """Labelled ticks that fit a log axis of any span: 1, 2, 5 (or every digit) within a
        decade or so, powers of ten beyond; minor ticks unlabelled (matplotlib labels them on
        short spans, in long strings that spill past the panel)."""
        if decades < 0.4:
            locator, formatter = LogLocator(10, subs=np.arange(1.0, 10.0)), FuncFormatter(lambda v, _: f"{v:.3g}")
        elif decades < 2.0:
            locator, formatter = LogLocator(10, subs=(1.0, 2.0, 5.0)), FuncFormatter(lambda v, _: f"{v:g}")
        else:
            locator, formatter = LogLocator(10, numticks=6), LogFormatterSciNotation(10)
        self.ax.yaxis.set_major_locator(locator)
        self.ax.yaxis.set_major_formatter(formatter)
        self.ax.yaxis.set_minor_formatter(NullFormatter())

    def _mark_coincident(self, curves) -> bool:
        """Dash a head's curve that equals an earlier head's so far (the one drawn under it
        shows), and say so in the legend ('h1=h0'); True if the legend changed."""
        heads = [i for i, (col, _) in enumerate(self.columns) if col.rpartition("_h")[2].isdigit()]
        same = coincident_with([curves[i] for i in heads], log_scale=self.log_scale)
        twin_of = [None] * len(self.columns)
        for i, j in zip(heads, same):
            twin_of[i] = None if j is None else heads[j]
        if twin_of == self.twin_of:
            return False
        self.twin_of = twin_of
        for i, j in enumerate(twin_of):
            self.lines[i].set_linestyle(self._style(self.columns[i][0])[2] if j is None else COINCIDENT_DASH)
        if self.legend is None or self.name in ("energy_rate", "gamma_bar"):
            return False
        for i, (handle, text) in enumerate(zip(self.legend.get_lines(), self.legend.get_texts())):
            j = twin_of[i]
            handle.set_linestyle("-" if j is None else COINCIDENT_DASH)
            text.set_text(self.short[i] if j is None else f"{self.short[i]}={self.short[j]}")
        return True

    def _curve(self, col: str, t: np.ndarray, log: Mapping) -> tuple[np.ndarray, np.ndarray]:
        """(times, values) drawn for a column: the energy's rate at the midpoints of the rows
        in the rate panel, relative energies where E is huge, the column itself otherwise."""
        y = np.asarray(log[col], dtype=float).ravel()
        if y.size != t.size:
            raise ValueError(f"log column {col!r} has {y.size} rows but 'time' has {t.size}")
        power_col = col.replace("radial_dominance_h", "tangent_power_h")
        if col.startswith("radial_dominance_h") and self.info.tangent_floor and power_col in log:
            power = np.asarray(log[power_col], dtype=float).ravel()
            if power.size == y.size and y.size:
                # once T_h has fallen below the floor the tokens have stopped: rho_h is noise
                spent = np.cumsum(power < self.info.tangent_floor * power[0]) > 0
                y = np.where(spent, np.nan, y)
                if spent.any() and self.note is None:
                    self.note = self.ax.text(0.99, 0.55, f"not drawn from t = {t[np.argmax(spent)]:.3g}: "
                                             f"T_h < {self.info.tangent_floor:g} T_h(0)",
                                             transform=self.ax.transAxes, ha="right", va="top",
                                             fontsize=7, color="0.35")
        if self.name == "energy_rate" and col == "energy":
            dt, de = np.diff(t), np.diff(y)
            # a step of E within its float32 round-off is no rate: not drawn (the kinetic
            # term, computed directly, goes on far below it)
            resolved = (dt > 0) & (np.abs(de) > ROUND_OFF_ULPS * FLOAT32_EPS * np.abs(y[1:]))
            with np.errstate(divide="ignore", invalid="ignore"):
                rate = np.where(resolved, de / np.where(dt > 0, dt, 1.0), np.nan)
            return 0.5 * (t[1:] + t[:-1]), rate
        if self.energy0 is not None:
            k = [c for c, _ in self.columns].index(col)
            return t, (y - self.energy0[k]) / abs(self.energy0[k])
        return t, y

    def _mark_layers(self, t: np.ndarray, log: Mapping) -> bool:
        """A dotted line and 'layer k' where the log's layer column steps (a layer schedule)."""
        layer = np.asarray(log.get("layer", []), dtype=float).ravel()
        if layer.size != t.size or layer.size < 2:
            return False
        steps = np.flatnonzero(np.diff(layer) != 0) + 1
        dirty = False
        for k in steps:
            when = float(t[k])
            if any(abs(when - m) <= 1e-9 * max(1.0, abs(when)) for m in self.layer_marks):
                continue
            self.layer_marks.append(when)
            self.ax.axvline(when, color="0.45", ls=":", lw=1.0, zorder=1)
            self.ax.text(when, 1.0, f" layer {int(layer[k])}", transform=self.ax.get_xaxis_transform(),
                         fontsize=7, color="0.35", ha="left", va="top")
            dirty = True
        return dirty

    def update(self, t: np.ndarray, log: Mapping) -> bool:
        lo, hi = math.inf, -math.inf
        curves = []
        for (col, _), line, dot in zip(self.columns, self.lines, self.heads):
            tx, y = self._curve(col, t, log)
            if self.log_scale or self.name == "radial_dominance":
                y = np.where(np.isfinite(y), y, np.nan)
            curves.append(y)
            fin = y[np.isfinite(y)]
            if self.log_scale:
                fin = fin[fin > 0]
            if fin.size:
                lo, hi = min(lo, float(fin.min())), max(hi, float(fin.max()))
            line.set_data(thin(tx), thin(y))
            if y.size:
                dot.set_data([tx[-1]], [y[-1]])
            else:
                dot.set_data([], [])
        dirty = self._mark_coincident(curves)
        dirty |= self._mark_layers(t, log)
        if self.note is not None and not self.note_drawn:   # a note set while reading the curves
            self.note_drawn = dirty = True
        refs = [r for r in self.refs if r > 0] if self.log_scale else self.refs
        if math.isfinite(lo):
            for r in refs:
                lo, hi = min(lo, r), max(hi, r)
            dirty |= self._update_ylim(lo, hi)
        elif self.ylim is None:
            dirty |= self._update_ylim(*(min(refs), max(refs)) if refs else ((0.1, 1.0) if self.log_scale else (0.0, 1.0)))
        if self.name == "energy" and not math.isfinite(lo) and t.size and self.note is None:
            self.note = self.ax.text(0.5, 0.5, "no energy: these heads have no potential\n"
                                     "(masked, biased or scheduled; docs/LOG.md)",
                                     transform=self.ax.transAxes, ha="center", va="center",
                                     fontsize=8, color="0.35")
            self.note_drawn = dirty = True
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
    """The stacked panels; `update(log)` returns True if the static background changed. The
    heads' legend goes on the first panel with a curve per head."""

    def __init__(self, axes, names, keys, info: RunInfo, t_span, first_log: Mapping | None = None):
        self.panels = []
        legend_at = next((name for name in names if name not in ("energy_rate", "gamma_bar")
                          and len(panel_columns(name, keys, info.n_heads)) > 1), None)
        for i, (ax, name) in enumerate(zip(axes, names)):
            cols = panel_columns(name, keys, info.n_heads)
            self.panels.append(Panel(ax, name, cols, info, t_span, show_xlabel=(i == len(names) - 1),
                                     legend=(name == legend_at), first_log=first_log))

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
