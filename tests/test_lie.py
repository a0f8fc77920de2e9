"""The exact step on the sphere (particles.lie, issue 35): Lie-Euler against its NumPy formula,
both Lie-group methods at their order, |x| kept at rounding level without renormalising, and
the scene key with its refusals."""
import numpy as np
import pytest

import reference as ref
from conftest import general_heads, random_tokens
from particles import integrators
from particles.simulation import Simulation
from scenes import SceneError, load_scene


def _rotate(z, y, u, c):
    """exp(c A(y, u)) z in NumPy: the rotation in the plane of (y, u / |u|) by c |u|."""
    norm = np.linalg.norm(u, axis=1, keepdims=True)
    e = u / norm
    zy, ze = np.sum(z * y, axis=1, keepdims=True), np.sum(z * e, axis=1, keepdims=True)
    t = c * norm
    return z + (np.cos(t) - 1) * (zy * y + ze * e) + np.sin(t) * (zy * e - ze * y)


@pytest.mark.parametrize("path", ["fused", "tiled"])
@pytest.mark.parametrize("integrator", ["euler", "heun"])
def test_exp_steps_match_their_numpy_formula(integrator, path):
    x, heads = random_tokens(11, 3, seed=2), general_heads(2, 3, seed=3)
    beta, dt = 1.5, 0.1
    sim = Simulation(x, heads, beta=beta, rule="softmax", dt=dt, integrator=integrator, dtype="float64",
                     retraction="exp", path=path)
    assert sim.path == path
    sim.advance(3)
    want = x
    for _ in range(3):
        v0 = ref.velocity(want, heads, beta, "softmax")
        if integrator == "euler":
            want = np.cos(np.linalg.norm(v0, axis=1, keepdims=True) * dt) * want \
                + np.sin(np.linalg.norm(v0, axis=1, keepdims=True) * dt) * v0 / np.linalg.norm(v0, axis=1, keepdims=True)
        else:
            y = _rotate(want, want, v0, dt)
            v1 = ref.velocity(y, heads, beta, "softmax")
            want = _rotate(_rotate(want, want, v0, dt / 2), y, v1, dt / 2)
    assert np.max(np.abs(sim.tokens - want)) < 1e-13


def test_lie_euler_and_commutator_free_heun_run_at_their_order():
    """Halving dt halves Lie-Euler's global error at t = 1.2 (measured 1.99) and quarters the
    commutator-free Heun's (4.01)."""
    x, heads = random_tokens(9, 3, seed=1), general_heads(2, 3, seed=1)
    t_end, beta = 1.2, 2.0
    exact = x
    for _ in range(2400):
        exact = ref.step_rk4(exact, heads, beta, "softmax", "sphere", t_end / 2400)
    for integrator, (lo, hi) in (("euler", (1.8, 2.2)), ("heun", (3.6, 4.4))):
        errors = []
        for steps in (24, 48):
            sim = Simulation(x, heads, beta=beta, rule="softmax", dt=t_end / steps, integrator=integrator,
                             dtype="float64", retraction="exp")
            sim.advance(steps)
            errors.append(np.max(np.abs(sim.tokens - exact)))
        assert lo < errors[0] / errors[1] < hi, (integrator, errors)


def test_the_exp_step_keeps_the_sphere_to_rounding_without_renormalising():
    """2,000 steps of 64 tokens: |x| - 1 stays within 100 eps (measured 5.8e-15, 26 eps) with
    no renormalisation, as renormalising every step keeps it (2.2e-16); the drift of the
    Heun step itself, which renormalising hides, is 1.6e-4 after one step from the start."""
    x, heads = random_tokens(64, 3, seed=2), general_heads(2, 3, seed=2)
    drift = {}
    for retraction in ("exp", "normalise"):
        sim = Simulation(x, heads, beta=4.0, rule="softmax", dt=0.05, integrator="heun", dtype="float64",
                         retraction=retraction, path="tiled")
        worst = 0.0
        for _ in range(4):
            sim.advance(500)
            worst = max(worst, np.max(np.abs(np.linalg.norm(sim.native_tokens(), axis=-1) - 1)))
        drift[retraction] = worst
    eps = np.finfo(np.float64).eps
    assert drift["exp"] < 100 * eps and drift["normalise"] < 4 * eps, drift
    # what a Heun step from the start leaves before any retraction: off the sphere at O(dt^3)
    y = x / np.linalg.norm(x, axis=1, keepdims=True)
    v = ref.velocity(y, heads, 4.0, "softmax")
    heun = y + 0.025 * (v + ref.velocity(y + 0.05 * v, heads, 4.0, "softmax"))
    assert np.max(np.abs(np.linalg.norm(heun, axis=1) - 1)) > 1e3 * drift["exp"]


def test_exp_is_refused_where_it_does_not_apply():
    x, heads = random_tokens(6, 3), general_heads(1, 3)
    with pytest.raises(ValueError, match="retraction 'exp' steps with integrator 'euler'"):
        Simulation(x, heads, integrator="rk4", retraction="exp")
    with pytest.raises(ValueError, match="flat space"):
        Simulation(x, heads, integrator="euler", geometry="flat", retraction="exp")
    with pytest.raises(ValueError, match="adaptive steps renormalise"):
        Simulation(x, heads, integrator="dopri5", retraction="exp")
    with pytest.raises(SceneError, match=r"\[dynamics\] retraction: 'exp' steps with integrator = 'euler'"):
        load_scene("quickstart", overrides=["dynamics.retraction=exp"])
    scene = load_scene("quickstart", overrides=["dynamics.retraction=exp", "dynamics.integrator=heun"])
    assert scene.data["dynamics"]["retraction"] == "exp"
    assert integrators.HEUN.order == 2
