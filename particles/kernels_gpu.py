"""Kernels shaped for a GPU (CUDA, Vulkan, Metal): the tiled path's implementation 'gpu'
(``paths.SPECS``, registered below), and the reduction 'chunked' that the plan names on a GPU
arch (``paths.REDUCTIONS``).

``TiledHeads``: the pair pass, the only O(n^2) work, with key tiles staged in shared memory
and several query rows per thread (see the section below); project and head_out are the
plain parallel kernels of ``KernelSet``.

``Reduce``: the column reductions over tokens of the observables
(``kernel_math.column_reduction``) as per-chunk partials
(one thread per (replica, column, chunk of CHUNK tokens)) and a finish over the chunks
(one thread per (replica, column)): parallel, no loop over n on a single thread, and a
fixed summation order, so a run is reproducible on one device. It accumulates in float64
where the device has it, else in float32; the log-sum-exp of the row energies is summed
after the shift by the maximum, so its exponentials lie in (0, 1] in either type.
"""
import functools

import taichi as ti

from . import backend, kernel_math, paths

CHUNK = 256  # tokens per partial sum


class Reduce:
    """Called as ``KernelSet.reduce(tok, x, out, sumx, slot)``: the reduction 'chunked'."""

    def __init__(self, n_slots: int, d: int):
        self.acc = backend.reduction_dtype()
        self.n_cols = n_slots + d  # the observable slots, then the d components of sum x_i/|x_i|
        self.partial, self.finish = _reduce_kernels(n_slots, d, self.acc)
        self._parts: dict[tuple[int, int], ti.Ndarray] = {}

    def __call__(self, tok, x, out, sumx, slot: int) -> None:
        R, n = tok.shape[0], tok.shape[1]
        part = self._parts.get((R, n))
        if part is None:
            part = self._parts[(R, n)] = ti.ndarray(self.acc, shape=(R, self.n_cols, -(-n // CHUNK), 4))
        self.partial(tok, x, part)
        self.finish(part, out, sumx, slot)


@functools.lru_cache(maxsize=None)
def _reduce_kernels(n_slots: int, d: int, acc):
    any3 = ti.types.ndarray(ndim=3)
    any4 = ti.types.ndarray(ndim=4)
    direction_norm, _ = kernel_math.direction_sum(acc, d)

    @ti.func
    def column(tok: ti.template(), x: ti.template(), b, i, col):
        """Slot col of token i, or for col >= n_slots component col - n_slots of x_i / |x_i|."""
        value = ti.cast(0, acc)
        if col < n_slots:
            value = ti.cast(tok[b, i, col], acc)
        else:
            norm = direction_norm(x, b, i)
            if norm > 0:
                value = ti.cast(x[b, i, col - n_slots], acc) / norm
        return value

    @ti.func
    def with_lse(col):  # the log-sum-exp is read for the row energies only
        return col < n_slots and kernel_math.is_row_energy_slot(col)

    chunk = kernel_math.column_reduction(acc, column, with_lse)

    @ti.func
    def chunk_partial(part: ti.template(), unused: ti.template(), b, ck, col):
        return ti.Vector([part[b, col, ck, k] for k in ti.static(range(4))])

    @ti.func
    def slot_column(col):  # the chunks' exponential sums are combined for every slot
        return col < n_slots

    chunks = kernel_math.column_reduction(acc, chunk_partial, slot_column, partials=True)

    @ti.kernel
    def partial(tok: any3, x: any3, part: any4):
        """part[b, col, chunk] = (sum, min, max, sum of e^(v - max)) over the chunk's tokens."""
        n = tok.shape[1]
        for b, col, ck in ti.ndrange(tok.shape[0], part.shape[1], part.shape[2]):
            r = chunk(tok, x, b, col, ck * CHUNK, ti.min(ck * CHUNK + CHUNK, n))
            for k in ti.static(range(4)):
                part[b, col, ck, k] = r[k]

    @ti.kernel
    def finish(part: any4, out: any4, sumx: any4, slot: ti.i32):
        """Combine the chunks in order into out[slot] (slots) and sumx[slot] (sum of x_i/|x_i|)."""
        for b, col in ti.ndrange(part.shape[0], part.shape[1]):
            r = chunks(part, part, b, col, 0, part.shape[2])
            if col < n_slots:
                kernel_math.store_column(out, slot, b, col, r)
            else:
                sumx[slot, b, col - n_slots, 0] = r[0]

    return partial, finish


# -- the tiled pair pass -------------------------------------------------------------------
#
# THREADS per thread block, each owning `rows_per_thread` query rows i (strided by THREADS,
# so that neighbouring threads touch neighbouring rows). The block walks the keys in tiles
# of `key_tile` tokens: its threads load the tile's k_j and u_j together into shared memory
# (coalesced: consecutive threads, consecutive components), wait, and each thread then
# sweeps the tile with its rows' beta q_i and accumulators in registers (online softmax, as
# the CPU path); one shared-memory read of k_j, u_j serves all of a thread's rows. Each
# thread writes only its own rows: gather, no atomics, one summation order on every run.
THREADS = 64
SHARED_BYTES = 16384  # shared memory per block that every Vulkan device guarantees
REGISTER_FLOATS = 128  # q and accumulator floats per thread, rows_per_thread (r + rv)


MAX_KEY_TILE = 64  # keys per tile at most: more blocks fit on a multiprocessor at a time


def key_tile(r: int, rv: int, itemsize: int) -> int:
    """Keys per shared-memory tile: the largest power of two up to MAX_KEY_TILE whose k and u fit."""
    fit = min(MAX_KEY_TILE, max(1, SHARED_BYTES // (itemsize * (r + rv))))
    return 1 << (fit.bit_length() - 1)


def rows_per_thread(r: int, rv: int) -> int:
    """4, 2 or 1 rows per thread, as many as keep q and the accumulators in registers."""
    return next(k for k in (4, 2, 1) if k * (r + rv) <= REGISTER_FLOATS or k == 1)


class TiledHeads:
    """project, the tiled pair pass and head_out: implementation 'gpu' of the tiled path."""

    def __init__(self, kern, rule, dtype: str, d: int, H: int, r: int, rv: int, features):
        self.kern = kern
        self.pair = _tiled_pair(rule, dtype, d, H, r, rv, features)

    def __call__(self, x, ops, hint, observe):
        """The heads' outputs at state x into ops.f (and ops.row): ``layout.Operands``."""
        self.kern.project(x, ops.Q, ops.K, ops.W, ops.q, ops.k, ops.u)
        self.pair(ops.q, ops.k, ops.u, ops.beta, hint, ops.hreal, ops.g, ops.row, observe)
        self.kern.head_out(ops.g, ops.O, ops.f)


@functools.lru_cache(maxsize=None)
def _tiled_pair(rule, dtype: str, d: int, H: int, r: int, rv: int, features):
    """Features (see ``kernels.Features``): a block walks only the key tiles that meet the
    union of its rows' bands (a causal block stops at its last row: about half the tiles),
    and each row only the keys of its own band inside them."""
    real = ti.f32 if dtype == "float32" else ti.f64
    banded, biased, head_beta, filtered = (features.banded, features.biased, features.head_beta,
                                           features.filtered)
    exponential = rule.exponential
    softmax_norm = rule.normalization == "softmax"
    add_key = kernel_math.key_by_key(rule, real)
    row_norm = kernel_math.normalisation(real, softmax_norm, exponential)
    finish_row = kernel_math.row_finish(real, exponential)
    NEG_BIG = -3.0e38 if dtype == "float32" else -1.0e300
    T = THREADS
    RT = rows_per_thread(r, rv)
    BK = key_tile(r, rv, 4 if dtype == "float32" else 8)
    loads_k, loads_u = -(-BK * r // T), -(-BK * rv // T)  # shared-memory stores per thread
    arr1, arr2, _, arr4 = kernel_math.ndarrays(real)
    int2 = ti.types.ndarray(dtype=ti.i32, ndim=2)

    @ti.func
    def c(value):
        return ti.cast(value, real)

    @ti.kernel
    def pair(q: arr4, k: arr4, u: arr4, beta: arr1, hint: int2, hreal: arr2, g: arr4, row: arr4,
             observe: ti.template()):
        """g_i = sum_j w_ij u_j, normalised; with observe, row energies and entropies (as
        ``KernelSet.pair``), keys staged tile by tile in shared memory."""
        R, n = q.shape[0], q.shape[2]
        n_row_tiles = (n + T * RT - 1) // (T * RT)
        n_key_tiles = (n + BK - 1) // BK
        ti.loop_config(block_dim=T)
        for t in range(R * H * n_row_tiles * T):
            tid = t % T  # the thread's place in its block (the loop is cut into blocks of T)
            bh = t // (T * n_row_tiles)
            b, h = bh // H, bh % H
            first = (t // T) % n_row_tiles * T * RT + tid  # rows first + s T, s < RT
            k_tile = ti.simt.block.SharedArray((BK * r,), real)
            u_tile = ti.simt.block.SharedArray((BK * rv,), real)
            bt = beta[b]
            if ti.static(head_beta):
                if hreal[h, 1] > 0:
                    bt = hreal[h, 1]
            qi = ti.Matrix.zero(real, RT, r)
            for s in ti.static(range(RT)):
                if first + s * T < n:  # rows past n pad the last block: they load, wait, write nothing
                    for a in ti.static(range(r)):
                        qi[s, a] = q[b, h, first + s * T, a] * bt
            acc = ti.Matrix.zero(real, RT, rv)
            m = ti.Vector([c(NEG_BIG)] * RT)  # running maximum of z (exponential rules)
            wsum = ti.Vector.zero(real, RT)   # sum of (shifted) kernel weights
            ent = ti.Vector.zero(real, RT)    # entropy accumulator
            pot = ti.Vector.zero(real, RT)    # row sum of the potential (non-exponential rules)
            top = ti.Vector.zero(real, RT)    # kernel rules: the largest weight, the positive
            wpos = ti.Vector.zero(real, RT)   # weights' sum
            # the key tiles this block walks (uniform over the block: it syncs)
            kt_lo, kt_hi = 0, n_key_tiles
            below, above = 0, 0
            if ti.static(banded):
                below, above = hint[h, 0], hint[h, 1]
                block_first = first - tid
                block_last = ti.min(block_first + T * RT, n) - 1
                kt_lo = ti.max(0, block_first - below) // BK
                kt_hi = (ti.min(n, block_last + above + 1) + BK - 1) // BK
            serve = True
            if ti.static(filtered):
                if hint[h, 2] == 0:  # another rule's pass serves this head (uniform per block)
                    kt_hi = kt_lo
                    serve = False
            for kt in range(kt_lo, kt_hi):
                j0 = kt * BK
                # (if statements, not `a if c else b`: Taichi evaluates both sides of that)
                for s in ti.static(range(loads_k)):
                    idx = s * T + tid
                    if idx < BK * r:
                        value = c(0)
                        if j0 + idx // r < n:
                            value = k[b, h, j0 + idx // r, idx % r]
                        k_tile[idx] = value
                for s in ti.static(range(loads_u)):
                    idx = s * T + tid
                    if idx < BK * rv:
                        value = c(0)
                        if j0 + idx // rv < n:
                            value = u[b, h, j0 + idx // rv, idx % rv]
                        u_tile[idx] = value
                ti.simt.block.sync()
                for jj in range(ti.min(BK, n - j0)):
                    kj = ti.Vector.zero(real, r)  # k_j, u_j in registers when they serve several rows
                    uj = ti.Vector.zero(real, rv)
                    if ti.static(RT > 1):
                        for a in ti.static(range(r)):
                            kj[a] = k_tile[jj * r + a]
                        for a in ti.static(range(rv)):
                            uj[a] = u_tile[jj * rv + a]
                    for s in ti.static(range(RT)):
                        i_s = first + s * T
                        j = j0 + jj
                        seen = True
                        if ti.static(banded):  # the row's own band
                            seen = j >= i_s - below and j <= i_s + above
                        if seen:
                            z = c(0)
                            for a in ti.static(range(r)):
                                if ti.static(RT > 1):
                                    z += qi[s, a] * kj[a]
                                else:
                                    z += qi[s, a] * k_tile[jj * r + a]
                            if ti.static(biased):
                                z -= hreal[h, 0] * c(ti.abs(i_s - j))
                            w, rebased, scale, m[s], wsum[s], ent[s], wpos[s], top[s], pot[s] = add_key(
                                z, i_s, j, n, m[s], wsum[s], ent[s], wpos[s], top[s], pot[s], observe)
                            if rebased:
                                for a in ti.static(range(rv)):
                                    acc[s, a] *= scale
                            for a in ti.static(range(rv)):
                                if ti.static(RT > 1):
                                    acc[s, a] += w * uj[a]
                                else:
                                    acc[s, a] += w * u_tile[jj * rv + a]
                ti.simt.block.sync()  # the tile is read by all before the next one lands
            for s in ti.static(range(RT)):
                i = first + s * T
                if i < n and serve:
                    count = c(n)  # mean normalisation: the number of visible keys
                    if ti.static(banded):
                        count = c(ti.min(n, i + above + 1) - ti.max(0, i - below))
                    norm = row_norm(wsum[s], m[s], count)
                    for a in ti.static(range(rv)):
                        g[b, h, i, a] = acc[s, a] * norm
                    if ti.static(observe):
                        stats = finish_row(m[s], wsum[s], ent[s], wpos[s], top[s], pot[s])
                        row[b, h, i, 0] = m[s]
                        row[b, h, i, 1] = wsum[s]
                        row[b, h, i, 2] = stats[0]
                        row[b, h, i, 3] = stats[1]

    return pair


paths.register("gpu", lambda kern, R, n, keep_qk: TiledHeads(kern, *kern.gpu_spec))
paths.register("chunked", lambda kern: Reduce(kern.n_slots, kern.d))
