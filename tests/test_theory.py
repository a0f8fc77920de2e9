"""particles.theory, the one home of the closed forms, held to tests/reference.py."""
import math

import numpy as np
import pytest

import reference
from particles import theory


@pytest.mark.parametrize("H", [1, 2, 3, 5, 8])
def test_c_star_and_beta_star_match_the_reference(H):
    assert theory.c_star(H) == pytest.approx(reference.c_star(H), rel=1e-15)
    c = theory.c_star(H)
    assert c * c + (H - 1) * c == pytest.approx(1.0, rel=1e-14)     # the defining identity
    for n, alpha in ((8, 1.0), (64, 0.7)):
        assert theory.beta_star(H, n, alpha) == pytest.approx(reference.beta_star(H, n, alpha), rel=1e-13)


def test_beta_star_one_answer_for_one_head():
    """One head has no radial coupling: beta* is +inf (never NaN), wherever it is asked."""
    assert theory.beta_star(1, 16) == math.inf
    with pytest.raises(ValueError, match="n >= 2"):
        theory.beta_star(2, 1)


def test_phi_and_its_inflection():
    beta, n = 1.3, 16
    lc = theory.lambda_c(beta, n)
    u = beta * lc
    assert math.exp(u) * (u - 2) == pytest.approx((n - 1) * (u + 2), rel=1e-12)   # phi'' = 0
    h = 1e-3 * lc

    def second(lam):
        return theory.phi(lam + h, beta, n) - 2 * theory.phi(lam, beta, n) + theory.phi(lam - h, beta, n)
    assert second(0.9 * lc) < 0 < second(1.1 * lc)   # concave before, convex after
    assert theory.phi(0.5, beta, n) == pytest.approx(reference.phi(0.5, beta, n), rel=1e-15)


@pytest.mark.parametrize("rule", ["softmax", "exp"])
def test_equiangular_rhs_matches_the_reference(rule):
    for g in (-0.05, 0.0, 0.3, 0.9):
        got = float(theory.equiangular_rhs(g, [1.0, 2.5], 1.2, 10, rule))
        assert got == pytest.approx(reference.equiangular_gamma_rhs(g, [1.0, 2.5], 1.2, 10, rule), rel=1e-13)


def test_eps_of_tokens_is_one_minus_the_mean_pairwise_cosine():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 9, 4))
    u = x / np.linalg.norm(x, axis=-1, keepdims=True)
    for r in range(3):
        cos = u[r] @ u[r].T
        mean = (cos.sum() - 9) / (9 * 8)
        assert theory.eps_of_tokens(x)[r] == pytest.approx(1 - mean, rel=1e-13)
