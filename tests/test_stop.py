"""Stop rules (particles.stop, issue 35): a run ends where the flow has stopped, each rule with
its reason in run.json, the summary and the command's message; the log and the film end there;
an interrupted run stops where the uninterrupted one did."""
import json
import os
import signal

import numpy as np
import pytest

from particles import load_log
from particles.app.run import resume_run, run_scene
from particles.simulation import Simulation
from scenes import SceneError, load_scene

QUIET = dict(render=False, progress=False, echo=lambda *a: None)


def _scene(*rules, steps=600):
    """Twelve tokens collapsing at beta = 1 (kinetic ~e^(-1.6 t)), logged every 0.25."""
    return load_scene("quickstart", overrides=[
        "tokens.n=12", "dynamics.rule=softmax", "dynamics.beta=1", "dynamics.dt=0.05",
        f"dynamics.steps={steps}", "dynamics.dtype=float64", "log.every=5", *rules])


def _run(tmp_path, *rules, **kw):
    result = run_scene(_scene(*rules), tmp_path / "run", **QUIET, **kw)
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    return result, info, load_log(tmp_path / "run")


def test_kinetic_rule_ends_the_run_with_its_reason(tmp_path):
    result, info, log = _run(tmp_path, "dynamics.stop_kinetic=1e-12", "dynamics.stop_window=1.0")
    assert result.status == "completed" and info["status"] == "completed"
    stop = info["summary"]["stopped"]
    assert 0 < stop["step"] < 600 and result.steps_done == stop["step"] == info["steps_done"]
    assert stop["reason"].startswith("stop rule: kinetic energy <= 1e-12 at every logged state from t = ")
    assert "stopped at step" in result.message and stop["reason"] in result.message
    # the rows that decided: every one in the window at most 1e-12, the one before it above
    t, k = log["time"], log["kinetic"]
    assert t[-1] == pytest.approx(stop["time"]) and log["step"][-1] == stop["step"]
    window = (t >= stop["time"] - 0.25 - 1.0 - 1e-9) & (t <= stop["time"] - 0.25 + 1e-9)
    assert np.all(k[window] <= 1e-12) and k[np.argmax(window) - 1] > 1e-12


def test_energy_rate_rule_ends_the_run_with_its_reason(tmp_path):
    result, info, log = _run(tmp_path, "dynamics.stop_energy_rate=1e-10", "dynamics.stop_window=0.5")
    stop = info["summary"]["stopped"]
    assert stop["reason"].startswith("stop rule: |dE/dt| <= 1e-10 at every logged state from t = ")
    rate = log["energy_rate_h0"]
    assert abs(rate[-2]) <= 1e-10 and np.max(np.abs(rate[:len(rate) // 2])) > 1e-10
    assert stop["step"] < 600


def test_cluster_rule_ends_the_run_with_its_reason(tmp_path):
    result, info, log = _run(tmp_path, "dynamics.stop_clusters=2.0", "log.cluster_threshold=0.999")
    stop = info["summary"]["stopped"]
    assert stop["reason"].startswith("stop rule: cluster count 1 (cos > 0.999) unchanged from t = ")
    since = float(stop["reason"].split("unchanged from t = ")[1].split(" ")[0])
    assert stop["time"] - since >= 2.0 and since > 0


def test_no_rule_met_runs_to_the_end(tmp_path):
    result, info, _ = _run(tmp_path, "dynamics.stop_kinetic=1e-40", "dynamics.steps=60")
    assert result.steps_done == 60 and "stopped" not in info["summary"]


def test_bad_stop_keys_are_refused_naming_them():
    with pytest.raises(SceneError, match=r"\[dynamics\] stop_window: applies to stop_kinetic or stop_energy_rate"):
        _scene("dynamics.stop_window=1.0")
    with pytest.raises(SceneError, match=r"\[dynamics\] stop_kinetic: expected a number > 0"):
        _scene("dynamics.stop_kinetic=-1")


def test_an_interrupted_run_stops_where_the_uninterrupted_one_did(tmp_path, monkeypatch):
    rules = ("dynamics.stop_clusters=2.0", "dynamics.stop_kinetic=1e-12", "dynamics.stop_window=1.0")
    want = run_scene(_scene(*rules), tmp_path / "whole", checkpoint_every=20, **QUIET)
    calls = {"n": 0}
    original = Simulation.advance

    def advance(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 30:
            os.kill(os.getpid(), signal.SIGINT)
        return out

    monkeypatch.setattr(Simulation, "advance", advance)
    cut = run_scene(_scene(*rules), tmp_path / "cut", checkpoint_every=20, **QUIET)
    assert cut.status == "interrupted" and cut.steps_done < want.steps_done
    monkeypatch.setattr(Simulation, "advance", original)
    done = resume_run(tmp_path / "cut", **QUIET)
    assert done.steps_done == want.steps_done < 600 and done.message == want.message
    assert (tmp_path / "cut" / "log.csv").read_bytes() == (tmp_path / "whole" / "log.csv").read_bytes()
