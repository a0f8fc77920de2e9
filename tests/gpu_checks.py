"""The checks of test_gpu.py, each run in its own process: Taichi is initialised once per
process, so a GPU check cannot share the CPU process of the main suite.

    python tests/gpu_checks.py CHECK [ARGS...]     (arch from PARTICLES_TEST_ARCH, default gpu)

Every check holds the engine on the GPU to tests/reference.py (float64 NumPy) at float32
tolerance, and exits non-zero with the failed assertion otherwise.
"""
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reference as ref  # noqa: E402
from conftest import RTOL, general_heads, random_tokens, rel_err  # noqa: E402

import particles  # noqa: E402
from row_checks import assert_row_matches  # noqa: E402

ARCH = os.environ.get("PARTICLES_TEST_ARCH", "gpu")
TOL = RTOL["float32"]
# The tiled GPU pair pass at these ranks: blocks of 64 threads x 4 rows, key tiles of 64.
# N = 300 spans two row blocks and five key tiles, the last of each partial; the ensemble's
# 600 tokens span three row blocks. test_gpu.py adds d = 40 (full heads: one row per thread,
# key tiles of 32).
N, D, N_ENSEMBLE = 300, 5, 600


def _rule_and_reference(rule: str):
    """The engine's rule name and the reference's rule for it (a user rule for 'user')."""
    if rule != "user":
        return rule, rule
    import taichi as ti

    def gpu_sigmoid(z):
        return 1 / (1 + ti.exp(-z))

    def gpu_softplus(z):
        return ti.log(1 + ti.exp(z))

    particles.register_rule("gpu_sigmoid", kernel=gpu_sigmoid, normalization="softmax",
                            potential=gpu_softplus, overwrite=True)
    user = ref.UserRule(kernel=lambda z: 1 / (1 + np.exp(-z)), normalization="softmax",
                        potential=lambda z: np.log1p(np.exp(z)))
    return "gpu_sigmoid", user


def _check_row(row, want, H, entropy_rate):
    """An observed row against the reference (the tolerances of test_observables, float32)."""
    assert_row_matches(row, want, H, 2e-5, entropy_rate)


def engine(rule: str, n: str = str(N), d: str = str(D)) -> None:
    """Velocity, one Euler and one RK4 step, and every observable, on both geometries."""
    name, ref_rule = _rule_and_reference(rule)
    n, d = int(n), int(d)
    H, beta, dt = 2, 1.2, 0.05
    heads = general_heads(H, d, seed=3)
    exponential = rule in ("exp", "softmax")
    for geometry in ("sphere", "flat"):
        x = random_tokens(n, d, seed=1)
        if geometry == "flat":
            x = x * np.linspace(0.5, 1.5, n)[:, None]
        want_v = ref.velocity(x, heads, beta, ref_rule, geometry)
        for integrator, stepper in (("euler", ref.step_euler), ("rk4", ref.step_rk4)):
            sim = particles.Simulation(x, heads, beta=beta, rule=name, geometry=geometry, dt=dt,
                                       integrator=integrator, dtype="float32", arch=ARCH,
                                       entropy_rate=exponential)
            assert sim.arch != "cpu" and type(sim._heads).__name__ == "TiledHeads", sim.arch
            assert rel_err(sim.velocity(), want_v) < TOL, (geometry, integrator, "velocity")
            sim.observe()
            (row,) = sim.take_rows()
            want = ref.observables(x, heads, beta, ref_rule, geometry, entropy_rate=exponential)
            if geometry == "flat":  # gamma_bar: the mean pairwise cosine of the unit tokens
                unit = x / np.linalg.norm(x, axis=1, keepdims=True)
                want.update({k: ref.observables(unit, heads, beta, ref_rule, geometry)[k]
                             for k in ("gamma_bar", "eps")})
            _check_row(row, want, H, exponential)
            per, per_want = sim.per_token(), ref.per_token(x, heads, beta, ref_rule, geometry)
            for key in per_want:
                np.testing.assert_allclose(per[key], per_want[key], rtol=2e-4, atol=2e-4, err_msg=key)
            sim.advance(1)
            got = sim.tokens
            assert rel_err(got, stepper(x, heads, beta, ref_rule, geometry, dt)) < TOL, (geometry, integrator)
    print(f"engine {rule} n={n} d={d}: ok on {sim.arch}")


def ensemble() -> None:
    """R replicas with their own beta, low-rank heads, against the reference per replica."""
    R, H, dt = 3, 2, 0.05
    rng = np.random.default_rng(5)
    heads = [particles.Head.from_factors(rng.standard_normal((2, D)), rng.standard_normal((2, D)),
                                         rng.standard_normal((D, 3)), rng.standard_normal((3, D)))
             for _ in range(H)]
    full = [(h.score, h.value) for h in heads]
    x = np.stack([random_tokens(N_ENSEMBLE, D, seed=s) for s in range(R)])
    betas = np.array([0.5, 1.0, 2.0])
    sim = particles.Simulation(x, heads, beta=betas, rule="softmax", dt=dt, integrator="rk4",
                               dtype="float32", arch=ARCH)
    sim.observe()
    rows = sim.take_rows()
    sim.advance(1)
    for b in range(R):
        (row,) = [r for r in rows if r["replica"] == b]
        _check_row(row, ref.observables(x[b], full, betas[b], "softmax", "sphere"), H, False)
        want = ref.step_rk4(x[b], full, betas[b], "softmax", "sphere", dt)
        assert rel_err(sim.tokens[b], want) < TOL, b
    print(f"ensemble: ok on {sim.arch}")


def reproducible() -> None:
    """Two runs from the same state on one device agree bitwise (gather-only writes)."""
    x = random_tokens(N, D, seed=4)
    runs = []
    for _ in range(2):
        sim = particles.Simulation(x, general_heads(2, D, seed=4), beta=1.5, rule="softmax", dt=0.05,
                                   integrator="euler", dtype="float32", arch=ARCH)
        sim.advance(10, observe_every=2)
        runs.append((sim.native_tokens(), sim.take_rows()))
    assert np.array_equal(runs[0][0], runs[1][0])
    assert runs[0][1] == runs[1][1]
    print(f"reproducible: ok on {sim.arch}")


def blow_up() -> None:
    """A NaN on the device is found, and reported with its step and token (finite_check)."""
    x = random_tokens(6, 3, 1)
    sim = particles.Simulation(x, [(np.eye(3), np.eye(3))], beta=1.0, rule="exp", geometry="flat",
                               dt=50.0, integrator="euler", dtype="float32", arch=ARCH)
    try:
        for _ in range(50):
            sim.advance(1)
            sim.check_finite()
    except particles.BlowUpError as err:
        assert err.step == sim.step_count and "token" in str(err), err
        bad = ~np.isfinite(sim.native_tokens()[0]).all(axis=-1)
        assert bad[err.token] and not bad[:err.token].any(), (err.token, bad)
        print(f"blow_up: ok on {sim.arch}")
        return
    raise AssertionError("no blow-up found in 50 steps of dt = 50")


def trajectory(out: str, arch: str, steps: str = "100") -> None:
    """Run `steps` Euler steps up to t = 4 with observables at 20 of them (every steps/20th)
    and save the tokens and the log. (100 steps: on Mesa's software Vulkan a step costs ~0.1 s
    whatever its size.)"""
    steps = int(steps)
    x = random_tokens(96, 4, seed=11)
    sim = particles.Simulation(x, general_heads(2, 4, seed=2), beta=2.0, rule="softmax", dt=4.0 / steps,
                               integrator="euler", dtype="float32", arch=arch)
    sim.advance(steps, observe_every=steps // 20)
    rows = sim.take_rows()
    keys = sorted(k for k in rows[0] if isinstance(rows[0][k], float))
    np.savez(out, tokens=sim.native_tokens(), log=np.array([[r[k] for k in keys] for r in rows]),
             keys=np.array(keys), arch=sim.arch)
    print(f"trajectory: {steps} steps on {sim.arch}")


def positions(*sizes: str) -> None:
    """positions_at each size "NxD" (default 600x5), in this one process; then a causal first
    token with V = I held bit for bit over 40 steps, at the first size's n."""
    import taichi as ti

    def gpu_recency(z, i, j, n):
        return 1 / (1 + ti.exp(-z)) / (1 + ti.abs(i - j))

    particles.register_rule("gpu_recency", kernel=gpu_recency, overwrite=True)
    recency = ref.PositionalRule(lambda z, i, j, n: 1 / (1 + np.exp(-z)) / (1 + np.abs(i - j)))
    sizes = [tuple(map(int, size.split("x"))) for size in sizes or (f"{N_ENSEMBLE}x{D}",)]
    for n, d in sizes:
        positions_at(n, d, recency)
    causal_first_token(sizes[0][0])


def positions_at(n: int, d: int, recency) -> None:
    """Masks (causal, windows across key tiles), ALiBi, per-head rules and betas and a
    position-aware rule (gpu_recency, registered) against the reference: velocity,
    observables, Euler and RK4 steps."""
    from particles import Attention

    cases = {
        "causal": ([Attention(mask="causal")] * 2, [ref.HeadSpec("softmax", mask="causal")] * 2),
        "window": ([Attention(mask="window", window=70), Attention(mask="causal_window", window=300)],
                   [ref.HeadSpec("softmax", mask="window", window=70),
                    ref.HeadSpec("softmax", mask="causal_window", window=300)]),
        "alibi_mixed": ([Attention(alibi=0.05, beta=2.0), Attention(rule="relu", mask="causal")],
                        [ref.HeadSpec("softmax", alibi=0.05, beta=2.0), ref.HeadSpec("relu", mask="causal")]),
        "user": ([Attention(rule="gpu_recency"), Attention(rule="gpu_recency", mask="causal")],
                 [ref.HeadSpec(recency), ref.HeadSpec(recency, mask="causal")]),
    }
    heads = general_heads(2, d, seed=3)
    beta, dt = 1.2, 0.05
    x = random_tokens(n, d, seed=1)
    for name, (attention, specs) in cases.items():
        for integrator in ("euler", "rk4"):
            sim = particles.Simulation(x, heads, beta=beta, rule="softmax", dt=dt, integrator=integrator,
                                       dtype="float32", arch=ARCH, attention=attention)
            assert sim.arch != "cpu" and type(sim._heads).__name__ == "TiledHeads", sim.arch
            assert rel_err(sim.velocity(), ref.spec_velocity(x, heads, beta, specs)) < TOL, (name, "velocity")
            sim.observe()
            (row,) = sim.take_rows()
            for key, value in ref.spec_observables(x, heads, beta, specs).items():
                assert abs(row[key] - value) <= 2e-4 * max(abs(value), 1e-2), (name, key, row[key], value)
            sim.advance(1)
            want = ref.spec_step(x, heads, beta, specs, "sphere", dt, integrator)
            assert rel_err(sim.tokens, want) < TOL, (name, integrator)
    print(f"positions n={n} d={d}: ok on {sim.arch}")


def causal_first_token(n: int) -> None:
    """Under a causal mask the first token attends to itself only: with V = I it is held bit
    for bit over 40 steps while the others move."""
    from particles import Attention

    rng = np.random.default_rng(2)
    y = rng.standard_normal((n, 2))
    y[0] = (0.0, 1.0)
    M = rng.standard_normal((2, 2)) + np.array([[0.0, 0.6], [-0.6, 0.0]])
    sim = particles.Simulation(y, [particles.Head.from_matrices(M, np.eye(2))], beta=8.0, rule="softmax",
                               dt=0.05, dtype="float32", arch=ARCH, attention=Attention(mask="causal"))
    first = sim.native_tokens()[0, 0].copy()
    for _ in range(40):
        sim.advance(1)
        assert np.array_equal(sim.native_tokens()[0, 0], first)
    assert np.median(np.abs(sim.tokens[1:] - y[1:] / np.linalg.norm(y[1:], axis=1, keepdims=True))) > 1e-2
    print(f"causal first token n={n}: ok on {sim.arch}")


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
