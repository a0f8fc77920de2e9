"""Exact properties of the initial configurations and of the head builders."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scenes import configurations as cf
from scenes import head_builders as hb

UNIT = 1e-12


def assert_unit(x):
    assert x.dtype == np.float64
    np.testing.assert_allclose(np.linalg.norm(x, axis=-1), 1.0, rtol=0, atol=UNIT)


def off_diagonal(g):
    return g[~np.eye(len(g), dtype=bool)]


# ----------------------------------------------------------------------------- random

def test_random_unit_seeded_and_spread():
    x = cf.random(200, 5, seed=3)
    assert x.shape == (200, 5)
    assert_unit(x)
    np.testing.assert_array_equal(x, cf.random(200, 5, seed=3))
    assert not np.array_equal(x, cf.random(200, 5, seed=4))
    assert np.linalg.norm(x.mean(axis=0)) < 0.25          # roughly uniform


def test_seed_must_be_a_nonnegative_int():
    with pytest.raises(ValueError, match="seed"):
        cf.random(3, 3, seed=-1)
    with pytest.raises(ValueError, match="seed"):
        cf.random(3, 3, seed=1.5)


# ----------------------------------------------------------------------------- equiangular

@pytest.mark.parametrize("n", [2, 3, 7, 12])
def test_equiangular_exact_for_every_gamma(n):
    gammas = [-1.0 / (n - 1), -0.5 / (n - 1), 0.0, 0.3, 0.75, 1.0]
    for gamma in gammas:
        for d in (n, n + 3):
            x = cf.equiangular(n, d, gamma, seed=5)
            assert x.shape == (n, d)
            assert_unit(x)
            np.testing.assert_allclose(off_diagonal(x @ x.T), gamma, rtol=0, atol=1e-12)


def test_equiangular_boundaries_need_fewer_dimensions():
    n = 6
    assert cf.equiangular_min_dim(n, -1 / (n - 1)) == n - 1
    assert cf.equiangular_min_dim(n, 1.0) == 1
    assert cf.equiangular_min_dim(n, 0.3) == n
    simplex = cf.equiangular(n, n - 1, -1 / (n - 1), seed=0)       # regular simplex in R^{n-1}
    np.testing.assert_allclose(off_diagonal(simplex @ simplex.T), -1 / (n - 1), atol=1e-12)
    np.testing.assert_allclose(simplex.sum(axis=0), 0.0, atol=1e-12)
    same = cf.equiangular(n, 2, 1.0, seed=0)
    np.testing.assert_allclose(same, np.broadcast_to(same[0], same.shape), atol=1e-15)


def test_equiangular_too_small_d_names_minimum():
    with pytest.raises(ValueError, match=r"minimum d = 8"):
        cf.equiangular(8, 7, 0.2)
    with pytest.raises(ValueError, match=r"minimum d = 7"):
        cf.equiangular(8, 6, -1 / 7)


def test_equiangular_gamma_out_of_range_names_range():
    with pytest.raises(ValueError, match=r"\[-1/\(n-1\), 1\]"):
        cf.equiangular(5, 5, -0.3)
    with pytest.raises(ValueError, match=r"\[-1/\(n-1\), 1\]"):
        cf.equiangular(5, 5, 1.01)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 10), extra=st.integers(0, 3), t=st.floats(0, 1), seed=st.integers(0, 99))
def test_equiangular_property(n, extra, t, seed):
    lo = -1.0 / (n - 1)
    gamma = lo + t * (1.0 - lo)
    x = cf.equiangular(n, n + extra, gamma, seed)
    assert_unit(x)
    np.testing.assert_allclose(off_diagonal(x @ x.T), gamma, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- orthogonal

def test_orthogonal_is_orthonormal():
    for n, d in [(1, 2), (5, 5), (4, 9)]:
        x = cf.orthogonal(n, d, seed=2)
        assert x.shape == (n, d)
        np.testing.assert_allclose(x @ x.T, np.eye(n), rtol=0, atol=1e-12)
    assert not np.allclose(cf.orthogonal(3, 5, 0), cf.orthogonal(3, 5, 1))


def test_orthogonal_n_greater_than_d_says_so():
    with pytest.raises(ValueError, match=r"n <= d.*n = 6 > d = 4"):
        cf.orthogonal(6, 4)


# ----------------------------------------------------------------------------- clusters

def test_clusters_round_robin_and_spread():
    centers = [[1, 0, 0], [0, 0, 2.0]]
    x = cf.clusters(10, 3, k=2, spread=0.05, seed=1, centers=centers)
    assert_unit(x)
    c = np.array([[1, 0, 0], [0, 0, 1.0]])
    cos = np.sum(x * c[np.arange(10) % 2], axis=1)
    assert np.all(cos > math.cos(0.05 * 6))                  # within ~4 sigma in 2 tangent dims
    exact = cf.clusters(6, 4, k=3, spread=0.0, seed=0)
    np.testing.assert_allclose(exact[0], exact[3], atol=1e-15)
    assert_unit(exact)


def test_clusters_angular_spread_matches():
    x = cf.clusters(3000, 3, k=1, spread=0.1, seed=0, centers=[[0, 0, 1]])
    angle = np.arccos(np.clip(x[:, 2], -1, 1))
    # the angle is the norm of a 2-D Gaussian tangent vector (std 0.1 per coordinate)
    assert abs(np.sqrt(np.mean(angle ** 2)) - 0.1 * math.sqrt(2)) < 0.005


def test_clusters_errors():
    with pytest.raises(ValueError, match=r"shape \(k, d\) = \(2, 3\)"):
        cf.clusters(5, 3, k=2, centers=[[1, 0, 0]])
    with pytest.raises(ValueError, match="zero"):
        cf.clusters(5, 3, k=2, centers=[[1, 0, 0], [0, 0, 0]])
    with pytest.raises(ValueError, match="k <= n"):
        cf.clusters(2, 3, k=3)


# ----------------------------------------------------------------------------- from_file

def test_from_file_formats(tmp_path):
    a = np.array([[3.0, 4.0], [0.0, -2.0], [1.0, 1.0]])
    np.save(tmp_path / "t.npy", a)
    np.savez(tmp_path / "named.npz", other=np.ones((2, 2)), tokens=a)
    np.savez(tmp_path / "first.npz", a)
    (tmp_path / "t.csv").write_text("3, 4\n0, -2\n1, 1\n")
    want = a / np.linalg.norm(a, axis=1, keepdims=True)
    for name in ("t.npy", "named.npz", "first.npz", "t.csv"):
        x = cf.from_file(tmp_path / name, n=3, d=2)
        np.testing.assert_allclose(x, want, atol=1e-15)
        assert_unit(x)


def test_from_file_errors_name_file_and_shape(tmp_path):
    np.save(tmp_path / "flat.npy", np.ones(5))
    with pytest.raises(ValueError, match=r"flat\.npy.*2-D.*found shape \(5,\)"):
        cf.from_file(tmp_path / "flat.npy")
    np.save(tmp_path / "t.npy", np.ones((4, 3)))
    with pytest.raises(ValueError, match=r"t\.npy.*expected shape \(4, 2\), found shape \(4, 3\)"):
        cf.from_file(tmp_path / "t.npy", n=4, d=2)
    np.save(tmp_path / "z.npy", np.array([[1.0, 0.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match=r"z\.npy.*row 1 is zero"):
        cf.from_file(tmp_path / "z.npy")
    (tmp_path / "bad.csv").write_text("1, a\n")
    with pytest.raises(ValueError, match=r"bad\.csv"):
        cf.from_file(tmp_path / "bad.csv")
    with pytest.raises(ValueError, match=r"nothere\.npy.*not found"):
        cf.from_file(tmp_path / "nothere.npy")
    (tmp_path / "t.txt").write_text("1, 0\n")
    with pytest.raises(ValueError, match=r"unsupported extension"):
        cf.from_file(tmp_path / "t.txt")


# ----------------------------------------------------------------------------- perturb

def test_perturb():
    x = cf.random(20, 4, seed=0)
    np.testing.assert_allclose(cf.perturb(x, 0.0, 0), x, atol=1e-15)
    y = cf.perturb(x, 0.01, seed=0)
    assert_unit(y)
    assert 0 < np.max(np.abs(y - x)) < 0.1
    np.testing.assert_array_equal(y, cf.perturb(x, 0.01, seed=0))
    # the noise stream differs from the construction stream: no degenerate rescaling
    assert np.max(np.abs(cf.perturb(x, 10.0, 0) - x)) > 0.1
    ens = cf.perturb(np.stack([x, x]), 0.01, seed=1)
    assert ens.shape == (2, 20, 4)
    assert_unit(ens)


# ----------------------------------------------------------------------------- heads

def test_scalar_heads():
    heads = hb.scalar([0.5, 2.0], 4)
    assert len(heads) == 2
    np.testing.assert_allclose(heads[1].score, 2.0 * np.eye(4))
    np.testing.assert_allclose(heads[1].value, 2.0 * np.eye(4))


def test_subspace_heads_disjoint_blocks_are_exactly_orthogonal():
    heads = hb.subspaces(7, [1.0, -2.0, 0.5], rank=2, start=1)
    for h, head in enumerate(heads):
        p = np.zeros((7, 7))
        idx = np.arange(1 + 2 * h, 3 + 2 * h)
        p[idx, idx] = 1.0
        np.testing.assert_array_equal(head.score, [1.0, -2.0, 0.5][h] * p)
        np.testing.assert_array_equal(head.value, head.score)       # aligned
        assert head.score_rank == 2
    for a in heads:
        for b in heads:
            if a is not b:
                assert np.all(b.score @ a.score == 0.0)
    with pytest.raises(ValueError, match=r"minimum d = 7"):
        hb.subspaces(6, [1.0, 1.0, 1.0], rank=2, start=1)


def test_subspace_from_basis_is_a_projector():
    head = hb.subspace(4, 3.0, basis=[[1, 1, 0, 0], [0, 1, 1, 0]])
    m = head.score
    np.testing.assert_allclose(m, m.T, atol=1e-14)
    np.testing.assert_allclose(m @ m, 3.0 * m, atol=1e-13)
    assert np.linalg.matrix_rank(m) == 2
    with pytest.raises(ValueError, match="linearly dependent"):
        hb.subspace(3, basis=[[1, 0, 0], [2, 0, 0]])
    with pytest.raises(ValueError, match=r"0 <= start < stop <= d = 3"):
        hb.subspace(3, block=[1, 4])


@pytest.mark.parametrize("count,rank,angle,d", [(2, 1, 75.0, 2), (3, 2, 75.0, 9),
                                                (4, 3, 30.0, 12), (3, 2, 90.0, 6)])
def test_near_orthogonal_principal_angles_exact(count, rank, angle, d):
    bases = hb.near_orthogonal_bases(count, d, rank, angle, seed=4)
    for h, b in enumerate(bases):
        assert b.shape == (d, rank)
        np.testing.assert_allclose(b.T @ b, np.eye(rank), atol=1e-12)
        for g in range(h + 1, count):
            sv = np.linalg.svd(b.T @ bases[g], compute_uv=False)
            angles = np.degrees(np.arccos(np.clip(sv, -1.0, 1.0)))
            np.testing.assert_allclose(angles, angle, rtol=0, atol=1e-10 if angle < 90 else 1e-6)
            np.testing.assert_allclose(sv, math.cos(math.radians(angle)), rtol=0, atol=1e-12)


def test_near_orthogonal_heads_operator_norm_and_min_dim():
    heads = hb.near_orthogonal(3, 7, rank=2, angle_deg=75.0, seed=0, strength=2.0)
    for a in heads:
        for b in heads:
            if a is not b:
                op = np.linalg.norm(b.score @ a.score, 2)
                assert abs(op - 4.0 * math.cos(math.radians(75.0))) < 1e-12
    with pytest.raises(ValueError, match=r"minimum d = 6"):
        hb.near_orthogonal(3, 5, rank=2)
    with pytest.raises(ValueError, match=r"\(0, 90\]"):
        hb.near_orthogonal(2, 4, angle_deg=0.0)


def test_random_heads():
    sym = hb.random_symmetric(6, seed=1, strength=2.0)
    np.testing.assert_allclose(sym.score, sym.score.T, atol=1e-15)
    np.testing.assert_array_equal(sym.score, hb.random_symmetric(6, seed=1, strength=2.0).score)
    r = hb.random(6, rank=2, seed=1)
    assert r.score_rank == 2 and np.linalg.matrix_rank(r.score) == 2
    assert not np.allclose(r.score, r.score.T)
    np.testing.assert_allclose(r.value, r.score)


def test_values_identity_and_noise():
    head = hb.subspace(4, 1.5, block=[0, 2])
    assert hb.with_value(head) is head
    ident = hb.with_value(head, "identity")
    np.testing.assert_allclose(ident.value, np.eye(4))
    np.testing.assert_allclose(ident.score, head.score)
    noisy = hb.with_value(head, "aligned", 0.1, seed=2)
    e = (noisy.value - head.score) / 0.1
    assert 0.3 < np.linalg.norm(e) / 4 < 2.0                 # ||E||_F ~ sqrt(d^2/d) = 2
    np.testing.assert_array_equal(noisy.value, hb.with_value(head, "aligned", 0.1, seed=2).value)
    assert not np.allclose(noisy.value, hb.with_value(head, "aligned", 0.1, seed=3).value)
    with pytest.raises(ValueError, match="value must be one of"):
        hb.with_value(head, "mirror")


def test_matrix_head():
    m = np.arange(9.0).reshape(3, 3)
    head = hb.matrix(m)
    np.testing.assert_allclose(head.score, m)
    np.testing.assert_allclose(head.value, m)
    head = hb.matrix(m, np.eye(3))
    np.testing.assert_allclose(head.value, np.eye(3))
