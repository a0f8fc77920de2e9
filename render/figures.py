"""Static figures of a run's log: every quantity against time (`plot_summary`, or
`summary_figure` for the Figure itself), several runs on one axis per quantity
(`plot_comparison`), or one quantity for all heads (`plot_quantity`).

`log` is a mapping column -> array (``particles.load_log`` reads a log.csv into one). Per-head
columns `<base>_h<h>` are grouped into one subplot. Theory values come in as `Reference`s
(the application layer knows which apply to a run: render draws arrays and numbers).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from matplotlib import colormaps
from matplotlib.colors import to_rgba_array
from matplotlib.lines import Line2D

from .colors import qualitative_palette
from .panels import COINCIDENT_DASH, coincident_with, thin

HEAD_COLUMN = re.compile(r"^(?P<base>.+)_h(?P<h>\d+)$")
AXIS_COLUMNS = ("step", "time")
MAX_POINTS = 20000
DESCRIPTIONS = {
    "energy": "total $E$",
    "kinetic": r"$\frac{1}{n}\sum_i\|\dot x_i\|^2$",
    "gamma_bar": r"mean pairwise cosine $\bar\gamma$",
    "eps": r"$\varepsilon = 1-\bar\gamma$",
    "energy_h": "head energy $E_h$",
    "tangent_power_h": "tangent power $T_h$",
    "cross_coupling_h": "cross-coupling $C_h$",
    "radial_shadow_h": "radial shadow coupling $R_h$",
    "energy_rate_h": r"$dE_h/dt$",
    "radial_mean_h": r"mean radial shadow $a^h_i$",
    "radial_absmax_h": r"max $|a^h_i|$",
    "radial_dominance_h": r"radial dominance $\rho_h$",
    "entropy_mean_h": r"mean attention entropy",
    "entropy_min_h": "min attention entropy",
    "entropy_max_h": "max attention entropy",
    "entropy_rate_h": r"$d\bar H_h/dt$",
    "min_cosine": "min pairwise cosine",
    "clusters": "number of clusters",
}


def log_columns(log: Mapping) -> dict[str, np.ndarray]:
    """Columns of a log (a mapping column -> array-like, e.g. ``particles.load_log(path)``)
    as float arrays of one length."""
    if not isinstance(log, Mapping):
        raise TypeError(f"expected the log's columns as a mapping name -> array (read a log.csv with "
                        f"particles.load_log), got {type(log).__name__}")
    cols = {str(k): np.asarray(v, dtype=float).ravel() for k, v in log.items()}
    lengths = {v.size for v in cols.values()}
    if len(lengths) > 1:
        raise ValueError(f"log columns have different lengths: { {k: v.size for k, v in cols.items()} }")
    if not cols:
        raise ValueError("the log has no columns")
    return cols


def group_columns(names) -> dict[str, list[tuple[int | None, str]]]:
    """base name -> [(head or None, column)], in order of first appearance; step/time left out."""
    groups: dict[str, list] = {}
    for name in names:
        if name in AXIS_COLUMNS:
            continue
        m = HEAD_COLUMN.match(name)
        if m:
            groups.setdefault(m["base"], []).append((int(m["h"]), name))
        else:
            groups.setdefault(name, []).append((None, name))
    for base in groups:
        groups[base].sort(key=lambda hc: -1 if hc[0] is None else hc[0])
    return groups


def _time_axis(cols: dict[str, np.ndarray]):
    n = next(iter(cols.values())).size
    if "time" in cols:
        return cols["time"], "time $t$"
    if "step" in cols:
        return cols["step"], "step"
    return np.arange(n, dtype=float), "row"


@dataclass(frozen=True)
class Reference:
    """A value of the theory drawn beside a logged quantity: a horizontal line at ``value``
    (rho = 1, c*(H), ln n) or a curve ``values`` at ``times`` (the equiangular ODE's gamma).
    ``quantity``: the log's column or per-head base it belongs with ('radial_dominance',
    'gamma_bar', 'entropy_mean')."""
    quantity: str
    label: str
    value: float | None = None
    times: np.ndarray | None = None
    values: np.ndarray | None = None


LOG_DECADES = 1e3       # a positive quantity spanning more than this factor is drawn on a log axis
ZERO_NOTE = "zero throughout, not drawn"
NAN_NOTE = "not defined (NaN) throughout, not drawn (energies: no potential, docs/LOG.md)"
LINE_STYLES = ("-", "--", ":", "-.")
REFERENCE_CURVE = "tab:red"   # a curve of the theory over the measured one (the ODE, dE/dt)
REFERENCE_LINE_STYLES = ("--", (0, (1, 1.5)), "-.")   # rho = 1, c*(H), ...: told apart in the legend
LEGEND_IN_AXES = 4      # up to this many heads each subplot has its legend; beyond, one for the figure


def head_palette(n_heads: int) -> np.ndarray:
    """(H, 4) RGBA, one colour per head that never repeats: tab10 up to 10 heads, beyond that
    the qualitative palette (tab10 without its grey, then golden-angle hues)."""
    if n_heads <= 10:
        return to_rgba_array(colormaps["tab10"].colors[:max(n_heads, 1)])
    return qualitative_palette(n_heads)


def _wants_log(values: np.ndarray, base: str) -> bool:
    """A log axis for a positive quantity spanning decades: 3 (2 for rho, whose values at t = 0
    near 1 and c*(H) are the point, as in the film's panel), any for cluster counts."""
    fin = values[np.isfinite(values)]
    decades = 1e2 if base == "radial_dominance" else LOG_DECADES
    return bool(fin.size and fin.min() > 0 and (base == "clusters" or fin.max() / fin.min() > decades))


def _log_axis(ax, base: str) -> None:
    ax.set_yscale("log")   # cluster counts fall by factors: a log axis keeps 64 -> 2 -> 1 legible
    if base == "clusters":   # counts as plain numbers (64, 8, 2), not 6 x 10^1
        from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())


def _is_zero_throughout(members, cols) -> bool:
    """Every finite value exactly 0 (rho and R with one head or in flat space): a panel of a
    flat line at 0 says nothing, so the figure leaves it out and says so."""
    ys = np.concatenate([cols[c] for _, c in members])
    fin = ys[np.isfinite(ys)]
    return bool(fin.size) and not fin.any()


def _reference_lines(ax, refs: Sequence[Reference], color="0.3") -> None:
    lines = 0
    for ref in refs:
        if ref.value is not None and math.isfinite(ref.value):
            ax.axhline(ref.value, color=color, ls=REFERENCE_LINE_STYLES[lines % len(REFERENCE_LINE_STYLES)],
                       lw=1.0, zorder=1, label=ref.label)
            lines += 1
        elif ref.times is not None:
            ax.plot(ref.times, ref.values, color=REFERENCE_CURVE, ls=COINCIDENT_DASH, lw=1.6, alpha=0.9, zorder=4,
                    label=ref.label)


def _draw_group(ax, t, base: str, members, cols, legend_ok: bool = True, palette=None,
                refs: Sequence[Reference] = ()) -> None:
    """One subplot: a total (black) and/or its per-head parts (one colour each), the references
    that belong to ``base``; a log axis where a positive quantity spans decades."""
    ys = [cols[col] for _, col in members]
    allv = np.concatenate(ys) if ys else np.array([])
    log_axis = _wants_log(allv, base)
    if log_axis:
        _log_axis(ax, base)
    heads = [h for h, _ in members if h is not None]
    palette = head_palette(max(heads) + 1 if heads else 1) if palette is None else palette
    per_head = [(h, cols[col]) for h, col in members if h is not None]
    # a head whose curve equals an earlier head's, judged on the scale drawn: dashed on top, and said
    twin_of = dict(zip((h for h, _ in per_head), coincident_with([y for _, y in per_head], log_scale=log_axis)))
    for h, col in members:
        y = cols[col]
        color = "black" if h is None else palette[h]
        label = f"head {h}" if h is not None else ("total" if base == "energy" else col)
        style = "-"
        if twin_of.get(h) is not None:
            style, label = COINCIDENT_DASH, f"head {h} (= head {per_head[twin_of[h]][0]})"
        # columns logged every k rows (clusters, min_cosine) are nan in between: skip those
        # rows, or the line would have no two neighbouring points to join
        defined = ~np.isnan(y)
        ax.plot(thin(t[defined], MAX_POINTS), thin(y[defined], MAX_POINTS), color=color,
                lw=1.8 if h is None else 1.3, ls=style, label=label)
    _reference_lines(ax, [r for r in refs if r.quantity == base])
    fin = allv[np.isfinite(allv)]
    if not fin.size:   # nothing drawn: keep the run's time axis and say why it is empty
        if np.isfinite(t).any():
            lo, hi = float(np.nanmin(t)), float(np.nanmax(t))
            ax.set_xlim(lo, hi if hi > lo else lo + 1.0)
        why = ("these heads have no potential\n(masked, biased or scheduled; docs/LOG.md)"
               if base.startswith("energy") else "no finite values logged")
        ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center", fontsize=8, color="0.35")
    if heads and len(heads) < len(members):          # a total and its per-head parts
        desc = DESCRIPTIONS.get(base, "") + " and per head"
    else:
        desc = DESCRIPTIONS.get(base + "_h" if heads else base)
    if any(r.quantity == base for r in refs) and base == "kinetic":
        desc = DESCRIPTIONS["kinetic"] + r" and $dE/dt$"
    ax.set_title(base if desc is None else f"{base}: {desc}", fontsize=9, loc="left")
    ax.tick_params(labelsize=8)
    ax.grid(True, color="0.92", lw=0.6)
    handles = ax.get_legend_handles_labels()[0]
    if legend_ok and len(handles) > 1:
        ax.legend(fontsize=7, ncol=1 if len(handles) <= 4 else 2, framealpha=0.8)


def _layer_switches(t, cols) -> list[float]:
    """Times at which the log's `layer` column changes (a layer schedule's switches)."""
    layer = cols.get("layer")
    if layer is None:
        return []
    ok = np.isfinite(layer)
    lt, ly = t[ok], layer[ok]
    return [float(lt[i]) for i in range(1, len(ly)) if ly[i] != ly[i - 1]]


def _mark_switches(ax, switches, first: bool) -> None:
    for k, ts in enumerate(switches):
        ax.axvline(ts, color="0.55", ls=(0, (2, 2)), lw=0.9, zorder=0)
        if first:
            ax.text(ts, 1.0, f" layer {k + 1}", transform=ax.get_xaxis_transform(), fontsize=7,
                    color="0.4", va="top", ha="left")


def summary_groups(cols: Mapping[str, np.ndarray]) -> tuple[dict, list[str]]:
    """The subplots of the summary figure (base -> members) and the quantities left out as zero
    throughout. `layer` is no subplot (its switches are marked in every one)."""
    groups = {b: m for b, m in group_columns(cols).items() if b not in ("layer", "replica")}
    zero = [b for b, m in groups.items() if _is_zero_throughout(m, cols)]
    return {b: m for b, m in groups.items() if b not in zero}, zero


def _nan_throughout(members, cols) -> bool:
    return not any(np.isfinite(cols[c]).any() for _, c in members)


def summary_figure(log, title: str | None = None, references: Sequence[Reference] = ()) -> Figure:
    """The summary figure: a grid with a subplot per logged quantity (per-head columns together,
    one colour per head) against time, the theory's ``references`` in their subplots, the
    energy's rate of change beside the kinetic term, layer switches marked, quantities that
    are zero throughout named in a note instead of drawn, under ``title``."""
    cols = log_columns(log)
    groups, zero = summary_groups(cols)
    empty = [b for b, m in groups.items() if _nan_throughout(m, cols)]
    if len(empty) < len(groups):   # a subplot with nothing in it is a note instead
        groups = {b: m for b, m in groups.items() if b not in empty}
    else:
        empty = []
    if not groups:
        raise ValueError("the log has no quantities besides step/time" + (f" ({', '.join(zero)} are zero)"
                                                                           if zero else ""))
    t, xlabel = _time_axis(cols)
    n_heads = max([h + 1 for m in groups.values() for h, _ in m if h is not None] or [1])
    palette = head_palette(n_heads)
    k = len(groups)
    ncols = min(4, max(1, math.ceil(math.sqrt(k))))
    nrows = math.ceil(k / ncols)
    fig = new_figure(4.2 * ncols, 2.7 * nrows + (0.5 if n_heads > LEGEND_IN_AXES else 0.0))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    switches = _layer_switches(t, cols)
    for i, (base, members) in enumerate(groups.items()):
        ax = axes[i // ncols][i % ncols]
        many = any(h is not None for h, _ in members) and n_heads > LEGEND_IN_AXES
        _draw_group(ax, t, base, members, cols, legend_ok=not many, palette=palette, refs=references)
        if many and ax.get_legend_handles_labels()[0]:   # references and totals keep a legend
            extra = [(hd, lb) for hd, lb in zip(*ax.get_legend_handles_labels()) if not lb.startswith("head ")]
            if extra:
                ax.legend(*zip(*extra), fontsize=7, framealpha=0.8)
        _mark_switches(ax, switches, first=i == 0)
        if i // ncols == nrows - 1 or i + ncols >= k:
            ax.set_xlabel(xlabel, fontsize=8)
    for j in range(k, nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    if n_heads > LEGEND_IN_AXES:   # one legend for the heads, every one named
        handles = [Line2D([], [], color=palette[h], lw=1.6) for h in range(n_heads)]
        fig.legend(handles, [f"head {h}" for h in range(n_heads)], loc="outside lower center",
                   ncol=min(n_heads, 12), fontsize=8, frameon=False)
    notes = ([f"{ZERO_NOTE}: {', '.join(zero)}"] if zero else []) + (
        [f"{NAN_NOTE}: {', '.join(empty)}"] if empty else [])
    if notes:   # a figure-level label: constrained layout keeps it clear of the x labels
        fig.supxlabel(";   ".join(notes), fontsize=7, color="0.4", x=0.005, ha="left")
    if title:
        fig.suptitle(title, fontsize=12, fontweight="bold")
    return fig


def _equal_heads(heads, cols, log_scale: bool) -> str:
    """' (heads equal)' or ' (h2 = h0)': a run's heads drawn one over another, in one colour
    and told apart only by line style, said in its legend entry (judged as the panels judge)."""
    if len(heads) < 2:
        return ""
    same = coincident_with([cols[c] for _, c in heads], log_scale=log_scale)
    if all(j == 0 for j in same[1:]):
        return f" (all {len(heads)} heads equal)"
    pairs = [f"h{heads[i][0]} = h{heads[j][0]}" for i, j in enumerate(same) if j is not None]
    return f" ({', '.join(pairs)})" if pairs else ""


COMPARED = ("gamma_bar", "eps", "energy", "kinetic", "radial_dominance", "entropy_mean", "clusters", "min_cosine")


def comparison_figure(runs: Sequence[tuple[str, Mapping, Sequence[Reference]]], title: str | None = None) -> Figure:
    """Several runs on one axis per quantity: ``runs`` is [(label, log, references)]. Each run
    has one colour (its heads one line style each: solid, dashed, dotted, dash-dot), its curves
    of the theory drawn dotted in its colour and the lines (rho = 1, c*(H), ln n) once, in grey.
    Quantities zero throughout in every run are left out and named."""
    if len(runs) < 1:
        raise ValueError("comparison_figure needs at least one run")
    logs = [log_columns(log) for _, log, _ in runs]
    panels, zero = [], []
    for base in COMPARED:
        per_run = [group_columns(c).get(base) for c in logs]
        if not any(per_run):
            continue
        if all(m is None or _is_zero_throughout(m, c) for m, c in zip(per_run, logs)):
            zero.append(base)
            continue
        panels.append(base)
    if not panels:
        raise ValueError("the runs' logs have no quantity in common to compare")
    colors = colormaps["tab10"].colors
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = new_figure(4.6 * ncols, 3.0 * nrows + 0.5)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for i, base in enumerate(panels):
        ax = axes[i // ncols][i % ncols]
        values = np.concatenate([c[col] for c in logs for _, col in (group_columns(c).get(base) or [])])
        if _wants_log(values, base):
            _log_axis(ax, base)
        lines_drawn, curves_named = set(), set()
        for r, ((label, _, refs), cols) in enumerate(zip(runs, logs)):
            members = group_columns(cols).get(base) or []
            t, xlabel = _time_axis(cols)
            color = colors[r % len(colors)]
            total = [m for m in members if m[0] is None]
            heads = [] if total and base == "energy" else [m for m in members if m[0] is not None]   # E: the total
            name = label + _equal_heads(heads, cols, ax.get_yscale() == "log")
            if total + heads and _nan_throughout(total + heads, cols):   # drawn as nothing: said so
                name = label + " (NaN throughout" + (": no potential)" if base == "energy" else ")")
            for j, (h, col) in enumerate(total + heads):
                y = cols[col]
                ok = ~np.isnan(y)
                ax.plot(thin(t[ok], MAX_POINTS), thin(y[ok], MAX_POINTS), color=color,
                        ls=LINE_STYLES[h % len(LINE_STYLES)] if h is not None else "-",
                        lw=1.8 if h is None else 1.3, label=name if j == 0 else None)
            for ref in refs:
                if ref.quantity != base:
                    continue
                if ref.value is not None:
                    key = (round(ref.value, 12), ref.label)
                    if key not in lines_drawn:
                        style = REFERENCE_LINE_STYLES[len(lines_drawn) % len(REFERENCE_LINE_STYLES)]
                        lines_drawn.add(key)
                        ax.axhline(ref.value, color="0.3", ls=style, lw=1.0, zorder=1, label=ref.label)
                elif ref.times is not None:   # the theory's curve: dotted, in the run's colour
                    ax.plot(ref.times, ref.values, color=color, ls=(0, (1, 1.2)), lw=2.6, alpha=0.7, zorder=4,
                            label=None if ref.label in curves_named else ref.label)
                    curves_named.add(ref.label)
            if i // ncols == nrows - 1 or i + ncols >= len(panels):
                ax.set_xlabel(xlabel, fontsize=8)
        desc = DESCRIPTIONS.get(base) if base == "energy" else DESCRIPTIONS.get(base + "_h") or DESCRIPTIONS.get(base)
        if base == "kinetic" and any(r.quantity == base for _, _, refs in runs for r in refs):
            desc = DESCRIPTIONS["kinetic"] + r" and $dE/dt$"
        ax.set_title(f"{base}: {desc}" if desc else base, fontsize=9, loc="left")
        ax.tick_params(labelsize=8)
        ax.grid(True, color="0.92", lw=0.6)
        ax.legend(fontsize=7, framealpha=0.8)
    for j in range(len(panels), nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    drawn = [group_columns(c).get(b) or [] for c in logs for b in panels]
    n_heads = max([h + 1 for m in drawn for h, _ in m if h is not None] or [0])
    if n_heads > 1:
        handles = [Line2D([], [], color="0.2", ls=LINE_STYLES[h % len(LINE_STYLES)], lw=1.3)
                   for h in range(min(n_heads, len(LINE_STYLES)))]
        names = [f"head {h}" for h in range(min(n_heads, len(LINE_STYLES)))]
        if n_heads > len(LINE_STYLES):
            names[-1] += f" (styles repeat every {len(LINE_STYLES)} heads)"
        fig.legend(handles, names, loc="outside lower center", ncol=len(handles), fontsize=8, frameon=False,
                   title="per-head quantities: colour = run, line style = head", title_fontsize=8)
    if zero:
        fig.supxlabel(f"{ZERO_NOTE}: {', '.join(zero)}", fontsize=7, color="0.4", x=0.005, ha="left")
    if title:
        fig.suptitle(title, fontsize=11, fontweight="bold")
    return fig


def new_figure(w_in: float, h_in: float, dpi: int = 100) -> Figure:
    """A constrained-layout Figure on its own Agg canvas (pyplot's global state untouched)."""
    fig = Figure(figsize=(w_in, h_in), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_png_svg(fig: Figure, out_stem) -> list[Path]:
    """Write ``fig`` to out_stem.png (110 dpi) and out_stem.svg; returns both paths."""
    stem = Path(out_stem)
    if stem.suffix.lower() in (".png", ".svg"):
        stem = stem.with_suffix("")
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [Path(str(stem) + ".png"), Path(str(stem) + ".svg")]
    fig.savefig(paths[0], dpi=110)
    if fig.get_layout_engine() is not None:
        # keep the layout the PNG's draw computed (in inches, whatever the dpi): the SVG would
        # otherwise solve the constrained layout of every panel again (~4 of its ~6 s at 16 panels)
        fig.set_layout_engine("none")
    fig.savefig(paths[1])
    return paths


def plot_summary(log, out_stem, title: str | None = None, references: Sequence[Reference] = ()) -> list[Path]:
    """`summary_figure` written to out_stem.png and out_stem.svg; returns the two paths."""
    return save_png_svg(summary_figure(log, title, references), out_stem)


def plot_comparison(runs, out_stem, title: str | None = None) -> list[Path]:
    """`comparison_figure` written to out_stem.png and out_stem.svg; returns the two paths."""
    return save_png_svg(comparison_figure(runs, title), out_stem)


def plot_quantity(log, column: str, out_path) -> Path:
    """One quantity against time: an exact column, or a per-head base name such as
    "energy_rate" (every head). The format follows out_path's extension (png, svg, pdf)."""
    cols = log_columns(log)
    groups = group_columns(cols)
    if column in cols and column not in AXIS_COLUMNS:
        m = HEAD_COLUMN.match(column)
        base = m["base"] if m else column
        members = [(int(m["h"]) if m else None, column)]
    elif column in groups:
        base, members = column, groups[column]
    else:
        raise ValueError(f"unknown quantity {column!r}; available: {sorted(groups)} or columns {sorted(cols)}")
    t, xlabel = _time_axis(cols)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig = new_figure(6.4, 4.0)
    ax = fig.add_subplot()
    _draw_group(ax, t, base, members, cols)
    ax.set_xlabel(xlabel, fontsize=9)
    fig.savefig(out, dpi=120)
    return out
