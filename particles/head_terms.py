"""A layer's per-token terms, applied to the projected q, k, u after ``project`` and before the
pair pass: the heads' biases (``Head.query_bias``, ``key_bias``, ``value_bias``) and rotary
positions (``Attention.rotary``). Each is O(n r) per evaluation; no n x n array.

    q_i = R_i (Q x_i + b_q),   k_j = R_j (K x_j + b_k),   u_j = W x_j + b_v

(R_i: the rotation at position i, the identity for a head without rotary.) The implementations
that serve them declare ``head_terms`` in ``particles.paths`` (the plain pass, which keeps q, k
and u in full arrays); the others leave a layer that has them.
"""

import functools

import numpy as np
import taichi as ti

__all__ = ["has_terms", "LayerTerms"]


def has_terms(heads, attention) -> bool:
    """Does a layer (its heads and their Attention) carry biases or rotary positions?"""
    return any(h.has_biases for h in heads) or any(a.rotary is not None for a in attention)


@functools.lru_cache(maxsize=None)
def _kernel(dtype: str, H: int, r: int, rv: int, rotary: bool):
    real = ti.f32 if dtype == "float32" else ti.f64
    arr2 = ti.types.ndarray(dtype=real, ndim=2)
    arr3 = ti.types.ndarray(dtype=real, ndim=3)
    arr4 = ti.types.ndarray(dtype=real, ndim=4)
    int3 = ti.types.ndarray(dtype=ti.i32, ndim=3)
    P = max(1, r // 2)

    @ti.kernel
    def terms(q: arr4, k: arr4, u: arr4, bq: arr2, bk: arr2, bv: arr2, pairs: int3, cos: arr3,
              sin: arr3):
        """Biases added, then pair (a, b) of head h turned by its angle at position i (an
        unused pair slot is (0, 0) with cos 1, sin 0: the identity)."""
        for b, h, i in ti.ndrange(q.shape[0], H, q.shape[2]):
            for a in ti.static(range(r)):
                q[b, h, i, a] += bq[h, a]
                k[b, h, i, a] += bk[h, a]
            for a in ti.static(range(rv)):
                u[b, h, i, a] += bv[h, a]
            if ti.static(rotary):
                for p in ti.static(range(P)):
                    a0, a1 = pairs[h, p, 0], pairs[h, p, 1]
                    c, s = cos[h, i, p], sin[h, i, p]
                    q0, q1 = q[b, h, i, a0], q[b, h, i, a1]
                    q[b, h, i, a0] = q0 * c - q1 * s
                    q[b, h, i, a1] = q1 * c + q0 * s
                    k0, k1 = k[b, h, i, a0], k[b, h, i, a1]
                    k[b, h, i, a0] = k0 * c - k1 * s
                    k[b, h, i, a1] = k1 * c + k0 * s

    return terms


class LayerTerms:
    """One layer's bias vectors and rotation tables on the device, and the kernel that applies
    them to ``ops.q``, ``ops.k``, ``ops.u`` (``layout.Operands``): a pass's ``after_project``."""

    def __init__(self, heads, attention, dtype: str, n: int, r: int, rv: int, np_real):
        H = len(heads)
        P = max(1, r // 2)
        bq, bk, bv = np.zeros((H, r)), np.zeros((H, r)), np.zeros((H, rv))
        pairs = np.zeros((H, P, 2), dtype=np.int32)
        cos, sin = np.ones((H, n, P)), np.zeros((H, n, P))
        for h, (head, att) in enumerate(zip(heads, attention)):
            for out, b in ((bq, head.query_bias), (bk, head.key_bias), (bv, head.value_bias)):
                if b is not None:
                    out[h, :b.size] = b
            if att.rotary is not None:
                idx = att.rotary.pairs_of(head.score_rank)
                ang = att.rotary.angles(head.score_rank, n)
                pairs[h, :len(idx)] = idx
                cos[h, :, :len(idx)], sin[h, :, :len(idx)] = np.cos(ang), np.sin(ang)
        self.rotary = any(a.rotary is not None for a in attention)
        real = ti.f32 if dtype == "float32" else ti.f64
        self._arrays = []
        for host, dt in ((bq, real), (bk, real), (bv, real), (pairs, ti.i32), (cos, real), (sin, real)):
            dev = ti.ndarray(dt, shape=host.shape)
            dev.from_numpy(host if dt == ti.i32 else host.astype(np_real))
            self._arrays.append(dev)
        self._kernel = _kernel(dtype, H, r, rv, self.rotary)

    def __call__(self, ops) -> None:
        self._kernel(ops.q, ops.k, ops.u, *self._arrays)
