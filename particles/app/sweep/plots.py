"""Figures of a parameter sweep's results table (``particles.app.sweep``).

    from particles.app.sweep.plots import plot_sweep, plot_phase_diagram, plot_clustering_time
    plot_sweep("sweeps/phase_diagram_1head")      # picks the figures that apply

Every figure is a matplotlib ``Figure`` on the Agg canvas (pyplot is never touched), written
as ``<stem>.png`` and ``<stem>.svg``. The table is read with ``particles.app.sweep.load_results``;
the sweep's ``sweep.json`` beside it (when present) tells which units have scalar heads,
which initial configuration, rule and cluster threshold -- what the theory overlays need.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from matplotlib.colors import LogNorm

from particles.atomic import refuse_symlink
from particles.errors import MissingFileError, ParticlesUserError
from render.figures import new_figure, save_png_svg
from particles.theory import beta_star, c_star, equiangular_rhs, equiangular_time  # noqa: F401

FIXED = ("tokens.n", "tokens.d", "H", "tokens.seed", "dynamics.beta")
REPLICA_COLUMNS = ("tokens.seed", "dynamics.beta")


# ============================================================================ reading

def _load(results_csv):
    from particles.app.sweep.store import load_results
    path = Path(results_csv)
    if path.is_dir():
        path = path / "results.csv"
    if not path.is_file():
        raise MissingFileError(f"no sweep results at {str(path)!r}")
    cols = load_results(path)
    meta = {}
    mp = path.parent / "sweep.json"
    if mp.is_file():
        try:
            meta = json.loads(mp.read_text())
        except (OSError, json.JSONDecodeError):
            meta = {}
    with open(path, encoding="utf-8") as fh:
        header = fh.readline().strip().split(",")
    if "step" not in cols or cols["step"].size == 0:
        raise ParticlesUserError(f"{path} has no rows yet")
    _require_numbers(path, cols, header)
    return path, cols, meta, header


def _require_numbers(path: Path, cols: dict, header: list[str]) -> None:
    """The columns a sweep writes as numbers (point, and from tokens.n on but the stop reason)
    hold numbers: a damaged or hand-edited table is named, not a traceback."""
    start = header.index("tokens.n") if "tokens.n" in header else len(header)
    for name in ["point"] + header[start:]:
        if name in cols and name != "stop_reason" and cols[name].dtype.kind not in "fi":
            bad = next(v for v in cols[name] if not _is_number(v))
            raise ParticlesUserError(f"{path}: column {name!r} holds {str(bad)!r} where the sweep "
                                     "writes a number (a damaged or edited table: run the sweep "
                                     "again into a new folder)")


def _is_number(text) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _panel_columns(cols: dict, header: list[str], exclude=()) -> list[str]:
    """Swept columns that define a panel / series: the axis columns (between `point` and
    `tokens.n`), plus n, d, H where they vary; never beta or seed."""
    i, j = header.index("point"), header.index("tokens.n")
    keys = header[i + 1:j] + [c for c in ("tokens.n", "tokens.d", "H") if np.unique(cols[c]).size > 1]
    return [k for k in keys if k not in REPLICA_COLUMNS and k not in exclude]


def _fmt(v) -> str:
    if isinstance(v, (float, np.floating)):
        return f"{float(v):g}"
    return str(v)


def _groups(cols: dict, keys: list[str]):
    """[(label, mask)] for each combination of ``keys`` present, in sorted order."""
    if not keys:
        return [("", np.ones(cols["step"].size, dtype=bool))]
    combos = sorted({tuple(cols[k][i] for k in keys) for i in range(cols["step"].size)},
                    key=lambda c: tuple((0, x) if not isinstance(x, str) else (1, x) for x in c))
    out = []
    for combo in combos:
        mask = np.ones(cols["step"].size, dtype=bool)
        for k, v in zip(keys, combo):
            mask &= cols[k] == v
        out.append((", ".join(f"{k} = {_fmt(v)}" for k, v in zip(keys, combo)), mask))
    return out


def _edges(c: np.ndarray, log: bool) -> np.ndarray:
    """Cell edges around sorted centres (geometric midpoints on a log axis)."""
    if c.size == 1:
        return np.array([c[0] * 0.9, c[0] * 1.1]) if log else np.array([c[0] - 0.5, c[0] + 0.5])
    x = np.log(c) if log else c
    mid = (x[1:] + x[:-1]) / 2
    e = np.concatenate([[x[0] - (mid[0] - x[0])], mid, [x[-1] + (x[-1] - mid[-1])]])
    return np.exp(e) if log else e


def _cell_medians(b_idx, t_idx, values, nb, nt) -> np.ndarray:
    cell = b_idx * nt + t_idx
    order = np.argsort(cell, kind="stable")
    cs, vs = cell[order], values[order]
    out = np.full(nb * nt, np.nan)
    bounds = np.flatnonzero(np.diff(cs)) + 1
    for chunk_c, chunk_v in zip(np.split(cs, bounds), np.split(vs, bounds)):
        fin = chunk_v[np.isfinite(chunk_v)]
        if fin.size:
            out[chunk_c[0]] = np.median(fin)
    return out.reshape(nb, nt)


def _unit_meta(meta: dict, units: np.ndarray) -> dict | None:
    um = meta.get("unit_meta") or {}
    for u in np.unique(units):
        if str(u) in um:
            return um[str(u)]
    return None


# ============================================================================ phase diagram

def plot_phase_diagram(results_csv, out_stem, quantity: str | None = None) -> list[Path]:
    """Median over replicas (seeds) of the cluster count -- or of eps when clusters were not
    recorded (``quantity`` picks: "clusters" or "eps") -- as a heat map over (beta, t): beta
    across, time up (log scale when the recorded times span > 20x). One panel per combination
    of the other swept parameters (e.g. heads.kind x heads.count).

    Overlays:
    - white contour: where the median crosses 1.5 clusters (the data's one-cluster boundary),
      or eps = 1 - threshold for eps maps;
    - red curve, **the equiangular ODE** of MODEL.md (Theorem 22): the time the ODE takes gamma
      from gamma0 to the cluster threshold tau (all pairwise cosines > tau <=> one cluster in an
      equiangular configuration), for units whose heads are all scalar (M = V = lambda I), on
      the sphere, rule softmax or exp. It is *exact* (solid) for orthogonal starts (gamma0 = 0)
      and equiangular starts (gamma0 = tokens.gamma): the dynamics keep those configurations
      equiangular, so the data boundary must sit on the curve. For random starts it is drawn
      dashed, as a *reference* only: random tokens are near-equiangular with gamma0 ~ 0 only
      when d >> n; in low d (the 1-head S^2 diagram) nearby tokens merge first into metastable
      clusters, so the data deviate from the curve, which is the point of showing it;
    - dotted vertical line, **beta*** of Theorem 19, where it applies: H >= 2 equal scalar heads
      and orthogonal starts (n <= d), when beta* > 0 lies in the swept range. Below beta* the
      radial dominance condition holds at the start; it is about per-head energy monotonicity,
      not about clustering speed.
    """
    path, cols, meta, header = _load(results_csv)
    if "dynamics.beta" not in cols:
        raise ParticlesUserError("the results have no dynamics.beta column")
    if quantity is None:
        quantity = "clusters" if "clusters" in cols else "eps"
    if quantity not in cols:
        have = [q for q in ("clusters", "eps") if q in cols]
        raise ParticlesUserError(f"the sweep did not record {quantity!r} (recorded: {', '.join(have) or 'neither'}); "
                                 "add clusters = true or \"eps\" to [record]")
    betas = np.unique(cols["dynamics.beta"])
    times = np.unique(cols["time"])
    if betas.size < 2:
        raise ParticlesUserError("a phase diagram needs at least two values of dynamics.beta")
    panels = _groups(cols, _panel_columns(cols, header))
    ncol = min(3, math.ceil(math.sqrt(len(panels))))
    nrow = math.ceil(len(panels) / ncol)
    fig = new_figure(4.8 * ncol + 1.2, 3.8 * nrow + 0.4)
    axes = fig.subplots(nrow, ncol, squeeze=False)
    vals = cols[quantity].astype(float)
    fin = vals[np.isfinite(vals)]
    if quantity == "clusters":
        vmax = max(2.0, float(fin.max()) if fin.size else 2.0)
        norm, clabel = LogNorm(vmin=1.0, vmax=vmax), "median number of clusters"
    else:
        pos = fin[fin > 0]
        lo = max(float(pos.min()) if pos.size else 1e-8, 1e-8)
        hi = max(float(pos.max()) if pos.size else 1.0, lo * 10)
        norm, clabel = LogNorm(vmin=lo, vmax=hi), r"median $\varepsilon = 1-\bar\gamma$"
    tpos = times[times > 0]
    tlog = tpos.size >= 2 and tpos.max() / tpos.min() > 20
    blin = np.allclose(np.diff(betas), np.diff(betas)[0], rtol=1e-6) if betas.size > 2 else True
    mesh = None
    for k, (label, mask) in enumerate(panels):
        ax = axes[k // ncol][k % ncol]
        bi = np.searchsorted(betas, cols["dynamics.beta"][mask])
        ti = np.searchsorted(times, cols["time"][mask])
        med = _cell_medians(bi, ti, vals[mask], betas.size, times.size)
        t_plot = times if not tlog else np.where(times > 0, times, tpos.min() / 2)
        mesh = ax.pcolormesh(_edges(betas, not blin), _edges(t_plot, tlog), med.T, norm=norm,
                             cmap="viridis", shading="flat")
        if tlog:
            ax.set_yscale("log")
        if not blin:
            ax.set_xscale("log")
        level = 1.5 if quantity == "clusters" else None
        um = _unit_meta(meta, cols["unit"][mask]) if "unit" in cols else None
        tau = (um or {}).get("threshold") or 0.99
        if level is None:
            level = 1.0 - tau
        if np.isfinite(med).sum() >= 4 and np.nanmin(med) < level < np.nanmax(med):
            ax.contour(betas, t_plot, med.T, levels=[level], colors="white", linewidths=1.2)
        _overlays(ax, um, cols, mask, betas, t_plot, tau)
        if "stop_time" in cols:
            _stop_marks(ax, cols, mask, betas, blin)
        if label:
            ax.set_title(label, fontsize=9, loc="left")
        ax.set_xlabel(r"$\beta$", fontsize=9)
        ax.set_ylabel("time $t$", fontsize=9)
        ax.set_ylim(_edges(t_plot, tlog)[0], _edges(t_plot, tlog)[-1])
        ax.set_xlim(_edges(betas, not blin)[0], _edges(betas, not blin)[-1])
        ax.tick_params(labelsize=8)
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            ax.legend(fontsize=7, loc="upper left", framealpha=0.8)
    for j in range(len(panels), nrow * ncol):
        axes[j // ncol][j % ncol].set_visible(False)
    if mesh is not None:
        cbar = fig.colorbar(mesh, ax=axes.ravel().tolist(), label=clabel, shrink=0.9)
        if quantity == "clusters":
            ticks = [v for v in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512, 1024)
                     if v <= norm.vmax]
            cbar.set_ticks(ticks, labels=[str(v) for v in ticks])
            cbar.minorticks_off()
    title = meta.get("name", path.parent.name)
    n_seeds = np.unique(cols["tokens.seed"]).size
    fig.suptitle(f"{title}: {clabel} over {n_seeds} seeds", fontsize=10)
    return save_png_svg(fig, out_stem)


def _stop_marks(ax, cols, mask, betas, blin: bool) -> None:
    """Where stop rules ended units: a dashed white segment at each unit's stop time over the
    cells of its betas (the rows above it hold the state the unit stopped in)."""
    edges = _edges(betas, not blin)
    units, stops, beta = cols["unit"][mask], cols["stop_time"][mask].astype(float), cols["dynamics.beta"][mask]
    label = "stop rule met: rows above repeat the stopped state"
    for u in np.unique(units):
        mine = units == u
        t_stop = stops[mine][0]
        if not np.isfinite(t_stop):
            continue
        cells = np.searchsorted(betas, np.unique(beta[mine]))
        for lo, hi in _runs(cells):
            ax.hlines(t_stop, edges[lo], edges[hi + 1], colors="white", linestyles="--", lw=1.4,
                      label=label)
            label = None


def _runs(cells: np.ndarray):
    """Consecutive runs (first, last) of sorted cell indices."""
    start = prev = int(cells[0])
    for c in map(int, cells[1:]):
        if c != prev + 1:
            yield start, prev
            start = c
        prev = c
    yield start, prev


def _overlays(ax, um: dict | None, cols, mask, betas, t_plot, tau: float) -> None:
    if not um or um.get("geometry") != "sphere" or not um.get("scalar_strengths"):
        return
    lam, n, init, rule = um["scalar_strengths"], int(um["n"]), um.get("init"), um.get("rule")
    if rule in ("softmax", "exp"):
        exact = init in ("orthogonal", "equiangular")
        if init == "orthogonal":
            gamma0 = 0.0
        elif init == "equiangular":
            gamma0 = float(um.get("gamma") or 0.0)
        else:
            gamma0 = 0.0
        b = np.linspace(betas.min(), betas.max(), 300)
        T = equiangular_time(b, lam, n, rule, gamma0, tau)
        ok = np.isfinite(T) & (T <= t_plot.max() * 1.5) & (T > 0)
        if ok.any():
            ax.plot(b[ok], T[ok], color="red", lw=1.4, ls="-" if exact else "--",
                    label=(f"equiangular ODE: $\\gamma$ {gamma0:g} -> {tau:g}"
                           + ("" if exact else " (reference)")))
    if init == "orthogonal" and len(lam) >= 2 and len(set(lam)) == 1 and n <= int(um["d"]):
        bs = beta_star(len(lam), n, float(lam[0]))
        if np.isfinite(bs) and betas.min() <= bs <= betas.max():
            ax.axvline(bs, color="orange", ls=":", lw=1.5, label=f"$\\beta^*$ = {bs:.3g} (Thm 19)")


# ============================================================================ clustering time

def plot_clustering_time(results_csv, axis: str, out_stem) -> list[Path]:
    """Clustering time (first t with eps < threshold; [record] clustering_time) against n or d
    (``axis``: "n", "d", "tokens.n", "tokens.d" or any numeric column) on log-log axes: every
    replica as a dot, the median over seeds as a line, and a least-squares fit of
    log T = a + s log x to the medians with its slope s in the legend (e.g. s ~ 1 for T = O(n),
    Theorem 25's softmax bound). One series per combination of the other swept parameters.
    Replicas that never reached the threshold are left out and counted in the legend."""
    path, cols, meta, header = _load(results_csv)
    col = {"n": "tokens.n", "d": "tokens.d"}.get(axis, axis)
    if col not in cols:
        raise ParticlesUserError(f"no column {axis!r} in the results (columns: {', '.join(cols)})")
    if "clustering_time" not in cols:
        raise ParticlesUserError("the sweep did not record clustering_time; add [record] "
                                 "clustering_time = {threshold = 1e-3}")
    # one row per replica (the clustering time repeats on every recorded time)
    last = np.ones(cols["point"].size, dtype=bool)
    last[:-1] = cols["point"][1:] != cols["point"][:-1]
    one = {k: v[last] for k, v in cols.items()}
    x_all = one[col].astype(float)
    if np.unique(x_all).size < 2:
        raise ParticlesUserError(f"{col} takes one value only; sweep it to see a trend")
    keys = _panel_columns(one, header, exclude=(col,)) + (["dynamics.beta"]
                                                         if np.unique(one["dynamics.beta"]).size > 1 else [])
    series = _groups(one, keys)
    fig = new_figure(6.4, 4.6)
    ax = fig.add_subplot()
    colors = [f"C{i % 10}" for i in range(len(series))]
    for (label, mask), color in zip(series, colors):
        x, T = x_all[mask], one["clustering_time"][mask].astype(float)
        ok = np.isfinite(T) & (T > 0)
        ax.scatter(x[ok], T[ok], s=8, alpha=0.35, color=color, lw=0)
        xs = np.unique(x)
        med = np.array([np.median(T[(x == v) & ok]) if np.any((x == v) & ok) else np.nan for v in xs])
        good = np.isfinite(med) & (med > 0) & (xs > 0)
        missing = int((~ok).sum())
        text = label or "median"
        if good.sum() >= 2:
            slope, icpt = np.polyfit(np.log(xs[good]), np.log(med[good]), 1)
            text += f": slope {slope:.2f}"
            xf = np.geomspace(xs[good].min(), xs[good].max(), 50)
            ax.plot(xf, np.exp(icpt) * xf ** slope, color=color, ls="--", lw=1.0)
        if missing:
            text += f" ({missing} never clustered)"
        ax.plot(xs[good], med[good], "o-", color=color, lw=1.5, ms=4, label=text)
    ax.set_xscale("log")
    ax.set_yscale("log")
    name = {"tokens.n": "number of tokens $n$", "tokens.d": "dimension $d$"}.get(col, col)
    ax.set_xlabel(name, fontsize=9)
    thr = None
    for u in (meta.get("unit_meta") or {}).values():
        thr = u.get("clustering_threshold")
        break
    ax.set_ylabel("clustering time" + (f" (first t with $\\varepsilon$ < {thr:g})" if thr else ""),
                  fontsize=9)
    ax.grid(True, which="both", color="0.92", lw=0.6)
    ax.legend(fontsize=7, framealpha=0.8)
    ax.set_title(f"{meta.get('name', path.parent.name)}: clustering time against {col}",
                 fontsize=10, loc="left")
    return save_png_svg(fig, out_stem)


# ============================================================================ entry

def plot_sweep(sweep_dir) -> list[Path]:
    """Every figure that applies to a sweep folder, written into it; returns the paths.

    - ``phase_diagram.png/.svg`` when dynamics.beta takes >= 2 values and clusters or eps was
      recorded;
    - ``clustering_time_n`` / ``clustering_time_d`` when tokens.n / tokens.d takes >= 2 values
      and clustering_time was recorded.
    """
    folder = Path(sweep_dir)
    mp = folder / "sweep.json"
    if not mp.is_file():
        raise MissingFileError(f"{str(folder)!r} is not a sweep folder (no sweep.json in it)")
    meta = json.loads(mp.read_text())
    results = folder / "results.csv"
    axes = {a["key"]: a["values"] for a in meta.get("axes", [])}
    cols = meta.get("columns", [])
    written: list[Path] = []
    for name in ("phase_diagram", "clustering_time_n", "clustering_time_d"):
        for suffix in (".png", ".svg"):   # never write through a link left in the folder
            refuse_symlink(folder / (name + suffix))
    if len(axes.get("dynamics.beta", [])) >= 2 and ("clusters" in cols or "eps" in cols):
        written += plot_phase_diagram(results, folder / "phase_diagram")
    for key, short in (("tokens.n", "n"), ("tokens.d", "d")):
        if len(axes.get(key, [])) >= 2 and "clustering_time" in cols:
            written += plot_clustering_time(results, key, folder / f"clustering_time_{short}")
    if not written:
        raise ParticlesUserError(
                    f"nothing to plot for {str(folder)!r}: a phase diagram needs >= 2 values of "
                    "dynamics.beta and clusters or eps recorded; a clustering-time plot needs >= 2 values "
                    "of tokens.n or tokens.d and [record] clustering_time")
    return written


__all__ = ["plot_sweep", "plot_phase_diagram", "plot_clustering_time", "equiangular_time",
           "equiangular_rhs", "beta_star", "c_star"]
