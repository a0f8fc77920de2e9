"""The two CPU paths (fused: k steps per launch; tiled: a launch per kernel) over many steps,
against the float64 reference: logged rows across batch flushes, ensembles, the auto choice."""
import numpy as np
import pytest

import particles
import reference as ref
from conftest import general_heads, random_tokens, rel_err
from particles import kernels_fused, paths

OBSERVED = ("energy", "kinetic", "gamma_bar", "tangent_power_h0", "cross_coupling_h1",
            "radial_shadow_h1", "radial_absmax_h0", "entropy_mean_h1", "entropy_min_h0")


@pytest.mark.parametrize("path", ["fused", "tiled"])
@pytest.mark.parametrize("integrator", ["euler", "rk4"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_many_steps_with_logged_rows_across_batch_flushes(dtype, integrator, path):
    """23 steps in uneven calls, a row every 4 steps, a 3-row batch buffer (so launches are cut
    where the buffer fills): every state and every row matches the reference at its step."""
    n, d, H, beta, dt, every = 21, 4, 2, 1.4, 0.04, 4
    x = random_tokens(n, d, seed=5)
    heads = general_heads(H, d, seed=8)
    sim = particles.Simulation(x, heads, beta=beta, rule="softmax", dt=dt, integrator=integrator,
                               dtype=dtype, batch=3, path=path)
    stepper = ref.step_rk4 if integrator == "rk4" else ref.step_euler
    states = [x]
    for _ in range(23):
        states.append(stepper(states[-1], heads, beta, "softmax", "sphere", dt))
    for chunk in (5, 1, 17):
        sim.advance(chunk, observe_every=every)
    rows = sim.take_rows()
    assert [r["step"] for r in rows] == [0, 4, 8, 12, 16, 20]
    tol = 1e-9 if dtype == "float64" else 1e-4
    assert rel_err(sim.tokens, states[23]) < tol
    for row in rows:
        want = ref.observables(states[row["step"]], heads, beta, "softmax", "sphere")
        for key in OBSERVED:
            assert abs(row[key] - want[key]) <= tol * max(abs(want[key]), 1e-2), (row["step"], key)


@pytest.mark.parametrize("rule", ["softmax", "exp", "relu"])
def test_fused_and_tiled_ensembles_agree(rule):
    """Replicas with their own beta, 12 RK4 steps: the paths agree to the float32 tolerance."""
    R, n, d = 3, 17, 3
    xs = np.stack([random_tokens(n, d, s) for s in range(R)])
    betas = np.array([0.5, 1.0, 2.0])
    heads = general_heads(3, d, 4)
    out = {}
    for path in ("fused", "tiled"):
        sim = particles.Simulation(xs, heads, beta=betas, rule=rule, dtype="float32", dt=0.02, path=path)
        sim.advance(12, observe_every=6)
        out[path] = (sim.tokens, sim.take_rows())
    assert rel_err(out["fused"][0], out["tiled"][0]) < 1e-5
    for a, b in zip(out["fused"][1], out["tiled"][1]):
        assert (a["step"], a["replica"]) == (b["step"], b["replica"])
        assert abs(a["kinetic"] - b["kinetic"]) <= 1e-4 * abs(b["kinetic"])


def test_float32_fused_keeps_tokens_on_the_sphere_for_ten_thousand_steps():
    sim = particles.Simulation(random_tokens(40, 3, 2), general_heads(2, 3, 2), beta=3.0,
                               rule="softmax", dt=0.01, integrator="rk4", path="fused")
    sim.advance(10_000, observe_every=100)
    assert len(sim.take_rows()) == 100
    norms = np.linalg.norm(sim.native_tokens().astype(np.float64), axis=-1)
    assert np.max(np.abs(norms - 1.0)) < 1e-6


def test_auto_path_choice_and_errors(monkeypatch):
    # the path is chosen before the kernels are built: without the warm-up nothing compiles
    # (five builds of n = 256, 257 took ~20 s); the other tests here run every path
    monkeypatch.setattr(particles.Simulation, "_warm_up", lambda self: None)
    x = random_tokens(paths.FUSED_MAX_N, 3)
    heads = general_heads(1, 3)
    assert particles.Simulation(x, heads).path == "fused"
    assert particles.Simulation(x, heads, path="tiled").path == "tiled"
    assert particles.Simulation(x, heads, rule="softmax", entropy_rate=True).path == "tiled"
    bigger = random_tokens(paths.FUSED_MAX_N + 1, 3)
    assert particles.Simulation(bigger, heads, dtype="float64").path == "tiled"
    # float32: by the pair work n^2 H (r + rv + EXP_COST), either side of FUSED_MAX_WORK
    assert particles.Simulation(bigger, heads).path == "fused"
    def needs(n, H, r, d=3):
        return paths.Needs(rules=frozenset({"exponential"}), positions=False, layers=False,
                           entropy_rate=False, arch="cpu", n=n, d=d, H=H, r=r, rv=r, dtype="float32")
    assert paths.pair_work(1024, 1, 3, 3) <= paths.FUSED_MAX_WORK
    assert paths.choose("auto", needs(1024, 1, 3)).path == "fused"
    assert paths.pair_work(4096, 4, 16, 16) > paths.FUSED_MAX_WORK
    assert paths.choose("auto", needs(4096, 4, 16)).path == "tiled"
    assert paths.choose("auto", needs(64, 1, 3, d=paths.FUSED_MAX_D + 1)).path == "tiled"
    with pytest.raises(ValueError, match="path must be one of"):
        particles.Simulation(x, heads, path="fast")
    with pytest.raises(ValueError, match="which uses the entropy rate"):
        particles.Simulation(x, heads, rule="softmax", entropy_rate=True, path="fused")


def test_a_fused_simulation_builds_measures_and_caches_no_pass_it_does_not_run(monkeypatch, tmp_path):
    """Tuning on (conftest turns it off), an empty cache: 600 tokens take the fused path, whose
    kernel is the only code built; the wide pass (which n >= WIDE_MIN_N takes on the tiled
    path) is neither built nor timed, so no tuning entry is written."""
    from particles import tuning
    cache = tmp_path / "tuning.json"
    monkeypatch.setenv(tuning.ENV, "measure")
    monkeypatch.setenv(tuning.CACHE_ENV, str(cache))
    n = paths.WIDE_MIN_N + 88
    sim = particles.Simulation(random_tokens(n, 3), general_heads(1, 3), rule="softmax", integrator="euler")
    assert (sim.path, sim.implementation) == ("fused", "fused")
    assert sim.tuning == "-" and not cache.exists()
    assert all(head_pass is None for st in sim._layers for _, head_pass, _ in st.passes)


def test_a_tiled_simulation_of_the_same_size_asks_for_its_wide_tiles(monkeypatch):
    """The other side of the test above: on the tiled path the wide pass runs, and asks
    ``tuning`` for its tiles (here a stand-in that records the call)."""
    from particles import tuning
    asked = []

    def wide_tiles(dtype, key, prepare):
        asked.append(key)
        return tuning.Choice(tuning.WIDE_CANDIDATES[dtype][0], "recorded")
    monkeypatch.setattr(tuning, "wide_tiles", wide_tiles)
    n = paths.WIDE_MIN_N + 88
    fused = particles.Simulation(random_tokens(n, 3), general_heads(1, 3), rule="softmax", integrator="euler")
    assert fused.implementation == "fused" and asked == []
    tiled = particles.Simulation(random_tokens(n, 3), general_heads(1, 3), rule="softmax",
                                 integrator="euler", path="tiled")
    assert tiled.implementation == "wide" and len(asked) == 1 and tiled.tuning.endswith("(recorded)")


def test_the_plan_names_the_code_that_runs():
    """sim.path and sim.implementation: the rule, masks, mixed rules, n and the path decide the
    implementation of every pass, and only the operands it reads are allocated at full size."""
    from particles import Attention
    x, heads = random_tokens(20, 3), general_heads(2, 3)
    cases = [(dict(), "fused", "fused"), (dict(path="tiled"), "tiled", "fast"),
             (dict(path="plain"), "plain", "plain"), (dict(rule="relu", path="tiled"), "tiled", "plain"),
             (dict(path="tiled", attention=[Attention(mask="causal"), Attention()]), "tiled", "fast"),
             (dict(attention=[Attention(rule="relu"), Attention()]), "tiled", "plain")]
    for kwargs, path, implementation in cases:
        sim = particles.Simulation(x, heads, rule=kwargs.pop("rule", "softmax"), **kwargs)
        assert (sim.path, sim.implementation) == (path, implementation), kwargs
        full = sim.plan.operands
        for name in paths.OPERANDS:
            tokens = getattr(sim, f"_{name}").shape[2]
            assert tokens == (20 if name in full else 1), (kwargs, name)


def test_vector_exp_matches_numpy_over_the_clamped_range():
    """The fused and wide passes' float32 exp (a polynomial of e^(z/32), squared five times)
    against float64 np.exp on [CLAMP, 0]: absolute error (weights are <= 1) within 25 float32
    ulps of 1 (the squarings double the rounding five times), relative error within 5e-6 where
    the weight counts (z >= -10)."""
    import taichi as ti
    from particles import backend, kernel_math, kernels

    backend.init("cpu")
    L = 16
    vec = ti.types.vector(L, ti.f32)
    _, _, _, exp_clamped = kernel_math.vector_helpers(ti.f32, L)

    @ti.kernel
    def apply(z: ti.types.ndarray(dtype=vec, ndim=1), out: ti.types.ndarray(dtype=vec, ndim=1)):
        for i in range(z.shape[0]):
            out[i] = exp_clamped(z[i])

    z = np.concatenate([np.linspace(kernel_math.CLAMP, 0.0, 4000), [0.0, -1e-7, -0.5, -29.99]])
    z = np.resize(z.astype(np.float32), (-(-z.size // L) * L,))
    zin, out = ti.ndarray(vec, shape=(z.size // L,)), ti.ndarray(vec, shape=(z.size // L,))
    zin.from_numpy(z.reshape(-1, L))
    with kernels.compile_options(scalarize=False):
        apply(zin, out)
    got = out.to_numpy().reshape(-1).astype(np.float64)
    want = np.exp(z.astype(np.float64))
    assert np.max(np.abs(got - want)) < 25 * 2.0 ** -23
    heavy = z >= -10
    assert np.max(np.abs(got[heavy] - want[heavy]) / want[heavy]) < 5e-6


def _fused_run(monkeypatch, workers, x, heads, **kw):
    if workers == 1:
        monkeypatch.setattr(kernels_fused, "PARALLEL_MIN_WORK", float("inf"))
    else:
        monkeypatch.setattr(kernels_fused, "PARALLEL_MIN_WORK", 0.0)
        monkeypatch.setattr(kernels_fused, "available_threads", lambda: workers)
    sim = particles.Simulation(x, heads, path="fused", batch=4, **kw)
    assert sim._fused.workers == workers
    sim.advance(9, observe_every=3)
    sim.advance(4, observe_every=3)
    return sim.native_tokens(), sim.take_rows()


@pytest.mark.parametrize("n", [21, pytest.param(50, marks=pytest.mark.slow), pytest.param(70, marks=pytest.mark.slow)])
@pytest.mark.parametrize("rule,integrator,dtype", [("softmax", "rk4", "float32"),
                                                   ("softmax", "euler", "float64"),
                                                   ("relu", "rk4", "float32")])
def test_threads_sharing_a_fused_launch_change_no_number(monkeypatch, n, rule, integrator, dtype):
    """A launch shared by 2 or 3 threads (more threads than this machine may have cores: the
    ticket scheme must finish whoever turns up) gives bitwise the numbers of one thread, for
    row-tile shapes TR = 2, 4, 3 (n = 21, 50, 70 in float32) and an ensemble; and they are
    the reference's."""
    R, d, H, beta, dt = 2, 4, 3, 1.3, 0.03
    xs = np.stack([random_tokens(n, d, seed=s) for s in range(R)])
    heads = general_heads(H, d, seed=3)
    kw = dict(beta=beta, rule=rule, dt=dt, integrator=integrator, dtype=dtype)
    one = _fused_run(monkeypatch, 1, xs, heads, **kw)
    for workers in (2, 3):
        many = _fused_run(monkeypatch, workers, xs, heads, **kw)
        assert np.array_equal(many[0], one[0])
        assert [r["step"] for r in many[1]] == [r["step"] for r in one[1]] == [0, 0, 3, 3, 6, 6, 9, 9, 12, 12]
        for a, b in zip(many[1], one[1]):
            assert all(a[k] == b[k] or (np.isnan(a[k]) and np.isnan(b[k])) for k in b), (a, b)
    stepper = ref.step_rk4 if integrator == "rk4" else ref.step_euler
    state = xs[1].astype(np.float64)
    for _ in range(13):
        state = stepper(state, heads, beta, rule, "sphere", dt)
    assert rel_err(one[0][1].astype(np.float64), state) < (1e-9 if dtype == "float64" else 1e-4)
