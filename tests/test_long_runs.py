"""Long runs lose nothing: resume is bitwise, interrupts keep everything, reruns are identical."""
import signal
import time

import numpy as np
import pytest

from particles.output import load_log, load_trajectory
from particles.app.run import resume_run, run_scene
from scenes import load_scene
from cli_runner import start_particles

QUIET = dict(render=False, progress=False, echo=lambda *a: None)


def small_scene(steps, **extra):
    overrides = ["tokens.n=24", "log.every=3", "log.trajectory_every=4", "log.clusters_every=6",
                 f"dynamics.steps={steps}", "dynamics.beta=3.0"] + [f"{k}={v}" for k, v in extra.items()]
    return load_scene("quickstart", overrides=overrides)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_resume_is_bitwise_identical_to_an_uninterrupted_run(tmp_path, dtype):
    n_steps = 30
    full = run_scene(small_scene(2 * n_steps, **{"dynamics.dtype": dtype}), tmp_path / "full", **QUIET)
    half = run_scene(small_scene(n_steps, **{"dynamics.dtype": dtype}), tmp_path / "half",
                     checkpoint_every=n_steps, **QUIET)
    assert half.status == "completed" and (tmp_path / "half" / "checkpoint.npz").is_file()
    resumed = resume_run(tmp_path / "half", steps=2 * n_steps, **QUIET)
    assert resumed.status == "completed" and resumed.steps_done == 2 * n_steps
    assert (tmp_path / "full" / "log.csv").read_text() == (tmp_path / "half" / "log.csv").read_text()
    s1, t1, x1, _ = load_trajectory(tmp_path / "full")
    s2, t2, x2, _ = load_trajectory(tmp_path / "half")
    assert np.array_equal(s1, s2) and np.array_equal(x1, x2) and x1.dtype == np.dtype(dtype)


def test_same_scene_and_seed_give_the_same_log(tmp_path):
    a = run_scene(small_scene(40), tmp_path / "a", **QUIET)
    b = run_scene(small_scene(40), tmp_path / "b", **QUIET)
    assert a.log.read_text() == b.log.read_text()


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_sigint_and_sigterm_end_the_run_cleanly(tmp_path, sig):
    out = tmp_path / sig.name
    proc = start_particles("run", "quickstart", "--out", out, "--steps", 1000000, "--no-render",
                           "--set", "log.every=1")
    log = out / "log.csv"
    deadline = time.time() + 120
    while time.time() < deadline and (not log.exists() or log.read_text().count("\n") < 20):
        time.sleep(0.2)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "interrupted at step" in stdout and "particles resume" in stdout
    assert "Traceback" not in stderr
    rows = load_log(out)
    assert len(rows["step"]) >= 20 and np.all(np.diff(rows["step"]) == 1)
    assert (out / "checkpoint.npz").is_file()
    steps, _, _, _ = load_trajectory(out)
    assert steps[-1] <= rows["step"][-1]
    import json
    assert json.loads((out / "run.json").read_text())["status"] == "interrupted"


def test_blow_up_stops_with_a_clear_error_and_keeps_outputs(tmp_path):
    scene = load_scene("quickstart", overrides=["dynamics.geometry=flat", "dynamics.rule=exp",
                                                "dynamics.beta=3.0", "dynamics.dt=0.5", "dynamics.steps=400",
                                                "log.every=1", "render.color_by=index", "log.clusters_every=0"])
    result = run_scene(scene, tmp_path / "boom", **QUIET)
    assert result.status == "blow-up"
    assert "blow-up at step" in result.message and "reduce dt" in result.message
    rows = load_log(result.log)
    assert len(rows["step"]) >= 1 and np.all(np.isfinite(rows["gamma_bar"][:-1]))
