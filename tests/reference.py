"""Independent float64 NumPy reference for the multi-head attention particle model.

This module restates ``docs/MODEL.md`` as plainly as possible, in float64, with
full n x n matrices.  It is the oracle the engine is held against, so it imports
nothing from ``particles``, ``scenes`` or ``render``; clarity wins over speed.

Notation (MODEL.md)
-------------------
x        (n, d) tokens; rows x_i (unit vectors for the sphere geometry).
heads    list of (M_h, V_h) pairs of d x d arrays (V_h = None means V_h = M_h).
s^h_ij = <x_i, M_h x_j>                       (``scores``)
w^h_ij = k(beta s^h_ij) / N^h_i               (``weights``)
f^h_i  = sum_j w^h_ij V_h x_j                 (``head_outputs``)
v_i    = sum_h f^h_i;  sphere: xdot_i = v_i - <v_i, x_i> x_i;  flat: xdot_i = v_i
E_h    = 1/(2 beta n^2) sum_ij K(beta s^h_ij) (``energy_per_head``)

Rules
-----
``rule`` is one of the built-in names

=========  ============  =============  =====================
name       kernel k(z)   normalisation  potential K (K' = k)
=========  ============  =============  =====================
"exp"      e^z           mean (N = n)   e^z
"softmax"  e^z           softmax        e^z
"relu"     max(z, 0)     mean           max(z, 0)^2 / 2
=========  ============  =============  =====================

or a user rule, built as ``UserRule(kernel=f, normalization="softmax"|"mean",
potential=g_or_None)`` (vectorised NumPy callables of z; a dict with the same keys
is accepted too).  A user rule without a potential has energy ``nan``.

Conventions that MODEL.md leaves open (stated here once)
--------------------------------------------------------
* Entropy of row i uses p^h_ij = k(beta s^h_ij) / sum_j k(beta s^h_ij), whatever
  the normalisation of the dynamics (for exp and softmax this is softmax_j), with
  0 log 0 = 0.  A row whose kernel weights are all 0 (possible for relu) has
  entropy 0 by definition.
* a^h_i = <f^h_i, x_i> is reported in both geometries (``radial_mean``,
  ``radial_absmax``, per-token ``radial_h``), but in the flat geometry there is no
  projection, so the radial shadow coupling R_h and the dominance ratio rho_h are 0.
* rho_h = (1/n) sum_i sum_{h'!=h} |a^h_i a^h'_i| / T_h; when T_h = 0 it is +inf if
  the numerator is positive and 0 if the numerator is 0 too.
* gamma_bar = (||sum_i x_i||^2 - n) / (n (n-1)) exactly as MODEL.md writes it (it
  assumes unit tokens; in the flat geometry it is that same formula); nan for n = 1.
* ``min_cosine`` and ``count_clusters`` use cosines <x_i, x_j>/(|x_i||x_j|), which
  are the inner products <x_i, x_j> for unit tokens.
* ``entropy_rate`` (Theorem 27) is defined for the exponential kernels (rules
  "exp" and "softmax"); it is nan for relu and for user rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

import numpy as np

__all__ = [
    "UserRule", "scores", "weights", "head_outputs", "velocity",
    "step_euler", "step_rk4", "energy_per_head", "log_energy_per_head",
    "observables", "per_token", "entropy_rows", "entropy_rate_rows",
    "min_cosine", "cluster_labels", "count_clusters",
    "c_star", "beta_star", "phi", "equiangular_gamma_rhs", "solve_equiangular_gamma",
    "radial_dominance_orthonormal", "radial_dominance_crossing_beta",
    "radial_cs_ratio_orthonormal",
    "orthonormal_tokens", "equiangular_tokens",
    "PositionalRule", "HeadSpec", "alibi_slopes", "visible", "spec_weights", "spec_head_outputs",
    "spec_velocity", "spec_step", "spec_entropy_rows", "spec_observables", "layer_at", "run_schedule",
]

GEOMETRIES = ("sphere", "flat")


# --------------------------------------------------------------------------- rules

@dataclass(frozen=True)
class UserRule:
    """A user-defined interaction rule (vectorised NumPy callables of z = beta*s)."""

    kernel: Callable[[np.ndarray], np.ndarray]
    normalization: str = "softmax"
    potential: Optional[Callable[[np.ndarray], np.ndarray]] = None

    def __post_init__(self):
        if self.normalization not in ("softmax", "mean"):
            raise ValueError(f"normalization must be 'softmax' or 'mean', got {self.normalization!r}")


_BUILTIN = ("exp", "softmax", "relu")

RuleLike = Union[str, UserRule, dict]


def _rule(rule: RuleLike):
    """Return (name, kernel, normalization, potential, exponential) for a rule."""
    if isinstance(rule, dict):
        rule = UserRule(**rule)
    if isinstance(rule, UserRule):
        return ("user", rule.kernel, rule.normalization, rule.potential, False)
    if rule == "exp":
        return ("exp", np.exp, "mean", np.exp, True)
    if rule == "softmax":
        return ("softmax", np.exp, "softmax", np.exp, True)
    if rule == "relu":
        return ("relu", lambda z: np.maximum(z, 0.0), "mean",
                lambda z: 0.5 * np.maximum(z, 0.0) ** 2, False)
    raise ValueError(f"unknown rule {rule!r}; built-in rules are {_BUILTIN} (or pass a UserRule)")


def _heads(heads):
    out = []
    for h in heads:
        if isinstance(h, np.ndarray) and h.ndim == 3:   # stacked (2, d, d) = (M, V)
            h = (h[0], h[1])
        if isinstance(h, (tuple, list)):
            M, V = (h[0], h[1]) if len(h) > 1 else (h[0], None)
        else:
            M, V = h, None
        M = np.asarray(M, dtype=np.float64)
        V = M if V is None else np.asarray(V, dtype=np.float64)
        out.append((M, V))
    return out


def _check_geometry(geometry):
    if geometry not in GEOMETRIES:
        raise ValueError(f"geometry must be one of {GEOMETRIES}, got {geometry!r}")


def _logsumexp(z, axis=None):
    """log sum exp z along axis (row-max shifted); -inf for an all -inf slice."""
    z = np.asarray(z, dtype=np.float64)
    m = np.max(z, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(z - m), axis=axis, keepdims=True)) + m
    return np.squeeze(out, axis=axis) if axis is not None else out.reshape(())[()]


# ------------------------------------------------------------------ the dynamics

def scores(x, M):
    """S (n x n) with S_ij = <x_i, M x_j>, i.e. S = x M x^T."""
    x = np.asarray(x, dtype=np.float64)
    return x @ np.asarray(M, dtype=np.float64) @ x.T


def weights(x, M, beta, rule: RuleLike = "exp"):
    """W (n x n), w_ij = k(beta s_ij) / N_i.

    Exponential kernels are evaluated with a row-max shift m_i = max_j z_ij:
    softmax: w_ij = e^{z_ij - m_i} / sum_j e^{z_ij - m_i};
    exp (mean): w_ij = e^{z_ij - m_i} * e^{m_i - log n}, which only overflows
    when the weight itself does.
    """
    name, k, norm, _, expo = _rule(rule)
    z = beta * scores(x, M)
    n = z.shape[0]
    if expo:
        m = z.max(axis=1, keepdims=True)
        e = np.exp(z - m)
        if norm == "softmax":
            return e / e.sum(axis=1, keepdims=True)
        return e * np.exp(m - np.log(n))
    kz = np.asarray(k(z), dtype=np.float64)
    if norm == "softmax":
        N = kz.sum(axis=1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(N != 0, kz / np.where(N != 0, N, 1.0), 0.0)
    return kz / n


def head_outputs(x, heads, beta, rule: RuleLike = "exp"):
    """F (H, n, d), f^h_i = sum_j w^h_ij V_h x_j."""
    x = np.asarray(x, dtype=np.float64)
    return np.stack([weights(x, M, beta, rule) @ (x @ V.T) for M, V in _heads(heads)])


def _project(x, v, geometry):
    if geometry == "sphere":
        return v - np.sum(v * x, axis=-1, keepdims=True) * x
    return v


def velocity(x, heads, beta, rule: RuleLike = "exp", geometry="sphere"):
    """xdot (n, d): v = sum_h f^h; sphere: v - <v, x> x (x as given, not renormalised); flat: v."""
    _check_geometry(geometry)
    x = np.asarray(x, dtype=np.float64)
    v = head_outputs(x, heads, beta, rule).sum(axis=0)
    return _project(x, v, geometry)


def _retract(x, geometry):
    if geometry == "sphere":
        return x / np.linalg.norm(x, axis=-1, keepdims=True)
    return x


def step_euler(x, heads, beta, rule: RuleLike = "exp", geometry="sphere", dt=0.01):
    """Explicit Euler x + dt xdot(x), then (sphere) retraction x <- x/|x|. Order 1."""
    x = np.asarray(x, dtype=np.float64)
    return _retract(x + dt * velocity(x, heads, beta, rule, geometry), geometry)


def step_rk4(x, heads, beta, rule: RuleLike = "exp", geometry="sphere", dt=0.01):
    """Classical RK4 in the ambient space on xdot = velocity(x), then (sphere) retraction.

    Stage points x + dt/2 k1 etc. are *not* renormalised: the sphere velocity
    v - <v, x> x is evaluated at them as they are.  Order 4.
    """
    x = np.asarray(x, dtype=np.float64)
    f = lambda y: velocity(y, heads, beta, rule, geometry)  # noqa: E731
    k1 = f(x)
    k2 = f(x + 0.5 * dt * k1)
    k3 = f(x + 0.5 * dt * k2)
    k4 = f(x + dt * k3)
    return _retract(x + (dt / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4), geometry)


# ------------------------------------------------------------------------ energy

def log_energy_per_head(x, heads, beta, rule: RuleLike = "exp"):
    """(H,) log E_h, for beta > 0.

    Exponential potential: log E_h = logsumexp_ij(beta s^h_ij) - log(2 beta n^2),
    finite in float64 even when beta*s is several hundred.  Other potentials:
    log of the direct sum (-inf where E_h = 0, nan where E_h < 0 or undefined).
    """
    name, _, _, K, expo = _rule(rule)
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    if beta <= 0:
        raise ValueError("log_energy_per_head needs beta > 0 (use energy_per_head)")
    out = []
    for M, _V in _heads(heads):
        z = beta * scores(x, M)
        if expo:
            out.append(_logsumexp(z) - np.log(2.0 * beta * n * n))
        elif K is None:
            out.append(np.nan)
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                out.append(np.log(np.sum(K(z)) / (2.0 * beta * n * n)))
    return np.array(out, dtype=np.float64)


def energy_per_head(x, heads, beta, rule: RuleLike = "exp"):
    """(H,) E_h = 1/(2 beta n^2) sum_ij K(beta s^h_ij); nan for a user rule without potential.

    For the exponential potential and beta > 0 it is exp(log_energy_per_head) so that
    beta*s up to ~700 stays finite (E itself must fit in a float64).
    """
    name, _, _, K, expo = _rule(rule)
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    if expo and beta > 0:
        return np.exp(log_energy_per_head(x, heads, beta, rule))
    out = []
    for M, _V in _heads(heads):
        if K is None:
            out.append(np.nan)
            continue
        z = beta * scores(x, M)
        with np.errstate(divide="ignore", invalid="ignore"):
            out.append(np.sum(K(z)) / (2.0 * beta * n * n))
    return np.array(out, dtype=np.float64)


# ----------------------------------------------------------------------- entropy

def _row_probabilities(z, rule):
    """p_ij = k(z_ij)/sum_j k(z_ij) and log p_ij (rows of zero mass give p = 0)."""
    name, k, _, _, expo = _rule(rule)
    if expo:
        logp = z - _logsumexp(z, axis=1)[:, None]
        return np.exp(logp), logp
    kz = np.asarray(k(z), dtype=np.float64)
    N = kz.sum(axis=1, keepdims=True)
    safeN = np.where(N != 0, N, 1.0)
    p = np.where(N != 0, kz / safeN, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = np.log(p)
    return p, logp


def entropy_rows(x, M, beta, rule: RuleLike = "exp"):
    """(n,) H_i = -sum_j p_ij log p_ij with 0 log 0 = 0 (and H_i = 0 for an all-zero row)."""
    p, logp = _row_probabilities(beta * scores(x, M), rule)
    terms = np.where(p > 0, p * np.where(p > 0, logp, 0.0), 0.0)
    return -terms.sum(axis=1)


def entropy_rate_rows(x, xdot, M, beta, rule: RuleLike = "softmax"):
    """(n,) dH_i/dt = -beta^2 Cov_{p_i}(s_i., sdot_i.)  (Theorem 27; exponential kernels only).

    sdot_ij = <xdot_i, M x_j> + <x_i, M xdot_j>.  nan for non-exponential kernels.
    """
    _name, _, _, _, expo = _rule(rule)
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    if not expo:
        return np.full(n, np.nan)
    M = np.asarray(M, dtype=np.float64)
    s = x @ M @ x.T
    sdot = xdot @ M @ x.T + x @ M @ xdot.T
    p, _ = _row_probabilities(beta * s, rule)
    ms = np.sum(p * s, axis=1)
    msd = np.sum(p * sdot, axis=1)
    cov = np.sum(p * (s - ms[:, None]) * (sdot - msd[:, None]), axis=1)
    return -beta ** 2 * cov


# ------------------------------------------------------------------- observables

def _per_head_terms(x, heads, beta, rule, geometry):
    """F (H,n,d), a (H,n), xdot (n,d), T (H,), C (H,), R (H,), rho (H,)."""
    _check_geometry(geometry)
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    F = head_outputs(x, heads, beta, rule)                       # (H, n, d)
    H = F.shape[0]
    v = F.sum(axis=0)
    xdot = _project(x, v, geometry)
    a = np.einsum("hnd,nd->hn", F, x)                            # radial shadows a^h_i
    PF = np.stack([_project(x, F[h], geometry) for h in range(H)])
    T = np.einsum("hnd,hnd->h", PF, PF) / n
    C = np.zeros(H)
    R = np.zeros(H)
    Rabs = np.zeros(H)
    for h in range(H):
        for g in range(H):
            if g == h:
                continue
            C[h] += np.sum(F[h] * F[g]) / n
            if geometry == "sphere":
                R[h] += np.sum(a[h] * a[g]) / n
                Rabs[h] += np.sum(np.abs(a[h] * a[g])) / n
    rho = np.empty(H)
    for h in range(H):
        if T[h] > 0:
            rho[h] = Rabs[h] / T[h]
        else:
            rho[h] = np.inf if Rabs[h] > 0 else 0.0
    return F, a, xdot, T, C, R, rho


def observables(x, heads, beta, rule: RuleLike = "exp", geometry="sphere", entropy_rate=False):
    """The logged quantities of one state, keys as the log columns of docs/LOG.md (no step/time).

    energy, kinetic, gamma_bar, eps, and for each head h: energy_h{h},
    tangent_power_h{h}, cross_coupling_h{h}, radial_shadow_h{h}, energy_rate_h{h},
    radial_mean_h{h}, radial_absmax_h{h}, radial_dominance_h{h}, entropy_mean_h{h},
    entropy_min_h{h}, entropy_max_h{h}, and (entropy_rate=True) entropy_rate_h{h}.
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    hs = _heads(heads)
    F, a, xdot, T, C, R, rho = _per_head_terms(x, hs, beta, rule, geometry)
    E = energy_per_head(x, hs, beta, rule)
    ssum = x.sum(axis=0)
    gamma_bar = (float(ssum @ ssum) - n) / (n * (n - 1)) if n > 1 else np.nan
    out = {
        "energy": float(np.sum(E)),
        "kinetic": float(np.sum(xdot * xdot) / n),
        "gamma_bar": float(gamma_bar),
        "eps": float(1.0 - gamma_bar),
    }
    for h, (M, _V) in enumerate(hs):
        ent = entropy_rows(x, M, beta, rule)
        out[f"energy_h{h}"] = float(E[h])
        out[f"tangent_power_h{h}"] = float(T[h])
        out[f"cross_coupling_h{h}"] = float(C[h])
        out[f"radial_shadow_h{h}"] = float(R[h])
        out[f"energy_rate_h{h}"] = float(T[h] + C[h] - R[h])
        out[f"radial_mean_h{h}"] = float(np.mean(a[h]))
        out[f"radial_absmax_h{h}"] = float(np.max(np.abs(a[h])))
        out[f"radial_dominance_h{h}"] = float(rho[h])
        out[f"entropy_mean_h{h}"] = float(np.mean(ent))
        out[f"entropy_min_h{h}"] = float(np.min(ent))
        out[f"entropy_max_h{h}"] = float(np.max(ent))
        if entropy_rate:
            out[f"entropy_rate_h{h}"] = float(np.mean(entropy_rate_rows(x, xdot, M, beta, rule)))
    return out


def per_token(x, heads, beta, rule: RuleLike = "exp", geometry="sphere"):
    """Per-token arrays: radial_h{h} = a^h_i = <f^h_i, x_i>, entropy_h{h} = H^h_i."""
    x = np.asarray(x, dtype=np.float64)
    hs = _heads(heads)
    _check_geometry(geometry)
    F = head_outputs(x, hs, beta, rule)
    out = {}
    for h, (M, _V) in enumerate(hs):
        out[f"radial_h{h}"] = np.sum(F[h] * x, axis=1)
        out[f"entropy_h{h}"] = entropy_rows(x, M, beta, rule)
    return out


# ------------------------------------------------------------ clustering measures

def _cosines(x):
    x = np.asarray(x, dtype=np.float64)
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    return u @ u.T


def min_cosine(x):
    """min_{i != j} cos(x_i, x_j); 1.0 for a single token."""
    G = _cosines(x)
    n = G.shape[0]
    if n < 2:
        return 1.0
    return float(np.min(G[~np.eye(n, dtype=bool)]))


def cluster_labels(x, threshold):
    """Connected components of the graph i ~ j iff cos(x_i, x_j) > threshold.

    Labels are 0, 1, ... in order of each component's smallest token index.
    """
    G = _cosines(x) > threshold
    n = G.shape[0]
    labels = np.full(n, -1, dtype=np.int64)
    cur = 0
    for start in range(n):
        if labels[start] >= 0:
            continue
        stack = [start]
        labels[start] = cur
        while stack:
            i = stack.pop()
            for j in np.nonzero(G[i] & (labels < 0))[0]:
                labels[j] = cur
                stack.append(j)
        cur += 1
    return labels


def count_clusters(x, threshold):
    """Number of connected components of i ~ j iff <x_i, x_j> > threshold (unit tokens)."""
    labels = cluster_labels(x, threshold)
    return int(labels.max() + 1) if labels.size else 0


# ----------------------------------------------------------------- closed forms

def c_star(H):
    """c*(H) = (sqrt((H-1)^2 + 4) - (H-1)) / 2: the root in (0, 1] of c^2 + (H-1) c = 1."""
    H = np.asarray(H, dtype=np.float64)
    out = (np.sqrt((H - 1.0) ** 2 + 4.0) - (H - 1.0)) / 2.0
    return float(out) if out.ndim == 0 else out


def beta_star(H, n, alpha):
    """beta* = 1/(2 alpha) ln( c*(H)^2 (n-1) / (1 - c*(H)^2) )  (Theorem 19; +inf for H = 1).

    Since 1 - c*^2 = (H-1) c*, this equals 1/(2 alpha) ln( c*(H) (n-1)/(H-1) ).
    """
    c = c_star(H)
    if c >= 1.0:
        return np.inf
    return float(np.log(c * c * (n - 1) / (1.0 - c * c)) / (2.0 * alpha))


def phi(lam, beta, n):
    """phi(lambda) = 2 lambda / (e^{lambda beta} + n - 1): one head's early rate at gamma = 0."""
    lam = np.asarray(lam, dtype=np.float64)
    out = 2.0 * lam / (np.exp(lam * beta) + n - 1.0)
    return float(out) if out.ndim == 0 else out


def _kappa(gamma, lambdas, beta, n, rule):
    lam = np.asarray(lambdas, dtype=np.float64)
    if rule == "softmax":
        # lambda e^{b l g} / (e^{b l} + (n-1) e^{b l g}) = lambda / (e^{b l (1-g)} + n - 1)
        return float(np.sum(lam / (np.exp(beta * lam * (1.0 - gamma)) + (n - 1.0))))
    if rule == "exp":
        return float(np.sum(lam * np.exp(beta * lam * gamma)) / n)
    raise ValueError("equiangular closed form is for rules 'softmax' and 'exp'")


def equiangular_gamma_rhs(gamma, lambdas, beta, n, rule="softmax"):
    """dgamma/dt = 2 kappa(gamma) (1 - gamma) (1 + (n-1) gamma)  (Theorem 22).

    softmax: kappa = sum_h lambda_h e^{beta lambda_h gamma} / (e^{beta lambda_h} + (n-1) e^{beta lambda_h gamma})
    exp:     kappa = (1/n) sum_h lambda_h e^{beta lambda_h gamma}
    (scalar heads M_h = V_h = lambda_h I on an equiangular configuration, sphere).
    """
    return 2.0 * _kappa(gamma, lambdas, beta, n, rule) * (1.0 - gamma) * (1.0 + (n - 1.0) * gamma)


def solve_equiangular_gamma(gamma0, lambdas, beta, n, rule="softmax", t_end=1.0, dt=1e-4,
                            return_trajectory=False):
    """gamma(t_end) from classical RK4 on the scalar ODE with step <= dt (last step lands on t_end).

    With dt = 1e-4 the global error is ~dt^4 * O(1), i.e. ~1e-12 or better for
    moderate beta*lambda.  return_trajectory=True gives (times, gammas) arrays.
    """
    steps = max(1, int(np.ceil(t_end / dt - 1e-12)))
    h = t_end / steps
    f = lambda g: equiangular_gamma_rhs(g, lambdas, beta, n, rule)  # noqa: E731
    g = float(gamma0)
    if return_trajectory:
        gs = np.empty(steps + 1)
        gs[0] = g
    for k in range(steps):
        k1 = f(g)
        k2 = f(g + 0.5 * h * k1)
        k3 = f(g + 0.5 * h * k2)
        k4 = f(g + h * k3)
        g = g + (h / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
        if return_trajectory:
            gs[k + 1] = g
    if return_trajectory:
        return np.linspace(0.0, t_end, steps + 1), gs
    return g


def radial_dominance_orthonormal(H, n, alpha, beta, rule="softmax"):
    """Closed form of rho_h at orthonormal tokens, H identical heads M_h = V_h = alpha I (sphere).

    Derivation.  Orthonormal tokens (n <= d): s_ii = alpha, s_ij = 0 (j != i).
    Write q = e^{beta alpha}.  The weights are
        exp  (mean):    w_ii = q / n,            w_ij = 1 / n
        softmax:        w_ii = q / (q + n - 1),  w_ij = 1 / (q + n - 1)
    i.e. in both cases w_ii = q * w_off with a common off-diagonal weight w_off.
    Then f^h_i = alpha (w_ii x_i + w_off sum_{j!=i} x_j), so
        a^h_i       = <f^h_i, x_i> = alpha w_ii            (same for every head and token)
        P_i f^h_i   = alpha w_off sum_{j!=i} x_j,   T_h = alpha^2 w_off^2 (n-1)
        (1/n) sum_i sum_{h'!=h} |a^h_i a^h'_i| = (H-1) alpha^2 w_ii^2
    and the normalisation cancels in the ratio:
        rho_h = (H-1) w_ii^2 / ((n-1) w_off^2) = (H-1) e^{2 beta alpha} / (n-1)
    for BOTH rules (exp and softmax).  (Also C_h = (H-1) alpha^2 (w_ii^2 + (n-1) w_off^2)
    and R_h = (H-1) alpha^2 w_ii^2 here, since the heads are identical, not orthogonal.)

    rho_h = 1 at beta_rho = ln((n-1)/(H-1)) / (2 alpha)  (``radial_dominance_crossing_beta``).
    At MODEL.md's beta* = 1/(2 alpha) ln(c*^2 (n-1)/(1-c*^2)) = 1/(2 alpha) ln(c* (n-1)/(H-1))
    (using 1 - c*^2 = (H-1) c*) one gets rho_h(beta*) = c*(H) < 1 (e.g. 1/golden ratio
    = 0.618 for H = 2), not 1: beta* < beta_rho by ln(1/c*)/(2 alpha).  beta* is instead
    where the angle theta between f^h_i and x_i has cos(theta) = c*(H), i.e. where
    (H-1) |a^h_i| ||f^h_i|| = ||P_i f^h_i||^2 (``radial_cs_ratio_orthonormal`` = 1).
    For H = 1, rho_h = 0.
    """
    if rule not in ("exp", "softmax"):
        raise ValueError("closed form derived for rules 'exp' and 'softmax'")
    return float((H - 1) * np.exp(2.0 * beta * alpha) / (n - 1))


def radial_dominance_crossing_beta(H, n, alpha):
    """The beta at which rho_h (as logged) reaches 1 at orthonormal tokens: ln((n-1)/(H-1))/(2 alpha)."""
    if H <= 1:
        return np.inf
    return float(np.log((n - 1.0) / (H - 1.0)) / (2.0 * alpha))


def radial_cs_ratio_orthonormal(H, n, alpha, beta):
    """(H-1) |a^h_i| ||f^h_i|| / ||P_i f^h_i||^2 at orthonormal tokens, identical scalar heads.

    With u^2 = e^{2 beta alpha}/(n-1) this is (H-1) u sqrt(1 + u^2); it equals 1 exactly
    at MODEL.md's beta* (Theorem 19), for both exp and softmax.
    """
    u2 = np.exp(2.0 * beta * alpha) / (n - 1.0)
    return float((H - 1) * np.sqrt(u2) * np.sqrt(1.0 + u2))


# ------------------------------------------------------------ configurations

def orthonormal_tokens(n, d, seed=0):
    """n orthonormal tokens in R^d (n <= d), randomly rotated."""
    if n > d:
        raise ValueError("orthonormal tokens need n <= d")
    rng = np.random.default_rng(seed)
    Qm, _ = np.linalg.qr(rng.standard_normal((d, d)))
    return Qm[:, :n].T.copy()


def equiangular_tokens(n, d, gamma, seed=0):
    """n unit tokens with <x_i, x_j> = gamma (i != j), gamma in [-1/(n-1), 1], d >= n+1.

    Centred simplex directions u_i (cos = -1/(n-1)) mixed with a common axis e:
    x_i = sqrt(a) u_i + sqrt(1-a) e with a = (1-gamma)(n-1)/n; then randomly rotated.
    """
    if d < n + 1:
        raise ValueError("equiangular_tokens needs d >= n + 1")
    if not (-1.0 / (n - 1) - 1e-15 <= gamma <= 1.0):
        raise ValueError("gamma must lie in [-1/(n-1), 1]")
    U = np.eye(n) - 1.0 / n
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    a = max(0.0, (1.0 - gamma) * (n - 1.0) / n)
    X = np.zeros((n, d))
    X[:, :n] = np.sqrt(a) * U
    X[:, n] = np.sqrt(max(0.0, 1.0 - a))
    rng = np.random.default_rng(seed)
    Qm, _ = np.linalg.qr(rng.standard_normal((d, d)))
    return X @ Qm.T


# ------------------------------------------------------ positions, masks and depth
#
# A head may carry its own rule, beta, mask and ALiBi slope (``HeadSpec``); tokens sit at
# positions 0..n-1 (row order). With z_ij = beta_h s_ij - m_h |i - j| and V_ij = 1 where the
# mask lets row i see key j:
#     softmax:  w_ij = V_ij k(z_ij) / sum_j V_ij k(z_ij)
#     mean:     w_ij = V_ij k(z_ij) / sum_j V_ij          (the number of visible keys)
# masks: "none" (all), "causal" (j <= i), "window" (|i - j| <= w), "causal_window"
# (i - w <= j <= i). A positional user rule's kernel is k(z, i, j, n) (NumPy arrays I, J).
# Entropies are over the visible keys. A schedule is a list of layers (heads, specs) with
# start steps: layer l drives the steps [starts[l], starts[l+1]).

MASKS = ("none", "causal", "window", "causal_window")


@dataclass(frozen=True)
class PositionalRule:
    """A user rule whose kernel sees positions: kernel(z, i, j, n), vectorised NumPy."""

    kernel: Callable
    normalization: str = "softmax"


@dataclass(frozen=True)
class HeadSpec:
    rule: object = "softmax"           # a rule name, UserRule or PositionalRule
    beta: Optional[float] = None       # None: the run's beta
    mask: str = "none"
    window: Optional[int] = None
    alibi: float = 0.0

    def __post_init__(self):
        if self.mask not in MASKS:
            raise ValueError(f"mask must be one of {MASKS}, got {self.mask!r}")


def alibi_slopes(H):
    """The ALiBi paper's slopes 2^(-8h/H), h = 1..H."""
    return [2.0 ** (-8.0 * h / H) for h in range(1, H + 1)]


def visible(n, spec: HeadSpec):
    """(n, n) booleans: may row i see key j?"""
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    if spec.mask == "none":
        return np.ones((n, n), dtype=bool)
    if spec.mask == "causal":
        return j <= i
    if spec.mask == "window":
        return np.abs(i - j) <= spec.window
    return (j <= i) & (i - j <= spec.window)


def _spec_logits(x, M, beta, spec):
    n = x.shape[0]
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    b = spec.beta if spec.beta is not None else beta
    return b * scores(x, M) - spec.alibi * np.abs(i - j), i, j


def spec_kernel_values(x, M, beta, spec):
    """(n, n) k(z_ij) where visible, 0 elsewhere; the row shift m_i for exponential rules
    (k values are then e^{z - m_i}); and the normalisation kind."""
    z, i, j = _spec_logits(np.asarray(x, dtype=np.float64), M, beta, spec)
    vis = visible(z.shape[0], spec)
    if isinstance(spec.rule, PositionalRule):
        kz = np.asarray(spec.rule.kernel(z, i, j, z.shape[0]), dtype=np.float64)
        return np.where(vis, kz, 0.0), None, spec.rule.normalization, vis
    name, k, norm, _, expo = _rule(spec.rule)
    if expo:
        zm = np.where(vis, z, -np.inf)
        m = zm.max(axis=1, keepdims=True)
        return np.where(vis, np.exp(zm - m), 0.0), m, norm, vis
    return np.where(vis, np.asarray(k(z), dtype=np.float64), 0.0), None, norm, vis


SINKHORN_ITERATIONS = 20   # the built-in rule's


def sinkhorn_weights(z, iterations=SINKHORN_ITERATIONS):
    """Doubly stochastic diag(a) e^z diag(b): a from the rows (the softmax), then per iteration
    b from the columns and a from the rows (multiplicative, on the n x n matrix)."""
    K = np.exp(z - z.max())
    a = 1 / K.sum(axis=1)
    for _ in range(iterations):
        b = 1 / (K.T @ a)
        a = 1 / (K @ b)
    return a[:, None] * K * (b[None, :] if iterations else 1.0)


def spec_weights(x, M, beta, spec: HeadSpec):
    """(n, n) w_ij of one head under its spec."""
    if spec.rule == "sinkhorn":   # full attention only (no masks, biases or positions)
        return sinkhorn_weights(beta * scores(x, M))
    kz, m, norm, vis = spec_kernel_values(x, M, beta, spec)
    if norm == "softmax":
        N = kz.sum(axis=1, keepdims=True)
        return np.where(N != 0, kz / np.where(N != 0, N, 1.0), 0.0)
    count = vis.sum(axis=1, keepdims=True)
    return kz * (np.exp(m) if m is not None else 1.0) / count


def spec_head_outputs(x, heads, beta, specs):
    x = np.asarray(x, dtype=np.float64)
    return np.stack([spec_weights(x, M, beta, s) @ (x @ V.T) for (M, V), s in zip(_heads(heads), specs)])


def spec_velocity(x, heads, beta, specs, geometry="sphere"):
    _check_geometry(geometry)
    x = np.asarray(x, dtype=np.float64)
    return _project(x, spec_head_outputs(x, heads, beta, specs).sum(axis=0), geometry)


def spec_step(x, heads, beta, specs, geometry="sphere", dt=0.01, integrator="rk4"):
    """One Euler or RK4 step (as step_euler / step_rk4) under per-head specs."""
    x = np.asarray(x, dtype=np.float64)
    f = lambda y: spec_velocity(y, heads, beta, specs, geometry)  # noqa: E731
    if integrator == "euler":
        return _retract(x + dt * f(x), geometry)
    k1 = f(x)
    k2 = f(x + 0.5 * dt * k1)
    k3 = f(x + 0.5 * dt * k2)
    k4 = f(x + dt * k3)
    return _retract(x + (dt / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4), geometry)


def spec_entropy_rows(x, M, beta, spec):
    """(n,) entropy of p_ij = k(z_ij) / sum over the visible keys."""
    kz, _, _, _ = spec_kernel_values(x, M, beta, spec)
    N = kz.sum(axis=1, keepdims=True)
    p = np.where(N != 0, kz / np.where(N != 0, N, 1.0), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    return -terms.sum(axis=1)


def spec_observables(x, heads, beta, specs, geometry="sphere"):
    """The log columns that need no potential (energy columns are nan under masks, biases,
    positions and schedules): kinetic, gamma_bar, eps and per head the T/C/R terms, radial
    shadows, dominance and entropies."""
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    hs = _heads(heads)
    F = spec_head_outputs(x, hs, beta, specs)
    H = F.shape[0]
    xdot = _project(x, F.sum(axis=0), geometry)
    a = np.einsum("hnd,nd->hn", F, x)
    PF = np.stack([_project(x, F[h], geometry) for h in range(H)])
    T = np.einsum("hnd,hnd->h", PF, PF) / n
    ssum = x.sum(axis=0)
    gamma_bar = (float(ssum @ ssum) - n) / (n * (n - 1)) if n > 1 else np.nan
    out = {"kinetic": float(np.sum(xdot * xdot) / n), "gamma_bar": gamma_bar, "eps": 1.0 - gamma_bar}
    for h in range(H):
        others = [g for g in range(H) if g != h]
        C = sum(np.sum(F[h] * F[g]) for g in others) / n
        R = sum(np.sum(a[h] * a[g]) for g in others) / n if geometry == "sphere" else 0.0
        Rabs = sum(np.sum(np.abs(a[h] * a[g])) for g in others) / n if geometry == "sphere" else 0.0
        ent = spec_entropy_rows(x, hs[h][0], beta, specs[h])
        out[f"tangent_power_h{h}"] = float(T[h])
        out[f"cross_coupling_h{h}"] = float(C)
        out[f"radial_shadow_h{h}"] = float(R)
        out[f"energy_rate_h{h}"] = float(T[h] + C - R)
        out[f"radial_mean_h{h}"] = float(np.mean(a[h]))
        out[f"radial_absmax_h{h}"] = float(np.max(np.abs(a[h])))
        out[f"radial_dominance_h{h}"] = float(Rabs / T[h]) if T[h] > 0 else (np.inf if Rabs > 0 else 0.0)
        out[f"entropy_mean_h{h}"] = float(np.mean(ent))
        out[f"entropy_min_h{h}"] = float(np.min(ent))
        out[f"entropy_max_h{h}"] = float(np.max(ent))
    return out


def layer_at(starts, step):
    """The layer in force for the step from state ``step`` (starts: first step of each layer)."""
    return max(l for l, s in enumerate(starts) if s <= step)


def run_schedule(x, layers, starts, beta, steps, geometry="sphere", dt=0.01, integrator="rk4"):
    """x after ``steps`` steps of a layer schedule; layers: [(heads, specs), ...]."""
    x = np.asarray(x, dtype=np.float64)
    if geometry == "sphere":
        x = x / np.linalg.norm(x, axis=-1, keepdims=True)
    for step in range(steps):
        heads, specs = layers[layer_at(starts, step)]
        x = spec_step(x, heads, beta, specs, geometry, dt, integrator)
    return x
