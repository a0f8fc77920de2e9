"""Recorded runs that hold behaviour bitwise fixed across refactors (tests/test_golden.py).

Each run is small (seconds) and covers a different path: rules, geometries, integrators,
dtypes, ensembles, cluster counts, trajectories, a resumed run and a sweep. Record again
(only when a change of numbers is intended and explained) with

    PYTHONPATH=$PWD python tests/golden_runs.py
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

GOLDEN = Path(__file__).resolve().parent / "golden"

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
    with tempfile.TemporaryDirectory() as tmp:
        for run_name in sys.argv[1:] or NAMES:
            record(run_name, Path(tmp))
            print("recorded", run_name)
