"""Sinkhorn attention (particles.sinkhorn; docs/MODEL.md "Sinkhorn attention") against an
independent float64 NumPy Sinkhorn: multiplicative row/column scalings of the n x n matrix
e^z (here an n x n matrix is fine: it is the reference)."""
import numpy as np
import pytest

import particles
from particles import Attention, Simulation, paths
from particles.errors import ParticlesUserError

SERVING = [s.name for s in paths.SPECS if "sinkhorn" in s.rules]


def reference_weights(z, iterations, tolerance=0.0):
    """P = diag(a) e^z diag(b): a from the rows first (the softmax), then per iteration b from
    the columns and a from the rows; stop early once every column sums to 1 within tolerance."""
    K = np.exp(z - z.max())            # a constant shift: absorbed by the scalings
    b = np.ones(len(z))
    a = 1 / (K @ b)
    taken = 0
    for _ in range(iterations):
        columns = K.T @ a * b
        if tolerance > 0 and np.max(np.abs(columns - 1)) <= tolerance:
            break
        b = 1 / (K.T @ a)
        a = 1 / (K @ b)
        taken += 1
    return a[:, None] * K * b[None, :], taken


def reference_velocity(x, heads, beta, iterations, tolerance=0.0):
    v = np.zeros_like(x)
    for M, V in heads:
        P, _ = reference_weights(beta * (x @ M @ x.T), iterations, tolerance)
        v += P @ (x @ V.T)
    return v - np.sum(v * x, axis=1, keepdims=True) * x


def _system(seed=2, n=12, d=4):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    heads = [(rng.normal(size=(d, d)), rng.normal(size=(d, d)) / 2) for _ in range(2)]
    return x, heads


@pytest.mark.parametrize("path", SERVING)
@pytest.mark.parametrize("iterations", [0, 3, 40])
def test_velocity_and_rk4_steps_match_the_float64_reference(iterations, path):
    x, heads = _system()
    beta, dt, steps = 1.2, 0.02, 3
    rule = particles.sinkhorn_rule(iterations=iterations)
    sim = Simulation(x, heads, beta=beta, rule=rule, dtype="float64", path=path, dt=dt)
    assert (sim.path, sim.implementation) == (path, "sinkhorn")
    np.testing.assert_allclose(sim.velocity(), reference_velocity(x, heads, beta, iterations),
                               rtol=0, atol=1e-12)
    sim.advance(steps)
    f = lambda p: reference_velocity(p, heads, beta, iterations)  # noqa: E731
    y = x
    for _ in range(steps):
        k1 = f(y); k2 = f(y + dt / 2 * k1); k3 = f(y + dt / 2 * k2); k4 = f(y + dt * k3)
        y = y + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        y /= np.linalg.norm(y, axis=1, keepdims=True)
    np.testing.assert_allclose(sim.tokens, y, rtol=0, atol=1e-12)


def test_no_iteration_is_the_softmax_and_many_give_doubly_stochastic_weights():
    x, heads = _system(seed=4)
    soft = Simulation(x, heads, beta=2.0, rule="softmax", dtype="float64", path="plain").velocity()
    zero = Simulation(x, heads, beta=2.0, rule=particles.sinkhorn_rule(0), dtype="float64").velocity()
    np.testing.assert_allclose(zero, soft, rtol=0, atol=1e-13)
    P, _ = reference_weights(2.0 * (x @ heads[0][0] @ x.T), 500)
    np.testing.assert_allclose(P.sum(axis=1), 1, atol=1e-14)
    np.testing.assert_allclose(P.sum(axis=0), 1, atol=1e-10)   # the reference converges


@pytest.mark.parametrize("dtype, atol", [("float64", 1e-12), ("float32", 2e-5)])
def test_a_tolerance_stops_at_the_references_iteration_with_columns_within_it(dtype, atol):
    x, heads = _system(seed=6, n=16)
    beta, tolerance = 1.5, 1e-4
    rule = particles.sinkhorn_rule(iterations=200, tolerance=tolerance)
    sim = Simulation(x, heads[:1], beta=beta, rule=rule, dtype=dtype, path="plain")
    got = sim.velocity()
    P, taken = reference_weights(beta * (x @ heads[0][0] @ x.T), 200, tolerance)
    (_, sinkhorn_pass, _), = sim._layers[0].passes
    assert 2 <= taken < 200 and sinkhorn_pass.iterations == taken
    np.testing.assert_allclose(got, reference_velocity(x, heads[:1], beta, 200, tolerance),
                               rtol=0, atol=atol)
    assert np.max(np.abs(P.sum(axis=0) - 1)) <= tolerance


def test_sinkhorn_heads_beside_softmax_heads_and_under_a_placement():
    x, heads = _system(seed=8, n=10)
    sim = Simulation(x, heads, beta=1.0, rule="softmax", dtype="float64",
                     attention=[Attention(), Attention(rule="sinkhorn")])
    assert sim.implementation == "plain+sinkhorn"   # mixed rules: a pass per rule
    rng_heads = [heads[0]]
    want = reference_velocity(x, rng_heads, 1.0, 0) + reference_velocity(x, heads[1:], 1.0, 20)
    np.testing.assert_allclose(sim.velocity(), want, rtol=0, atol=1e-12)
    pre = Simulation(2 * x, heads[:1], beta=1.0, rule="sinkhorn", dtype="float64", normalisation="pre")
    P, _ = reference_weights(x @ heads[0][0] @ x.T, 20)
    np.testing.assert_allclose(pre.velocity(), P @ (x @ heads[0][1].T), rtol=0, atol=1e-12)


def test_what_sinkhorn_does_not_serve_is_refused_clearly():
    x, heads = _system(n=6, d=3)
    with pytest.raises(ValueError, match=r"path 'fused' cannot serve .*Sinkhorn"):
        Simulation(x, heads, rule="sinkhorn", path="fused")
    with pytest.raises(ValueError, match=r"no pair pass of path 'tiled' serves rules of the form "
                                         r"Sinkhorn \(doubly stochastic\) with masks"):
        Simulation(x, heads, rule="sinkhorn", attention=Attention(mask="causal"))
    for bad in (dict(iterations=-1), dict(iterations=2.5), dict(tolerance=1.0)):
        with pytest.raises(ParticlesUserError, match="sinkhorn"):
            particles.sinkhorn_rule(**bad)


def test_the_energy_is_nan_and_the_entropy_is_that_of_the_weights():
    x, heads = _system(seed=9, n=8, d=3)
    res = Simulation(x, heads[:1], beta=1.0, rule="sinkhorn", dtype="float64").run(0, every=1)
    P, _ = reference_weights(x @ heads[0][0] @ x.T, 20)
    assert np.isnan(res["energy"][0])
    entropy = -np.sum(P * np.log(P), axis=1)
    assert res["entropy_mean_h0"][0] == pytest.approx(entropy.mean(), rel=1e-12)
    assert res["entropy_max_h0"][0] == pytest.approx(entropy.max(), rel=1e-12)


def test_ranks_above_the_unrolled_limit_run_their_loops_at_run_time():
    """d = 72 > kernel_math.UNROLL_MAX_D: the score and pull loops are runtime loops."""
    rng = np.random.default_rng(12)
    x = rng.normal(size=(6, 72))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    heads = [(rng.normal(size=(72, 72)) / 8, rng.normal(size=(72, 72)) / 8)]
    sim = Simulation(x, heads, beta=1.0, rule="sinkhorn", dtype="float64", path="plain")
    np.testing.assert_allclose(sim.velocity(), reference_velocity(x, heads, 1.0, 20), rtol=0, atol=1e-12)
