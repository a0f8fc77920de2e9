"""Self-consistency of the float64 reference (tests/reference.py) against MODEL.md's mathematics.

These hold the oracle itself to the identities of the model (Theorem 11's energy
rate, the per-head split T + C - R, Theorem 27's entropy rate, Theorem 22's
equiangular ODE, Theorem 19's closed forms) before the engine is held to it.
"""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import benchmark_scripts  # noqa: E402
import reference as ref  # noqa: E402


def random_sphere(n, d, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def symmetric_heads(d, H, seed, scale=0.8):
    rng = np.random.default_rng(seed)
    heads = []
    for _ in range(H):
        A = rng.standard_normal((d, d)) * scale / np.sqrt(d)
        M = 0.5 * (A + A.T)
        heads.append((M, M))
    return heads


def general_heads(d, H, seed, scale=0.8):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((d, d)) * scale / np.sqrt(d),
             rng.standard_normal((d, d)) * scale / np.sqrt(d)) for _ in range(H)]


def energy_rates(obs, H):
    return np.array([obs[f"energy_rate_h{h}"] for h in range(H)])


# ------------------------------------------------------------------ basics

def test_observable_keys_exact():
    x = random_sphere(6, 4, 0)
    heads = symmetric_heads(4, 2, 1)
    keys = {"energy", "kinetic", "gamma_bar", "eps"}
    per = ["energy", "tangent_power", "cross_coupling", "radial_shadow", "energy_rate",
           "radial_mean", "radial_absmax", "radial_dominance", "entropy_mean",
           "entropy_min", "entropy_max"]
    keys |= {f"{p}_h{h}" for p in per for h in range(2)}
    assert set(ref.observables(x, heads, 1.0, "exp", "sphere")) == keys
    keys_rate = keys | {f"entropy_rate_h{h}" for h in range(2)}
    assert set(ref.observables(x, heads, 1.0, "exp", "sphere", entropy_rate=True)) == keys_rate
    assert set(ref.per_token(x, heads, 1.0, "exp")) == {"radial_h0", "radial_h1",
                                                       "entropy_h0", "entropy_h1"}


def test_weights_match_direct_formula_and_overflow_safely():
    x = random_sphere(7, 5, 2)
    M = general_heads(5, 1, 3)[0][0]
    n = 7
    z = 1.7 * ref.scores(x, M)
    assert np.allclose(ref.scores(x, M), np.einsum("id,de,je->ij", x, M, x))
    assert np.allclose(ref.weights(x, M, 1.7, "exp"), np.exp(z) / n, rtol=1e-14, atol=0)
    assert np.allclose(ref.weights(x, M, 1.7, "softmax"),
                       np.exp(z) / np.exp(z).sum(1, keepdims=True), rtol=1e-14, atol=0)
    assert np.allclose(ref.weights(x, M, 1.7, "relu"), np.maximum(z, 0) / n, rtol=0, atol=0)
    user = ref.UserRule(kernel=lambda z: 1.0 + np.tanh(z), normalization="softmax")
    k = 1.0 + np.tanh(z)
    assert np.allclose(ref.weights(x, M, 1.7, user), k / k.sum(1, keepdims=True))
    # beta*s ~ 600: the naive exponential overflows in the row sum, not in the weights
    big = 600.0
    W = ref.weights(x, np.eye(5), big, "softmax")
    assert np.all(np.isfinite(W)) and np.allclose(W.sum(1), 1.0)
    E = ref.energy_per_head(x, [(np.eye(5), None)], 700.0, "exp")
    assert np.all(np.isfinite(E)) and E[0] > 0
    logE = ref.log_energy_per_head(x, [(np.eye(5), None)], 700.0, "exp")[0]
    direct = np.log(np.sum(np.exp(700.0 * (x @ x.T) - 700.0))) + 700.0 - np.log(2 * 700.0 * n * n)
    assert logE == pytest.approx(direct, rel=1e-14)


# ------------------------------------------------------- energy (Theorem 11)

@pytest.mark.parametrize("geometry", ["sphere", "flat"])
@pytest.mark.parametrize("rule", ["exp", "relu"])
def test_energy_rate_identity(geometry, rule):
    """Symmetric M_h, V_h = M_h, mean normalisation: sum_h (T_h + C_h - R_h) = kinetic = dE/dt."""
    n, d, H, beta = 9, 5, 3, 1.3
    x = random_sphere(n, d, 4)
    if geometry == "flat":
        x = x * np.random.default_rng(5).uniform(0.6, 1.4, size=(n, 1))
    heads = symmetric_heads(d, H, 6)
    obs = ref.observables(x, heads, beta, rule, geometry)
    assert np.sum(energy_rates(obs, H)) == pytest.approx(obs["kinetic"], rel=1e-12, abs=1e-15)

    xdot = ref.velocity(x, heads, beta, rule, geometry)
    h = 1e-5
    Ep = ref.energy_per_head(x + h * xdot, heads, beta, rule)
    Em = ref.energy_per_head(x - h * xdot, heads, beta, rule)
    fd = (Ep - Em) / (2 * h)
    # total: dE/dt = kinetic; per head: dE_h/dt = T_h + C_h - R_h
    assert fd.sum() == pytest.approx(obs["kinetic"], rel=1e-7)
    assert np.allclose(fd, energy_rates(obs, H), rtol=1e-7, atol=1e-10)


def test_energy_increases_along_flow():
    x = random_sphere(8, 4, 7)
    heads = symmetric_heads(4, 2, 8)
    E0 = ref.observables(x, heads, 2.0, "exp")["energy"]
    for _ in range(20):
        x = ref.step_rk4(x, heads, 2.0, "exp", "sphere", 0.05)
        E1 = ref.observables(x, heads, 2.0, "exp")["energy"]
        assert E1 >= E0 - 1e-14
        E0 = E1


def test_orthogonal_subspace_heads_have_zero_cross_coupling():
    d, n, beta = 4, 7, 1.5
    x = random_sphere(n, d, 9)
    M1 = np.diag([1.2, 0.7, 0.0, 0.0])
    M2 = np.diag([0.0, 0.0, 0.9, 1.1])
    heads = [(M1, M1), (M2, M2)]
    for geometry in ("sphere", "flat"):
        obs = ref.observables(x, heads, beta, "exp", geometry)
        assert obs["cross_coupling_h0"] == 0.0 and obs["cross_coupling_h1"] == 0.0
    obs = ref.observables(x, heads, beta, "exp", "sphere")
    # the radial shadow survives exact orthogonality on the sphere (Theorems 16-17) ...
    assert abs(obs["radial_shadow_h0"]) > 1e-3
    assert obs["energy_rate_h0"] == pytest.approx(obs["tangent_power_h0"] - obs["radial_shadow_h0"],
                                                  rel=1e-14)
    # ... and is absent in flat space
    flat = ref.observables(x, heads, beta, "exp", "flat")
    assert flat["radial_shadow_h0"] == 0.0 and flat["radial_dominance_h0"] == 0.0


# ------------------------------------------------------- entropy (Theorem 27)

@pytest.mark.parametrize("rule,geometry", [("softmax", "sphere"), ("softmax", "flat"),
                                           ("exp", "sphere")])
def test_entropy_rate_matches_finite_difference(rule, geometry):
    n, d, H, beta = 8, 5, 2, 2.0
    x = random_sphere(n, d, 10)
    heads = general_heads(d, H, 11)
    obs = ref.observables(x, heads, beta, rule, geometry, entropy_rate=True)
    dt = 1e-4
    xp = ref.step_rk4(x, heads, beta, rule, geometry, dt)
    xm = ref.step_rk4(x, heads, beta, rule, geometry, -dt)
    op = ref.observables(xp, heads, beta, rule, geometry)
    om = ref.observables(xm, heads, beta, rule, geometry)
    for h in range(H):
        fd = (op[f"entropy_mean_h{h}"] - om[f"entropy_mean_h{h}"]) / (2 * dt)
        assert obs[f"entropy_rate_h{h}"] == pytest.approx(fd, rel=1e-6, abs=1e-9)


def test_entropy_conventions():
    x = np.eye(6)[:4]                   # exactly orthonormal: off-diagonal scores are exactly 0
    heads = [(np.eye(6), None)]
    # relu at orthonormal tokens: only the self weight is nonzero -> entropy 0
    pt = ref.per_token(x, heads, 1.0, "relu")
    assert np.all(pt["entropy_h0"] == 0.0)
    # negative self score: the whole row is zero -> entropy defined as 0
    pt = ref.per_token(x, [(-np.eye(6), None)], 1.0, "relu")
    assert np.all(pt["entropy_h0"] == 0.0)
    # collapsed tokens: uniform attention, entropy log n
    xc = np.tile(x[:1], (4, 1))
    assert np.allclose(ref.per_token(xc, heads, 3.0, "softmax")["entropy_h0"], np.log(4))
    assert np.isnan(ref.observables(x, heads, 1.0, "relu", entropy_rate=True)["entropy_rate_h0"])


# ------------------------------------------------------ integrators

def test_rk4_and_euler_orders():
    x0 = random_sphere(6, 4, 12)
    heads = general_heads(4, 2, 13)
    t_end = 0.4

    def run(step, dt):
        x = x0
        for _ in range(int(round(t_end / dt))):
            x = step(x, heads, 1.0, "softmax", "sphere", dt)
        return x

    exact = run(ref.step_rk4, t_end / 400)
    e1 = np.abs(run(ref.step_rk4, t_end / 10) - exact).max()
    e2 = np.abs(run(ref.step_rk4, t_end / 20) - exact).max()
    assert 3.5 < np.log2(e1 / e2) < 4.5
    e1 = np.abs(run(ref.step_euler, t_end / 20) - exact).max()
    e2 = np.abs(run(ref.step_euler, t_end / 40) - exact).max()
    assert 0.8 < np.log2(e1 / e2) < 1.2


# ----------------------------------------------- equiangular (Theorem 22)

@pytest.mark.parametrize("rule,steps", [("softmax", 1000), ("exp", 300)])
def test_equiangular_ode_matches_particles(rule, steps):
    """n = 5, d = 6, unequal lambdas, particle RK4 dt = 1e-3 against the scalar ODE (mid-flight)."""
    n, d, beta, dt = 5, 6, 1.5, 1e-3
    lambdas = [0.4, 1.0, 1.7]
    heads = [(lam * np.eye(d), lam * np.eye(d)) for lam in lambdas]
    x = ref.equiangular_tokens(n, d, -0.1, seed=14)
    G = x @ x.T
    assert np.allclose(G[~np.eye(n, dtype=bool)], -0.1, atol=1e-14)
    for _ in range(steps):
        x = ref.step_rk4(x, heads, beta, rule, "sphere", dt)
    G = x @ x.T
    off = G[~np.eye(n, dtype=bool)]
    assert np.ptp(off) < 1e-12                               # stays equiangular
    gamma = ref.solve_equiangular_gamma(-0.1, lambdas, beta, n, rule, t_end=steps * dt, dt=1e-4)
    assert abs(off.mean() - gamma) < 1e-8
    assert ref.observables(x, heads, beta, rule)["gamma_bar"] == pytest.approx(gamma, abs=1e-8)


def test_equiangular_closed_forms():
    lambdas, beta, n = np.array([0.5, 1.0, 2.5]), 1.2, 7
    assert ref.equiangular_gamma_rhs(0.0, lambdas, beta, n, "softmax") == pytest.approx(
        np.sum(ref.phi(lambdas, beta, n)), rel=1e-14)
    for rule in ("softmax", "exp"):
        assert ref.equiangular_gamma_rhs(1.0, lambdas, beta, n, rule) == 0.0
        assert ref.equiangular_gamma_rhs(-1.0 / (n - 1), lambdas, beta, n, rule) == pytest.approx(0.0, abs=1e-15)
    # RK4 self-convergence of the scalar solver: dt=1e-4 agrees with dt=5e-5 to ~1e-13
    g1 = ref.solve_equiangular_gamma(0.05, lambdas, beta, n, "softmax", t_end=1.5, dt=1e-4)
    g2 = ref.solve_equiangular_gamma(0.05, lambdas, beta, n, "softmax", t_end=1.5, dt=5e-5)
    assert abs(g1 - g2) < 1e-12
    # late time: eps ~ C e^{-2 Lambda t}
    t, g = ref.solve_equiangular_gamma(0.05, lambdas, beta, n, "softmax", t_end=3.5, dt=1e-3,
                                       return_trajectory=True)
    eps = 1.0 - g                      # ~1e-11 at t = 3.5, still far above round-off
    late = slice(2000, 3501)
    slope = np.polyfit(t[late], np.log(eps[late]), 1)[0]
    assert slope == pytest.approx(-2.0 * lambdas.sum(), rel=1e-3)


# ------------------------------------------ critical temperature (Theorem 19)

def test_c_star_and_beta_star():
    assert ref.c_star(2) == pytest.approx(2.0 / (1.0 + np.sqrt(5.0)), rel=1e-15)
    assert ref.c_star(1) == 1.0 and ref.beta_star(1, 10, 1.0) == np.inf
    for H in (2, 3, 5):
        c = ref.c_star(H)
        assert c * c + (H - 1) * c == pytest.approx(1.0, rel=1e-14)


@pytest.mark.parametrize("rule", ["exp", "softmax"])
@pytest.mark.parametrize("H,n,d,alpha,beta", [(2, 5, 6, 1.0, 0.3), (3, 6, 6, 0.7, 1.1),
                                              (4, 3, 5, 2.0, 0.05)])
def test_radial_dominance_orthonormal_matches_observables(rule, H, n, d, alpha, beta):
    x = ref.orthonormal_tokens(n, d, seed=H + n)
    heads = [(alpha * np.eye(d), alpha * np.eye(d))] * H
    obs = ref.observables(x, heads, beta, rule, "sphere")
    closed = ref.radial_dominance_orthonormal(H, n, alpha, beta, rule)
    for h in range(H):
        assert obs[f"radial_dominance_h{h}"] == pytest.approx(closed, rel=1e-12)


@pytest.mark.parametrize("H,n", [(2, 4), (2, 50), (3, 10), (5, 100)])
def test_rho_at_beta_star_is_c_star_not_one(H, n):
    """Finding: the logged ratio rho_h equals c*(H) < 1 at beta*, and reaches 1 only at
    ln((n-1)/(H-1))/(2 alpha); beta* is where (H-1)|a| ||f|| = ||P f||^2 instead."""
    alpha = 0.9
    bs = ref.beta_star(H, n, alpha)
    for rule in ("exp", "softmax"):
        assert ref.radial_dominance_orthonormal(H, n, alpha, bs, rule) == pytest.approx(ref.c_star(H), rel=1e-12)
        assert ref.radial_dominance_orthonormal(
            H, n, alpha, ref.radial_dominance_crossing_beta(H, n, alpha), rule) == pytest.approx(1.0, rel=1e-12)
    assert ref.radial_cs_ratio_orthonormal(H, n, alpha, bs) == pytest.approx(1.0, rel=1e-12)
    # the Cauchy-Schwarz form from the observables themselves at beta*
    d = n
    x = ref.orthonormal_tokens(n, d, seed=1)
    heads = [(alpha * np.eye(d), alpha * np.eye(d))] * H
    F = ref.head_outputs(x, heads, bs, "softmax")
    a = ref.per_token(x, heads, bs, "softmax")["radial_h0"]
    Pf = F[0] - a[:, None] * x
    ratio = (H - 1) * np.abs(a) * np.linalg.norm(F[0], axis=1) / np.sum(Pf * Pf, axis=1)
    assert np.allclose(ratio, 1.0, rtol=1e-12)


# -------------------------------------------------- clustering measures

def test_clusters_and_min_cosine():
    e = np.eye(3)
    x = np.array([e[0], e[0], (e[0] + 1e-3 * e[1]) / np.linalg.norm(e[0] + 1e-3 * e[1]), e[1], -e[1]])
    assert ref.count_clusters(x, 0.99) == 3
    assert ref.count_clusters(x, -1.5) == 1
    assert ref.min_cosine(x) == pytest.approx(-1.0)
    assert list(ref.cluster_labels(x, 0.99)) == [0, 0, 0, 1, 2]
    # chained components: 0~1, 1~2 but not 0~2
    th = np.array([0.0, 0.5, 1.0])
    xc = np.stack([np.cos(th), np.sin(th), 0 * th], axis=1)
    assert ref.count_clusters(xc, np.cos(0.6)) == 1
    assert ref.count_clusters(xc, np.cos(0.4)) == 3


# ------------------------------------ the NumPy speed peer agrees with the reference

def _load_peers():
    return benchmark_scripts.load("peers")


def test_numpy_peer_matches_reference_in_float32():
    peers = _load_peers()
    n, d, H, r, rv, beta, dt = 40, 6, 3, 4, 5, 2.5, 0.05
    Q, K, O, W = peers.make_factors(H, d, r, rv, scale=1.2, seed=15)
    heads = [(Q[h].T.astype(np.float64) @ K[h], O[h].astype(np.float64) @ W[h]) for h in range(H)]
    x = random_sphere(n, d, 16).astype(np.float32)
    x64 = x.astype(np.float64)
    expect = ref.step_euler(x64, heads, beta, "softmax", "sphere", dt)
    assert np.abs(peers.numpy_step(x, Q, K, O, W, beta, dt) - expect).max() < 2e-5
    x_new, obs = peers.numpy_step_with_observables(x, Q, K, O, W, beta, dt)
    assert np.abs(x_new - expect).max() < 2e-5
    want = ref.observables(x64, heads, beta, "softmax", "sphere")
    assert set(obs) == set(want)
    for key, val in want.items():
        assert obs[key] == pytest.approx(val, rel=2e-4, abs=2e-5), key
    if peers.TORCH_AVAILABLE:
        y = peers.torch_step(x, Q, K, O, W, beta, dt, device="cpu")
        assert np.abs(y - expect).max() < 2e-5
    else:
        with pytest.raises(ImportError):
            peers.torch_step(x, Q, K, O, W, beta, dt)


def test_numpy_rk4_peer_matches_reference_in_float32():
    peers = _load_peers()
    n, d, H, r, rv, beta, dt = 24, 5, 2, 3, 4, 1.5, 0.05
    Q, K, O, W = peers.make_factors(H, d, r, rv, seed=4)
    heads = [(Q[h].T.astype(np.float64) @ K[h], O[h].astype(np.float64) @ W[h]) for h in range(H)]
    x = random_sphere(n, d, 5).astype(np.float32)
    want = x.astype(np.float64)
    for _ in range(7):
        want = ref.step_rk4(want, heads, beta, "softmax", "sphere", dt)
    got, rows = peers.numpy_rk4_run(x, Q, K, O, W, beta, dt, 7, observe_every=3)
    assert np.abs(got - want).max() < 1e-5
    assert len(rows) == 3 and rows[0]["energy"] == pytest.approx(
        ref.observables(x.astype(np.float64), heads, beta, "softmax", "sphere")["energy"], rel=1e-4)


def test_user_rules_reproduce_builtins():
    x = random_sphere(7, 4, 17)
    heads = general_heads(4, 2, 18)
    as_exp = ref.UserRule(kernel=np.exp, normalization="mean", potential=np.exp)
    as_softmax = {"kernel": np.exp, "normalization": "softmax", "potential": np.exp}
    as_relu = ref.UserRule(kernel=lambda z: np.maximum(z, 0.0), normalization="mean",
                           potential=lambda z: 0.5 * np.maximum(z, 0.0) ** 2)
    for user, name in ((as_exp, "exp"), (as_softmax, "softmax"), (as_relu, "relu")):
        for geometry in ("sphere", "flat"):
            got = ref.observables(x, heads, 1.4, user, geometry)
            want = ref.observables(x, heads, 1.4, name, geometry)
            for key in want:
                assert got[key] == pytest.approx(want[key], rel=1e-12, abs=1e-15), (name, key)
    no_potential = ref.UserRule(kernel=np.exp, normalization="softmax")
    assert np.isnan(ref.observables(x, heads, 1.4, no_potential)["energy"])
    with pytest.raises(ValueError):
        ref.UserRule(kernel=np.exp, normalization="sum")
