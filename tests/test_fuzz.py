"""Random and malformed scenes: every one ends in a valid run or a clear SceneError, never a crash."""
import tempfile

import pytest
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings, strategies as st

from particles.app.run import run_scene
from scenes import Scene, SceneError, load_scene

QUIET = dict(render=False, progress=False, echo=lambda *a: None)

garbage = st.one_of(st.none(), st.booleans(), st.integers(-5, 10), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=6), st.lists(st.integers(-2, 5), max_size=3))
small_int = st.integers(-1, 6)


def maybe(strategy):
    return st.one_of(strategy, garbage)


tokens = st.fixed_dictionaries({"n": maybe(st.integers(2, 8)), "d": maybe(st.integers(2, 5))}, optional={
    "init": maybe(st.sampled_from(["random", "equiangular", "orthogonal", "clusters", "file", "spiral"])),
    "gamma": maybe(st.floats(-0.5, 1.0)), "seed": maybe(small_int), "noise": maybe(st.floats(0, 0.5)),
    "clusters": maybe(small_int), "replicas": maybe(st.integers(1, 3)), "nn": garbage})
head = st.fixed_dictionaries({"kind": maybe(st.sampled_from(
    ["scalar", "subspace", "random_symmetric", "random", "near_orthogonal", "matrix", "bogus"]))}, optional={
    "strength": maybe(st.floats(-2, 2)), "count": maybe(st.integers(1, 3)), "rank": maybe(small_int),
    "block": maybe(st.lists(small_int, min_size=2, max_size=2)), "angle": maybe(st.floats(0, 120)),
    "value": maybe(st.sampled_from(["aligned", "identity", "weird"])), "value_noise": maybe(st.floats(0, 1))})
dynamics = st.fixed_dictionaries({}, optional={
    "rule": maybe(st.sampled_from(["exp", "softmax", "relu", "mystery"])),
    "geometry": maybe(st.sampled_from(["sphere", "flat", "torus"])), "beta": maybe(st.floats(0, 5)),
    "dt": maybe(st.floats(0, 0.2)), "steps": maybe(st.integers(1, 3)), "t_end": maybe(st.floats(0, 0.1)),
    "integrator": maybe(st.sampled_from(["euler", "rk4", "leapfrog"])),
    "dtype": maybe(st.sampled_from(["float32", "float64", "int8"])), "beeta": garbage})
log = st.fixed_dictionaries({}, optional={"every": maybe(small_int), "clusters_every": maybe(small_int),
                                          "trajectory_every": maybe(small_int), "entropy_rate": maybe(st.booleans())})
scene_dicts = st.fixed_dictionaries({"tokens": tokens}, optional={
    "heads": st.one_of(head, st.lists(head, max_size=3)), "dynamics": dynamics, "log": log,
    "render": st.fixed_dictionaries({}, optional={"enabled": st.just(False)}), "extra": garbage})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scene_dicts)
def test_random_scene_dicts_run_or_fail_clearly(raw):
    try:
        scene = Scene.from_dict(raw)
    except SceneError as err:
        assert str(err) and err.problems
        event("rejected with a SceneError")
        return
    event("valid scene, ran")
    with tempfile.TemporaryDirectory() as tmp:
        scene = scene.replace(dynamics={"steps": min(scene.dynamics.steps, 3)})
        result = run_scene(scene, Path(tmp) / "run", **QUIET)
        assert result.status in ("completed", "blow-up")
        if result.status == "blow-up":
            assert "blow-up at step" in result.message


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=200))
def test_malformed_toml_text_is_a_scene_error(text):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.toml"
        path.write_text(text, encoding="utf-8")
        try:
            load_scene(path)
        except SceneError as err:
            assert "fuzz.toml" in str(err)


valid_scenes = st.fixed_dictionaries({
    "tokens": st.fixed_dictionaries({"n": st.integers(3, 7), "d": st.integers(2, 5),  # clusters: 3 by default
                                     "init": st.sampled_from(["random", "clusters"]), "seed": st.integers(0, 9),
                                     "replicas": st.integers(1, 2)}),
    "heads": st.fixed_dictionaries({"kind": st.sampled_from(["scalar", "random_symmetric", "random"]),
                                    "count": st.integers(1, 3), "strength": st.one_of(st.just(0.0), st.floats(1e-3, 3), st.floats(-3, -1e-3)),  # in float32's range
                                    "value": st.sampled_from(["aligned", "identity"])}),
    "dynamics": st.fixed_dictionaries({
        "rule": st.sampled_from(["exp", "softmax", "relu"]), "geometry": st.sampled_from(["sphere", "flat"]),
        "beta": st.floats(0.01, 50), "dt": st.floats(1e-4, 5.0), "steps": st.integers(1, 3),
        "integrator": st.sampled_from(["euler", "rk4"]), "dtype": st.sampled_from(["float32", "float64"])}),
    "log": st.fixed_dictionaries({"every": st.integers(1, 2), "clusters_every": st.integers(0, 2),
                                  "entropy_rate": st.booleans()}),
    "render": st.just({"enabled": False}),
})


def _runs_or_blows_up(raw):
    scene = Scene.from_dict(raw)
    with tempfile.TemporaryDirectory() as tmp:
        result = run_scene(scene, Path(tmp) / "run", **QUIET)
        assert result.status in ("completed", "blow-up"), result.message
        event(result.status)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_scenes)
def test_valid_parameter_combinations_run_or_report_a_blow_up(raw):
    _runs_or_blows_up(raw)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_scenes)
def test_a_few_valid_parameter_combinations_run_or_report_a_blow_up(raw):
    """The fast tier's sample of the one above (each combination compiles its kernels)."""
    _runs_or_blows_up(raw)
