"""Static figures of a run's log: every quantity against time (`plot_summary`), or one
quantity for all heads (`plot_quantity`).

`log` is a mapping column -> array (``particles.load_log`` reads a log.csv into one). Per-head columns `<base>_h<h>` are grouped into one subplot with a legend.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Mapping

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .colors import head_color
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


def _draw_group(ax, t, base: str, members, cols, legend_ok: bool = True) -> None:
    ys = []
    per_head = [(h, cols[col]) for h, col in members if h is not None]
    # a head whose curve equals an earlier head's: dashed on top, and said
    twin_of = dict(zip((h for h, _ in per_head), coincident_with([y for _, y in per_head])))
    for h, col in members:
        y = cols[col]
        ys.append(y)
        color = "black" if h is None else head_color(h)
        label = f"head {h}" if h is not None else ("total" if base == "energy" else col)
        style = "-"
        if twin_of.get(h) is not None:
            style, label = COINCIDENT_DASH, f"head {h} (= head {per_head[twin_of[h]][0]})"
        # columns logged every k rows (clusters, min_cosine) are nan in between: skip those
        # rows, or the line would have no two neighbouring points to join
        defined = ~np.isnan(y)
        ax.plot(thin(t[defined], MAX_POINTS), thin(y[defined], MAX_POINTS), color=color, lw=1.8 if h is None else 1.3,
                ls=style, label=label)
    allv = np.concatenate(ys) if ys else np.array([])
    fin = allv[np.isfinite(allv)]
    if fin.size and fin.min() > 0 and (base == "clusters" or fin.max() / fin.min() > 1e3):
        ax.set_yscale("log")   # cluster counts fall by factors: a log axis keeps 64 -> 2 -> 1 legible
    if not fin.size:   # nothing drawn: keep the run's time axis and say why it is empty
        if np.isfinite(t).any():
            lo, hi = float(np.nanmin(t)), float(np.nanmax(t))
            ax.set_xlim(lo, hi if hi > lo else lo + 1.0)
        why = ("these heads have no potential\n(masked, biased or scheduled; docs/LOG.md)"
               if base.startswith("energy") else "no finite values logged")
        ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center", fontsize=8, color="0.35")
    if base == "radial_dominance":
        ax.axhline(1.0, color="0.3", ls="--", lw=1.0)
    heads = [h for h, _ in members if h is not None]
    if heads and len(heads) < len(members):          # a total and its per-head parts
        desc = DESCRIPTIONS.get(base, "") + " and per head"
    else:
        desc = DESCRIPTIONS.get(base + "_h" if heads else base)
    ax.set_title(base if desc is None else f"{base}: {desc}", fontsize=9, loc="left")
    ax.tick_params(labelsize=8)
    ax.grid(True, color="0.92", lw=0.6)
    if legend_ok and len(members) > 1 and len(members) <= 12:
        ax.legend(fontsize=7, ncol=1 if len(members) <= 4 else 2, framealpha=0.8)


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
    fig.savefig(paths[1])
    return paths


def plot_summary(log, out_stem, title: str | None = None) -> list[Path]:
    """One figure, a grid with a subplot per logged quantity (per-head columns together) against
    time, under ``title`` (e.g. the scene, n, d, H, rule, beta); written to out_stem.png and
    out_stem.svg. Returns the two paths."""
    cols = log_columns(log)
    groups = group_columns(cols)
    if not groups:
        raise ValueError("the log has no quantities besides step/time")
    t, xlabel = _time_axis(cols)
    k = len(groups)
    ncols = min(4, max(1, math.ceil(math.sqrt(k))))
    nrows = math.ceil(k / ncols)
    fig = new_figure(4.2 * ncols, 2.7 * nrows)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for i, (base, members) in enumerate(groups.items()):
        ax = axes[i // ncols][i % ncols]
        _draw_group(ax, t, base, members, cols)
        if i // ncols == nrows - 1 or i + ncols >= k:
            ax.set_xlabel(xlabel, fontsize=8)
    for j in range(k, nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    if title:
        fig.suptitle(title, fontsize=12, fontweight="bold")
    return save_png_svg(fig, out_stem)


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
