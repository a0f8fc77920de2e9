"""Verdicts and the statistics behind them: least-squares fits with confidence intervals,
bootstrap over seeds, censored medians.

Every check of the report ends in one of three verdicts (plus "cannot decide" where the
experiment is too weak to tell), so that a reader sees at once whether the measurement
agrees with the theorem in its regime, disagrees, or lies outside what the theorem says
(information, not a passed check). Checks of algebraic identities, which only an arithmetic
bug could fail, say "identity holds" and are counted apart from the experiments whose
outcome was open.
"""
from __future__ import annotations

import math

import numpy as np

AGREES = "agrees"
DISAGREES = "disagrees"
OUTSIDE = "information (outside the theorem's assumptions)"   # reported, never a passed check
IDENTITY = "identity holds"   # an algebraic identity: only an arithmetic bug could fail it
UNDECIDED = "cannot decide"
VERDICTS = (AGREES, DISAGREES, IDENTITY, OUTSIDE, UNDECIDED)


def verdict(ok: bool) -> str:
    """agrees / disagrees from a criterion that was met or not."""
    return AGREES if ok else DISAGREES


def lstsq(X, y):
    """Ordinary least squares y ~ X @ coef; returns (coef, standard errors, residuals).

    X is (m, p). Standard errors are nan when there are no residual degrees of freedom.
    """
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ coef
    dof = X.shape[0] - X.shape[1]
    if dof > 0:
        s2 = float(resid @ resid) / dof
        cov = s2 * np.linalg.pinv(X.T @ X)
        se = np.sqrt(np.maximum(np.diag(cov), 0.0))
    else:
        se = np.full(X.shape[1], math.nan)
    return coef, se, resid


def censored_median(times) -> float:
    """Lower median of times where nan means 'never reached' (counted as +inf): finite exactly
    when at least half of the runs reached the level."""
    t = np.asarray(times, dtype=np.float64)
    v = np.where(np.isfinite(t), t, np.inf)
    return float(np.percentile(v, 50, method="lower"))


def bootstrap(samples: list, statistic, B: int = 400, seed: int = 0, level: float = 0.95):
    """Percentile bootstrap over independent groups of seeds.

    ``samples`` is a list of 1-D arrays (one group per measured point, e.g. the seeds of one
    (n, d)); each replicate resamples every group with replacement and evaluates
    ``statistic(list_of_resampled_groups)`` -> 1-D array. Returns (low, high) arrays of the
    central ``level`` interval, ignoring replicates where the statistic is not finite.
    """
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(B):
        res = [g[rng.integers(0, len(g), len(g))] for g in samples]
        draws.append(np.atleast_1d(np.asarray(statistic(res), dtype=np.float64)))
    draws = np.array(draws)
    a = (1 - level) / 2
    lo = np.array([np.nanpercentile(c[np.isfinite(c)], 100 * a) if np.isfinite(c).any() else math.nan
                   for c in draws.T])
    hi = np.array([np.nanpercentile(c[np.isfinite(c)], 100 * (1 - a)) if np.isfinite(c).any() else math.nan
                   for c in draws.T])
    return lo, hi


def ci_text(value, lo, hi, digits: int = 3) -> str:
    """'v [lo, hi]' for the report."""
    def f(x):
        return "n/a" if not np.isfinite(x) else f"{x:.{digits}g}"
    return f"{f(value)} [{f(lo)}, {f(hi)}]"
