"""The engine against the independent float64 NumPy reference (tests/reference.py)."""
import numpy as np
import pytest

import particles
import reference as ref
from conftest import engine_matrix, RTOL, general_heads, random_tokens, rel_err, symmetric_heads
from particles.observables import columns
from row_checks import assert_row_matches

RULES = ("exp", "softmax", "relu")


@pytest.mark.parametrize("rule, H, geometry, dtype, path", engine_matrix())
def test_velocity_observables_and_one_step_match_reference(rule, H, geometry, dtype, path):
    """The velocity, every logged quantity and per-token value of the state, then one step,
    from one build per case (each case compiles its own kernels, the suite's main cost)."""
    n, d, beta, dt = 14, 5, 1.2, 0.05
    x = random_tokens(n, d, seed=H + 1)
    if geometry == "flat":
        x = x * np.linspace(0.5, 1.5, n)[:, None]  # flat tokens need not be unit
    heads = general_heads(H, d, seed=3)
    entropy_rate = rule != "relu" and path == "tiled"  # the fused path has no entropy-rate pass
    # one integrator per case (each is its own fused kernel to compile): Euler with one head,
    # RK4 with three, so each path meets both; every integrator on every path is also in
    # tests/test_path_capabilities.py
    integrator, stepper = ("euler", ref.step_euler) if H == 1 else ("rk4", ref.step_rk4)
    sim = particles.Simulation(x, heads, beta=beta, rule=rule, geometry=geometry, dt=dt,
                               integrator=integrator, dtype=dtype, entropy_rate=entropy_rate,
                               path=path)
    assert sim.path == path
    assert rel_err(sim.velocity(), ref.velocity(x, heads, beta, rule, geometry)) < RTOL[dtype]

    sim.observe()
    (row,) = sim.take_rows()
    want = ref.observables(x, heads, beta, rule, geometry, entropy_rate=entropy_rate)
    if geometry == "flat":  # gamma_bar is the mean pairwise cosine: the reference formula on unit tokens
        unit = x / np.linalg.norm(x, axis=1, keepdims=True)
        want.update({k: ref.observables(unit, heads, beta, rule, geometry)[k] for k in ("gamma_bar", "eps")})
    assert set(columns(H, entropy_rate=entropy_rate)) - {"step", "time"} == set(want)
    rtol = 1e-9 if dtype == "float64" else 2e-5
    assert_row_matches(row, want, H, rtol, entropy_rate)
    per, per_want = sim.per_token(), ref.per_token(x, heads, beta, rule, geometry)
    for key in per_want:
        np.testing.assert_allclose(per[key], per_want[key], rtol=rtol * 10, atol=rtol * 10)

    sim.advance(1)
    assert rel_err(sim.tokens, stepper(x, heads, beta, rule, geometry, dt)) < RTOL[dtype]


def test_low_rank_factored_heads_match_full_matrices():
    n, d, r = 11, 6, 2
    rng = np.random.default_rng(3)
    x = random_tokens(n, d, 3)
    factors = [(rng.standard_normal((r, d)), rng.standard_normal((r, d)),
                rng.standard_normal((d, r)), rng.standard_normal((r, d))) for _ in range(2)]
    heads = [particles.Head.from_factors(q, k, o, w) for q, k, o, w in factors]
    full = [(q.T @ k, o @ w) for q, k, o, w in factors]
    sim = particles.Simulation(x, heads, beta=0.8, rule="softmax", dtype="float64")
    assert sim.score_rank == r and sim.value_rank == r
    assert rel_err(sim.velocity(), ref.velocity(x, full, 0.8, "softmax", "sphere")) < 1e-10


def test_float32_stays_on_sphere_for_ten_thousand_steps():
    x = random_tokens(16, 3, 1)
    sim = particles.Simulation(x, general_heads(2, 3, 1), beta=2.0, rule="softmax", dt=0.01,
                               integrator="euler", dtype="float32")
    sim.advance(10_000)
    norms = np.linalg.norm(sim.native_tokens().astype(np.float64), axis=-1)
    assert np.max(np.abs(norms - 1.0)) < 1e-6


@pytest.mark.parametrize("geometry", ["sphere", "flat"])
def test_energy_increases_at_rate_of_kinetic_theorem11(geometry):
    """Rule exp, symmetric M_h, V_h = M_h: dE/dt = (1/n) sum ||xdot||^2 >= 0, to O(dt)."""
    x = random_tokens(12, 4, 5)
    heads = symmetric_heads(2, 4, 5)
    t_end = 0.4 if geometry == "sphere" else 0.2  # flat space with rule exp blows up near t = 0.4
    errors = []
    for dt in (0.02, 0.01):
        sim = particles.Simulation(x, heads, beta=1.0, rule="exp", geometry=geometry, dt=dt,
                                   integrator="rk4", dtype="float64")
        sim.advance(round(t_end / dt), observe_every=1)
        sim.observe()
        rows = sim.take_rows()
        energy = np.array([r["energy"] for r in rows])
        kinetic = np.array([r["kinetic"] for r in rows])
        assert np.all(np.diff(energy) > 0)
        rate = np.diff(energy) / dt
        midpoint_kinetic = 0.5 * (kinetic[1:] + kinetic[:-1])
        errors.append(np.max(np.abs(rate - kinetic[:-1]) / kinetic[:-1]))
        # the trapezoid of the identity is second order: a much tighter check
        assert np.max(np.abs(rate - midpoint_kinetic) / kinetic[:-1]) < 100 * dt ** 2
    assert errors[1] < 0.1 and 1.6 < errors[0] / errors[1] < 2.4  # first order in dt


@pytest.mark.parametrize("rule", ["softmax", "exp"])
def test_equiangular_gamma_follows_the_scalar_ode(rule):
    n, d, beta, gamma0, dt, steps = 5, 6, 1.5, 0.1, 0.0025, 400
    lambdas = [0.4, 1.0, 1.7]
    x = ref.equiangular_tokens(n, d, gamma0, seed=2)
    heads = [particles.Head.scalar(lam, d) for lam in lambdas]
    sim = particles.Simulation(x, heads, beta=beta, rule=rule, dt=dt, integrator="rk4", dtype="float64")
    times, gammas = ref.solve_equiangular_gamma(gamma0, lambdas, beta, n, rule, t_end=steps * dt,
                                                dt=1e-3, return_trajectory=True)
    for k in range(1, 11):
        sim.advance(steps // 10)
        g = sim.tokens @ sim.tokens.T
        off = g[~np.eye(n, dtype=bool)]
        want = gammas[round(k * (steps // 10) * dt / 1e-3)]
        assert np.max(np.abs(off - want)) < 1e-6


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_replica_in_ensemble_equals_run_alone(dtype):
    n, d, R = 10, 4, 3
    xs = np.stack([random_tokens(n, d, s) for s in range(R)])
    betas = np.array([0.5, 1.0, 2.0])
    heads = general_heads(2, d, 9)
    ens = particles.Simulation(xs, heads, beta=betas, rule="softmax", dtype=dtype)
    ens.advance(25, observe_every=5)
    ens_rows = ens.take_rows()
    for b in range(R):
        alone = particles.Simulation(xs[b], heads, beta=betas[b], rule="softmax", dtype=dtype)
        alone.advance(25, observe_every=5)
        assert np.array_equal(ens.tokens[b], alone.tokens)
        mine = [r for r in ens_rows if r["replica"] == b]
        theirs = alone.take_rows()
        assert [r["energy_h1"] for r in mine] == [r["energy_h1"] for r in theirs]


@pytest.mark.parametrize("integrator,order", [("euler", 1), ("rk4", 4)])
def test_integrator_order_from_log_log_slope(integrator, order):
    x = random_tokens(8, 3, 11)
    heads = general_heads(2, 3, 11)
    t_end = 0.4
    exact = x
    for _ in range(400):  # fine RK4 reference on the same ODE
        exact = ref.step_rk4(exact, heads, 1.0, "softmax", "sphere", t_end / 400)
    dts = [0.1, 0.05, 0.025] if integrator == "rk4" else [0.02, 0.01, 0.005]
    errors = []
    for dt in dts:
        sim = particles.Simulation(x, heads, beta=1.0, rule="softmax", dt=dt, integrator=integrator,
                                   dtype="float64")
        sim.advance(round(t_end / dt))
        errors.append(np.max(np.abs(sim.tokens - exact)))
    slope = np.polyfit(np.log(dts), np.log(errors), 1)[0]
    assert abs(slope - order) < 0.25, (slope, errors)


def test_float32_softmax_does_not_overflow_at_large_beta_score():
    """beta * s reaches about 300: e^z overflows float32, the running maximum does not."""
    x = random_tokens(20, 3, 4)
    heads = [(10.0 * np.eye(3), np.eye(3))]
    beta = 30.0
    sim = particles.Simulation(x, heads, beta=beta, rule="softmax", dtype="float32")
    v = sim.velocity()
    assert np.all(np.isfinite(v))
    assert rel_err(v, ref.velocity(x, heads, beta, "softmax", "sphere")) < 1e-4
    sim.observe()
    row = sim.take_rows()[0]
    want = ref.observables(x, heads, beta, "softmax", "sphere")
    assert np.isfinite(row["energy_h0"])  # about e^300: kept in log form on the device
    assert abs(row["energy_h0"] / want["energy_h0"] - 1) < 1e-4


def test_bad_inputs_give_clear_errors():
    x = random_tokens(5, 3)
    with pytest.raises(ValueError, match="geometry"):
        particles.Simulation(x, [np.eye(3)], geometry="torus")
    with pytest.raises(ValueError, match="unknown rule 'nope'"):
        particles.Simulation(x, [np.eye(3)], rule="nope")
    with pytest.raises(ValueError, match="dimension 4"):
        particles.Simulation(x, [np.eye(4)])
    with pytest.raises(ValueError, match="beta"):
        particles.Simulation(x, [np.eye(3)], beta=-1.0)
    with pytest.raises(ValueError, match="dt"):
        particles.Simulation(x, [np.eye(3)], dt=0)


@pytest.mark.parametrize("path", ["fused", "tiled"])
def test_user_rule_registered_from_python(path):
    import taichi as ti
    name = "test_sigmoid_engine"

    def sigmoid(z):
        return 1 / (1 + ti.exp(-z))

    def softplus(z):
        return ti.log(1 + ti.exp(z))

    if name not in particles.registered_rules():
        particles.register_rule(name, kernel=sigmoid, normalization="softmax", potential=softplus)
    with pytest.raises(ValueError, match="lambda"):
        particles.register_rule("test_lambda_rule", kernel=lambda z: z)
    x = random_tokens(9, 4, 2)
    heads = general_heads(2, 4, 2)
    user = ref.UserRule(kernel=lambda z: 1 / (1 + np.exp(-z)), normalization="softmax",
                        potential=lambda z: np.log1p(np.exp(z)))
    sim = particles.Simulation(x, heads, beta=1.1, rule=name, dtype="float64", path=path)
    assert rel_err(sim.velocity(), ref.velocity(x, heads, 1.1, user, "sphere")) < 1e-10
    sim.observe()
    row = sim.take_rows()[0]
    want = ref.observables(x, heads, 1.1, user, "sphere")
    assert abs(row["energy"] / want["energy"] - 1) < 1e-10
    assert abs(row["entropy_mean_h1"] / want["entropy_mean_h1"] - 1) < 1e-10


def test_blow_up_is_reported_with_step_and_token():
    x = random_tokens(6, 3, 1)
    sim = particles.Simulation(x, [(np.eye(3), np.eye(3))], beta=1.0, rule="exp", geometry="flat",
                               dt=50.0, integrator="euler", dtype="float32")
    with pytest.raises(particles.BlowUpError) as info:
        for _ in range(50):
            sim.advance(1)
            sim.check_finite()
    msg = str(info.value)
    assert "blow-up at step" in msg and "token" in msg and "dt" in msg
    assert info.value.step == sim.step_count


def test_blow_up_names_a_heads_own_beta():
    x = random_tokens(6, 3, 1)
    own = particles.Attention(beta=1e30)
    sim = particles.Simulation(x, [(np.eye(3), np.eye(3)), (np.eye(3), np.eye(3))], beta=1.0, rule="exp",
                               geometry="flat", dt=0.01, integrator="euler", dtype="float32",
                               attention=[particles.Attention(), own])
    with pytest.raises(particles.BlowUpError) as info:
        for _ in range(5):
            sim.advance(1)
            sim.check_finite()
    msg = str(info.value)
    assert "beta = 1e+30 (head 1's own)" in msg and "float64" in msg, msg


@pytest.mark.parametrize("rule", [pytest.param("softmax", marks=pytest.mark.slow), "exp"])
def test_large_tile_path_at_n_above_256_matches_reference(rule):
    """n >= 256 takes the engine's large register tiles; hold them against the reference too."""
    n, d, H, beta = 300, 8, 2, 1.7
    x = random_tokens(n, d, seed=5)
    heads = general_heads(H, d, seed=5)
    want_v = ref.velocity(x, heads, beta, rule, "sphere")
    want = ref.observables(x, heads, beta, rule, "sphere", entropy_rate=True)
    for dtype in ("float64", "float32"):
        sim = particles.Simulation(x, heads, beta=beta, rule=rule, dtype=dtype, entropy_rate=True)
        assert rel_err(sim.velocity(), want_v) < RTOL[dtype]
        sim.observe()
        row = sim.take_rows()[0]
        tol = 1e-9 if dtype == "float64" else 1e-4
        for key in ("energy_h1", "entropy_mean_h0", "radial_mean_h1", "kinetic", "entropy_rate_h0"):
            assert abs(row[key] - want[key]) <= tol * max(abs(want[key]), 1e-3), (dtype, key)


@pytest.mark.parametrize("rule", [pytest.param("softmax", marks=pytest.mark.slow), "exp"])
def test_wide_pass_at_large_n_matches_reference(rule):
    """From kernels_wide.WIDE_MIN_N tokens the full-width pass runs (rows in 512-bit lanes,
    flash blocks of columns): n not a multiple of any tile, ranks not multiples of AC."""
    from particles import kernels_wide
    n, d, beta, rng = kernels_wide.WIDE_MIN_N + 9, 6, 1.3, np.random.default_rng(12)
    x = random_tokens(n, d, seed=6)
    factors = [(rng.standard_normal((r, d)), rng.standard_normal((r, d)), rng.standard_normal((d, rv)),
                rng.standard_normal((rv, d))) for r, rv in ((3, 5), (6, 6))]
    heads = [particles.Head.from_factors(q, k, o, w) for q, k, o, w in factors]
    full = [(q.T @ k, o @ w) for q, k, o, w in factors]
    want_v = ref.velocity(x, full, beta, rule, "sphere")
    want = ref.observables(x, full, beta, rule, "sphere")
    for dtype in ("float64", "float32"):
        sim = particles.Simulation(x, heads, beta=beta, rule=rule, dtype=dtype, path="tiled")
        assert isinstance(sim._heads, kernels_wide.WideHeads)
        assert rel_err(sim.velocity(), want_v) < RTOL[dtype]
        sim.observe()
        row = sim.take_rows()[0]
        tol = 1e-9 if dtype == "float64" else 1e-4
        for key in ("energy_h1", "entropy_mean_h0", "entropy_min_h1", "radial_mean_h1", "kinetic",
                    "tangent_power_h0", "cross_coupling_h1"):
            assert abs(row[key] - want[key]) <= tol * max(abs(want[key]), 1e-3), (dtype, key)


@pytest.mark.parametrize("mask, implementation", [("causal", "plain"), ("none", "fused")])
def test_float32_entropy_of_low_entropy_relu_rows_does_not_cancel(mask, implementation):
    """ReLU rows where one weight dominates (nearly orthogonal tokens, a sharp head): the
    entropy log(wsum) - sum w log w / wsum cancelled in float32 (1.2e-5 relative on the
    masked case at beta = 40, growing with beta); taken relative to the row's largest weight
    (kernel_math.kernel_entropy), every row and column is within 2e-6, at any beta, and a row
    that sees one key has entropy exactly 0."""
    rng = np.random.default_rng(3)
    n = d = 12
    x = np.eye(n) + 0.008 * rng.standard_normal((n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    M = np.eye(d)
    spec = ref.HeadSpec("relu", mask=mask)
    for beta in (5.0, 40.0):
        sim = particles.Simulation(x, [(M, M)], beta=beta, rule="relu", dtype="float32",
                                   attention=[particles.Attention(mask=mask)])
        assert sim.implementation == implementation
        sim.observe()
        row = sim.take_rows()[0]
        got = sim.per_token()["entropy_h0"]
        want = ref.spec_entropy_rows(x, M, beta, spec)
        seen = want > 0
        assert np.max(np.abs(got[seen] - want[seen]) / want[seen]) < 2e-6
        assert np.all(got[~seen] == 0) and (mask == "none" or not seen[0])
        assert want[seen].min() < 0.12   # low-entropy rows are there
        for key, value in ref.spec_observables(x, [(M, M)], beta, [spec]).items():
            if key.startswith("entropy"):
                assert row[key] == pytest.approx(value, rel=2e-6), key
