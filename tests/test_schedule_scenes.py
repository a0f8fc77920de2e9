"""Scenes with masks, ALiBi, per-head options and [[layers]]: validation, the Simulation they
build, the log's layer column, the NaN energy and its note, and a resumed scheduled run."""
import json

import numpy as np
import pytest

import particles
from particles.app.build import build_simulation
from particles.app.run import resume_run, run_scene
from particles.output import load_log
from scenes import Scene, load_scene
from scenes.errors import SceneError

QUIET = dict(render=False, progress=False, echo=lambda *a: None)


def _scene(**changes):
    base = {"tokens": {"n": 12, "d": 3, "seed": 1},
            "heads": {"kind": "scalar", "count": 2, "strength": 1.0},
            "dynamics": {"rule": "softmax", "beta": 2.0, "dt": 0.05, "steps": 12},
            "log": {"every": 1}}
    for key, value in changes.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return Scene.from_dict(base)


def test_scene_attention_keys_reach_every_head():
    scene = _scene(dynamics={"mask": "causal_window", "window": 3, "alibi": True},
                   heads=[{"kind": "scalar", "rule": "relu", "beta": 3.0},
                          {"kind": "scalar", "mask": "causal", "alibi_slope": 0.5}])
    sim = build_simulation(scene)
    a0, a1 = sim.attention
    slopes = particles.alibi_slopes(2)
    assert (a0.mask, a0.window, a0.alibi, a0.beta, a0.rule.name) == ("causal_window", 3, slopes[0], 3.0, "relu")
    assert (a1.mask, a1.window, a1.alibi, a1.beta, a1.rule.name) == ("causal", None, 0.5, None, "softmax")


def test_layers_build_a_schedule_with_shared_and_own_heads():
    scene = _scene(dynamics={"layer_every": 0.2},
                   layers=[{"rule": "relu", "heads": {"kind": "random", "count": 2, "seed": 3}},
                           {"mask": "causal"}])
    sim = build_simulation(scene)
    assert sim.scheduled and sim.schedule.starts == (0, 4, 8)
    assert [a.rule.name for a in sim.layer_attention[1]] == ["relu", "relu"]
    assert [a.mask for a in sim.layer_attention[2]] == ["causal", "causal"]
    layer0 = [h.score for h in scene.build_heads()]
    assert all(np.array_equal(a.score, b) for a, b in zip(sim.schedule.layers[2].heads, layer0))
    assert not np.array_equal(sim.schedule.layers[1].heads[0].score, layer0[0])


@pytest.mark.parametrize("changes, message", [
    (dict(dynamics={"mask": "causual"}), "[dynamics] mask: expected one of"),
    (dict(dynamics={"mask": "window"}), "[dynamics] window: missing (required)"),
    (dict(dynamics={"window": 3}), "[dynamics] window: applies to mask = 'window' or 'causal_window' only"),
    (dict(heads={"kind": "scalar", "rule": "gelu"}), "head rule: 'gelu' is not a built-in rule"),
    (dict(heads={"kind": "scalar", "alibi_slope": -1}), "alibi_slope: expected a number >= 0"),
    (dict(layers=[{"start": 0.33}]), "[[layers]] #1 start: a layer switches between steps: 0.33 is not a multiple"),
    (dict(layers=[{"start": 0.4}, {"start": 0.2}]), "[[layers]] #2 start: layers must start in increasing time"),
    (dict(layers=[{"heads": [{"kind": "scalar"}], "start": 0.2}]), "every layer needs the same number of heads"),
    (dict(layers=[{}]), "[[layers]] #1 start: missing (required)"),
    (dict(layers=[{"start": 0.2, "strength": 2}]), "unknown key 'strength' in [[layers]] #1"),
    (dict(dynamics={"layer_every": 0.2}), "layer_every: applies to a scene with [[layers]]"),
    (dict(layers="causal"), "layers: expected an array of tables"),
    (dict(heads={"kind": "scalar", "window": 2}, dynamics={"mask": "window", "window": 1}),
     "[heads] window: applies with this table's own mask"),
    (dict(layers=[{"start": 0.2, "window": 2}]), "[[layers]] #1 window: applies with this table's own mask"),
    (dict(dynamics={"dtype": "float64", "dt": 1e-300}, layers=[{"start": 1e300}]),
     "[[layers]] #1 start: a layer switches between steps"),
])
def test_bad_position_and_layer_keys_name_the_key(changes, message):
    with pytest.raises(SceneError) as err:
        _scene(**changes)
    assert message in str(err.value)
    assert "<object" not in str(err.value)   # never an internal placeholder in a message


def test_t_end_over_dt_beyond_float_range_is_a_scene_error():
    with pytest.raises(SceneError) as err:
        Scene.from_dict({"tokens": {"n": 4, "d": 3}, "dynamics": {"t_end": 1e300, "dt": 1e-300}})
    assert "[dynamics] t_end: t_end / dt = " in str(err.value)


def test_window_with_a_misspelt_mask_reports_only_the_mask():
    with pytest.raises(SceneError) as err:
        _scene(heads={"kind": "scalar", "mask": "windw", "window": 2})
    assert err.value.problems == [p for p in err.value.problems if "mask" in p] and len(err.value.problems) == 1


def test_scheduled_run_logs_layers_nan_energy_and_a_note(tmp_path):
    scene = _scene(layers=[{"start": 0.2, "rule": "relu"}, {"start": 0.4, "mask": "causal"}])
    lines = []
    result = run_scene(scene, tmp_path / "run", render=False, progress=False, echo=lines.append)
    log = load_log(result.log)
    assert list(log["layer"]) == [0] * 4 + [1] * 4 + [2] * 5
    assert np.all(np.isnan(log["energy"])) and np.all(np.isfinite(log["tangent_power_h0"]))
    assert np.all(np.isfinite(log["radial_shadow_h1"])) and np.all(np.isfinite(log["entropy_mean_h0"]))
    summary = json.loads((tmp_path / "run" / "run.json").read_text())["summary"]
    assert "layer schedule" in summary["energy_note"]
    assert any("note: energy columns are NaN" in line for line in lines)


def test_masked_run_summary_says_why_energy_is_nan(tmp_path):
    scene = _scene(heads=[{"kind": "scalar"}, {"kind": "scalar", "mask": "causal"}])
    result = run_scene(scene, tmp_path / "run", **QUIET)
    log = load_log(result.log)
    assert np.all(np.isfinite(log["energy_h0"])) and np.all(np.isnan(log["energy_h1"]))
    assert np.all(np.isnan(log["energy"]))
    note = json.loads((tmp_path / "run" / "run.json").read_text())["summary"]["energy_note"]
    assert "head 1: a causal mask" in note and "head 0" not in note


def test_resumed_scheduled_run_equals_the_uninterrupted_one(tmp_path):
    """Interrupted inside layer 1 (a checkpoint at step 8, the run cut at 10), resumed to 20:
    the log and trajectory equal a run straight through, bit for bit."""
    scene = _scene(dynamics={"steps": 20, "layer_every": 0.3},
                   log={"every": 2, "trajectory_every": 2},
                   layers=[{"rule": "relu", "heads": {"kind": "random", "count": 2, "seed": 4}},
                           {"mask": "causal"}])
    whole = run_scene(scene, tmp_path / "whole", **QUIET)
    part = run_scene(scene.replace(dynamics={"steps": 10}), tmp_path / "part", checkpoint_every=8, **QUIET)
    assert part.status == "completed"
    resumed = resume_run(tmp_path / "part", steps=20, **QUIET)
    a, b = load_log(whole.log), load_log(resumed.log)
    assert list(a["layer"]) == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2]
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    ta, tb = particles.load_trajectory(tmp_path / "whole"), particles.load_trajectory(tmp_path / "part")
    np.testing.assert_array_equal(ta.tokens, tb.tokens)


def test_bundled_causal_scene_keeps_token_zero_fixed(tmp_path):
    scene = load_scene("causal_kpr").replace(dynamics={"steps": 60}, log={"trajectory_every": 10})
    run_scene(scene, tmp_path / "kpr", **QUIET)
    traj = particles.load_trajectory(tmp_path / "kpr")
    x = np.asarray(traj.tokens)
    assert np.max(np.abs(x[:, 0] - x[0, 0])) < 1e-6     # token 0 (float32 run)
    assert np.median(np.linalg.norm(x[-1, 1:] - x[0, 1:], axis=1)) > 0.05


@pytest.mark.parametrize("changes, message", [
    (dict(heads=[{"kind": "scalar", "alibi_slope": 1e39}]), "[heads] head 0: alibi_slope = 1e+39 is not finite in float32"),
    (dict(heads=[{"kind": "scalar", "beta": 1e-50}]), "[heads] head 0: beta = 1e-50 is zero in float32"),
    (dict(layers=[{"start": 0.2, "heads": {"kind": "scalar", "count": 2, "strength": 1e39}}]),
     "[[layers]] #1 head 0: a matrix entry is not finite in float32"),
    (dict(layers=[{"start": 0.2, "heads": [{"kind": "scalar", "alibi_slope": 1e39}, {"kind": "scalar"}]}]),
     "[[layers]] #1 head 0: alibi_slope = 1e+39 is not finite in float32"),
])
def test_head_and_layer_values_must_stay_finite_in_the_dtype(changes, message):
    scene = _scene(**changes)
    with pytest.raises(ValueError) as err:
        build_simulation(scene)
    assert message in str(err.value)
    build_simulation(scene.replace(dynamics={"dtype": "float64"}))   # float64 holds them


def test_a_window_wider_than_any_sequence_is_no_limit():
    seen = [build_simulation(_scene(dynamics={"dtype": "float64", **attention}))
            for attention in ({"mask": "window", "window": 10**20}, {"mask": "window", "window": 11})]
    for sim in seen:
        sim.advance(5)
    np.testing.assert_allclose(seen[0].tokens, seen[1].tokens, rtol=0, atol=1e-12)
