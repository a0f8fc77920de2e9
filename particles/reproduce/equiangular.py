"""The equiangular reduction of scalar heads: gamma(t) from the one-dimensional ODE.

With scalar heads M_h = V_h = lambda_h I on an equiangular configuration (all pairwise
cosines gamma), the flow stays equiangular and

    dgamma/dt = 2 kappa(gamma) (1 - gamma) (1 + (n-1) gamma),
    softmax: kappa = sum_h lambda_h / (e^{beta lambda_h (1 - gamma)} + n - 1)
    exp:     kappa = (1/n) sum_h lambda_h e^{beta lambda_h gamma}.

Solved here by classical RK4 with a fine fixed step (an independent check of the engine,
which integrates n d-dimensional tokens instead).
"""
from __future__ import annotations

import math

import numpy as np


def kappa(gamma, lambdas, beta: float, n: int, rule: str = "softmax"):
    lam = np.asarray(lambdas, dtype=np.float64).reshape(-1, *([1] * np.ndim(gamma)))
    g = np.asarray(gamma, dtype=np.float64)
    if rule == "softmax":
        return np.sum(lam / (np.exp(beta * lam * (1.0 - g)) + (n - 1.0)), axis=0)
    if rule == "exp":
        return np.sum(lam * np.exp(beta * lam * g), axis=0) / n
    raise ValueError(f"the equiangular ODE is written for rules 'softmax' and 'exp', not {rule!r}")


def gamma_rate(gamma, lambdas, beta: float, n: int, rule: str = "softmax"):
    """dgamma/dt of the equiangular ODE."""
    g = np.asarray(gamma, dtype=np.float64)
    return 2.0 * kappa(g, lambdas, beta, n, rule) * (1.0 - g) * (1.0 + (n - 1.0) * g)


def gamma_curve(gamma0: float, lambdas, beta: float, n: int, times, rule: str = "softmax",
                max_step: float = 1e-3) -> np.ndarray:
    """gamma at the given increasing times (from gamma0 at t = 0), RK4 with steps <= max_step."""
    times = np.asarray(times, dtype=np.float64)
    out = np.empty(len(times))
    g, t = float(gamma0), 0.0
    f = lambda y: float(gamma_rate(y, lambdas, beta, n, rule))  # noqa: E731
    for k, target in enumerate(times):
        steps = max(1, int(math.ceil((target - t) / max_step - 1e-12))) if target > t else 0
        h = (target - t) / steps if steps else 0.0
        for _ in range(steps):
            k1 = f(g); k2 = f(g + 0.5 * h * k1); k3 = f(g + 0.5 * h * k2); k4 = f(g + h * k3)
            g += h / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
        t = target
        out[k] = g
    return out


def escape_time(level: float, gamma0: float, lambdas, beta: float, n: int, rule: str = "softmax",
                step: float = 1e-3, t_max: float = 1e4) -> float:
    """First t with gamma(t) >= level (RK4 with a fixed step, linear interpolation; nan if never)."""
    f = lambda y: float(gamma_rate(y, lambdas, beta, n, rule))  # noqa: E731
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
