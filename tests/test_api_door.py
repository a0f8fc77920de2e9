"""The Python API guards its door as the scene loader does (issue 27): every call either works
or raises ValueError / TypeError (the project's ParticlesUserError) naming the argument,
never an error from inside Taichi or NumPy. One test per row of the issue's table, a
property test over hostile values, and the size check on every path into a Simulation."""
import math
import traceback

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import random_tokens
from particles import Attention, Head, Layer, Schedule, Simulation
from particles.errors import ParticlesUserError
from particles.simulation import BlowUpError

X = random_tokens(6, 3, seed=1)
EYE = np.eye(3)


@pytest.fixture(scope="module")
def sim():
    return Simulation(X, [EYE], beta=1.0, dt=0.05)


def refused(match, fn, *args, **kwargs):
    with pytest.raises((ValueError, TypeError), match=match) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, ParticlesUserError), type(info.value)
    return str(info.value)


# ----------------------------------------------------------------------------- the table

def test_complex_tokens_are_refused():
    msg = refused("tokens", Simulation, X + 1j, [EYE])
    assert "complex" in msg


def test_a_step_that_overflows_float32_is_refused():
    msg = refused("dt", Simulation, X, [EYE], dt=1e300)
    assert "not finite in float32" in msg and "float64" in msg
    Simulation(X, [EYE], dt=1e300 ** 0.1, dtype="float64")   # 1e30 is a float64 step


def test_a_step_that_is_zero_in_float32_is_refused():
    assert "zero in float32" in refused("dt", Simulation, X, [EYE], dt=1e-50)


@pytest.mark.parametrize("make, name", [
    (lambda: Simulation(X, [EYE], beta=1e39), "beta"),
    (lambda: Simulation(X, [EYE], attention=Attention(beta=1e39)), r"attention\[0\]\.beta"),
    (lambda: Simulation(X, [EYE], attention=Attention(alibi=1e39)), r"attention\[0\]\.alibi"),
])
def test_betas_and_slopes_outside_float32_are_refused(make, name):
    assert "not finite in float32" in refused(name, make)


def test_set_state_refuses_nan(sim):
    bad = X.copy()
    bad[2, 1] = np.nan
    assert "index (2, 1)" in refused("tokens must be finite", sim.set_state, bad)


def test_set_state_refuses_a_negative_step(sim):
    refused(r"step must be an integer from 0 to .*got -4", sim.set_state, X, step=-4)


def test_advance_refuses_a_string(sim):
    refused(r"steps must be an integer, got '10' \(str\)", sim.advance, "10")
    refused("observe_every", sim.advance, 1, observe_every=2.0)


def test_schedule_refuses_float_start_steps():
    layer = Layer([EYE])
    refused(r"Schedule starts\[1\] must be an integer, got 5.0", Schedule, (layer, layer), (0, 5.0))
    refused("steps", Schedule.every, (layer, layer), 2.5)


@pytest.mark.parametrize("shape", [(0, 6, 3), (6, 0), (1, 6, 0), (0, 1, 9, 4), (6,), ()])
def test_empty_or_misshapen_tokens_are_refused(shape):
    refused(r"tokens must have shape \(n, d\) or \(R, n, d\)", Simulation, np.zeros(shape), [EYE])


def test_a_negative_batch_is_refused():
    refused("batch must be an integer >= 1, got -1", Simulation, X, [EYE], batch=-1)


def test_too_many_tokens_are_refused_before_allocating():
    # a view of 300 million tokens: no memory behind it, so only the check can say no
    huge = np.broadcast_to(np.ones(3), (300_000_000, 3))
    assert "GiB of memory" in refused("tokens of shape", Simulation, huge, [EYE])


def test_no_advance_after_a_blow_up_until_the_state_is_set():
    s = Simulation(X, [EYE], beta=1.0, dt=0.05, dtype="float64", path="tiled")
    s.set_state(X / np.linalg.norm(X, axis=1, keepdims=True))
    s._x.from_numpy(np.full((1, 6, 3), np.nan))      # a state gone non-finite in the kernels
    with pytest.raises(BlowUpError):
        s.check_finite()
    refused("BlowUpError.*set_state", s.advance, 1)
    refused("BlowUpError", s.run, 2)
    s.set_state(X, step=0)
    s.advance(2)
    assert s.step_count == 2 and np.all(np.isfinite(s.tokens))


# ----------------------------------------------------------------------------- hostile values

HOSTILE = [math.nan, math.inf, -math.inf, 1j, 1 + 2j, "x", "10", None, [], (), {}, object(),
           np.array(3.0), np.zeros(0), np.zeros((0, 3)), np.zeros((2, 0)), 1e39, 1e300, 1e-50,
           -1, -4, 0, 0.0, 2.5, True, 10**30, np.full((6, 3), np.nan), np.zeros((6, 3)),
           [[1, 2], [3]], np.array(["a", "b"]), np.ones((6, 3)) * 1j, np.ones((2, 2, 2, 2))]
hostile = st.sampled_from(HOSTILE)

# what a message may call each argument (heads are named by the matrix they hold)
NAMES = {"tokens": ("tokens",), "heads": ("head", "matrix", "factor", "dimension"),
         "beta": ("beta",), "dt": ("dt",), "rule": ("rule",), "geometry": ("geometry",),
         "dtype": ("dtype",), "integrator": ("integrator",), "path": ("path",),
         "batch": ("batch",), "attention": ("attention", "mask", "alibi", "beta", "window", "rule"),
         "steps": ("steps",), "observe_every": ("observe_every",), "every": ("every",),
         "step": ("step",), "arch": ("arch",)}
VALID = {"tokens": X, "heads": [EYE], "beta": 1.0, "dt": 0.05, "rule": "softmax",
         "geometry": "sphere", "dtype": "float32", "integrator": "rk4", "path": "auto",
         "batch": 64, "attention": None, "arch": "cpu"}
SETTINGS = settings(max_examples=50, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))


def assert_ours(err):
    """Raised by the project's own checks, never from inside Taichi or NumPy."""
    where = traceback.extract_tb(err.__traceback__)[-1].filename
    assert isinstance(err, ParticlesUserError) or (
        "site-packages" not in where and ("particles" in where or "scenes" in where)), \
        f"{type(err).__name__} from {where}: {err}"


def holds(fn, kwargs):
    """fn(**kwargs) works or raises the project's error naming one of the hostile arguments."""
    try:
        fn(**kwargs)
    except (ValueError, TypeError) as err:
        assert_ours(err)
        bad = [k for k, v in kwargs.items() if v is not VALID.get(k)]
        msg = str(err)
        assert any(word in msg for k in bad for word in NAMES.get(k, (k,))), (bad, msg)


@SETTINGS
@given(st.dictionaries(st.sampled_from(sorted(VALID)), hostile, min_size=1, max_size=3))
def test_simulation_refuses_hostile_arguments_by_name(bad):
    holds(Simulation, {**VALID, **bad})


@SETTINGS
@given(st.sampled_from(["from_matrices", "from_factors", "scalar", "init"]), hostile, hostile)
def test_head_refuses_hostile_arguments_by_name(how, a, b):
    def call():
        if how == "from_matrices":
            return Head.from_matrices(a, b)
        if how == "from_factors":
            return Head.from_factors(a, b)
        if how == "scalar":
            return Head.scalar(a, b)
        return Head(a, b, EYE, EYE)
    try:
        call()
    except (ValueError, TypeError) as err:
        assert_ours(err)
        assert any(w in str(err) for w in ("matrix", "factor", "query", "key", "value", "strength",
                                           "dim")), str(err)


@SETTINGS
@given(st.sampled_from(["mask", "window", "alibi", "beta", "rule"]), hostile)
def test_attention_refuses_hostile_arguments_by_name(key, value):
    kwargs = {key: value}
    if key == "window":
        kwargs["mask"] = "window"
    try:
        Attention(**kwargs)
    except (ValueError, TypeError) as err:
        assert_ours(err)
        assert key in str(err) or (key == "rule" and "rule" in str(err)), str(err)


@SETTINGS
@given(hostile, hostile)
def test_layer_and_schedule_refuse_hostile_arguments_by_name(heads, start):
    try:
        layer = Layer(heads)
    except (ValueError, TypeError) as err:
        assert isinstance(err, ParticlesUserError) and "heads" in str(err), str(err)
        layer = Layer([EYE])
    try:
        Schedule((Layer([EYE]), layer), (0, start))
    except (ValueError, TypeError) as err:
        assert isinstance(err, ParticlesUserError) and "start" in str(err), str(err)


@SETTINGS
@given(st.sampled_from(["advance", "run", "set_state"]), hostile, hostile)
def test_advance_run_and_set_state_refuse_hostile_arguments_by_name(sim, method, a, b):
    sim.set_state(X, step=0)
    if method == "advance":
        kwargs, fn = {"steps": a, "observe_every": b}, sim.advance
    elif method == "run":
        kwargs, fn = {"steps": a, "every": b}, sim.run
    else:
        kwargs, fn = {"tokens": a, "step": b}, sim.set_state
    if isinstance(a, int) and not isinstance(a, bool) and 0 <= a <= 10**12 and a > 100:
        return   # a valid, merely long run
    holds(fn, kwargs)
    assert np.all(np.isfinite(sim.tokens))


# ----------------------------------------------------------------------------- every path, one size check

def test_every_path_into_a_simulation_checks_the_size(monkeypatch):
    """build_simulation with tokens of its own (a sweep unit, a re-render) is checked too."""
    from particles.app import build
    from scenes import load_scene
    scene = load_scene("quickstart")
    monkeypatch.setattr(build, "available_bytes", lambda: 2**20)
    huge = np.broadcast_to(np.ones(scene.data["tokens"]["d"]), (10**6, scene.data["tokens"]["d"]))
    with pytest.raises(ValueError, match="GiB of memory"):
        build.build_simulation(scene, tokens=huge)


def test_build_simulation_takes_a_scene_or_its_sections_as_a_dict():
    """As its docstring says: a Scene, or a dict of sections (validated again); anything else
    is refused by name."""
    import particles
    from particles.errors import ParticlesTypeError
    from scenes import load_scene
    scene = load_scene("quickstart")
    from_scene, from_dict = particles.build_simulation(scene), particles.build_simulation(scene.data)
    assert np.array_equal(from_dict.tokens, from_scene.tokens) and from_dict.dt == from_scene.dt
    assert np.array_equal(from_dict.betas, from_scene.betas)
    with pytest.raises(ParticlesUserError, match="beta"):
        particles.build_simulation({**scene.data, "dynamics": {**scene.data["dynamics"], "beta": -1.0}})
    with pytest.raises(ParticlesTypeError, match="got str"):
        particles.build_simulation("quickstart")


def test_a_sweep_of_too_many_tokens_is_refused_before_a_unit_runs(tmp_path, capsys):
    from particles.app.cli import main
    path = tmp_path / "big.toml"
    path.write_text('name = "big"\n[tokens]\nn = 8\nd = 3\n[heads]\nkind = "scalar"\n'
                    '[dynamics]\nsteps = 2\n[axes]\n"tokens.n" = [100000000]\n'
                    '[record]\ntimes = [0.0]\nobservables = ["eps"]\n')
    code = main(["sweep", str(path), "--out", str(tmp_path / "out")])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and ("GiB of memory" in err or "token pairs" in err), err
    assert not (tmp_path / "out" / "results.csv").exists()
