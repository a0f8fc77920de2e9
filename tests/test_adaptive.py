"""Adaptive steps (particles.adaptive, issue 35): the embedded pairs as tableaux against a NumPy
reference of the same tableau and at their order; the controller's global error on the
equiangular ODE's closed form; each replica of an ensemble its own step, bitwise its run
alone; a non-finite stage rejected, never written; an interrupted run resumed bitwise."""
import json
import os
import signal

import numpy as np
import pytest

import particles
import reference as ref
from conftest import general_heads, random_tokens, rel_err
from particles import Adaptive, integrators
from particles.app.run import resume_run, run_scene
from particles.output import load_log, load_trajectory
from particles.simulation import Simulation
from scenes import load_scene

QUIET = dict(render=False, progress=False, echo=lambda *a: None)
PAIRS = [integrators.DOPRI5, integrators.BS32]


def _ref_rk_step(x, heads, tableau, dt, beta):
    """Float64 NumPy step of the tableau (dense Butcher matrix), renormalised."""
    S = tableau.stages
    A = np.zeros((S, S))
    for s, row in enumerate(tableau.a, start=1):
        A[s, :s] = row
    b = np.array(tableau.weights) / tableau.denominator
    k = []
    for s in range(S):
        k.append(ref.velocity(x + dt * sum(A[s, j] * k[j] for j in range(s)), heads, beta, "softmax"))
    y = x + dt * sum(b[s] * k[s] for s in range(S))
    return y / np.linalg.norm(y, axis=1, keepdims=True)


@pytest.mark.parametrize("path", ["fused", "tiled", "plain"])
@pytest.mark.parametrize("tableau", PAIRS, ids=lambda t: t.name)
def test_embedded_pairs_as_fixed_steps_match_their_numpy_tableau(path, tableau):
    """The tableau object steps at the fixed dt on every path, to rounding (1e-10 in float64)."""
    x, heads = random_tokens(11, 3, seed=2), general_heads(2, 3, seed=3)
    sim = Simulation(x, heads, beta=1.2, rule="softmax", dt=0.05, integrator=tableau, dtype="float64",
                     path=path)
    assert sim.path == path and sim.stepper is None
    sim.advance(3)
    want = x
    for _ in range(3):
        want = _ref_rk_step(want, heads, tableau, 0.05, 1.2)
    assert rel_err(sim.tokens, want) < 1e-10


@pytest.mark.parametrize("path", ["fused", "tiled"])
def test_embedded_pairs_run_at_their_order(path):
    """Halving dt divides the global error at t = 1.2 by at least ~2^p and less than 2^(p+1):
    DOPRI5 (measured 50 from 12 to 24 steps, 44 from 24 to 48: its h^6 term still shows),
    BS32 7.8."""
    x, heads = random_tokens(9, 3, seed=1), general_heads(2, 3, seed=1)
    t_end, beta = 1.2, 2.0
    exact = x
    for _ in range(4800):
        exact = ref.step_rk4(exact, heads, beta, "softmax", "sphere", t_end / 4800)
    for tableau, (lo, hi) in zip(PAIRS, [(28, 64), (6.5, 9.5)]):
        errors = []
        for steps in (12, 24):
            sim = Simulation(x, heads, beta=beta, rule="softmax", dt=t_end / steps, integrator=tableau,
                             dtype="float64", path=path)
            sim.advance(steps)
            errors.append(np.max(np.abs(sim.tokens - exact)))
        assert lo < errors[0] / errors[1] < hi, (tableau.name, errors)


def test_embedded_weights_satisfy_their_order_conditions():
    """b_hat is a method of order p - 1 (conditions to that order), b - b_hat sums to 0, and
    both pairs are first-same-as-last."""
    for tableau in PAIRS:
        S = tableau.stages
        A = np.zeros((S, S))
        for s, row in enumerate(tableau.a, start=1):
            A[s, :s] = row
        c = A.sum(axis=1)
        for w, order in ((tableau.weights, tableau.order), (tableau.b_hat, tableau.b_hat_order)):
            b = np.array(w) / tableau.denominator
            conditions = [b.sum() - 1, b @ c - 1 / 2]
            if order >= 3:
                conditions += [b @ c ** 2 - 1 / 3, b @ A @ c - 1 / 6]
            if order >= 4:
                conditions += [b @ c ** 3 - 1 / 4, b @ (c * (A @ c)) - 1 / 8, b @ A @ c ** 2 - 1 / 12,
                               b @ A @ A @ c - 1 / 24]
            if order >= 5:
                conditions += [b @ c ** 4 - 1 / 5, b @ A @ A @ A @ c - 1 / 120]
            assert np.max(np.abs(conditions)) < 1e-14, (tableau.name, order)
        assert tableau.fsal
    assert not integrators.RK4.fsal


@pytest.mark.parametrize("path", ["fused", "tiled"])
@pytest.mark.parametrize("tableau", PAIRS, ids=lambda t: t.name)
def test_one_accepted_adaptive_step_is_its_numpy_tableau_step(tableau, path):
    """An attempt's stage combinations (tiled: kernels of 3, 5 or 7 slope arguments by stage;
    fused: the whole attempt in one launch) and new state: one accepted step of h = dt_max
    from the NumPy tableau to 1e-12, on two replicas."""
    x = np.stack([random_tokens(10, 3, seed=5), random_tokens(10, 3, seed=6)])
    heads = general_heads(2, 3, seed=5)
    sim = Simulation(x, heads, beta=1.5, rule="softmax", dt=0.04, dtype="float64", path=path,
                     integrator=Adaptive(tableau.name, rtol=1e-3, atol=1e-3, dt_max=0.04))
    assert (sim.stepper.attempt is not None) == (path == "fused")
    sim.advance(1)
    if path == "fused":   # past its first call the launch skips Taichi's per-call lookup
        assert sim.stepper.attempt._direct is not sim.stepper.attempt.kernel
    assert sim.stepper.stats()["accepted"] == [1, 1] and sim.stepper.stats()["rejected"] == [0, 0]
    assert sim.stepper.stats()["evaluations"] == tableau.stages   # the first, then S - 1 (FSAL)
    for r in range(2):
        assert rel_err(sim.tokens[r], _ref_rk_step(x[r], heads, tableau, 0.04, 1.5)) < 1e-12


def test_adaptive_steps_on_the_fused_path_match_the_tiled_path():
    """auto takes the fused path at small n (one launch per evaluation); both paths take the
    same steps and agree to rounding."""
    x, heads = random_tokens(16, 3, seed=4), general_heads(2, 3, seed=4)
    out = {}
    for path in ("auto", "tiled"):
        sim = Simulation(x, heads, beta=4.0, rule="softmax", dt=0.5, dtype="float64", path=path,
                         integrator=Adaptive("dopri5", rtol=1e-8, atol=1e-8))
        sim.advance(8)
        out[sim.path] = (sim.tokens, sim.stepper.stats()["accepted"])
    assert set(out) == {"fused", "tiled"} and out["fused"][1] == out["tiled"][1]
    assert np.max(np.abs(out["fused"][0] - out["tiled"][0])) < 1e-12


def test_fused_attempts_shared_by_threads_are_bitwise_one_threads(monkeypatch):
    """The fused path's whole attempt (stages, error norms, accept) in a launch that two threads
    share takes the same steps to the bit as one thread alone."""
    from particles import kernels_fused
    x = np.stack([random_tokens(40, 3, seed=7), random_tokens(40, 3, seed=8)])
    heads = general_heads(2, 3, seed=5)
    out = []
    for workers in (1, 2):
        monkeypatch.setattr(kernels_fused, "PARALLEL_MIN_WORK", float("inf") if workers == 1 else 0.0)
        monkeypatch.setattr(kernels_fused, "available_threads", lambda: workers)
        sim = Simulation(x, heads, beta=[1.5, 4.0], rule="softmax", dt=0.5, dtype="float64", path="fused",
                         integrator=Adaptive("dopri5", rtol=1e-8, atol=1e-8))
        assert sim.stepper.attempt.workers == workers
        sim.advance(2)
        out.append((sim.native_tokens(), sim.stepper.stats()))
    assert out[0][1]["accepted"][0] != out[0][1]["accepted"][1]   # each replica its own steps
    assert np.array_equal(out[0][0], out[1][0]) and out[0][1] == out[1][1]


def test_bad_adaptive_settings_are_refused():
    x, heads = random_tokens(8, 3), general_heads(1, 3)
    assert Simulation(x, heads, integrator="dopri5").adaptive == Adaptive("dopri5")
    with pytest.raises(ValueError, match="rtol = 1e-09 is below what float32 resolves"):
        Simulation(x, heads, integrator=Adaptive("bs32", rtol=1e-9))
    with pytest.raises(ValueError, match="has no embedded weights"):
        Adaptive(integrators.RK4)
    with pytest.raises(ValueError, match="dt_max"):
        Adaptive(dt_min=0.1, dt_max=0.1)


def test_adaptive_error_on_the_equiangular_ode_over_a_long_time():
    """gamma(t) of an equiangular start against the scalar ODE (Theorem 22) to t = 30, sampled on
    a grid of 0.5: the largest error is within 5x the tolerance, with far fewer steps than a
    fixed RK4 step of the same accuracy would take (the step grows as gamma -> 1)."""
    n, d, beta, gamma0 = 5, 6, 2.0, -0.2
    x = ref.equiangular_tokens(n, d, gamma0, seed=2)
    tol = 1e-8
    sim = Simulation(x, [np.eye(d)], beta=beta, rule="softmax", dt=0.5,
                     integrator=Adaptive("dopri5", rtol=tol, atol=tol), dtype="float64")
    times, gammas = ref.solve_equiangular_gamma(gamma0, [1.0], beta, n, "softmax", t_end=30.0, dt=1e-3,
                                                return_trajectory=True)
    worst = 0.0
    for k in range(1, 61):
        sim.advance(1)
        y = sim.tokens
        g = (y @ y.T)[~np.eye(n, dtype=bool)]
        assert np.ptp(g) < 10 * tol    # stays equiangular
        worst = max(worst, abs(g.mean() - gammas[k * 500]))
    stats = sim.stepper.stats()
    assert worst < 5 * tol, worst
    assert 1e-2 * tol < worst      # the error is the controller's, not rounding
    assert stats["accepted"][0] < 400 and stats["dt_next"][0] > 0.3, stats


@pytest.mark.parametrize("path", ["fused", "tiled"])
def test_each_replica_takes_its_own_steps_and_matches_its_run_alone(path):
    """Three betas in one ensemble: their step counts differ (the cold one takes fewest) and each
    replica's final tokens and counts are bitwise those of the same run alone."""
    x, heads = random_tokens(10, 3, seed=5), general_heads(2, 3, seed=5)
    betas = [0.5, 3.0, 9.0]
    method = Adaptive("dopri5", rtol=1e-7, atol=1e-7)
    ens = Simulation(np.stack([x] * 3), heads, beta=betas, rule="softmax", dt=0.25, integrator=method,
                     dtype="float64", path=path)
    result = ens.run(24, every=4)
    counts = ens.stepper.stats()
    assert len(set(counts["accepted"])) == 3 and counts["accepted"][0] < counts["accepted"][2], counts
    for r, beta in enumerate(betas):
        alone = Simulation(x, heads, beta=beta, rule="softmax", dt=0.25, integrator=method, dtype="float64",
                           path=path)
        mine = alone.run(24, every=4)
        assert np.array_equal(alone.tokens, ens.tokens[r])
        assert alone.stepper.stats()["accepted"] == [counts["accepted"][r]]
        assert alone.stepper.stats()["rejected"] == [counts["rejected"][r]]
        assert np.array_equal(mine["kinetic"], result["kinetic"][result["replica"] == r])


def _sqrt_rule():
    import taichi as ti

    def brittle(z):
        """Finite on the sphere (z <= 1) and NaN off it beyond z = 1.2."""
        return ti.sqrt(1.2 - z)

    particles.register_rule("adaptive_brittle", kernel=brittle, normalization="softmax")


def test_a_non_finite_stage_rejects_the_step_and_is_never_written():
    """A rule that is NaN off the sphere: the first step (as long as the grid step, 2.0) puts a
    stage point off it, the step is rejected and retried shorter, and the run ends finite,
    matching the same flow at a small fixed step."""
    _sqrt_rule()
    x, heads = random_tokens(8, 3, seed=3), [np.eye(3)]
    sim = Simulation(x, heads, beta=1.0, rule="adaptive_brittle", dt=2.0,
                     integrator=Adaptive("dopri5", rtol=1e-8, atol=1e-8), dtype="float64")
    sim.advance(1)
    stats = sim.stepper.stats()
    assert stats["rejected"][0] >= 1, stats
    assert np.all(np.isfinite(sim.tokens))
    fixed = Simulation(x, heads, beta=1.0, rule="adaptive_brittle", dt=2.0 / 2000, integrator="rk4",
                       dtype="float64")
    fixed.advance(2000)
    assert np.max(np.abs(sim.tokens - fixed.tokens)) < 1e-6


def test_a_step_below_dt_min_stops_the_run_naming_it():
    _sqrt_rule()
    x = random_tokens(8, 3, seed=3)
    sim = Simulation(x, [np.eye(3)], beta=1.0, rule="adaptive_brittle", dt=2.0,
                     integrator=Adaptive("dopri5", rtol=1e-8, atol=1e-8, dt_min=0.5), dtype="float64")
    with pytest.raises(particles.BlowUpError, match="adaptive step underflow .* below dt_min = 0.5"):
        sim.advance(1)


def _scene(steps=30):
    return load_scene("quickstart", overrides=[
        "tokens.n=12", "log.every=2", "log.clusters_every=2", "log.trajectory_every=3",
        f"dynamics.steps={steps}", "dynamics.dt=0.2", "dynamics.dtype=float64", "dynamics.beta=6",
        "dynamics.integrator=dopri5", "dynamics.rtol=1e-7", "dynamics.atol=1e-7"])


def test_an_interrupted_adaptive_run_resumes_bitwise(tmp_path, monkeypatch):
    """SIGINT after the 5th advance: the run stops at a served state with a checkpoint holding
    the controller's state; resume finishes it, and the log, trajectory and final tokens are
    bitwise the uninterrupted run's, its step counts too."""
    want = run_scene(_scene(), tmp_path / "whole", checkpoint_every=10, **QUIET)
    assert want.status == "completed"
    calls = {"n": 0}
    original = Simulation.advance

    def advance(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 5:
            os.kill(os.getpid(), signal.SIGINT)
        return out

    monkeypatch.setattr(Simulation, "advance", advance)
    got = run_scene(_scene(), tmp_path / "cut", checkpoint_every=10, **QUIET)
    assert got.status == "interrupted" and 0 < got.steps_done < 30
    monkeypatch.setattr(Simulation, "advance", original)
    done = resume_run(tmp_path / "cut", **QUIET)
    assert done.status == "completed"
    assert (tmp_path / "cut" / "log.csv").read_bytes() == (tmp_path / "whole" / "log.csv").read_bytes()
    s1, _, x1, _ = load_trajectory(tmp_path / "cut")
    s2, _, x2, _ = load_trajectory(tmp_path / "whole")
    assert np.array_equal(s1, s2) and np.array_equal(x1, x2)
    info = [json.loads((tmp_path / name / "run.json").read_text())["adaptive"] for name in ("cut", "whole")]
    assert info[0]["accepted"] == info[1]["accepted"] and info[0]["rejected"] == info[1]["rejected"]
    assert info[1]["accepted"][0] > 0 and info[1]["rtol"] == 1e-7
    assert len(load_log(tmp_path / "whole")["kinetic"]) == 16
