"""The notebook API: sim.run -> arrays per column with the final state observed, set_beta /
set_state, rules registered again, named trajectories, run_scene from `particles`."""
import numpy as np
import pytest

import particles
from conftest import random_tokens


def make(beta=1.5, R=None, dtype="float64", path="auto"):
    x = random_tokens(10, 4, seed=7) if R is None else np.stack([random_tokens(10, 4, seed=7 + r) for r in range(R)])
    return particles.Simulation(x, [np.eye(4), 0.3 * np.eye(4)], beta=beta, rule="softmax", dt=0.05,
                                dtype=dtype, path=path)


def test_run_returns_arrays_and_observes_the_final_state():
    res = make().run(23, every=5)
    assert list(res["step"]) == [0, 5, 10, 15, 20, 23]          # the final state too
    assert res.step.dtype == np.int64 and res["eps"].shape == (6,)
    assert np.allclose(res.time, res.step * 0.05)
    plain = make()
    plain.advance(23, observe_every=5)
    plain.observe()
    rows = plain.take_rows()
    assert [r["eps"] for r in rows] == list(res["eps"])         # bitwise the engine's rows
    assert np.array_equal(res.final_tokens, plain.tokens)
    with pytest.raises(KeyError, match="no column"):
        res["nonsense"]


def test_run_of_an_ensemble_has_a_replica_column():
    res = make(beta=[1.0, 2.0], R=2).run(4, every=2)
    assert list(res.replica) == [0, 1, 0, 1, 0, 1] and list(res.step) == [0, 0, 2, 2, 4, 4]
    assert res.final_tokens.shape == (2, 10, 4)


def test_to_pandas():
    pd = pytest.importorskip("pandas")
    frame = make().run(3).to_pandas()
    assert isinstance(frame, pd.DataFrame) and list(frame["step"]) == [0, 1, 2, 3]


def test_set_beta_and_set_state_equal_a_fresh_simulation():
    sim = make(beta=1.5)
    sim.run(5)
    fresh = particles.Simulation(random_tokens(10, 4, seed=99), [np.eye(4), 0.3 * np.eye(4)], beta=3.0,
                                 rule="softmax", dt=0.05, dtype="float64")
    sim.set_state(fresh.native_tokens(), step=0)             # the fresh one's (normalised) start
    sim.set_beta(3.0)
    assert np.array_equal(sim.velocity(), fresh.velocity())
    assert sim.run(4)["energy"].tolist() == fresh.run(4)["energy"].tolist()
    with pytest.raises(ValueError, match="positive"):
        sim.set_beta(-1.0)


def test_integrators_see_operations_not_the_simulation():
    sim = make(path="tiled")  # the fused path runs whole steps in one launch, without the integrator
    for name in ("evaluate", "after_first_stage", "axpy", "accumulate", "retract", "x", "xdot"):
        assert not hasattr(sim, name), name
    seen = []

    base = sim.integrator

    class Spy(type(base)):
        def step(self, ops, dt, observe):
            seen.append(type(ops).__name__)
            super().step(ops, dt, observe)
    sim.integrator = Spy(base.name, base.reach, base.weights, base.denominator, base.order)
    sim.advance(1)
    assert seen == ["_Operations"]


def test_registering_the_same_rule_again_is_fine():
    import taichi as ti

    def bump(z):
        return ti.exp(-z * z)

    first = particles.register_rule("test_api_bump", kernel=bump, normalization="mean")

    def bump(z):  # noqa: F811 - the notebook cell, run again
        return ti.exp(-z * z)
    assert particles.register_rule("test_api_bump", kernel=bump, normalization="mean") is first

    def other(z):
        return ti.exp(-2 * z * z)
    with pytest.raises(ValueError, match="another definition"):
        particles.register_rule("test_api_bump", kernel=other, normalization="mean")


def test_load_trajectory_is_named_and_run_scene_is_exported(tmp_path):
    from scenes import load_scene
    assert particles.run_scene.__module__ == "particles.app.run"
    scene = load_scene("quickstart", overrides=["dynamics.steps=10", "tokens.n=8"])
    particles.run_scene(scene, tmp_path / "r", render=False, progress=False, echo=lambda *_: None)
    traj = particles.load_trajectory(tmp_path / "r")
    assert isinstance(traj, particles.Trajectory)
    assert list(traj.steps) == [0, 5, 10] and traj.tokens.shape == (3, 8, 3) and traj.meta["n"] == 8
    steps, times, tokens, meta = traj                       # still unpacks
    assert np.array_equal(times, traj.times)
