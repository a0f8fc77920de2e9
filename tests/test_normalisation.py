"""LayerNorm placements (particles.normalisation; docs/MODEL.md "Normalisation placements")
against an independent float64 NumPy reference written here: the velocity, RK4 steps and the
logged radius, energy and kinetic columns, on every path that declares the placements."""
import numpy as np
import pytest

from particles import Simulation, paths
from particles.errors import ParticlesUserError

PLACEMENTS = ("pre", "peri", "ngpt")
ALPHA = {"pre": 1.0, "peri": 1.0, "ngpt": 0.7}
# the paths that declare the placements (paths.SPECS), each with the pair pass it runs here
SERVING = [s.name for s in paths.SPECS if "pre" in s.normalisations]


def _pull(y, heads, beta, rule):
    """v_i = sum_h sum_j w^h_ij V_h y_j at the directions y (n x n matrices: the reference)."""
    v = np.zeros_like(y)
    for M, V in heads:
        z = beta * (y @ M @ y.T)
        if rule == "softmax":
            w = np.exp(z - z.max(axis=1, keepdims=True))
            w /= w.sum(axis=1, keepdims=True)
        elif rule == "relu":                    # max(z, 0) / n
            w = np.maximum(z, 0) / len(y)
        else:                                   # exp: e^z / n
            w = np.exp(z) / len(y)
        v += w @ (y @ V.T)
    return v


def reference_velocity(x, heads, beta, rule, placement, alpha=1.0):
    y = x / np.linalg.norm(x, axis=-1, keepdims=True)
    v = _pull(y, heads, beta, rule)
    if placement == "post":      # the paper's sphere, at unit tokens
        return v - np.sum(v * y, axis=-1, keepdims=True) * y
    if placement == "pre":
        return v
    u = v / np.linalg.norm(v, axis=-1, keepdims=True)
    if placement == "peri":
        return u
    return alpha * (u - np.sum(u * y, axis=-1, keepdims=True) * y)   # ngpt


def reference_rk4(x, heads, beta, rule, placement, alpha, dt, steps):
    f = lambda p: reference_velocity(p, heads, beta, rule, placement, alpha)  # noqa: E731
    for _ in range(steps):
        k1 = f(x)
        k2 = f(x + 0.5 * dt * k1)
        k3 = f(x + 0.5 * dt * k2)
        k4 = f(x + dt * k3)
        x = x + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        if placement in ("post", "ngpt"):
            x = x / np.linalg.norm(x, axis=-1, keepdims=True)
    return x


def _system(seed=3, n=10, d=4):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) * rng.uniform(0.5, 2.0, size=(n, 1))   # radii far from 1
    heads = [(rng.normal(size=(d, d)) / 2, rng.normal(size=(d, d)) / 2) for _ in range(2)]
    return x, heads


@pytest.mark.parametrize("path", SERVING)
@pytest.mark.parametrize("rule", ["softmax", "exp"])
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_velocity_and_rk4_steps_match_the_float64_reference(placement, rule, path):
    x, heads = _system()
    beta, dt, steps = 1.3, 0.02, 4
    alpha = ALPHA[placement]
    sim = Simulation(x, heads, beta=beta, rule=rule, dtype="float64", path=path, dt=dt,
                     normalisation=placement, ngpt_alpha=alpha)
    assert sim.path == path
    start = x / np.linalg.norm(x, axis=-1, keepdims=True) if placement == "ngpt" else x
    np.testing.assert_allclose(sim.tokens, start, rtol=0, atol=1e-15)   # pre/peri keep radii
    want = reference_velocity(start, heads, beta, rule, placement, alpha)
    np.testing.assert_allclose(sim.velocity(), want, rtol=0, atol=1e-12)
    sim.advance(steps)
    want = reference_rk4(start, heads, beta, rule, placement, alpha, dt, steps)
    np.testing.assert_allclose(sim.tokens, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("rule, n, dtype, implementation, atol", [
    ("relu", 10, "float64", "plain", 1e-12),      # a k(z) rule: the plain pass on the tiled path
    ("softmax", 512, "float32", "wide", 2e-5),    # the wide pass from n = 512
])
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_every_pair_pass_implementation_serves_the_placements(placement, rule, n, dtype,
                                                              implementation, atol):
    x, heads = _system(seed=7, n=n, d=3)
    sim = Simulation(x, heads, beta=0.8, rule=rule, dtype=dtype, normalisation=placement,
                     ngpt_alpha=ALPHA[placement])
    assert (sim.path, sim.implementation) == ("tiled", implementation)
    start = sim.tokens          # as the dtype holds them
    want = reference_velocity(start, heads, 0.8, rule, placement, ALPHA[placement])
    np.testing.assert_allclose(sim.velocity(), want, rtol=0, atol=atol)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_logged_radius_energy_and_kinetic_are_those_of_the_reference(placement):
    x, _ = _system(seed=5, n=9, d=3)
    M = np.diag([1.0, 0.6, 0.3])     # symmetric, V = M: Theorem 11's energy of the directions
    heads, beta = [(M, M)], 1.5
    sim = Simulation(x, heads, beta=beta, rule="exp", dtype="float64", normalisation=placement,
                     ngpt_alpha=ALPHA[placement])
    res = sim.run(2, every=2)
    state = reference_rk4(x if placement != "ngpt" else x / np.linalg.norm(x, axis=-1, keepdims=True),
                          heads, beta, "exp", placement, ALPHA[placement], sim.dt, 2)
    y = state / np.linalg.norm(state, axis=-1, keepdims=True)
    n = len(y)
    energy = np.exp(beta * (y @ M @ y.T)).sum() / (2 * beta * n * n)
    xdot = reference_velocity(state, heads, beta, "exp", placement, ALPHA[placement])
    assert res["energy"][-1] == pytest.approx(energy, rel=1e-12)
    assert res["kinetic"][-1] == pytest.approx(np.mean(np.sum(xdot ** 2, axis=1)), rel=1e-12)
    radius = np.linalg.norm(state, axis=-1)
    if placement in ("pre", "peri"):
        got = [res[c][-1] for c in ("radius_mean", "radius_min", "radius_max")]
        np.testing.assert_allclose(got, [radius.mean(), radius.min(), radius.max()], rtol=1e-13)
        assert radius.max() - radius.min() > 0.5     # the radii are state, not ones
    else:
        assert "radius_mean" not in res.columns
        np.testing.assert_allclose(radius, 1.0, atol=1e-14)


def test_the_default_is_the_papers_sphere_and_the_fused_path_refuses_the_others():
    x, heads = _system(n=6, d=3)
    assert Simulation(x, heads, dtype="float64").normalisation == "post"
    assert Simulation(x, heads, dtype="float64", normalisation="pre").path == "tiled"  # auto
    with pytest.raises(ValueError, match=r"path 'fused' cannot serve .*normalisation 'peri'"):
        Simulation(x, heads, dtype="float64", path="fused", normalisation="peri")


@pytest.mark.parametrize("kwargs, message", [
    (dict(normalisation="mid"), r"normalisation must be one of \('post', 'pre', 'peri', 'ngpt'\)"),
    (dict(normalisation="pre", geometry="flat"), r"needs geometry 'sphere'"),
    (dict(normalisation="pre", ngpt_alpha=0.5), r"ngpt_alpha .* applies only with normalisation 'ngpt'"),
    (dict(normalisation="ngpt", ngpt_alpha=0.0), r"ngpt_alpha must be a positive finite number"),
    (dict(normalisation="peri", entropy_rate=True, rule="softmax"), r"entropy rate .* normalisation 'peri'"),
    (dict(normalisation="pre", retraction="exp", integrator="euler"), r"retraction 'exp' .*normalisation 'pre'"),
])
def test_bad_placements_are_refused_clearly(kwargs, message):
    x, heads = _system(n=5, d=3)
    with pytest.raises(ParticlesUserError, match=message):
        Simulation(x, heads, dtype="float64", **kwargs)


@pytest.mark.parametrize("placement", ("post",) + PLACEMENTS)
def test_equiangular_start_follows_the_reduced_ode_of_its_placement(placement):
    """Orthonormal tokens (gamma = 0) under scalar softmax heads stay equiangular with one
    radius: the engine's n tokens against theory's two-number ODE (docs/MODEL.md)."""
    from particles import theory
    n, lambdas, beta, alpha = 8, (1.0, 0.5), 1.5, ALPHA.get(placement, 1.0)
    heads = [(lam * np.eye(n), lam * np.eye(n)) for lam in lambdas]
    sim = Simulation(np.eye(n), heads, beta=beta, rule="softmax", dtype="float64", dt=0.01,
                     normalisation=placement, ngpt_alpha=alpha)
    res = sim.run(150, every=50)
    gamma, radius = theory.equiangular_placement_curve(0.0, lambdas, beta, n, res["time"], "softmax",
                                                       placement, alpha, max_step=1e-3)
    np.testing.assert_allclose(res["gamma_bar"], gamma, rtol=0, atol=1e-9)
    if placement in ("pre", "peri"):
        np.testing.assert_allclose(res["radius_mean"], radius, rtol=1e-9)
        np.testing.assert_allclose(res["radius_max"] - res["radius_min"], 0, atol=1e-12)
    if placement == "post":   # the reduction's post case is Theorem 22's ODE
        np.testing.assert_allclose(gamma, theory.equiangular_curve(0.0, lambdas, beta, n, res["time"]),
                                   rtol=0, atol=1e-13)
    assert gamma[-1] > 0.2    # the tokens did move


def test_a_pre_ln_scene_logs_each_radius_and_films_the_directions(tmp_path):
    """The bundled twin runs from the command line: its note, radius columns in log.csv equal
    to the saved tokens' radii, and a film (which draws the directions, coloured by radius)."""
    import csv
    from cli_runner import particles_cli
    from particles import load_trajectory
    out = tmp_path / "run"
    proc = particles_cli("run", "normalisation_pre", "--steps", 6, "--set", "log.every=3",
                         "--set", "log.trajectory_every=3", "--set", "render.frames=2", "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "note: normalisation 'pre': energy is that of the directions" in proc.stdout
    rows = list(csv.DictReader(open(out / "log.csv")))
    traj = load_trajectory(out / "trajectory")
    radius = np.linalg.norm(traj.tokens[-1], axis=-1)
    assert [int(r["step"]) for r in rows] == [0, 3, 6]
    assert float(rows[-1]["radius_max"]) == pytest.approx(radius.max(), rel=1e-6)
    assert float(rows[-1]["radius_mean"]) == pytest.approx(radius.mean(), rel=1e-6)
    assert float(rows[-1]["radius_mean"]) > 1.1        # grown from the unit sphere in 0.3
    assert (out / "animation.mp4").stat().st_size > 0


@pytest.mark.parametrize("placement", ("post",) + PLACEMENTS)
def test_the_energy_of_the_directions_rises_at_the_placements_rate(placement):
    """Theorem 11's assumptions (exp, V = M symmetric): dE/dt = (1/n) sum_i s_i |P A_i|^2 with
    the placement's speed s_i (docs/MODEL.md), by a central difference of the logged energy."""
    x, _ = _system(seed=11, n=10, d=3)
    M = np.array([[1.0, 0.3, 0.0], [0.3, 0.5, 0.2], [0.0, 0.2, 0.8]])
    heads, beta, dt, alpha = [(M, M)], 1.5, 1e-3, ALPHA.get(placement, 1.0)
    start = x if placement in ("pre", "peri") else x / np.linalg.norm(x, axis=-1, keepdims=True)
    sim = Simulation(start, heads, beta=beta, rule="exp", dtype="float64", dt=dt,
                     normalisation=placement, ngpt_alpha=alpha)
    energy = sim.run(20, every=10)["energy"]
    mid = reference_rk4(start, heads, beta, "exp", placement, alpha, dt, 10)
    r = np.linalg.norm(mid, axis=-1, keepdims=True)
    y = mid / r
    A = _pull(y, heads, beta, "exp")
    tangent = A - np.sum(A * y, axis=-1, keepdims=True) * y
    speed = {"post": 1.0, "pre": 1 / r, "peri": 1 / (r * np.linalg.norm(A, axis=-1, keepdims=True)),
             "ngpt": alpha / np.linalg.norm(A, axis=-1, keepdims=True)}[placement]
    rate = np.mean(np.sum(speed * tangent ** 2, axis=-1))
    assert np.all(np.diff(energy) > 0)
    assert (energy[2] - energy[0]) / (20 * dt) == pytest.approx(rate, rel=1e-4)   # O(dt^2): 3e-5


@pytest.mark.slow
def test_a_peri_ln_run_resumes_bitwise(tmp_path):
    """The checkpoint of a run whose radius is state (tokens off the unit sphere) is accepted,
    and the resumed log equals the uninterrupted one byte for byte."""
    from cli_runner import particles_cli
    whole, split = tmp_path / "whole", tmp_path / "split"
    for out, steps in ((whole, 40), (split, 20)):
        proc = particles_cli("run", "normalisation_peri", "--steps", steps, "--no-render", "--out", out, "--quiet")
        assert proc.returncode == 0, proc.stderr
    proc = particles_cli("resume", split, "--steps", 40, "--no-render", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert (split / "log.csv").read_bytes() == (whole / "log.csv").read_bytes()


@pytest.mark.slow
def test_a_sweep_records_the_radius_of_a_pre_ln_scene(tmp_path):
    from cli_runner import particles_cli
    sweep = tmp_path / "norm.toml"
    sweep.write_text('name = "norm"\ndescription = "pre-LN"\n[tokens]\nn = 8\nd = 3\ninit = "random"\n'
                     '[heads]\nkind = "scalar"\ncount = 1\n[dynamics]\nrule = "softmax"\ndt = 0.1\n'
                     't_end = 1.0\nnormalisation = "pre"\n[axes]\n"tokens.seed" = {count = 2}\n'
                     '[record]\ntimes = [1.0]\nobservables = ["eps", "radius_mean"]\n')
    proc = particles_cli("sweep", sweep, "--out", tmp_path / "out", "--workers", 1)
    assert proc.returncode == 0, proc.stderr
    import csv
    rows = list(csv.DictReader(open(tmp_path / "out" / "results.csv")))
    assert len(rows) == 2 and all(float(r["radius_mean"]) > 1.2 for r in rows)   # grown from 1
    post = sweep.read_text().replace('normalisation = "pre"', 'normalisation = "post"')
    sweep.write_text(post)
    proc = particles_cli("sweep", sweep, "--out", tmp_path / "post")
    assert proc.returncode == 2 and "'radius_mean' is not a log column" in proc.stderr


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_placements_around_a_causal_pass_and_a_schedule_of_layers(placement):
    """The transform wraps whatever pass runs: a causal softmax head (the tiled fast pass over
    its key band) and a schedule whose second layer has other heads."""
    from particles import Attention, Layer, Schedule
    x, heads = _system(seed=13, n=9, d=3)
    alpha = ALPHA[placement]
    sim = Simulation(x, heads[:1], beta=1.1, rule="softmax", dtype="float64", normalisation=placement,
                     ngpt_alpha=alpha, attention=Attention(mask="causal"))
    start = sim.tokens
    y = start / np.linalg.norm(start, axis=-1, keepdims=True)
    M, V = heads[0]
    z = np.where(np.tril(np.ones((9, 9))) > 0, 1.1 * (y @ M @ y.T), -np.inf)
    w = np.exp(z - z.max(axis=1, keepdims=True))
    v = (w / w.sum(axis=1, keepdims=True)) @ (y @ V.T)
    want = {"pre": v, "peri": v / np.linalg.norm(v, axis=-1, keepdims=True)}.get(placement)
    if want is None:
        u = v / np.linalg.norm(v, axis=-1, keepdims=True)
        want = alpha * (u - np.sum(u * y, axis=-1, keepdims=True) * y)
    np.testing.assert_allclose(sim.velocity(), want, rtol=0, atol=1e-12)
    layered = Simulation(x, Schedule((Layer(heads[:1]), Layer(heads[1:])), (0, 2)), beta=1.1, rule="softmax",
                         dtype="float64", dt=0.01, normalisation=placement, ngpt_alpha=alpha)
    layered.advance(4)
    start = x if placement != "ngpt" else x / np.linalg.norm(x, axis=-1, keepdims=True)
    mid = reference_rk4(start, heads[:1], 1.1, "softmax", placement, alpha, 0.01, 2)
    np.testing.assert_allclose(layered.tokens, reference_rk4(mid, heads[1:], 1.1, "softmax", placement, alpha,
                                                             0.01, 2), rtol=0, atol=1e-12)
