"""`particles plot`'s figures of runs: the summary of one run, several runs on one axis per
quantity, and the theory values that apply to each (c*(H), ln n, the equiangular ODE), read
from the run's scene. The drawing is render.figures'; this module knows the model."""
from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np

from render.figures import HEAD_COLUMN, Reference, plot_comparison, plot_summary

from particles import theory
from particles.output import load_log, refuse_link

from .summary import scene_title

ODE_POINTS = 400   # the equiangular ODE is drawn at this many times at most


def scene_data(run_dir: Path) -> dict:
    """A run's scene.toml as a dict ({} when absent or unreadable: the figure then goes without
    a title and without theory)."""
    try:
        with open(Path(run_dir) / "scene.toml", "rb") as fh:
            return tomllib.load(fh)
    except (OSError, ValueError):
        return {}


def run_title(run_dir: Path) -> str | None:
    """'quickstart    n = 64, d = 3, H = 2, rule = softmax, \u03b2 = 4' from a run's scene.toml
    (None without a readable one); every layer's rule is named (summary.scene_title)."""
    scene = scene_data(run_dir)
    return scene_title(scene, Path(run_dir).name) if scene else None


def references(scene: dict, columns=None) -> list[Reference]:
    """The theory values that apply to a run of ``scene`` (its data, as scene.toml holds it)
    whose log is ``columns``: rho = 1 and c*(H) in the radial-dominance panel (several heads on
    the sphere), ln n in the entropy panels, gamma_bar of the equiangular ODE (Theorem 22)
    where the start is equiangular and the heads scalar with V = M, one layer, no mask or
    bias, and dE/dt (the logged energy's centred difference) beside the kinetic term where
    Theorem 11 makes them equal (symmetric heads, V = M, rule exp)."""
    columns = columns or {}
    try:
        tok, dyn = scene.get("tokens", {}), scene.get("dynamics", {})
        n = int(tok["n"])
    except (KeyError, TypeError, ValueError):
        return []
    entries = _head_entries(scene.get("heads"))
    counted = _heads_in(columns)
    H = counted if counted is not None else sum(_count(e) for e in entries)
    refs = []
    if H >= 2 and dyn.get("geometry", "sphere") == "sphere":
        c = theory.c_star(H)
        refs += [Reference("radial_dominance", "\u03c1 = 1 (Condition 8)", 1.0),
                 Reference("radial_dominance", f"c*({H}) = {c:.3f} (Theorem 19)", c)]
    if n > 1:
        refs += [Reference(q, "ln n", float(np.log(n))) for q in ("entropy_mean", "entropy_min", "entropy_max")]
    times = np.asarray(columns.get("time", ()), dtype=float)
    lambdas = _equiangular_strengths(scene, entries)
    if lambdas is not None and times.size > 1 and np.isfinite(times).all():
        t = np.unique(np.linspace(0.0, float(times.max()), min(ODE_POINTS, times.size)))
        betas = dyn.get("betas") or [dyn.get("beta", 1.0)]
        gamma = theory.equiangular_curve(float(tok.get("gamma", 0.0)), lambdas, float(betas[0]), n, t,
                                         rule=dyn.get("rule", "exp"))
        refs.append(Reference("gamma_bar", "equiangular ODE", times=t, values=gamma))
    rate = _energy_rate(scene, entries, columns)
    if rate is not None:
        refs.append(Reference("kinetic", "$dE/dt$ from $E$ (Theorem 11: = kinetic)", times=rate[0], values=rate[1]))
    return refs


def _count(entry: dict) -> int:
    return int(entry.get("count", len(entry.get("strengths", ())) or 1))


SYMMETRIC_KINDS = ("scalar", "subspace", "near_orthogonal", "random_symmetric")
ROUND_OFF = {"float32": float(np.finfo(np.float32).eps), "float64": float(np.finfo(np.float64).eps)}


def _energy_rate(scene: dict, entries, columns) -> tuple[np.ndarray, np.ndarray] | None:
    """(times, dE/dt) by centred differences of the logged total energy, where Theorem 11 holds
    (else None); differences below the energy's round-off (eps(dtype) |E| / dt per row) are left
    out, where they are noise."""
    dyn = scene.get("dynamics", {})
    if (dyn.get("rule", "exp") != "exp" or scene.get("layers") or dyn.get("mask", "none") != "none"
            or dyn.get("alibi") or "energy" not in columns or "time" not in columns):
        return None
    for e in entries:
        if (e.get("kind") not in SYMMETRIC_KINDS or e.get("value", "aligned") != "aligned"
                or e.get("value_noise", 0.0)
                or any(e.get(k) is not None for k in ("rule", "beta", "mask", "alibi_slope"))):
            return None
    t, energy = np.asarray(columns["time"], float), np.asarray(columns["energy"], float)
    ok = np.isfinite(t) & np.isfinite(energy)
    if ok.sum() < 3:
        return None
    t, energy = t[ok], energy[ok]
    rate = np.gradient(energy, t)
    floor = 4 * ROUND_OFF.get(dyn.get("dtype", "float32"), ROUND_OFF["float32"]) * np.abs(energy).max() \
        / max(float(np.min(np.diff(t))), 1e-300)
    keep = np.abs(rate) > floor
    return (t[keep], rate[keep]) if keep.sum() >= 2 else None


def _head_entries(heads) -> list[dict]:
    if isinstance(heads, dict):
        return [heads]
    return list(heads) if isinstance(heads, list) else [{"kind": "scalar"}]


def _equiangular_strengths(scene: dict, entries) -> list[float] | None:
    """The heads' strengths where the equiangular ODE holds exactly, else None."""
    tok, dyn = scene.get("tokens", {}), scene.get("dynamics", {})
    if (tok.get("init") != "equiangular" or tok.get("noise", 0.0) or scene.get("layers")
            or dyn.get("rule", "exp") not in ("softmax", "exp") or dyn.get("geometry", "sphere") != "sphere"
            or dyn.get("mask", "none") != "none" or dyn.get("alibi")):
        return None
    lambdas = []
    for e in entries:
        if (e.get("kind") != "scalar" or e.get("value", "aligned") != "aligned" or e.get("value_noise", 0.0)
                or any(e.get(k) is not None for k in ("rule", "beta", "mask", "alibi_slope"))):
            return None
        count = _count(e)
        lambdas += [float(v) for v in e.get("strengths", [e.get("strength", 1.0)] * count)]
    return lambdas or None


def read_log(path: Path) -> tuple[Path, dict, str]:
    """(run folder, log columns, note) of a run folder or its log.csv; an ensemble's log is cut to
    replica 0 (the note says so)."""
    from particles.errors import ParticlesUserError
    path = Path(path)
    log = path / "log.csv" if path.is_dir() else path
    if not log.is_file():
        raise ParticlesUserError(f"no log found at {str(log)!r} (give a run directory holding log.csv)")
    columns = dict(load_log(refuse_link(log)))
    if not columns or len(next(iter(columns.values()))) == 0:
        raise ParticlesUserError(f"the log {str(log)!r} has no rows yet: nothing to plot")
    note = ""
    if "replica" in columns:
        keep = columns["replica"] == 0
        note = f" (replica 0 of {len(np.unique(columns['replica']))})"
        columns = {k: v[keep] for k, v in columns.items() if k != "replica"}
    return log.parent, columns, note


def _stem(out, default: Path) -> Path:
    stem = Path(out) if out else default
    if stem.suffix.lower() in (".png", ".svg"):
        stem = stem.with_suffix("")
    for suffix in (".png", ".svg"):   # never write through a link left in the folder
        refuse_link(Path(str(stem) + suffix))
    return stem


def plot_run(path, out=None) -> list[Path]:
    """summary.png and .svg of one run (in its folder unless ``out``), with its theory values."""
    run_dir, columns, note = read_log(path)
    scene = scene_data(run_dir)
    title = run_title(run_dir)
    refs = references(scene, columns)
    return plot_summary(columns, _stem(out, run_dir / "summary"), title=title and title + note, references=refs)


def plot_runs(paths, out=None) -> list[Path]:
    """One figure of several runs, each quantity on one axis (RUN1/comparison.png and .svg
    unless ``out``), each run's theory values beside it."""
    runs, titles = [], []
    loaded = [read_log(p) for p in paths]
    names = [scene_data(d).get("name", d.name) for d, _, _ in loaded]
    if len(set(names)) < len(names):   # the same scene twice: the folders tell them apart
        names = [d.name for d, _, _ in loaded]
    for (run_dir, columns, note), name in zip(loaded, names):
        scene = scene_data(run_dir)
        runs.append((name, columns, references(scene, columns)))
        titles.append((scene_title(scene, run_dir.name) or name) + note)
    return plot_comparison(runs, _stem(out, loaded[0][0] / "comparison"), title="\n".join(titles))


def _heads_in(columns) -> int | None:
    """The number of heads the log's per-head columns count (None without any)."""
    heads = [int(m["h"]) for m in map(HEAD_COLUMN.match, columns) if m]
    return max(heads) + 1 if heads else None
