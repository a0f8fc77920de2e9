"""Closed forms of the model (docs/MODEL.md), in one place: the critical inverse temperature
(Theorem 19), the early clustering rate phi and its inflection (Theorem 22), the equiangular
ODE (Theorem 22) and the radial dominance at orthonormal tokens.

Plain NumPy; the tests hold each to tests/reference.py, an independent implementation.
"""
from __future__ import annotations

import math

import numpy as np

from .errors import ParticlesUserError

_trapezoid = getattr(np, "trapezoid", None) or getattr(np, "trapz")   # NumPy 2 renamed trapz


def c_star(H: float) -> float:
    """c*(H) = (sqrt((H-1)^2 + 4) - (H-1)) / 2, the root in (0, 1] of c^2 + (H-1) c = 1."""
    return float((math.sqrt((H - 1.0) ** 2 + 4.0) - (H - 1.0)) / 2.0)


def beta_star(H: int, n: int, alpha: float = 1.0) -> float:
    """Theorem 19: beta* = 1/(2 alpha) ln(c*^2 (n-1) / (1 - c*^2)) for H scalar heads alpha I
    and n orthonormal tokens.

    +inf for H = 1: one head has no radial coupling, so Condition 8 holds at every beta.
    """
    if n < 2 or not alpha > 0:
        raise ParticlesUserError(f"beta* needs n >= 2 and alpha > 0, got n = {n}, alpha = {alpha}")
    c = c_star(H)
    if c >= 1.0:
        return math.inf
    return float(math.log(c * c * (n - 1) / (1.0 - c * c)) / (2.0 * alpha))


def rho_orthonormal(H: int, n: int, alpha: float, beta: float) -> float:
    """rho_h at orthonormal tokens, H identical scalar heads alpha I: (H-1) e^{2 beta alpha}/(n-1)."""
    return float((H - 1) * math.exp(2.0 * beta * alpha) / (n - 1))


def rho_crossing_beta(H: int, n: int, alpha: float) -> float:
    """The beta at which rho_h(t=0) = 1 at orthonormal tokens: ln((n-1)/(H-1)) / (2 alpha)."""
    if H <= 1:
        return math.inf
    return float(math.log((n - 1.0) / (H - 1.0)) / (2.0 * alpha))


def phi(lam, beta: float, n: int):
    """phi(lambda) = 2 lambda / (e^{lambda beta} + n - 1): one scalar head's early rate at gamma = 0."""
    lam = np.asarray(lam, dtype=np.float64)
    out = 2.0 * lam / (np.exp(lam * beta) + n - 1.0)
    return float(out) if out.ndim == 0 else out


def lambda_c(beta: float, n: int) -> float:
    """Inflection point of phi(lambda) = 2 lambda / (e^{beta lambda} + n - 1).

    phi'' = 0  <=>  e^u (u - 2) = (n - 1)(u + 2) with u = beta lambda (the root with u > 2),
    solved by bisection to machine precision.
    """
    m = n - 1.0
    g = lambda u: math.exp(u) * (u - 2.0) - m * (u + 2.0)  # noqa: E731
    lo, hi = 2.0, 4.0
    while g(hi) < 0:
        hi *= 2
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if g(mid) < 0 else (lo, mid)
    return 0.5 * (lo + hi) / beta


def equiangular_rhs(gamma, strengths, beta: float, n: int, rule: str = "softmax"):
    """dgamma/dt = 2 kappa(gamma) (1 - gamma) (1 + (n-1) gamma) (Theorem 22), scalar heads
    of the given strengths from an equiangular start."""
    g = np.asarray(gamma, dtype=np.float64)
    lam = np.asarray(strengths, dtype=np.float64).reshape(-1, *([1] * g.ndim))
    if rule == "softmax":
        # lambda e^{b l g} / (e^{b l} + (n-1) e^{b l g}) = lambda / (e^{b l (1-g)} + n - 1)
        kappa = np.sum(lam / (np.exp(beta * lam * (1.0 - g)) + (n - 1.0)), axis=0)
    elif rule == "exp":
        kappa = np.sum(lam * np.exp(beta * lam * g), axis=0) / n
    else:
        raise ParticlesUserError("the equiangular ODE is known for rules 'softmax' and 'exp'")
    return 2.0 * kappa * (1.0 - g) * (1.0 + (n - 1.0) * g)


def equiangular_time(betas, strengths, n: int, rule: str = "softmax", gamma0: float = 0.0,
                     gamma1: float = 0.99, points: int = 20001) -> np.ndarray:
    """Time for the equiangular ODE to take gamma from gamma0 to gamma1, per beta:
    T = int_{gamma0}^{gamma1} dgamma / F(gamma) (F > 0 on (-1/(n-1), 1)), by the trapezoid rule on
    ``points`` nodes. inf when gamma0 is a fixed point (-1/(n-1) or 1); 0 when gamma0 >= gamma1."""
    betas = np.atleast_1d(np.asarray(betas, dtype=np.float64))
    out = np.zeros(betas.shape)
    if gamma0 >= gamma1:
        return out
    if gamma0 <= -1.0 / (n - 1) + 1e-15:
        return np.full(betas.shape, np.inf)
    g = np.linspace(gamma0, gamma1, points)
    for i, b in enumerate(betas):
        with np.errstate(over="ignore", divide="ignore"):
            f = equiangular_rhs(g, strengths, float(b), n, rule)
            out[i] = _trapezoid(1.0 / f, g) if np.all(f > 0) else np.inf
    return out


def equiangular_curve(gamma0: float, lambdas, beta: float, n: int, times, rule: str = "softmax",
                max_step: float = 1e-3) -> np.ndarray:
    """gamma at the given increasing times (from gamma0 at t = 0) of the equiangular ODE, by classical
    RK4 with steps <= max_step (an independent check of the engine, which integrates n tokens)."""
    times = np.asarray(times, dtype=np.float64)
    out = np.empty(len(times))
    g, t = float(gamma0), 0.0
    f = lambda y: float(equiangular_rhs(y, lambdas, beta, n, rule))  # noqa: E731
    for k, target in enumerate(times):
        steps = max(1, int(math.ceil((target - t) / max_step - 1e-12))) if target > t else 0
        h = (target - t) / steps if steps else 0.0
        for _ in range(steps):
            k1 = f(g); k2 = f(g + 0.5 * h * k1); k3 = f(g + 0.5 * h * k2); k4 = f(g + h * k3)
            g += h / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
        t = target
        out[k] = g
    return out


def equiangular_escape_time(level: float, gamma0: float, lambdas, beta: float, n: int, rule: str = "softmax",
                step: float = 1e-3, t_max: float = 1e4) -> float:
    """First t with gamma(t) >= level (RK4 with a fixed step, linear interpolation; nan if never)."""
    f = lambda y: float(equiangular_rhs(y, lambdas, beta, n, rule))  # noqa: E731
    g, t, h = float(gamma0), 0.0, step
    if g >= level:
        return 0.0
    while t < t_max:
        k1 = f(g); k2 = f(g + 0.5 * h * k1); k3 = f(g + 0.5 * h * k2); k4 = f(g + h * k3)
        g1 = g + h / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
        if g1 >= level:
            return t + h * (level - g) / (g1 - g)
        g, t = g1, t + h
    return math.nan


def eps_of_tokens(x) -> np.ndarray:
    """eps = 1 - mean pairwise cosine, per replica of x (R, n, d) (the log's ``eps``), in float64."""
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[1]
    with np.errstate(invalid="ignore", divide="ignore"):
        u = x / np.linalg.norm(x, axis=-1, keepdims=True)
        s = u.sum(axis=1)
        gamma = (np.einsum("rd,rd->r", s, s) - n) / (n * (n - 1)) if n > 1 else np.ones(len(x))
    return 1.0 - gamma


__all__ = ["c_star", "beta_star", "rho_orthonormal", "rho_crossing_beta", "phi", "lambda_c",
           "equiangular_rhs", "equiangular_time", "eps_of_tokens"]


# ----------------------------------------------------------------- normalisation placements
# The equiangular reduction under a LayerNorm placement (docs/MODEL.md, "Normalisation
# placements"): scalar heads, every token's direction moves along P_theta A at the placement's
# speed s, all tokens sharing one radius r (r = 1 at t = 0).
LATE_CONTRACTION = {   # eps(t) late on: kind and exponent (docs/MODEL.md)
    "post": "exp(-2 Lambda t)", "ngpt": "exp(-2 alpha t)", "pre": "t^-2 (r^-2, r ~ Lambda t)",
    "peri": "t^-2 (r^-2, r ~ t)"}


def _equiangular_pull(gamma: float, strengths, beta: float, n: int, rule: str):
    """(<theta_i, A_i>, |A_i|, post-LN dgamma/dt) at an equiangular state of unit tokens."""
    lam = np.asarray(strengths, dtype=np.float64)
    if rule == "softmax":
        other = 1.0 / (np.exp(beta * lam * (1.0 - gamma)) + (n - 1.0))
        own = np.exp(beta * lam * (1.0 - gamma)) * other
    elif rule == "exp":
        other, own = np.exp(beta * lam * gamma) / n, np.exp(beta * lam) / n
    else:
        raise ParticlesUserError("the equiangular ODE is known for rules 'softmax' and 'exp'")
    c, e = float(np.sum(lam * own)), float(np.sum(lam * other))   # A_i = c theta_i + e sum_{j!=i} theta_j
    radial = c + e * (n - 1.0) * gamma
    norm = math.sqrt(max(c * c + 2 * c * e * (n - 1.0) * gamma + e * e * (n - 1.0) * (1.0 + (n - 2.0) * gamma), 0.0))
    return radial, norm, 2.0 * e * (1.0 - gamma) * (1.0 + (n - 1.0) * gamma)


def equiangular_placement_rhs(gamma: float, radius: float, strengths, beta: float, n: int,
                              rule: str = "softmax", placement: str = "post", alpha: float = 1.0):
    """(dgamma/dt, dr/dt): post s = 1; pre s = 1/r, rdot = <theta, A>; peri s = 1/(r |A|),
    rdot = <theta, A>/|A|; ngpt s = alpha/|A| (r = 1)."""
    radial, norm, rate = _equiangular_pull(gamma, strengths, beta, n, rule)
    if placement == "post":
        return rate, 0.0
    if placement == "pre":
        return rate / radius, radial
    if placement == "peri":
        return rate / (radius * norm), radial / norm
    if placement == "ngpt":
        return alpha * rate / norm, 0.0
    raise ParticlesUserError(f"unknown placement {placement!r}")


def equiangular_placement_curve(gamma0: float, lambdas, beta: float, n: int, times, rule: str = "softmax",
                                placement: str = "post", alpha: float = 1.0, max_step: float = 1e-3):
    """(gamma, r) at the given increasing times from (gamma0, 1), by classical RK4 with steps
    <= max_step (the engine integrates n tokens; this integrates two numbers)."""
    times = np.asarray(times, dtype=np.float64)
    out = np.empty((len(times), 2))
    y, t = np.array([float(gamma0), 1.0]), 0.0
    f = lambda p: np.array(equiangular_placement_rhs(p[0], p[1], lambdas, beta, n, rule,  # noqa: E731
                                                     placement, alpha))
    for k, target in enumerate(times):
        steps = max(1, int(math.ceil((target - t) / max_step - 1e-12))) if target > t else 0
        h = (target - t) / steps if steps else 0.0
        for _ in range(steps):
            k1 = f(y); k2 = f(y + 0.5 * h * k1); k3 = f(y + 0.5 * h * k2); k4 = f(y + h * k3)
            y = y + h / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
        t = target
        out[k] = y
    return out[:, 0], out[:, 1]
