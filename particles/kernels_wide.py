"""The large-n pair pass for exponential rules at the CPU's full vector width.

Taichi 1.7's LLVM loop vectoriser costs with a 128-bit target, so the scalarised tiles of
``kernels.FastHeads`` run 4 float32 lanes; this pass is written with explicit L-lane vectors
(16 float32 / 8 float64 = 512 bits by default; the lanes and tiles are picked per machine by
``particles.tuning``) compiled unscalarised, rows in lanes:

    project   beta Q_h x over rows, as vectors qv (R, r, nbl); K_h x and W_h x per token,
              as scalars ks (R, npad, r), us (R, npad, rv), broadcast in the pair pass
    pair      per group of TR x L rows, columns in blocks of JBK, flash-attention style:
              scores by register tiles (TR row vectors x JB columns, the rank innermost
              and contiguous), the block maximum and re-basing of the sums, the weights
              (vectorised exp), then the weighted sum of u by register tiles (TR row vectors
              x AC value components); at the end f = O g and the row statistics, scattered
              to the (R, H, n, d) and (R, H, n, 4) arrays ``kernels.combine`` reads.

One head per launch pair (project, pair), so the projections' memory is that of one head.
Cost per head: n^2 (r + rv) multiply-adds and n^2 exps, so a rank-r head costs r / d of a
full one. Memory: O(n (r + rv)) for the projections, plus per worker slot a block of scores
and the value accumulators (NSLOT x TR x (JBK + rv) vectors): no n x n matrix.
"""
import functools
import os

import numpy as np
import taichi as ti

from . import kernel_math, kernels, paths, tuning
from .kernel_math import CLAMP, lane_columns, vector_helpers
from .layout import Operands
from .paths import WIDE_MIN_N  # noqa: F401  (from this many tokens the wide pass serves)
AC = 8             # value components per accumulator tile
JBK = 256          # about this many columns per flash block (their scores stay in L1/L2)
MEASURE_MAX_N = 1024   # tiles are timed on at most this many tokens (a pass of a few ms to ~20 ms)


def _block(JB: int) -> int:
    """Columns per flash block: a multiple of JB, so score tiles never cross a block (nor the
    padded end of ks and us)."""
    return max(1, JBK // JB) * JB


def tuned(spec, n: int) -> tuning.Choice:
    """The tiles for this pass on this machine (``particles.tuning``: measured once per shape
    class, then cached)."""
    real, d, H, r, rv, softmax_norm = spec
    dtype = "float32" if real == ti.f32 else "float64"
    key = tuning.shape_class(dtype, d, r, rv, softmax_norm, n)
    return tuning.wide_tiles(dtype, key, lambda tiles: timed_pass(spec, n, tiles))


def timed_pass(spec, n: int, tiles: tuning.WideTiles):
    """One evaluation's head passes with these tiles on random unit tokens (at most
    MEASURE_MAX_N of them), as a call that returns when the pass is done."""
    real, d, H, r, rv, _ = spec
    np_real = np.float32 if real == ti.f32 else np.float64
    n = min(n, MEASURE_MAX_N)
    rng = np.random.default_rng(0)

    def device(*shape, scale=1.0):
        a = ti.ndarray(real, shape=shape)
        a.from_numpy((scale * rng.standard_normal(shape)).astype(np_real))
        return a

    x = rng.standard_normal((1, n, d))
    xs = ti.ndarray(real, shape=(1, n, d))
    xs.from_numpy((x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np_real))
    Q, K, W, O = (device(H, r, d, scale=d ** -0.5), device(H, r, d, scale=d ** -0.5),
                  device(H, rv, d, scale=d ** -0.5), device(H, d, rv, scale=rv ** -0.5))
    beta, f, row = device(1), ti.ndarray(real, shape=(1, H, n, d)), ti.ndarray(real, shape=(1, H, n, 4))
    heads = WideHeads(spec, 1, n, tuning.Choice(tiles, "being measured"))
    ops = Operands(x=xs, xdot=None, beta=beta, Q=Q, K=K, W=W, O=O, hreal=None, q=None, k=None, u=None,
                   g=None, f=f, row=row, tok=None, red=None, sumx=None)

    def one_pass():
        heads(xs, ops, None, False)
        ti.sync()

    return one_pass


class WideHeads:
    """project + pair (+ f = O g) for R replicas of n tokens; writes f and row."""

    def __init__(self, spec, n_replicas: int, n: int, choice: tuning.Choice):
        real, d, H, r, rv, softmax_norm = spec
        self.choice = choice
        L, TR, JB = choice.tiles.lanes, choice.tiles.rows, choice.tiles.cols
        self.kernels = _wide_kernels(real, d, H, r, rv, softmax_norm, L, TR, JB, AC)
        R = n_replicas
        rows = TR * L
        ngroups = -(-n // rows)
        nbl = ngroups * TR
        npad = -(-n // JB) * JB
        assert (TR * L) % JB == 0, "the projections fill whole row groups: JB must divide TR L"
        rvp = -(-rv // AC) * AC
        vec = ti.types.vector(L, real)
        self.nslot = min(R * ngroups, 4 * (os.cpu_count() or 1))
        self.H = H
        self.xt = ti.ndarray(vec, shape=(R, d, nbl))
        self.qv = ti.ndarray(vec, shape=(R, r, nbl))       # one head at a time: memory / H
        rl, rvl = -(-r // L) * L, -(-rvp // L) * L  # ranks padded to whole vectors
        self.ks = ti.ndarray(real, shape=(R, npad, rl))    # per token
        self.us = ti.ndarray(real, shape=(R, npad, rvl))
        self.kw = ti.ndarray(vec, shape=(d, rl // L))       # K_h, W_h by columns, rank in lanes
        self.ww = ti.ndarray(vec, shape=(d, rvl // L))
        np_real = np.float32 if real == ti.f32 else np.float64
        for padded in (self.ks, self.us):  # padding tokens stay zero
            padded.from_numpy(np.zeros(tuple(padded.shape), np_real))
        self.zs = ti.ndarray(vec, shape=(self.nslot, TR, _block(JB)))
        self.acc = ti.ndarray(vec, shape=(self.nslot, TR, rvp))
        self._compiled = False

    def __call__(self, x, ops, hint, observe):
        """ops.f and ops.row at state x. hint and ops.hreal (per-head bands, biases, betas) are
        unused: such heads never come here."""
        transpose, project, pair = self.kernels
        with kernels.compile_options(scalarize=False, active=not self._compiled):
            transpose(x, self.xt)
            for h in range(self.H):
                project(x, ops.Q, ops.K, ops.W, ops.beta, self.xt, self.qv, self.ks, self.us, self.kw,
                        self.ww, h)
                pair(self.qv, self.ks, self.us, ops.O, ops.f, ops.row, self.zs, self.acc, x.shape[1], h)
        self._compiled = True


@functools.lru_cache(maxsize=None)
def _wide_kernels(real, d: int, H: int, r: int, rv: int, softmax_norm: bool, L: int, TR: int,
                  JB: int, AC: int):
    f32 = real == ti.f32
    NEG_BIG = -3.0e38 if f32 else -1.0e300
    rvp = -(-rv // AC) * AC
    RC, RVC = -(-r // L), -(-rvp // L)          # vectors per token of k and u (rank in lanes)
    AB = 4 if r % 4 == 0 else (2 if r % 2 == 0 else 1)  # q components per projection tile
    TB = max(1, min(4, 16 // (RC + RVC)))       # tokens per k, u projection tile (<= 16 sums)
    JBK_ = _block(JB)
    vec = ti.types.vector(L, real)
    arr1, _, arr3, arr4 = kernel_math.ndarrays(real)
    _, v2, v3, _ = kernel_math.ndarrays(vec)
    c, splat, _, exp_clamped = vector_helpers(real, L)
    column = lane_columns(real, L)
    row_norm = kernel_math.normalisation(real, softmax_norm, True, guarded=False)
    finish_row = kernel_math.row_finish(real, True, guarded=False, log=kernel_math.lane_log(real, L))

    @ti.func
    def clamp(z):
        result = z
        if ti.static(f32):
            result = ti.max(z, c(CLAMP))
        return result

    rebase = kernel_math.online_rebase(exp_clamped, clamp)

    @ti.func
    def query(qv: ti.template(), b, h, a, row):   # one head's projections at a time: h unused
        return qv[b, a, row]

    @ti.func
    def token(ks: ti.template(), b, h, j, a):
        return ks[b, j, a]

    scores, weigh, weighted_sum = kernel_math.lane_tiles(real, L, TR, JB, AC, query, token, token)

    @ti.kernel
    def transpose(x: arr3, xt: v3):
        """The tokens with rows in lanes (zero padding), once per evaluation."""
        R, n = x.shape[0], x.shape[1]
        for b, e, jl in ti.ndrange(R, d, xt.shape[2]):
            v = splat(0)
            for k in range(L):
                if jl * L + k < n:
                    v[k] = x[b, jl * L + k, e]
            xt[b, e, jl] = v

    @ti.kernel
    def project(x: arr3, Qf: arr3, Kf: arr3, Wf: arr3, beta: arr1, xt: v3, qv: v3, ks: arr3,
                us: arr3, kw: v2, ww: v2, h: ti.i32):
        """beta Q_h x with rows in lanes (qv); K_h x_j and W_h x_j per token (ks, us: computed
        with the rank in lanes and stored lane by constant index, where a scatter of row
        vectors lane by variable index cost a third of the pass at n = 1024). Components run at run time (a static unroll over d = 64 costs seconds of
        compile)."""
        R, n = x.shape[0], x.shape[1]
        for e in range(d):  # K_h and W_h by columns, the rank in lanes
            for cc in range(kw.shape[1]):
                kw[e, cc] = column(Kf, h, e, cc, r)
            for cc in range(ww.shape[1]):
                ww[e, cc] = column(Wf, h, e, cc, rv)
        ti.loop_config(block_dim=1)
        for b, jl in ti.ndrange(R, qv.shape[2]):  # AB components at a time share each load of x
            bt = beta[b]
            for a0i in range(r // AB):
                a0 = a0i * AB
                sq = [splat(0) for _ in ti.static(range(AB))]
                for e in range(d):
                    xe = xt[b, e, jl]
                    for t in ti.static(range(AB)):
                        sq[t] += Qf[h, a0 + t, e] * xe
                for t in ti.static(range(AB)):
                    qv[b, a0 + t, jl] = sq[t] * bt
        for b, j0i in ti.ndrange(R, (n + TB - 1) // TB):  # TB tokens share each load of kw, ww
            j0 = j0i * TB
            sk = [[splat(0) for _ in ti.static(range(RC))] for _ in ti.static(range(TB))]
            su = [[splat(0) for _ in ti.static(range(RVC))] for _ in ti.static(range(TB))]
            for e in range(d):
                xe = [x[b, ti.min(j0 + t, n - 1), e] for t in ti.static(range(TB))]
                for cc in ti.static(range(RC)):
                    kc = kw[e, cc]
                    for t in ti.static(range(TB)):
                        sk[t][cc] += xe[t] * kc
                for cc in ti.static(range(RVC)):
                    wc = ww[e, cc]
                    for t in ti.static(range(TB)):
                        su[t][cc] += xe[t] * wc
            for t in ti.static(range(TB)):
                if j0 + t < n:
                    for cc in ti.static(range(RC)):
                        for k in ti.static(range(L)):  # lanes by constant index: a cheap extract
                            ks[b, j0 + t, cc * L + k] = sk[t][cc][k]
                    for cc in ti.static(range(RVC)):
                        for k in ti.static(range(L)):
                            us[b, j0 + t, cc * L + k] = su[t][cc][k]

    @ti.kernel
    def pair(qv: v3, ks: arr3, us: arr3, Of: arr3, f: arr4, row: arr4, zs: v3, acc: v3, n: ti.i32,
             h: ti.i32):
        """f and the row statistics of head h for every row; worker slot s takes row groups
        s, s + S, ... (of every replica)"""
        R = qv.shape[0]
        ngroups = qv.shape[2] // TR
        nslot = zs.shape[0]
        total = R * ngroups
        ti.loop_config(block_dim=1)  # a slot is a long task: hand them out one by one
        for s in range(nslot):
            for step in range((total - s + nslot - 1) // nslot):
                task = s + step * nslot
                b = task // ngroups
                il = (task % ngroups) * TR
                m = [splat(NEG_BIG) for _ in ti.static(range(TR))]
                wsum = [splat(0) for _ in ti.static(range(TR))]
                ent = [splat(0) for _ in ti.static(range(TR))]
                for t in ti.static(range(TR)):
                    for a in range(rvp):
                        acc[s, t, a] = splat(0)
                for jbi in range((n + JBK_ - 1) // JBK_):
                    jb = jbi * JBK_
                    jn = ti.min(JBK_, n - jb)
                    # scores, TR row vectors x JB columns per tile; block maximum
                    top = [splat(NEG_BIG) for _ in ti.static(range(TR))]
                    for j0i in range((jn + JB - 1) // JB):
                        scores(qv, ks, zs, top, b, h, il, s, j0i * JB, jb + j0i * JB, jn, r)
                    # a new maximum re-bases the sums (scale = e^(m_old - m_new) <= 1)
                    for t in ti.static(range(TR)):
                        mn = ti.max(m[t], top[t])
                        scale, wsum[t], ent[t] = rebase(m[t], mn, wsum[t], ent[t], True)
                        for a in range(rvp):
                            acc[s, t, a] = acc[s, t, a] * scale
                        m[t] = mn
                    # weights (in place of the scores)
                    for j in range(jn):
                        weigh(zs, s, j, m, wsum, ent, True)
                    # the weighted sum of u: TR row vectors x AC components per tile
                    for a0i in range(rvp // AC):
                        a0 = a0i * AC
                        part = [[acc[s, t, a0 + cc] for cc in ti.static(range(AC))]
                                for t in ti.static(range(TR))]
                        weighted_sum(zs, s, us, b, h, jb, jn, a0, part)
                        for t in ti.static(range(TR)):
                            for cc in ti.static(range(AC)):
                                acc[s, t, a0 + cc] = part[t][cc]
                # normalise, f = O g, the row statistics; scatter the rows of the group
                for t in ti.static(range(TR)):
                    norm = splat(0)
                    for k in range(L):
                        norm[k] = row_norm(wsum[t][k], m[t][k], c(n))
                    i0 = (il + t) * L
                    for e in range(d):
                        fe = splat(0)
                        for a in range(rv):
                            fe += Of[h, e, a] * acc[s, t, a]
                        fe = fe * norm
                        for k in range(L):
                            if i0 + k < n:
                                f[b, h, i0 + k, e] = fe[k]
                    entropy, energy = finish_row(m[t], wsum[t], ent[t], splat(0), splat(0), splat(0))
                    for k in range(L):
                        if i0 + k < n:
                            row[b, h, i0 + k, 0] = m[t][k]
                            row[b, h, i0 + k, 1] = wsum[t][k]
                            row[b, h, i0 + k, 2] = entropy[k]
                            row[b, h, i0 + k, 3] = energy[k]

    return transpose, project, pair


paths.register("wide", lambda kern, R, n, keep_qk: WideHeads(kern.spec, R, n, tuned(kern.spec, n)))
