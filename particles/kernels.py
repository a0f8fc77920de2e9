"""Taichi kernels, specialised per (rule, geometry, dtype, head shapes) by a cached factory.

The arrays' layout (x, q, k, u, g, f, row, tok) is described once in ``particles.layout``.
Every thread owns one row i and writes only it (gather, no atomics), and no n x n
matrix is ever stored: softmax is normalised with a running maximum.

Exponential rules (exp, softmax) take a faster path (``FastHeads``): each thread owns a
tile of TI rows and sweeps j in blocks of J columns, flash-attention style, on packed
copies of q, k, u laid out so that LLVM vectorises the inner loops (see ``_fast_kernels``).
"""

import functools
from dataclasses import dataclass

import taichi as ti

from . import backend, kernel_math, paths
# the per-token observable slots and reductions have one home, Taichi-free: particles.layout
from .layout import (RED_LSE, RED_MAX, RED_MIN, RED_SUM, SLOT_CROSS, SLOT_ENTROPY,  # noqa: F401
                     SLOT_ENTROPY_RATE, SLOT_KINETIC, SLOT_RADIAL, SLOT_RADIAL_ABS_PAIR,
                     SLOT_RADIAL_PAIR, SLOT_ROW_ENERGY, SLOT_TANGENT, SLOTS_PER_HEAD, n_tok_slots,
                     tok_slot)
from .rules import Rule
from .errors import ParticlesUserError


@dataclass(frozen=True)
class Features:
    """What a pair pass must know beyond k(z), each a compile-time switch (all off: the pair
    pass is exactly the plain one). Their parameters arrive per head at run time:
    ``hint`` (H, 3) int32: keys below and above the row (the band), 1 if this pass serves
    the head; ``hreal`` (H, 2): ALiBi slope, the head's own beta (0: the replica's)."""
    banded: bool = False     # a mask: the key loop runs over the band [i - below, i + above]
    biased: bool = False     # z_ij -= slope_h |i - j|
    head_beta: bool = False  # a head carries its own beta
    filtered: bool = False   # heads with other rules are served by other passes

    @property
    def any(self) -> bool:
        return self.banded or self.biased or self.head_beta or self.filtered


PLAIN = Features()
COMBINE_PARALLEL_TOKENS = 2048  # R n from which combine runs parallel on the CPU (1.2 ms serial at 4096 x 64 x 8)


@functools.lru_cache(maxsize=None)
def build(rule: Rule, geometry: str, dtype: str, d: int, n_heads: int, r: int, rv: int,
          features: Features = PLAIN) -> "KernelSet":
    return KernelSet(rule, geometry, dtype, d, n_heads, r, rv, features)


class KernelSet:
    """The compiled kernels for one specialisation; arrays are passed as arguments."""

    def __init__(self, rule: Rule, geometry: str, dtype: str, d: int, H: int, r: int, rv: int,
                 features: Features = PLAIN):
        real = ti.f32 if dtype == "float32" else ti.f64
        banded, biased, head_beta, filtered = (features.banded, features.biased, features.head_beta,
                                               features.filtered)
        sphere = geometry == "sphere"
        serial = not backend.is_gpu()  # on a GPU a serialized loop runs on a single thread
        exponential = rule.exponential
        softmax_norm = rule.normalization == "softmax"
        add_key = kernel_math.key_by_key(rule, real)
        row_norm = kernel_math.normalisation(real, softmax_norm, exponential)
        finish_row = kernel_math.row_finish(real, exponential)
        NEG_BIG = -3.0e38 if dtype == "float32" else -1.0e300
        n_slots = n_tok_slots(H)
        unrolled = d <= kernel_math.UNROLL_MAX_D   # loops over components unrolled at compile time
        direction_norm, direction_total = kernel_math.direction_sum(ti.f64, d)
        arr1, arr2, arr3, arr4 = kernel_math.ndarrays(real)
        f64arr4 = ti.types.ndarray(dtype=ti.f64, ndim=4)
        int2 = ti.types.ndarray(dtype=ti.i32, ndim=2)

        @ti.func
        def c(value):
            return ti.cast(value, real)

        @ti.kernel
        def project(x: arr3, Qf: arr3, Kf: arr3, Wf: arr3, q: arr4, k: arr4, u: arr4):
            """q = Q_h x, k = K_h x, u = W_h x for every replica, head and token."""
            for b, h, i in ti.ndrange(x.shape[0], H, x.shape[1]):
                for a in range(r):
                    sq = c(0)
                    sk = c(0)
                    for e in range(d):
                        sq += Qf[h, a, e] * x[b, i, e]
                        sk += Kf[h, a, e] * x[b, i, e]
                    q[b, h, i, a] = sq
                    k[b, h, i, a] = sk
                for a in range(rv):
                    su = c(0)
                    for e in range(d):
                        su += Wf[h, a, e] * x[b, i, e]
                    u[b, h, i, a] = su

        @ti.kernel
        def pair(q: arr4, k: arr4, u: arr4, beta: arr1, hint: int2, hreal: arr2, g: arr4, row: arr4,
                 observe: ti.template()):
            """g_i = sum_j w_ij u_j, normalised; with observe, row energies and entropies.
            With features, j runs over the row's band only and z carries the bias."""
            n = q.shape[2]
            for b, h, i in ti.ndrange(q.shape[0], H, n):
                if ti.static(filtered):
                    if hint[h, 2] == 0:
                        continue  # another rule's pass serves this head
                bt = beta[b]
                if ti.static(head_beta):
                    if hreal[h, 1] > 0:
                        bt = hreal[h, 1]
                qi = ti.Vector.zero(real, r)
                for a in ti.static(range(r)):
                    qi[a] = q[b, h, i, a] * bt
                acc = ti.Vector.zero(real, rv)
                m = c(NEG_BIG)       # running maximum of z (exponential rules)
                wsum = c(0)          # sum of (shifted) kernel weights
                ent = c(0)           # entropy accumulator
                pot = c(0)           # row sum of the potential (non-exponential rules)
                top = c(0)           # kernel rules: the largest weight, the positive weights' sum
                wpos = c(0)
                j_lo, j_hi = 0, n
                if ti.static(banded):
                    j_lo = ti.max(0, i - hint[h, 0])
                    j_hi = ti.min(n, i + hint[h, 1] + 1)
                for j in range(j_lo, j_hi):
                    z = c(0)
                    for a in ti.static(range(r)):
                        z += qi[a] * k[b, h, j, a]
                    if ti.static(biased):
                        z -= hreal[h, 0] * c(ti.abs(i - j))
                    w, rebased, scale, m, wsum, ent, wpos, top, pot = add_key(z, i, j, n, m, wsum, ent, wpos,
                                                                             top, pot, observe)
                    if rebased:
                        acc *= scale
                    for a in ti.static(range(rv)):
                        acc[a] += w * u[b, h, j, a]
                count = c(n)  # mean normalisation: the number of visible keys
                if ti.static(banded):
                    count = c(j_hi - j_lo)
                norm = row_norm(wsum, m, count)
                for a in ti.static(range(rv)):
                    g[b, h, i, a] = acc[a] * norm
                if ti.static(observe):
                    stats = finish_row(m, wsum, ent, wpos, top, pot)
                    row[b, h, i, 0] = m
                    row[b, h, i, 1] = wsum
                    row[b, h, i, 2] = stats[0]
                    row[b, h, i, 3] = stats[1]

        @ti.kernel
        def head_out(g: arr4, Of: arr3, f: arr4):
            """f^h_i = O_h g^h_i (head h's pull on token i)."""
            for b, h, i, e in ti.ndrange(g.shape[0], H, g.shape[2], d):
                s = c(0)
                for a in range(rv):
                    s += Of[h, e, a] * g[b, h, i, a]
                f[b, h, i, e] = s

        @ti.func
        def zero():
            return c(0)

        @ti.func
        def head_output(f: ti.template(), b, h, i, e):
            return f[b, h, i, e]

        @ti.func
        def point(y: ti.template(), b, i, e):
            return y[b, i, e]

        @ti.func
        def radial_shadow(radial: ti.template(), b, h, i):
            return radial[h]

        @ti.func
        def row_stat(row: ti.template(), b, h, i, k):
            return row[b, h, i, 2 + k]  # (max, weight sum, entropy, energy)

        @ti.func
        def store(tok: ti.template(), b, i, n, slot, value):
            tok[b, i, slot] = value

        observe_token = kernel_math.token_observables(H, d, sphere, zero, ti.abs, head_output, point,
                                                      radial_shadow, row_stat, store)

        @ti.kernel
        def combine(x: arr3, f: arr4, xdot: arr3, row: arr4, tok: arr3, observe: ti.template(),
                    parallel: ti.template()):
            """v_i = sum_h f^h_i; xdot_i = P_i v_i; with observe, the per-token observables
            (``kernel_math.token_observables``). Serial on the CPU below
            COMBINE_PARALLEL_TOKENS (cheaper than a parallel dispatch)."""
            ti.loop_config(serialize=serial and not parallel)
            for b, i in ti.ndrange(x.shape[0], x.shape[1]):
                radial = ti.Vector.zero(real, H)
                for e in range(d):
                    xe = x[b, i, e]
                    for h in ti.static(range(H)):
                        radial[h] += f[b, h, i, e] * xe
                v_radial = radial.sum() if ti.static(sphere) else c(0)
                kinetic = c(0)
                for e in range(d):
                    xe = x[b, i, e]  # read first: read after the sum, LLVM rounded xdot otherwise
                    ve = c(0)
                    for h in ti.static(range(H)):
                        ve += f[b, h, i, e]
                    xde = ve - v_radial * xe
                    xdot[b, i, e] = xde
                    kinetic += xde * xde
                if ti.static(observe):
                    observe_token(f, x, radial, row, tok, b, i, x.shape[1], v_radial, kinetic)

        @ti.kernel
        def entropy_rate(q: arr4, k: arr4, qd: arr4, kd: arr4, beta: arr1, row: arr4, tok: arr3):
            """-beta^2 Cov_p(s_i., sdot_i.) per row (Theorem 27), p the softmax weights.

            sdot_ij = <qdot_i, k_j> + <q_i, kdot_j>, where qdot = Q xdot, kdot = K xdot.
            """
            n = q.shape[2]
            for b, h, i in ti.ndrange(q.shape[0], H, n):
                m = row[b, h, i, 0]
                inv_l = c(1) / row[b, h, i, 1]
                bt = beta[b]
                s_ref = m / bt  # centre scores on the row maximum to limit cancellation
                es = c(0)
                esd = c(0)
                essd = c(0)
                for j in range(n):
                    s = c(0)
                    sd = c(0)
                    for a in ti.static(range(r)):
                        s += q[b, h, i, a] * k[b, h, j, a]
                        sd += qd[b, h, i, a] * k[b, h, j, a] + q[b, h, i, a] * kd[b, h, j, a]
                    p = ti.exp(bt * s - m) * inv_l
                    ds = s - s_ref
                    es += p * ds
                    esd += p * sd
                    essd += p * ds * sd
                cov = essd - es * esd
                tok[b, i, 1 + h * SLOTS_PER_HEAD + SLOT_ENTROPY_RATE] = -bt * bt * cov

        @ti.kernel
        def reduce(tok: arr3, x: arr3, out: f64arr4, sumx: f64arr4, slot: ti.i32):
            """Column reductions over tokens, one thread per (replica, slot), fixed order."""
            n = tok.shape[1]
            ti.loop_config(serialize=True)  # O(n) per slot: cheaper than a parallel dispatch
            for b, s in ti.ndrange(tok.shape[0], n_slots):
                kernel_math.reduce_slot(tok, b, s, n, out, slot)
            ti.loop_config(serialize=True)
            for b in range(x.shape[0]):
                # sum of the normalised tokens (they are unit already on the sphere)
                if ti.static(unrolled):
                    total = direction_total(x, b, x.shape[1])
                    for e in ti.static(range(d)):
                        sumx[slot, b, e, 0] = total[e]
                else:   # summed in place, in the same order
                    for e in range(d):
                        sumx[slot, b, e, 0] = 0
                    for i in range(x.shape[1]):
                        norm = direction_norm(x, b, i)
                        if norm > 0:
                            for e in range(d):
                                sumx[slot, b, e, 0] += ti.cast(x[b, i, e], ti.f64) / norm

        @ti.kernel
        def axpy(out: arr3, x: arr3, a: real, y: arr3):
            """out = x + a * y."""
            ti.loop_config(serialize=serial)  # O(n d): cheaper than a parallel dispatch (~80 us)
            for b, i in ti.ndrange(out.shape[0], out.shape[1]):
                if ti.static(unrolled):
                    for e in ti.static(range(d)):
                        out[b, i, e] = x[b, i, e] + a * y[b, i, e]
                else:
                    for e in range(d):
                        out[b, i, e] = x[b, i, e] + a * y[b, i, e]

        @ti.kernel
        def accumulate(acc: arr3, a: real, y: arr3, first: ti.i32):
            """acc = a * y (first) or acc += a * y."""
            ti.loop_config(serialize=serial)
            for b, i in ti.ndrange(acc.shape[0], acc.shape[1]):
                if ti.static(unrolled):
                    for e in ti.static(range(d)):
                        if first:
                            acc[b, i, e] = a * y[b, i, e]
                        else:
                            acc[b, i, e] += a * y[b, i, e]
                else:
                    for e in range(d):
                        if first:
                            acc[b, i, e] = a * y[b, i, e]
                        else:
                            acc[b, i, e] += a * y[b, i, e]

        @ti.func
        def set_point(y: ti.template(), b, i, e, value):
            y[b, i, e] = value

        @ti.func
        def unpadded(unused: ti.template(), i, sq):
            return sq

        retract_token = kernel_math.retraction(real, d, 0, zero, point, set_point, unpadded)

        @ti.kernel
        def retract(x: arr3):
            """Back onto the sphere by renormalising each token (no-op in flat space)."""
            if ti.static(sphere):
                ti.loop_config(serialize=serial)
                for b, i in ti.ndrange(x.shape[0], x.shape[1]):
                    retract_token(x, x, b, i)

        @ti.kernel
        def finite_check(x: arr3) -> ti.i32:
            """Index b * n + i of a token with a non-finite component, or -1."""
            bad = -1
            n = x.shape[1]
            for b, i in ti.ndrange(x.shape[0], n):
                if ti.static(unrolled):
                    for e in ti.static(range(d)):
                        if ti.math.isnan(x[b, i, e]) or ti.math.isinf(x[b, i, e]):
                            ti.atomic_max(bad, b * n + i)
                else:
                    for e in range(d):
                        if ti.math.isnan(x[b, i, e]) or ti.math.isinf(x[b, i, e]):
                            ti.atomic_max(bad, b * n + i)
            return bad

        self.project, self.pair, self.head_out, self.combine = project, pair, head_out, combine
        self.entropy_rate, self.reduce = entropy_rate, reduce
        self.axpy, self.accumulate, self.retract, self.finite_check = axpy, accumulate, retract, finite_check
        self.exponential = exponential
        self.spec = (real, d, H, r, rv, softmax_norm)
        self.gpu_spec = (rule, dtype, d, H, r, rv, features)
        self.features = features
        self.n_slots, self.d = n_slots, d


class PlainHeads:
    """project, pair and head_out on the (R, H, n, .) arrays."""

    after_project = None  # a layer's biases and rotary positions (head_terms.LayerTerms)

    def __init__(self, kern: KernelSet):
        self.kern = kern

    def __call__(self, x, ops, hint, observe):
        """The heads' outputs at state x into ops.f (and ops.row): ``layout.Operands``."""
        self.kern.project(x, ops.Q, ops.K, ops.W, ops.q, ops.k, ops.u)
        if self.after_project is not None:
            self.after_project(ops)
        self.kern.pair(ops.q, ops.k, ops.u, ops.beta, hint, ops.hreal, ops.g, ops.row, observe)
        self.kern.head_out(ops.g, ops.O, ops.f)


# -- the fast path for exponential rules ----------------------------------------------------
#
# Taichi scalarises vectors, and LLVM (its CPU backend) re-vectorises two loop shapes
# reliably; ``pair`` is built from them. (1) A register tile (``tile_sum``): a runtime loop
# whose body adds an outer product (TI coefficients) x (a vector of lanes) into TI x lanes
# scalars, both read as vector-typed array elements at constant offsets from one address,
# which the SLP vectoriser packs; its operands lie contiguously along the loop. (2) A loop
# of constant trip count over contiguous scratch, reductions included, which the loop
# vectoriser takes (the per-row passes over a block's weights). ``project`` and
# ``head_out`` are compiled with vectors left unscalarised instead (explicit SIMD, whole-
# vector stores). Indices are masked with INDEX_MASK / ELEMENT_MASK: no-ops for arrays
# under 2^30 floats / 2^26 vector elements that let LLVM prove an i32 index cannot wrap,
# hence that neighbours are adjacent in memory. ``benchmarks/step.py`` times the result.
INDEX_MASK = 0x3FFFFFFF
ELEMENT_MASK = 0x3FFFFFF
LARGE_N = 256  # from this many tokens on, the large tiles (their compile takes seconds)
# (dtype, large) -> TI rows per tile, L lanes per vector element, J columns per block.
TILES = {
    ("float32", True): (6, 16, 128),
    ("float64", True): (4, 8, 128),
    ("float32", False): (2, 8, 32),
    ("float64", False): (2, 8, 32),
}


def _pow2(k: int) -> int:
    return 1 << (k - 1).bit_length()


SMALL_RV = 8  # up to this value rank, the weighted sum of u runs along j (see pair)
A_SMALL = 2   # value components per pass along j


def _value_lanes(L: int, rv: int) -> int:
    """Lanes of the value accumulator (rv > SMALL_RV): L, or L / 2 when rv fits."""
    return L if rv > L // 2 else L // 2


class FastHeads:
    """project + pair + head_out for exponential rules on packed copies (O(n) memory).

    Layouts (b replica, h head, bh = b H + h, t < TI row of a tile, e < d, a component;
    ntile tiles of TI tokens, nbl groups of L tokens, npad = nbl L >= ntile TI tokens;
    value components in nac groups of AL lanes; TI-vectors are stored padded to TP = 2^k):
        xt  (R nbl d)          L-vectors   x, tokens in groups of L (zero padding)
        xq  (R ntq d)          TI-vectors  x, tokens in groups of TI, ntq TI >= npad
        qc, kc  (H ngq d)      TI-vectors  rows of Q, K in groups of TI (zero past r)
        ot  (H rv ndl)         L-vectors   O transposed
        qt  (R H ntile r)      TI-vectors  beta q: a tile's rows for one component
        kt  (R H nbl r)        L-vectors   k: a group's tokens for one component
        gt  (R H ntile rv)     TI-vectors  the normalised pulls g, as qt
        bias  (nbl)            L-vectors   0 for a real token, -1e30 for padding
    and for u, either (rv > SMALL_RV)
        wt  (H nac d)          AL-vectors  W transposed
        uc  (R H nac npu)      AL-vectors  u: a token's components, npu = ntq TI
    or (rv <= SMALL_RV, rvp = rv rounded up to A_SMALL)
        wt  (H ngw d)          TI-vectors  rows of W in groups of TI (zero past rv)
        uc  (R H rvp npad)     floats      u transposed
    """

    def __init__(self, spec, n_replicas: int, n: int, keep_qk: bool, features: Features = PLAIN):
        real, d, H, r, rv, softmax_norm = spec
        dtype = "float32" if real == ti.f32 else "float64"
        TI, L, J = TILES[(dtype, n >= LARGE_N)]
        AL = _value_lanes(L, rv)
        self.kernels = _fast_kernels(real, d, H, r, rv, softmax_norm, TI, L, J, AL, features.banded,
                                     features.biased, features.head_beta)
        R = n_replicas
        ntile = -(-n // TI)
        npad = -(-max(n, ntile * TI) // J) * J
        nbl, ntq, nac, ndl = npad // L, -(-npad // TI), -(-rv // AL), -(-d // L)
        vec_t, vec_l, vec_a = (ti.types.vector(k, real) for k in (_pow2(TI), L, AL))
        self.xt = ti.ndarray(vec_l, shape=(R * nbl * d,))
        self.xq = ti.ndarray(vec_t, shape=(R * ntq * d,))
        self.qc = ti.ndarray(vec_t, shape=(H * -(-r // TI) * d,))
        self.kc = ti.ndarray(vec_t, shape=(H * -(-r // TI) * d,))
        rvp = -(-rv // A_SMALL) * A_SMALL
        if rv <= SMALL_RV:
            self.wt = ti.ndarray(vec_t, shape=(H * -(-rvp // TI) * d,))
            self.uc = ti.ndarray(real, shape=(R * H * rvp * npad,))
        else:
            self.wt = ti.ndarray(vec_a, shape=(H * nac * d,))
            self.uc = ti.ndarray(vec_a, shape=(R * H * nac * ntq * TI,))
        self.ot = ti.ndarray(vec_l, shape=(H * rv * ndl,))
        self.qt = ti.ndarray(vec_t, shape=(R * H * ntile * r,))
        self.kt = ti.ndarray(vec_l, shape=(R * H * nbl * r,))
        self.gt = ti.ndarray(vec_t, shape=(R * H * ntile * rv,))
        self.bias = ti.ndarray(vec_l, shape=(nbl,))
        for a in (self.xt, self.xq, self.qc, self.kc, self.wt, self.uc, self.ot, self.qt, self.kt,
                  self.gt):
            if a.shape[0] >= (INDEX_MASK if a.element_type == real else ELEMENT_MASK):
                raise ParticlesUserError(f"{R} x {n} tokens is beyond the fast path's 32-bit indexing")
        self.n, self.keep_qk = n, keep_qk
        self._ready = False

    def __call__(self, x, ops, hint, observe):
        """Writes ops.f and ops.row (always: the row statistics cost O(n)); ops.q and ops.k
        if keep_qk. u and g are unused: the packed uc and gt take their place."""
        prep, project, pair, head_out = self.kernels
        first = not self._ready
        if first:
            with compile_options(scalarize=True):
                prep(ops.Q, ops.K, ops.W, ops.O, self.qc, self.kc, self.wt, self.ot, self.bias, self.n)
        with compile_options(scalarize=False, active=first):
            project(x, ops.beta, ops.hreal, self.qc, self.kc, self.wt, self.xt, self.xq, self.qt, self.kt,
                    self.uc, ops.q, ops.k, self.keep_qk)
        with compile_options(scalarize=True, active=first):
            pair(self.qt, self.kt, self.bias, self.uc, self.gt, ops.row, hint, ops.hreal, -1)
        with compile_options(scalarize=False, active=first):
            head_out(self.gt, self.ot, ops.f)
        self._ready = True


class compile_options:
    """Taichi compile options for a kernel's first call (when it compiles; a no-op unless
    active). Taichi's CFG passes off: they are quadratic in the unrolled register tiles (3x
    the compile time) and their rewrites stop LLVM from vectorising the tiles; LLVM's
    passes do the same job. Plain parallel range-fors, whose block size (1 for pair, see
    ``ti.loop_config``) is honoured: the multithreading-loop rewrite hands each thread at
    least 512 iterations, all of the work for a few hundred tiles. scalarize=False keeps
    Taichi vectors as LLVM vectors (explicit SIMD, whole-vector loads and stores)."""

    def __init__(self, scalarize: bool, active: bool = True):
        self.scalarize, self.active = scalarize, active

    def __enter__(self):
        if self.active:
            self.cfg = ti.lang.impl.current_cfg()
            self.saved = (self.cfg.cfg_optimization, self.cfg.make_cpu_multithreading_loop,
                          self.cfg.real_matrix_scalarize)
            self.cfg.cfg_optimization = False
            self.cfg.make_cpu_multithreading_loop = False
            self.cfg.real_matrix_scalarize = self.scalarize

    def __exit__(self, *exc):
        if self.active:
            (self.cfg.cfg_optimization, self.cfg.make_cpu_multithreading_loop,
             self.cfg.real_matrix_scalarize) = self.saved


@functools.lru_cache(maxsize=None)
def _fast_kernels(real, d: int, H: int, r: int, rv: int, softmax_norm: bool, TI: int, L: int,
                  J: int, AL: int, banded: bool = False, biased: bool = False, head_beta: bool = False):
    f32 = real == ti.f32
    ibits = ti.i32 if f32 else ti.i64
    sign_off = 0x7FFFFFFF if f32 else 0x7FFFFFFFFFFFFFFF
    shift = 31 if f32 else 63
    NEG_BIG = -3.0e38 if f32 else -1.0e300
    PAD = -1.0e30           # score of a padding column: its weight underflows to 0
    HIDDEN = -1.0e29        # banded: z - m below this is a PAD column (weight exactly 0)
    NB = J // L             # L-token groups per block
    lanes_j = rv <= SMALL_RV  # the weighted sum of u runs along j (see pair)
    A = A_SMALL
    ngq, nac, ndl = -(-r // TI), -(-rv // AL), -(-d // L)
    rvp = -(-rv // A) * A
    ngw = -(-rvp // TI)
    rva = rvp if lanes_j else nac * AL  # value rank padded to whole groups
    arr1, arr2, arr3, arr4 = kernel_math.ndarrays(real)
    int2 = ti.types.ndarray(dtype=ti.i32, ndim=2)
    vecL = ti.types.ndarray(dtype=ti.types.vector(L, real), ndim=1)
    TP = _pow2(TI)          # TI-vectors are stored padded to a power of 2: LLVM assumes
    vecT = ti.types.ndarray(dtype=ti.types.vector(TP, real), ndim=1)  # natural alignment
    vecA = ti.types.ndarray(dtype=ti.types.vector(AL, real), ndim=1)
    w_arr = vecT if lanes_j else vecA  # the types of wt and uc (see FastHeads)
    u_arr = arr1 if lanes_j else vecA
    row_norm = kernel_math.normalisation(real, softmax_norm, True, guarded=False)
    finish_row = kernel_math.row_finish(real, True, guarded=False)
    rebase = kernel_math.online_rebase(ti.exp)

    @ti.func
    def c(value):
        return ti.cast(value, real)

    @ti.func
    def tile_sum(init, cv: ti.template(), cbase, vv: ti.template(), vbase, vstride, K, never,
                 lanes: ti.template()):
        """init + sum_{a < K} cv[cbase + a] (x) vv[vbase + a vstride], a TI x lanes tile.

        The SLP vectoriser packs the tile only if (a) K is unknown to LLVM (a known trip
        count gets the loop unrolled into chains too deep for it), (b) the loop has a second
        exit (else the loop vectoriser takes it first) and (c) the caller lands the tile by
        consecutive stores in a local array that is also indexed at run time (so the array
        stays in memory). ``never`` is -1, unknown to LLVM: the caller passes K = r * -never
        for (a), and it makes the exit (b)."""
        s = init
        a = 0
        while a < K:
            w = cv[(cbase + a) & ELEMENT_MASK]
            v = vv[(vbase + a * vstride) & ELEMENT_MASK]
            for t in ti.static(range(TI)):
                for cc in ti.static(range(lanes)):
                    s[t, cc] += w[t] * v[cc]
            a += 1
            if a == never:
                break
        return s

    @ti.func
    def key(s):
        """An integer with the order of the float s (so max-reductions vectorise)."""
        bits = ti.bit_cast(s, ibits)
        return bits ^ ((bits >> shift) & ibits(sign_off))

    @ti.func
    def unkey(kk):
        return ti.bit_cast(kk ^ ((kk >> shift) & ibits(sign_off)), real)

    exp_le0 = kernel_math.exp_le0(real)  # e^x, x <= 0

    @ti.kernel
    def prep(Q: arr3, K: arr3, W: arr3, O: arr3, qc: vecT, kc: vecT, wt: w_arr, ot: vecL,
             bias: vecL, n: ti.i32):
        """The factor layouts and the padding bias (once: they never change)."""
        for h, g, e in ti.ndrange(H, ngq, d):
            vq = ti.Vector.zero(real, TP)
            vk = ti.Vector.zero(real, TP)
            for t in ti.static(range(TI)):
                if g * TI + t < r:
                    vq[t] = Q[h, g * TI + t, e]
                    vk[t] = K[h, g * TI + t, e]
            qc[(h * ngq + g) * d + e] = vq
            kc[(h * ngq + g) * d + e] = vk
        if ti.static(lanes_j):
            for h, g, e in ti.ndrange(H, ngw, d):
                vw = ti.Vector.zero(real, TP)
                for t in ti.static(range(TI)):
                    if g * TI + t < rv:
                        vw[t] = W[h, g * TI + t, e]
                wt[(h * ngw + g) * d + e] = vw
        else:
            for h, ac, e in ti.ndrange(H, nac, d):
                vw = ti.Vector.zero(real, AL)
                for cc in ti.static(range(AL)):
                    if ac * AL + cc < rv:
                        vw[cc] = W[h, ac * AL + cc, e]
                wt[(h * nac + ac) * d + e] = vw
        for h, a, ec in ti.ndrange(H, rv, ndl):
            vo = ti.Vector.zero(real, L)
            for cc in ti.static(range(L)):
                if ec * L + cc < d:
                    vo[cc] = O[h, ec * L + cc, a]
            ot[(h * rv + a) * ndl + ec] = vo
        for jl in range(bias.shape[0]):
            vb = ti.Vector.zero(real, L)
            for cc in ti.static(range(L)):
                if jl * L + cc >= n:
                    vb[cc] = c(PAD)
            bias[jl] = vb

    @ti.kernel
    def project(x: arr3, beta: arr1, hreal: arr2, qc: vecT, kc: vecT, wt: w_arr, xt: vecL, xq: vecT,
                qt: vecT, kt: vecL, uc: u_arr, q: arr4, k: arr4, keep_qk: ti.template()):
        """beta q, k, u into qt, kt, uc (and q, k with keep_qk). Compiled with Taichi
        vectors kept as LLVM vectors: each tile row is one vector, stored whole."""
        R, n = x.shape[0], x.shape[1]
        nbl = xt.shape[0] // (R * d)
        ntq = xq.shape[0] // (R * d)
        ntile = qt.shape[0] // (R * H * r)
        npad = nbl * L
        ti.loop_config(serialize=True)  # O(n d) copies: cheaper than a parallel dispatch
        for b, e in ti.ndrange(R, d):
            for jl in range(nbl):
                v = ti.Vector.zero(real, L)
                for cc in ti.static(range(L)):
                    if jl * L + cc < n:
                        v[cc] = x[b, jl * L + cc, e]
                xt[(b * nbl + jl) * d + e] = v
            for it in range(ntq):
                v = ti.Vector.zero(real, TP)
                for t in ti.static(range(TI)):
                    if it * TI + t < n:
                        v[t] = x[b, it * TI + t, e]
                xq[(b * ntq + it) * d + e] = v
        # one parallel loop over the k, q and u tiles (each parallel loop costs a dispatch)
        nk, nq = ngq * nbl, ngq * ntile
        nu = ngw * nbl if ti.static(lanes_j) else ntq * nac
        for b, h, blk in ti.ndrange(R, H, nk + nq + nu):
            bh = b * H + h
            if blk < nk:  # k: TI components x L tokens
                g, jl = blk // nbl, blk % nbl
                rows = [ti.Vector.zero(real, L) for _ in ti.static(range(TI))]
                for e in range(d):
                    w = kc[(h * ngq + g) * d + e]
                    v = xt[(b * nbl + jl) * d + e]
                    for t in ti.static(range(TI)):
                        rows[t] += w[t] * v
                for t in ti.static(range(TI)):
                    a = g * TI + t
                    if a < r:
                        kt[(bh * nbl + jl) * r + a] = rows[t]
                        if ti.static(keep_qk):
                            for cc in ti.static(range(L)):
                                if jl * L + cc < n:
                                    k[b, h, jl * L + cc, a] = rows[t][cc]
            elif blk < nk + nq:  # beta q: TI components x TI tokens
                g, it = (blk - nk) // ntile, (blk - nk) % ntile
                rows = [ti.Vector.zero(real, TP) for _ in ti.static(range(TI))]
                for e in range(d):
                    w = qc[(h * ngq + g) * d + e]
                    v = xq[(b * ntq + it) * d + e]
                    for t in ti.static(range(TI)):
                        rows[t] += w[t] * v
                for t in ti.static(range(TI)):
                    a = g * TI + t
                    if a < r:
                        bt = beta[b]
                        if ti.static(head_beta):  # the head's own beta, where it has one
                            if hreal[h, 1] > 0:
                                bt = hreal[h, 1]
                        qt[(bh * ntile + it) * r + a] = rows[t] * bt
                        if ti.static(keep_qk):
                            for cc in ti.static(range(TI)):
                                if it * TI + cc < n:
                                    q[b, h, it * TI + cc, a] = rows[t][cc]
            elif ti.static(lanes_j):  # u: TI components x L tokens
                g, jl = (blk - nk - nq) // nbl, (blk - nk - nq) % nbl
                rows = [ti.Vector.zero(real, L) for _ in ti.static(range(TI))]
                for e in range(d):
                    w = wt[(h * ngw + g) * d + e]
                    v = xt[(b * nbl + jl) * d + e]
                    for t in ti.static(range(TI)):
                        rows[t] += w[t] * v
                for t in ti.static(range(TI)):
                    a = g * TI + t
                    if a < rvp:
                        for cc in ti.static(range(L)):
                            uc[(bh * rvp + a) * npad + jl * L + cc] = rows[t][cc]
            else:  # u: TI tokens x AL components
                it, ac = (blk - nk - nq) // nac, (blk - nk - nq) % nac
                rows = [ti.Vector.zero(real, AL) for _ in ti.static(range(TI))]
                for e in range(d):
                    w = xq[(b * ntq + it) * d + e]
                    v = wt[(h * nac + ac) * d + e]
                    for t in ti.static(range(TI)):
                        rows[t] += w[t] * v
                for t in ti.static(range(TI)):
                    uc[(bh * nac + ac) * ntq * TI + it * TI + t] = rows[t]

    @ti.kernel
    def pair(qt: vecT, kt: vecL, bias: vecL, uc: u_arr, gt: vecT, row: arr4, hint: int2, hreal: arr2,
             never: ti.i32):
        """g_i = sum_j w_ij u_j for the TI rows of a tile per thread, in blocks of J columns:
        scores (register tile), block maximum and re-basing, weights (vectorised exp), then
        the weighted sum of u (register tile). Row statistics as in ``pair``. banded: only
        the blocks that meet the tile's bands (hint[h] = keys below, above a row); in a block
        that crosses a band edge the hidden scores become PAD, their weights exactly 0.
        biased: z_ij -= slope_h |i - j| (hreal[h, 0]) as the scores land."""
        R, n = row.shape[0], row.shape[2]
        ntile = qt.shape[0] // (R * H * r)
        nbl = bias.shape[0]
        npad = nbl * L
        npu = uc.shape[0] // (R * H * (rvp if ti.static(lanes_j) else nac))
        one = -never  # 1, unknown to LLVM (see tile_sum)
        rk, jn = r * one, J * one
        ti.loop_config(block_dim=1)  # a tile is heavy: hand them out one by one
        for b, h, it in ti.ndrange(R, H, ntile):
            bh = b * H + h
            m = ti.Vector([c(NEG_BIG)] * TI)    # running maximum of z per row
            wsum = ti.Vector.zero(real, TI)     # sum of e^{z - m}
            ent = ti.Vector.zero(real, TI)      # sum of e^{z - m} (z - m)
            acc = ti.Matrix.zero(real, TI, rva)  # sum of e^{z - m} u_j
            w = ti.Matrix.zero(real, TI, J)      # scores, then weights, of one block
            jb_lo, jb_hi = 0, npad // J
            below, above = 0, 0
            slope = c(0)
            if ti.static(biased):
                slope = hreal[h, 0]
            if ti.static(banded):
                below, above = hint[h, 0], hint[h, 1]
                i_last = ti.min(it * TI + TI, n) - 1
                jb_lo = ti.max(0, it * TI - below) // J
                jb_hi = (ti.min(n, i_last + above + 1) + J - 1) // J
            for jb in range(jb_lo, jb_hi):
                for jl in range(NB):
                    init = ti.Matrix.zero(real, TI, L)
                    bv = bias[jb * NB + jl]
                    for t in ti.static(range(TI)):
                        for cc in ti.static(range(L)):
                            init[t, cc] = bv[cc]
                    s = tile_sum(init, qt, (bh * ntile + it) * r, kt, (bh * nbl + jb * NB + jl) * r,
                                 1, rk, never, L)
                    for t in ti.static(range(TI)):
                        for cc in ti.static(range(L)):
                            if ti.static(biased):
                                dist = ti.abs(it * TI + t - ((jb * NB + jl) * L + cc))
                                w[t, jl * L + cc] = s[t, cc] - slope * c(dist)
                            else:
                                w[t, jl * L + cc] = s[t, cc]
                edge = False
                if ti.static(banded):
                    # a block wholly inside every row's band needs no mask
                    edge = jb * J < it * TI + TI - 1 - below or jb * J + J - 1 > it * TI + above
                    if edge:
                        for t in ti.static(range(TI)):
                            for j in range(J):
                                col = jb * J + j
                                if col < it * TI + t - below or col > it * TI + t + above:
                                    w[t, j] = c(PAD)
                for t in ti.static(range(TI)):  # one row per loop: fewer live registers
                    top = key(c(NEG_BIG))
                    for j in range(J):
                        top = ti.max(top, key(w[t, j]))
                    mb = unkey(top)
                    if mb > m[t]:
                        scale, wsum[t], ent[t] = rebase(m[t], mb, wsum[t], ent[t], True)
                        for a in range(rva):
                            acc[t, a] *= scale
                        m[t] = mb
                for t in ti.static(range(TI)):
                    wpart = c(0)
                    epart = c(0)
                    for j in range(J):
                        zm = w[t, j] - m[t]
                        e = exp_le0(zm)
                        if ti.static(banded):  # hidden keys (PAD): weight exactly 0, not e^-87
                            e = ti.select(zm > c(HIDDEN), e, c(0))
                            zm = ti.select(zm > c(HIDDEN), zm, c(0))
                        w[t, j] = e
                        wpart += e
                        epart += e * zm
                    wsum[t] += wpart
                    ent[t] += epart
                if ti.static(lanes_j):
                    # small rv: A components at a time, reductions along j (loop vectoriser)
                    for ab in range(rvp // A):
                        base = ti.Vector([0] * A)
                        for aa in ti.static(range(A)):
                            base[aa] = ((bh * rvp + ab * A + aa) * npu + jb * J) & INDEX_MASK
                        part = ti.Matrix.zero(real, TI, A)
                        for j in range(J):
                            for aa in ti.static(range(A)):
                                uj = uc[base[aa] + j]
                                for t in ti.static(range(TI)):
                                    part[t, aa] += w[t, j] * uj
                        for aa in ti.static(range(A)):
                            for t in ti.static(range(TI)):
                                acc[t, ab * A + aa] += part[t, aa]
                else:
                    # AL components at a time: a register tile, coefficients from w
                    for ac in range(nac * one):
                        s = ti.Matrix.zero(real, TI, AL)
                        ubase = (bh * nac + ac) * npu + jb * J
                        j = 0
                        while j < jn:  # as in tile_sum
                            uv = uc[(ubase + j) & ELEMENT_MASK]
                            for t in ti.static(range(TI)):
                                wt = w[t, j]
                                for cc in ti.static(range(AL)):
                                    s[t, cc] += wt * uv[cc]
                            j += 1
                            if j == never:
                                break
                        for t in ti.static(range(TI)):
                            for cc in ti.static(range(AL)):
                                acc[t, ac * AL + cc] += s[t, cc]
            norm = ti.Vector.zero(real, TI)
            for t in ti.static(range(TI)):
                i = it * TI + t
                if i < n:
                    count = c(n)  # mean normalisation: the number of visible keys
                    if ti.static(banded):
                        count = c(ti.min(n, i + above + 1) - ti.max(0, i - below))
                    norm[t] = row_norm(wsum[t], m[t], count)
                    row[b, h, i, 0] = m[t]
                    row[b, h, i, 1] = wsum[t]
                    stats = finish_row(m[t], wsum[t], ent[t], c(0), c(0), c(0))
                    row[b, h, i, 2] = stats[0]
                    row[b, h, i, 3] = stats[1]
            for a in range(rv):
                gv = ti.Vector.zero(real, TP)
                for t in ti.static(range(TI)):
                    gv[t] = acc[t, a] * norm[t]
                gt[(bh * ntile + it) * rv + a] = gv

    @ti.kernel
    def head_out(gt: vecT, ot: vecL, f: arr4):
        """f^h_i = O_h g^h_i: TI tokens x L components per tile (LLVM vectors, as project)."""
        R, n = f.shape[0], f.shape[2]
        ntile = gt.shape[0] // (R * H * rv)
        for b, h, it, ec in ti.ndrange(R, H, ntile, ndl):
            bh = b * H + h
            rows = [ti.Vector.zero(real, L) for _ in ti.static(range(TI))]
            for a in range(rv):
                w = gt[(bh * ntile + it) * rv + a]
                v = ot[(h * rv + a) * ndl + ec]
                for t in ti.static(range(TI)):
                    rows[t] += w[t] * v
            for t in ti.static(range(TI)):
                i = it * TI + t
                if i < n:
                    for cc in ti.static(range(L)):
                        if ti.static(ndl * L == d):
                            f[b, h, i, ec * L + cc] = rows[t][cc]
                        elif ec * L + cc < d:
                            f[b, h, i, ec * L + cc] = rows[t][cc]

    return prep, project, pair, head_out


# the implementations of ``paths.SPECS`` this module serves: factory(kern, R, n, keep_qk)
paths.register("plain", lambda kern, R, n, keep_qk: PlainHeads(kern))
paths.register("serial", lambda kern: kern.reduce)   # paths.REDUCTIONS: the CPU's
paths.register("fast", lambda kern, R, n, keep_qk: FastHeads(kern.spec, R, n, keep_qk, features=kern.features))
