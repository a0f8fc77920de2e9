"""Sinkhorn (doubly stochastic) attention: the pair pass of rules whose normalisation is
"sinkhorn" (docs/MODEL.md, "Sinkhorn attention"), implementation ``sinkhorn`` of the tiled
and plain paths.

The weights are P_ij = e^{f_i + z_ij + g_j}, z_ij = beta <Q x_i, K x_j>, with row and column
potentials f, g (the logarithms of Sinkhorn's scaling factors) found by alternate
normalisation: f from the rows (the softmax: no iteration), then per iteration g from the
columns and f from the rows again, so every row sums to 1 exactly and the columns approach 1.
Iterations stop after ``rule.iterations`` or once every column sum is within
``rule.tolerance`` of 1 (tolerance 0: always all the iterations). Each update is one pass over
all pairs with a running maximum (log-sum-exp), so nothing of size n x n is stored: O(n^2 r)
per update, two updates per iteration.
"""
from functools import lru_cache

import numpy as np
import taichi as ti

from . import paths
from .kernel_math import UNROLL_MAX_D
from .layout import Operands


@lru_cache(maxsize=None)
def _kernels(dtype: str, H: int, r: int, rv: int):
    real = ti.f32 if dtype == "float32" else ti.f64
    arr1 = ti.types.ndarray(dtype=real, ndim=1)
    arr3 = ti.types.ndarray(dtype=real, ndim=3)
    arr4 = ti.types.ndarray(dtype=real, ndim=4)
    hint_t = ti.types.ndarray(dtype=ti.i32, ndim=2)

    @ti.func
    def score(q: ti.template(), k: ti.template(), b, h, i, j, bt):
        s = ti.cast(0, real)
        if ti.static(r <= UNROLL_MAX_D):
            for a in ti.static(range(r)):
                s += q[b, h, i, a] * k[b, h, j, a]
        else:   # a runtime loop: ranks up to d = 384 compile quickly
            for a in range(r):
                s += q[b, h, i, a] * k[b, h, j, a]
        return bt * s

    @ti.func
    def log_sum_exp(q: ti.template(), k: ti.template(), bt, potential: ti.template(), b, h, fixed,
                    over_keys: ti.template()):
        """log sum_t e^{z + potential_t} over the keys t of row `fixed` (over_keys) or over the
        queries t of column `fixed`, with a running maximum (no overflow, one pass)."""
        m, s = ti.cast(-ti.math.inf, real), ti.cast(0, real)
        for t in range(q.shape[2]):
            z = ti.cast(0, real)
            if ti.static(over_keys):
                z = score(q, k, b, h, fixed, t, bt)
            else:
                z = score(q, k, b, h, t, fixed, bt)
            v = z + potential[b, h, t]
            if v > m:
                s = s * ti.exp(m - v) + 1
                m = v
            else:
                s += ti.exp(v - m)
        return m + ti.log(s)

    @ti.kernel
    def rows(q: arr4, k: arr4, beta: arr1, hint: hint_t, f: arr3, g: arr3):
        """f_i = -log sum_j e^{z_ij + g_j}: every row of P sums to 1."""
        for b, h, i in ti.ndrange(q.shape[0], H, q.shape[2]):
            if hint[h, 2] == 1:
                f[b, h, i] = -log_sum_exp(q, k, beta[b], g, b, h, i, True)

    @ti.kernel
    def columns(q: arr4, k: arr4, beta: arr1, hint: hint_t, f: arr3, g: arr3, g_new: arr3,
                err: arr1):
        """g_new_j = -log sum_i e^{f_i + z_ij}; err = max_j |column sum of P (with g) - 1|."""
        err[0] = 0
        for b, h, j in ti.ndrange(q.shape[0], H, q.shape[2]):
            if hint[h, 2] == 1:
                lse = log_sum_exp(q, k, beta[b], f, b, h, j, False)
                g_new[b, h, j] = -lse
                ti.atomic_max(err[0], ti.abs(ti.exp(g[b, h, j] + lse) - 1))  # max: order-free

    @ti.kernel
    def outputs(q: arr4, k: arr4, u: arr4, beta: arr1, hint: hint_t, f: arr3, g: arr3,
                pulls: arr4, row: arr4):
        """pulls_i = sum_j P_ij u_j (the plain kernels' head_out applies O_h); row: (0, 1, the
        row's entropy, 0: no energy)."""
        for b, h, i in ti.ndrange(q.shape[0], H, q.shape[2]):
            if hint[h, 2] == 1:
                entropy = ti.cast(0, real)
                if ti.static(rv <= UNROLL_MAX_D):   # the row's pull in registers
                    acc = ti.Vector.zero(real, rv)
                    for j in range(q.shape[2]):
                        logp = f[b, h, i] + score(q, k, b, h, i, j, beta[b]) + g[b, h, j]
                        p = ti.exp(logp)
                        entropy -= p * logp
                        for a in ti.static(range(rv)):
                            acc[a] += p * u[b, h, j, a]
                    for a in ti.static(range(rv)):
                        pulls[b, h, i, a] = acc[a]
                else:
                    for a in range(rv):
                        pulls[b, h, i, a] = 0
                    for j in range(q.shape[2]):
                        logp = f[b, h, i] + score(q, k, b, h, i, j, beta[b]) + g[b, h, j]
                        p = ti.exp(logp)
                        entropy -= p * logp
                        for a in range(rv):
                            pulls[b, h, i, a] += p * u[b, h, j, a]
                row[b, h, i, 0] = 0
                row[b, h, i, 1] = 1
                row[b, h, i, 2] = entropy
                row[b, h, i, 3] = 0

    return rows, columns, outputs


class SinkhornHeads:
    """The pair pass of one layer's Sinkhorn heads (those the hint marks), with the plain
    kernels' projection. ``iterations`` and ``error``: what the last evaluation took and the
    largest column-sum error it stopped at (read only when the rule has a tolerance, or on
    request by ``column_error``)."""

    def __init__(self, kern, R: int, n: int, keep_qk: bool):
        self.kern = kern
        rule, dtype, _, H, r, rv, _ = kern.gpu_spec
        self.max_iterations, self.tolerance = int(rule.iterations), float(rule.tolerance)
        real = ti.f32 if dtype == "float32" else ti.f64
        self._rows, self._columns, self._outputs = _kernels(dtype, H, r, rv)
        self.f = ti.ndarray(real, shape=(R, H, n))
        self.g = ti.ndarray(real, shape=(R, H, n))
        self.g_new = ti.ndarray(real, shape=(R, H, n))
        self.err = ti.ndarray(real, shape=(1,))
        self.iterations, self.error = 0, None
        self.after_project = None

    def __call__(self, x, ops: Operands, hint, observe):
        self.kern.project(x, ops.Q, ops.K, ops.W, ops.q, ops.k, ops.u)
        self.g.fill(0)
        self._rows(ops.q, ops.k, ops.beta, hint, self.f, self.g)
        taken = 0
        for _ in range(self.max_iterations):
            self._columns(ops.q, ops.k, ops.beta, hint, self.f, self.g, self.g_new, self.err)
            if self.tolerance > 0 and float(self.err.to_numpy()[0]) <= self.tolerance:
                break      # the columns already sum to 1 within the tolerance: keep these weights
            self.g, self.g_new = self.g_new, self.g
            self._rows(ops.q, ops.k, ops.beta, hint, self.f, self.g)
            taken += 1
        self.iterations = taken
        self._outputs(ops.q, ops.k, ops.u, ops.beta, hint, self.f, self.g, ops.g, ops.row)
        self.kern.head_out(ops.g, ops.O, ops.f)   # every head's f from its pulls, as the plain pass

    def column_error(self, ops: Operands, hint) -> float:
        """max_j |sum_i P_ij - 1| of the weights the last evaluation used (one more pass)."""
        self._columns(ops.q, ops.k, ops.beta, hint, self.f, self.g, self.g_new, self.err)
        return float(self.err.to_numpy()[0])


paths.register("sinkhorn", lambda kern, R, n, keep_qk: SinkhornHeads(kern, R, n, keep_qk))

