"""Logged quantities against closed forms and the theorems they show (every quantity against the
float64 NumPy reference on every path: tests/test_engine.py)."""
import math

import numpy as np
import pytest

import particles
import reference as ref
from conftest import general_heads, random_tokens, symmetric_heads
from particles.observables import pairwise_extremes

RULES = ("exp", "softmax", "relu")


def observed_row(x, heads, beta, rule, geometry, dtype="float64", entropy_rate=False, path="auto"):
    sim = particles.Simulation(x, heads, beta=beta, rule=rule, geometry=geometry, dtype=dtype,
                               entropy_rate=entropy_rate, path=path)
    sim.observe()
    (row,) = sim.take_rows()
    return sim, row


@pytest.mark.parametrize("geometry", ["sphere", "flat"])
def test_theorem11_energy_rates(geometry):
    """Rule exp, symmetric M_h = V_h: sum_h energy_rate_h = kinetic; each energy_rate_h matches
    the finite-difference rate of energy_h."""
    x = random_tokens(12, 4, 8)
    heads = symmetric_heads(3, 4, 8)
    dt = 1e-3
    sim = particles.Simulation(x, heads, beta=0.9, rule="exp", geometry=geometry, dt=dt, dtype="float64")
    sim.advance(21, observe_every=1)
    rows = sim.take_rows()
    for row in rows:
        total = sum(row[f"energy_rate_h{h}"] for h in range(3))
        assert abs(total - row["kinetic"]) < 1e-12 * max(row["kinetic"], 1)
    for h in range(3):
        e = np.array([r[f"energy_h{h}"] for r in rows])
        rate = np.array([r[f"energy_rate_h{h}"] for r in rows])
        fd = (e[2:] - e[:-2]) / (2 * dt)  # central difference: O(dt^2)
        assert np.max(np.abs(fd - rate[1:-1])) < 1e-4 * np.max(np.abs(rate))  # O(dt^2) = 1e-6


def orthogonal_subspace_heads(d=4, strength=1.0):
    p1 = np.diag([1.0, 1.0, 0.0, 0.0]) * strength
    p2 = np.diag([0.0, 0.0, 1.0, 1.0]) * strength
    return [(p1, p1), (p2, p2)]


def test_orthogonal_heads_radial_shadow_obstruction():
    """M_2 M_1 = 0: cross-coupling vanishes; on the sphere some configuration has a head whose
    energy decreases (radial shadow), while in flat space no head's rate is ever negative."""
    heads = orthogonal_subspace_heads()
    found_negative_on_sphere = False
    for seed in range(40):
        x = random_tokens(6, 4, seed)
        for geometry in ("sphere", "flat"):
            sim = particles.Simulation(x, heads, beta=2.0, rule="exp", geometry=geometry, dt=0.01,
                                       dtype="float64")
            # flat space with rule exp runs away in finite time (e^{beta |x|^2} self-pull): stay early
            sim.advance(30 if geometry == "sphere" else 4, observe_every=5 if geometry == "sphere" else 1)
            sim.check_finite()
            for row in sim.take_rows():
                for h in range(2):
                    assert abs(row[f"cross_coupling_h{h}"]) < 1e-12 * max(1.0, row[f"tangent_power_h{h}"])
                    if geometry == "flat":
                        assert row[f"energy_rate_h{h}"] >= -1e-12
                        assert row[f"radial_shadow_h{h}"] == 0.0
                    elif row[f"energy_rate_h{h}"] < 0:
                        found_negative_on_sphere = True
    assert found_negative_on_sphere


def test_entropy_rate_matches_finite_difference():
    x = random_tokens(10, 4, 2)
    heads = general_heads(2, 4, 2)
    dt = 1e-3
    sim = particles.Simulation(x, heads, beta=1.5, rule="softmax", dt=dt, dtype="float64",
                               entropy_rate=True)
    sim.advance(11, observe_every=1)
    rows = sim.take_rows()
    for h in range(2):
        ent = np.array([r[f"entropy_mean_h{h}"] for r in rows])
        rate = np.array([r[f"entropy_rate_h{h}"] for r in rows])
        fd = (ent[2:] - ent[:-2]) / (2 * dt)
        assert np.max(np.abs(fd - rate[1:-1])) < 1e-4 * np.max(np.abs(rate)) + 1e-8


def test_entropy_rises_to_log_n_from_equiangular_start():
    n, d = 6, 8
    x = ref.equiangular_tokens(n, d, 0.0, seed=1)
    x = x + 1e-9 * random_tokens(n, d, 3)  # break nothing visible; keeps it generic
    heads = [particles.Head.scalar(lam, d) for lam in (0.7, 1.3)]
    sim = particles.Simulation(x, heads, beta=1.0, rule="softmax", dt=0.05, dtype="float64")
    sim.advance(600, observe_every=10)
    sim.observe()
    rows = sim.take_rows()
    for h in range(2):
        ent = np.array([r[f"entropy_mean_h{h}"] for r in rows])
        assert np.all(np.diff(ent) >= -1e-12)
        assert abs(ent[-1] - math.log(n)) < 1e-6


@pytest.mark.parametrize("rule", ["exp", "softmax"])
@pytest.mark.parametrize("H", [2, 3])
def test_radial_dominance_closed_form_at_orthonormal_tokens(rule, H):
    """rho_h(0) = (H-1) e^{2 beta alpha} / (n-1) (derived in tests/reference.py), crossing 1
    at beta = ln((n-1)/(H-1)) / (2 alpha); MODEL.md's beta* sits below it, where rho = c*(H)."""
    n, alpha = 8, 1.0
    x = ref.orthonormal_tokens(n, n, seed=0)
    heads = [particles.Head.scalar(alpha, n) for _ in range(H)]
    crossing = ref.radial_dominance_crossing_beta(H, n, alpha)
    for beta in (0.3, ref.beta_star(H, n, alpha), crossing, 1.2 * crossing):
        if beta <= 0:
            continue
        _, row = observed_row(x, heads, beta, rule, "sphere")
        want = ref.radial_dominance_orthonormal(H, n, alpha, beta, rule)
        assert abs(row["radial_dominance_h0"] - want) < 1e-10 * want
    below, above = (observed_row(x, heads, b, rule, "sphere")[1]["radial_dominance_h0"]
                    for b in (crossing * (1 - 1e-6), crossing * (1 + 1e-6)))
    assert below < 1 < above
    _, at_star = observed_row(x, heads, ref.beta_star(H, n, alpha), rule, "sphere")
    assert abs(at_star["radial_dominance_h0"] - ref.c_star(H)) < 1e-10


def test_pairwise_extremes_match_reference_without_n_by_n():
    x = np.concatenate([random_tokens(1, 3, s) + 0.01 * random_tokens(20, 3, s + 50) for s in range(3)])
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    min_cos, count = pairwise_extremes(x, 0.99, block=7)
    assert abs(min_cos - ref.min_cosine(x)) < 1e-12
    assert count == ref.count_clusters(x, 0.99) == 3


def test_relu_rule_without_weights_has_zero_entropy_and_energy_nan_for_potential_free_rule():
    import taichi as ti

    def bump(z):
        return ti.exp(-z * z)

    if "test_bump_nopot" not in particles.registered_rules():
        particles.register_rule("test_bump_nopot", kernel=bump, normalization="mean")
    x = random_tokens(7, 3, 0)
    _, row = observed_row(x, general_heads(1, 3), 1.0, "test_bump_nopot", "sphere")
    assert math.isnan(row["energy"]) and math.isnan(row["energy_h0"])
    assert np.isfinite(row["entropy_mean_h0"])


def test_one_cluster_labeller_matches_the_reference_at_any_block_size():
    """particles.clusters: counts, labels and min cosine against reference.py, whatever the
    block of rows it holds at once (built as a sparse graph, never n x n at once)."""
    from particles.clusters import cluster_labels, cluster_stats
    rng = np.random.default_rng(5)
    centres = random_tokens(4, 5, 9)
    x = np.concatenate([c + 0.03 * rng.standard_normal((15, 5)) for c in centres])[rng.permutation(60)]
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    for thr in (0.99, 0.95, 0.5, -1.0):
        want = ref.count_clusters(x, thr)
        for max_elems in (60, 60 * 7, 1 << 22):
            mins, counts = cluster_stats(x[None], thr, max_elems=max_elems)
            assert counts[0] == want
            assert abs(mins[0] - ref.min_cosine(x)) < 1e-12
        labels = cluster_labels(x, thr, max_elems=60 * 3)
        assert labels.max() + 1 == want and labels[0] == 0
        firsts = [np.flatnonzero(labels == k)[0] for k in range(want)]
        assert firsts == sorted(firsts)             # numbered by smallest member
        assert np.array_equal(labels, ref.cluster_labels(x, thr))
