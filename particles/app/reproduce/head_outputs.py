"""Per-token head outputs on the host (float64 NumPy), for quantities the engine's log does not carry.

The paper states Theorem 19's condition as cos angle(f^h_i, x_i) <= c*(H) on every head's
output f^h_i = sum_j w^h_ij V_h x_j. The engine exposes a^h_i = <f^h_i, x_i> per token
(Simulation.per_token), not |f^h_i|; this module recomputes f^h_i from the tokens and the heads
(O(n^2 d) per head, fine at the sizes the reproduction uses) and is held against the engine's
a^h_i wherever it is used.
"""
from __future__ import annotations

import numpy as np


def head_outputs(x, heads, beta, rule: str) -> np.ndarray:
    """f^h_i for tokens x (R, n, d) and one beta per replica: (R, H, n, d). Rules exp and softmax."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 2:
        x = x[None]
    b = np.broadcast_to(np.asarray(beta, dtype=np.float64), (x.shape[0],))[:, None, None]
    out = []
    for h in heads:
        z = b * np.einsum("rid,de,rje->rij", x, h.score, x)
        zmax = z.max(axis=2, keepdims=True)
        e = np.exp(z - zmax)
        if rule == "softmax":
            w = e / e.sum(axis=2, keepdims=True)
        elif rule == "exp":
            w = e * np.exp(zmax) / x.shape[1]
        else:
            raise ValueError(f"head_outputs supports rules 'exp' and 'softmax', not {rule!r}")
        out.append(np.einsum("rij,ed,rjd->rie", w, h.value, x))
    return np.stack(out, axis=1)


def output_cosines(x, heads, beta, rule: str):
    """(cos angle(f^h_i, x_i), a^h_i), each (R, H, n)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 2:
        x = x[None]
    f = head_outputs(x, heads, beta, rule)
    a = np.einsum("rhid,rid->rhi", f, x)
    norm = np.linalg.norm(f, axis=-1)
    cos = np.divide(a, norm, out=np.zeros_like(a), where=norm > 0)
    return cos, a
