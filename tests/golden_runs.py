"""Recorded runs that hold behaviour fixed across refactors (tests/test_golden.py).

Each run is small (seconds) and covers a different path: rules, geometries, integrators,
dtypes, ensembles, cluster counts, trajectories, a resumed run and a sweep. Record again
(only when a change of numbers is intended and explained) with

    PYTHONPATH=$PWD python tests/golden_runs.py

The recording stores the machine's fingerprint (`machine.json`: CPU model and vector width,
Taichi and LLVM versions). Taichi's JIT compiles for the host CPU and LLVM orders the
reductions behind the observables by vector width, so the bits are reproducible only on a
matching machine. There the comparison is bitwise; elsewhere every number is held to the
dtype's tolerance `RTOL` (see `compare_tables`).
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

GOLDEN = Path(__file__).resolve().parent / "golden"
MACHINE_FILE = GOLDEN / "machine.json"

# Relative tolerance of a logged number on another machine. Between an AMD EPYC (Zen 5) and
# an Intel Xeon (AVX-512) the logs differed by at most 3e-6 (float32) and 1.1e-15 (float64),
# relative, with bitwise-equal tokens; these bounds leave a margin of ~7x and ~1000x, and are
# still far below what a real change of the numbers does (a 0.1% change of dt moves float32
# observables by ~1e-4; tests/test_golden.py shows it fails).
RTOL = {"float32": 2e-5, "float64": 1e-12}

# name -> (scene, overrides, steps); resume runs go half way with checkpoints, then resume.
RUNS = {
    "quickstart": ("quickstart", [], 60),
    "flat_euler_f64": ("radial_shadow_flat",
                       ["dynamics.integrator=euler", "dynamics.dtype=float64", "log.trajectory_every=4",
                        "log.clusters_every=8", "dynamics.t_end=0.2"], None),
    "entropy_rate": ("entropy_rise", ["log.trajectory_every=10"], 30),
}
RESUMED = ("relu_vs_softmax_relu", ["tokens.replicas=2", "dynamics.betas=[1.0, 2.0]",
                                    "log.trajectory_every=6", "log.clusters_every=6"], 24, 48)
SWEEP = {
    "name": "golden_sweep", "scene": "quickstart", "batch": 3,
    "tokens": {"n": 12}, "dynamics": {"t_end": 2.0, "dt": 0.05},
    "axes": {"dynamics.beta": [0.5, 2.0], "tokens.seed": {"count": 2}},
    "record": {"times": [0.0, 1.0, 2.0], "observables": ["eps", "energy"], "clusters": True,
               "threshold": 0.95, "clustering_time": {"threshold": 0.5, "every": 2}},
}


def dtype_of(name: str) -> str:
    """The dtype a golden run computes in (its scene's, after the overrides)."""
    if name == "sweep":
        from scenes import load_scene
        return load_scene(SWEEP["scene"]).dynamics.dtype
    scene_name, overrides, steps = RUNS[name] if name in RUNS else RESUMED[:3]
    return _load_scene(scene_name, overrides, steps).dynamics.dtype


def recorded_machine() -> dict:
    try:
        return json.loads(MACHINE_FILE.read_text())
    except (OSError, ValueError):
        return {}


def same_machine(recorded: dict, here: dict) -> bool:
    """Bits are expected to repeat only when everything that decides them is the same."""
    keys = ("model", "vendor", "family", "model_number", "vector_width_bits", "taichi", "llvm")
    return bool(recorded) and all(recorded.get(k) == here.get(k) for k in keys)


def _is_integer_cell(cell: str) -> bool:
    return cell.lstrip("-").isdigit()


def compare_tables(got: str, want: str, rtol: float, what: str) -> None:
    """Hold CSV text `got` to `want` cell by cell: identical header and non-numeric or integer
    cells (steps, cluster counts, unit names); each float within rtol * (|want| + m), where m
    is the median magnitude of its column (so a column that passes through 0 is held at its
    own scale); NaN only where NaN was recorded. Raises AssertionError naming the first
    cell that differs."""
    got_rows = [r.split(",") for r in got.strip("\n").split("\n")]
    want_rows = [r.split(",") for r in want.strip("\n").split("\n")]
    assert got_rows[0] == want_rows[0], f"{what}: the columns differ from the recording"
    assert len(got_rows) == len(want_rows), f"{what}: {len(got_rows) - 1} rows, recorded {len(want_rows) - 1}"
    header = want_rows[0]
    scale = []
    for c in range(len(header)):
        mags = sorted(abs(float(r[c])) for r in want_rows[1:] if _is_float(r[c]) and math.isfinite(float(r[c])))
        scale.append(mags[len(mags) // 2] if mags else 0.0)
    for i, (g_row, w_row) in enumerate(zip(got_rows[1:], want_rows[1:]), start=1):
        assert len(g_row) == len(w_row), f"{what}: row {i} has {len(g_row)} cells, recorded {len(w_row)}"
        for c, (g, w) in enumerate(zip(g_row, w_row)):
            where = f"{what}: row {i}, column {header[c]}: got {g}, recorded {w}"
            if _is_integer_cell(w) or not _is_float(w):
                assert g == w, where
                continue
            assert _is_float(g), where
            gv, wv = float(g), float(w)
            if math.isnan(wv) or math.isinf(wv):
                assert g == w or (math.isnan(gv) and math.isnan(wv)), where
                continue
            assert abs(gv - wv) <= rtol * (abs(wv) + scale[c]), f"{where} (rtol {rtol:g})"


def _is_float(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def compare(name: str, got: dict, want_dir: Path, bitwise: bool) -> None:
    """Hold a produced golden run to its recording: bitwise, or to its dtype's tolerance."""
    rtol = RTOL[dtype_of(name)]
    texts = [t for t in ("log.csv", "results.csv") if (want_dir / t).is_file()]
    assert texts, f"golden run {name} has no recorded table"
    for text in texts:
        want = (want_dir / text).read_text()
        if bitwise:
            assert got[text] == want, f"{name}/{text} differs from the recording"
        else:
            compare_tables(got[text], want, rtol, f"{name}/{text}")
    if (want_dir / "trajectory.npz").is_file():
        with np.load(want_dir / "trajectory.npz") as want:
            for key in ("steps", "times", "tokens"):
                assert got["trajectory"][key].dtype == want[key].dtype
                if bitwise or key == "steps":
                    assert np.array_equal(got["trajectory"][key], want[key]), f"{name} trajectory {key}"
                else:
                    assert got["trajectory"][key].shape == want[key].shape, f"{name} trajectory {key}"
                    atol = rtol * max(1.0, float(np.max(np.abs(want[key]), initial=0.0)))
                    np.testing.assert_allclose(got["trajectory"][key], want[key], rtol=0, atol=atol,
                                               err_msg=f"{name} trajectory {key} (atol {atol:g})")
    else:
        assert "trajectory" not in got


def _api():
    from particles.app.run import resume_run, run_scene
    from particles.app.sweep import Sweep, run_sweep
    return run_scene, resume_run, Sweep, run_sweep


def _load_scene(name, overrides, steps):
    from scenes import load_scene
    extra = [f"dynamics.steps={steps}"] if steps is not None else []
    return load_scene(name, overrides=list(overrides) + extra)


def produce(name: str, out: Path) -> Path:
    """Run golden run ``name`` into the fresh folder ``out``; returns the folder."""
    run_scene, resume_run, Sweep, run_sweep = _api()
    quiet = dict(render=False, progress=False, echo=lambda *_: None)
    if name in RUNS:
        scene = _load_scene(*RUNS[name])
        run_scene(scene, out, **quiet)
    elif name == "resumed":
        scene_name, overrides, first, total = RESUMED
        run_scene(_load_scene(scene_name, overrides, first), out, checkpoint_every=8, **quiet)
        resume_run(out, steps=total, checkpoint_every=8, **quiet)
    elif name == "sweep":
        sweep = Sweep.from_dict(json.loads(json.dumps(SWEEP)), source="golden")
        run_sweep(sweep, out)
    else:
        raise KeyError(name)
    return out


NAMES = list(RUNS) + ["resumed", "sweep"]


def outputs(folder: Path) -> dict:
    """What a golden run holds fixed: the log / results text and the trajectory arrays."""
    out = {}
    for text in ("log.csv", "results.csv"):
        if (folder / text).is_file():
            out[text] = (folder / text).read_text()
    traj = folder / "trajectory"
    if traj.is_dir():
        chunks = sorted(traj.glob("chunk_*.npz"))
        parts = {"steps": [], "times": [], "tokens": []}
        for chunk in chunks:
            with np.load(chunk) as data:
                for key in parts:
                    parts[key].append(data[key])
        out["trajectory"] = {k: np.concatenate(v) for k, v in parts.items()}
    return out


def record(name: str, scratch: Path) -> None:
    import shutil
    folder = produce(name, scratch / name)
    got = outputs(folder)
    dest = GOLDEN / name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for text in ("log.csv", "results.csv"):
        if text in got:
            (dest / text).write_text(got[text])
    if "trajectory" in got:
        np.savez_compressed(dest / "trajectory.npz", **got["trajectory"])


if __name__ == "__main__":
    import tempfile

    from particles import backend, machine
    here = backend.fingerprint()
    recorded = recorded_machine()
    names = sys.argv[1:] or NAMES
    if recorded and not same_machine(recorded, here) and set(names) != set(NAMES):
        sys.exit(f"the recording was made on {machine.describe(recorded)}; this is "
                 f"{machine.describe(here)}: record every run here (no arguments), not a few")
    with tempfile.TemporaryDirectory() as tmp:
        for run_name in names:
            record(run_name, Path(tmp))
            print("recorded", run_name)
    MACHINE_FILE.write_text(json.dumps(here, indent=1) + "\n")
    print("on", machine.describe(here))
