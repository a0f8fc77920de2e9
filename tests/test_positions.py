"""Masks, positional biases, position-aware rules, per-head rules and betas, layer schedules:
the engine against the float64 reference (tests/reference.py), plus exact identities."""
from pathlib import Path

import numpy as np
import pytest

import particles
import reference as ref
from conftest import RTOL, general_heads, random_tokens, rel_err
from particles import Attention, Layer, Schedule

ROOT = Path(__file__).resolve().parents[1]


def _recency_rule():
    """The example file's rule, registered from the file; its NumPy twin for the reference."""
    particles.load_rule_file(ROOT / "examples" / "recency_rule.py")

    def twin(z, i, j, n):
        return 1.0 / (1.0 + np.exp(-z)) / (1.0 + np.abs(i - j))
    return "sigmoid_recency", ref.PositionalRule(twin, "softmax")


def _cases():
    """name -> (engine attention per head, reference specs per head), 3 heads."""
    slopes = particles.alibi_slopes(3)
    engine_user, ref_user = _recency_rule()
    return {
        "causal_softmax": ([Attention(mask="causal")] * 3, [ref.HeadSpec("softmax", mask="causal")] * 3),
        "causal_exp": ([Attention(mask="causal", rule="exp")] * 3, [ref.HeadSpec("exp", mask="causal")] * 3),
        "causal_relu": ([Attention(mask="causal", rule="relu")] * 3, [ref.HeadSpec("relu", mask="causal")] * 3),
        "window_softmax": ([Attention(mask="window", window=3)] * 3,
                           [ref.HeadSpec("softmax", mask="window", window=3)] * 3),
        "alibi_softmax": ([Attention(alibi=m) for m in slopes],
                          [ref.HeadSpec("softmax", alibi=m) for m in ref.alibi_slopes(3)]),
        "mixed_heads": ([Attention(mask="causal", beta=2.0), Attention(mask="causal_window", window=2, rule="relu"),
                         Attention(alibi=0.5, rule="exp", beta=0.7)],
                        [ref.HeadSpec("softmax", mask="causal", beta=2.0),
                         ref.HeadSpec("relu", mask="causal_window", window=2),
                         ref.HeadSpec("exp", alibi=0.5, beta=0.7)]),
        "user_positional": ([Attention(rule=engine_user), Attention(rule=engine_user, mask="causal"),
                             Attention(rule=engine_user, alibi=0.25)],
                            [ref.HeadSpec(ref_user), ref.HeadSpec(ref_user, mask="causal"),
                             ref.HeadSpec(ref_user, alibi=0.25)]),
    }


CASES = tuple(_cases())


def test_alibi_slopes_are_the_papers_geometric_sequence():
    assert particles.alibi_slopes(8) == [2.0 ** -k for k in range(1, 9)]
    assert particles.alibi_slopes(4) == [0.25, 0.0625, 0.015625, 0.00390625]


# the fast tier checks each case on the sphere in float32; the full suite in all four
@pytest.mark.parametrize("case, geometry, dtype", [
    pytest.param(c, g, t, id=f"{c}-{g}-{t}",
                 marks=() if (g, t) == ("sphere", "float32") else pytest.mark.slow)
    for c in CASES for g in ("sphere", "flat") for t in ("float64", "float32")])
def test_velocity_and_steps_match_reference(case, geometry, dtype):
    n, d, beta, dt = 13, 4, 1.3, 0.05
    attention, specs = _cases()[case]
    x = random_tokens(n, d, seed=3)
    heads = general_heads(3, d, seed=5)
    want = ref.spec_velocity(x, heads, beta, specs, geometry)
    for integrator in ("euler", "rk4"):
        sim = particles.Simulation(x, heads, beta=beta, rule="softmax", geometry=geometry, dt=dt,
                                   integrator=integrator, dtype=dtype, attention=attention)
        assert rel_err(sim.velocity(), want) < RTOL[dtype]
        sim.advance(2)
        expect = ref.spec_step(ref.spec_step(x, heads, beta, specs, geometry, dt, integrator),
                               heads, beta, specs, geometry, dt, integrator)
        assert rel_err(sim.tokens, expect) < 2 * RTOL[dtype]


@pytest.mark.parametrize("geometry", ["sphere", "flat"])
def test_observables_match_reference_and_energy_is_nan(geometry):
    n, d, beta = 11, 4, 1.1
    attention, specs = _cases()["mixed_heads"]
    x = random_tokens(n, d, seed=8)
    heads = general_heads(3, d, seed=2)
    sim = particles.Simulation(x, heads, beta=beta, rule="softmax", geometry=geometry, dtype="float64",
                               attention=attention)
    sim.observe()
    row = sim.take_rows()[0]
    want = ref.spec_observables(x, heads, beta, specs, geometry)
    for key, value in want.items():
        assert row[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    assert np.isnan(row["energy"]) and all(np.isnan(row[f"energy_h{h}"]) for h in range(3))


def test_per_head_beta_keeps_the_energy_of_unmasked_heads():
    """Full attention with its own beta still has a potential: E_h uses the head's beta."""
    n, d = 9, 3
    x = random_tokens(n, d, seed=4)
    heads = general_heads(2, d, seed=4)
    sim = particles.Simulation(x, heads, beta=1.0, rule="softmax", dtype="float64",
                               attention=[Attention(beta=2.5), Attention(rule="relu")])
    sim.observe()
    row = sim.take_rows()[0]
    assert row["energy_h0"] == pytest.approx(ref.energy_per_head(x, heads[:1], 2.5, "softmax")[0], rel=1e-10)
    assert row["energy_h1"] == pytest.approx(ref.energy_per_head(x, heads[1:], 1.0, "relu")[0], rel=1e-10)


@pytest.mark.parametrize("rule", ["softmax", "exp", "relu"])
@pytest.mark.parametrize("integrator", ["euler", "rk4"])
def test_a_mask_that_excludes_nothing_equals_the_unmasked_rule(rule, integrator):
    """window >= n - 1 and causal_window with w >= n - 1 see every key a plain (or causal)
    head sees: the same sums in the same order (path 'plain'), the same numbers. Bit for bit
    for the exponential rules; ReLU's key loop has no running maximum, so LLVM vectorises
    its sums, and the banded kernel (loop bounds from the band) and the plain one may split
    them into lanes differently: on a Zen 4 EPYC (family 25) window vs none differed by
    1 ulp in the tokens (1.2e-7) and 1.4e-6 relative in a row after 20 RK4 steps, while
    a Zen 5 was bitwise. So ReLU is held to float32 rounding, far below what a key the
    mask wrongly hid or showed would change (~1e-2)."""
    n, d = 12, 3
    x = random_tokens(n, d, seed=6)
    heads = general_heads(2, d, seed=6)
    pairs = (({"attention": None}, {"attention": Attention(mask="window", window=n - 1)}),
             ({"attention": Attention(mask="causal")},
              {"attention": Attention(mask="causal_window", window=n + 5)}))
    for plain, masked in pairs:
        runs = []
        for kw in (plain, masked):
            sim = particles.Simulation(x, heads, beta=1.7, rule=rule, dt=0.05, integrator=integrator,
                                       dtype="float32", path="plain", **kw)
            sim.advance(20, observe_every=5)
            runs.append((sim.native_tokens(), sim.take_rows()))
        bitwise = rule != "relu"
        if bitwise:
            assert np.array_equal(runs[0][0], runs[1][0])
        else:
            np.testing.assert_allclose(runs[1][0], runs[0][0], rtol=0, atol=1e-6)
        for a, b in zip(runs[0][1], runs[1][1]):
            for key in a:
                if key.startswith("energy"):  # the masked head has no potential by definition
                    continue
                if np.isnan(a[key]) and np.isnan(b[key]):
                    continue
                if bitwise:
                    assert a[key] == b[key], key
                else:
                    assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    assert np.max(np.abs(runs[0][0][0] - x)) > 1e-3  # it moved: the equality is not of a frozen state


def _kqv_tokens(n, seed):
    """Random tokens in S^1 with the first on an axis (exactly unit in every float type, so
    the tangent projection of a radial velocity is exactly zero); M random non-symmetric."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 2))
    x[0] = (0.0, 1.0)
    M = rng.standard_normal((2, 2)) + np.array([[0.0, 0.6], [-0.6, 0.0]])
    assert abs(M[0, 1] - M[1, 0]) > 0.1  # non-symmetric
    return x, [particles.Head.from_matrices(M, np.eye(2))]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("integrator", ["euler", "rk4"])
def test_causal_first_token_never_moves_when_v_is_identity(dtype, integrator):
    """Token 0 sees only itself: f_0 = V x_0 = x_0, radial, so its velocity is exactly 0.
    Token 0 is compared bit for bit at every step; the others must move, and without the
    mask token 0 must move too (the check cannot pass by a frozen or trivial run)."""
    x, heads = _kqv_tokens(24, seed=2)
    kw = dict(beta=8.0, rule="softmax", dt=0.05, integrator=integrator, dtype=dtype)
    sim = particles.Simulation(x, heads, attention=Attention(mask="causal"), **kw)
    first = sim.native_tokens()[0, 0].copy()
    for _ in range(60):
        sim.advance(1)
        assert np.array_equal(sim.native_tokens()[0, 0], first)
    moved = np.linalg.norm(sim.tokens[1:] - random_unit(x)[1:], axis=1)
    assert np.median(moved) > 0.1
    free = particles.Simulation(x, heads, **kw)
    free.advance(60)
    assert np.linalg.norm(free.tokens[0] - first) > 1e-2


def random_unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_causal_first_token_drift_is_rounding_for_a_generic_start():
    """For a first token off the axes the projection leaves |x|^2 - 1 of rounding size: its
    drift stays at the float64 rounding level while the rest moves O(1)."""
    x, heads = _kqv_tokens(24, seed=3)
    x[0] = (0.6, -1.3)
    sim = particles.Simulation(x, heads, beta=8.0, rule="softmax", dt=0.05, dtype="float64",
                               attention=Attention(mask="causal"))
    sim.advance(100)
    assert np.max(np.abs(sim.tokens[0] - random_unit(x)[0])) < 1e-14
    assert np.median(np.linalg.norm(sim.tokens[1:] - random_unit(x)[1:], axis=1)) > 0.1


def _three_layers(d):
    h1, h2, h3 = general_heads(2, d, 1), general_heads(2, d, 2), general_heads(2, d, 3)
    engine = [Layer(h1), Layer(h2, rule="relu", attention=Attention(mask="causal")),
              Layer(h3, attention=[Attention(alibi=0.5), Attention(mask="window", window=2, beta=2.0)])]
    reference = [(h1, [ref.HeadSpec("softmax")] * 2), (h2, [ref.HeadSpec("relu", mask="causal")] * 2),
                 (h3, [ref.HeadSpec("softmax", alibi=0.5), ref.HeadSpec("softmax", mask="window", window=2,
                                                                         beta=2.0)])]
    return engine, reference


@pytest.mark.parametrize("geometry", ["sphere", "flat"])
@pytest.mark.parametrize("integrator", ["euler", "rk4"])
def test_layer_schedule_matches_reference(geometry, integrator):
    n, d, beta, dt, starts = 10, 3, 1.2, 0.04, (0, 4, 9)
    x = random_tokens(n, d, 7)
    engine, reference = _three_layers(d)
    sim = particles.Simulation(x, Schedule(engine, starts), beta=beta, rule="softmax", geometry=geometry,
                               dt=dt, integrator=integrator, dtype="float64")
    sim.advance(14, observe_every=1)
    want = ref.run_schedule(x, reference, starts, beta, 14, geometry, dt, integrator)
    assert rel_err(sim.tokens, want) < 1e-9
    rows = sim.take_rows()
    assert [r["layer"] for r in rows] == [ref.layer_at(starts, s) for s in range(14)]
    assert all(np.isnan(r["energy"]) for r in rows)
    assert all(np.isfinite(r["kinetic"]) and np.isfinite(r["entropy_mean_h1"]) for r in rows)


def test_schedule_every_and_resume_bitwise():
    """A run resumed from a saved state in a later layer equals the uninterrupted run."""
    n, d = 10, 3
    x = random_tokens(n, d, 9)
    engine, _ = _three_layers(d)
    schedule = Schedule.every(engine, 5)
    assert schedule.starts == (0, 5, 10) and schedule.layer_at(4) == 0 and schedule.layer_at(99) == 2
    kw = dict(beta=1.5, rule="softmax", dt=0.05, dtype="float32")
    whole = particles.Simulation(x, schedule, **kw)
    whole.advance(13)
    part = particles.Simulation(x, schedule, **kw)
    part.advance(7)
    saved, step = part.native_tokens(), part.step_count
    resumed = particles.Simulation(x, schedule, **kw)
    resumed.set_tokens(saved, step=step)
    assert resumed.layer == 1
    resumed.advance(6)
    assert np.array_equal(resumed.native_tokens(), whole.native_tokens())


def test_bad_attention_and_schedules_are_refused_clearly():
    with pytest.raises(ValueError, match="mask must be one of"):
        Attention(mask="diagonal")
    with pytest.raises(ValueError, match="needs a window"):
        Attention(mask="window")
    with pytest.raises(ValueError, match="window is given"):
        Attention(window=3)
    with pytest.raises(ValueError, match=r"alibi \(the ALiBi slope\)"):
        Attention(alibi=-1.0)
    with pytest.raises(ValueError, match="unknown rule"):
        Attention(rule="no_such_rule")
    with pytest.raises(ValueError, match="start steps"):
        Schedule((Layer([np.eye(2)]), Layer([np.eye(2)])), (0, 0))
    x = random_tokens(5, 2, 0)
    with pytest.raises(ValueError, match="same number of heads"):
        particles.Simulation(x, Schedule((Layer([np.eye(2)]), Layer([np.eye(2)] * 2)), (0, 3)))
    with pytest.raises(ValueError, match="entropy rate"):
        particles.Simulation(x, [np.eye(2)], rule="softmax", entropy_rate=True,
                             attention=Attention(mask="causal"))
    with pytest.raises(ValueError, match="attention has 2 entries"):
        particles.Simulation(x, [np.eye(2)], attention=[Attention(), Attention()])


def test_position_aware_rule_registration_is_checked():
    import taichi as ti

    def two_args(z, i):
        return ti.exp(z)

    def four_args(z, i, j, n):
        return ti.exp(z)

    def potential(z):
        return ti.exp(z)

    with pytest.raises(ValueError, match="takes 2 arguments"):
        particles.register_rule("test_two_args", kernel=two_args)
    with pytest.raises(ValueError, match="has no potential"):
        particles.register_rule("test_positional_potential", kernel=four_args, potential=potential)
    rule = particles.register_rule("test_positional_ok", kernel=four_args, overwrite=True)
    assert rule.positional and not rule.has_potential


# the fast tier: every mask in float32, float64 with the causal one
@pytest.mark.parametrize("mask, window, dtype", [
    pytest.param(mask, window, dtype, marks=() if dtype == "float32" or mask == "causal" else pytest.mark.slow)
    for dtype in ("float32", "float64") for mask, window in (("causal", None), ("window", 37), ("causal_window", 90))])
def test_masked_exponential_heads_take_the_tiled_cpu_path(mask, window, dtype):
    """Masks alone keep exp/softmax heads on the tiled CPU path (large tiles at n = 300: the
    key blocks outside a row tile's band are skipped, edge blocks masked); against the
    reference. Biases and per-head betas take the plain kernels."""
    n, d, beta = 300, 4, 1.3
    x = random_tokens(n, d, 12)
    heads = general_heads(2, d, 12)
    for rule in ("softmax", "exp"):
        sim = particles.Simulation(x, heads, beta=beta, rule=rule, dtype=dtype,
                                   attention=Attention(mask=mask, window=window))
        assert type(sim._heads).__name__ == "FastHeads"
        specs = [ref.HeadSpec(rule, mask=mask, window=window)] * 2
        assert rel_err(sim.velocity(), ref.spec_velocity(x, heads, beta, specs)) < RTOL[dtype]
        sim.observe()
        row = sim.take_rows()[0]
        for key, value in ref.spec_observables(x, heads, beta, specs).items():
            assert row[key] == pytest.approx(value, rel=1e-9 if dtype == "float64" else 2e-5, abs=1e-12), key
    mixed = particles.Simulation(x[:20], heads, beta=beta, rule="softmax",
                                 attention=[Attention(), Attention(rule="exp")])
    assert type(mixed._heads).__name__ == "PlainHeads"  # one pass per rule: the plain kernels


# the fast tier: small tiles in float64, large tiles in float32
@pytest.mark.parametrize("n, dtype", [
    pytest.param(n, dtype, marks=() if (n, dtype) in ((13, "float64"), (300, "float32")) else pytest.mark.slow)
    for n in (13, 300) for dtype in ("float32", "float64")])
def test_alibi_and_head_betas_on_the_tiled_cpu_path(n, dtype):
    """ALiBi slopes (with and without a mask) and per-head betas on the tiled path."""
    d, beta = 4, 1.3
    x = random_tokens(n, d, 13)
    heads = general_heads(2, d, 13)
    for rule in ("softmax", "exp"):
        attention = [Attention(mask="causal", alibi=0.2, beta=0.5, rule=rule), Attention(alibi=0.05, beta=2.0)]
        specs = [ref.HeadSpec(rule, mask="causal", alibi=0.2, beta=0.5), ref.HeadSpec(rule, alibi=0.05, beta=2.0)]
        if rule == "exp":
            attention[1] = Attention(alibi=0.05, beta=2.0, rule="exp")
            specs[1] = ref.HeadSpec("exp", alibi=0.05, beta=2.0)
        sim = particles.Simulation(x, heads, beta=beta, rule=rule, dtype=dtype, attention=attention)
        assert type(sim._heads).__name__ == "FastHeads"
        assert rel_err(sim.velocity(), ref.spec_velocity(x, heads, beta, specs)) < RTOL[dtype]
        sim.advance(1)
        assert rel_err(sim.tokens, ref.spec_step(x, heads, beta, specs, "sphere", 0.01, "rk4")) < 2 * RTOL[dtype]
