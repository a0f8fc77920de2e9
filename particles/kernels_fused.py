"""The small-n path: k whole steps in one kernel launch, no launch floor.

For systems that fit in cache, the ~25 launches of an RK4 step (about 80 us each) cost far
more than the arithmetic. ``FusedSteps`` advances k steps in ONE launch: every integrator
stage, the retraction, and the observables of the logged steps (reduced on the device into
the Simulation's batch buffer). Replicas of an ensemble run in parallel, one per thread;
inside a replica everything is serial.

SIMD: Taichi 1.7 runs LLVM's IR optimisation with a generic x86-64 cost model (128-bit
vectors, what the loop vectoriser picks), while the JIT's code generator targets the host
CPU (AVX-512 here). So the full width comes only from explicit Taichi vectors compiled
unscalarised: the state lives transposed, ``L`` tokens per vector (16 float32 / 8 float64
= 512 bits), and every loop over tokens is a loop over such vectors. Taichi cannot cast,
bit-cast or call exp on those vectors, so the float32 exp is a polynomial of e^(z / 32)
squared five times (``exp_clamped``).

Layout per replica b (e < d, a < rank, jl < nbl groups of L tokens, npad = nbl L):
    xt, st, kt_, at  (R, d, nbl)     state, stage state, stage velocity, RK4 sum (transposed)
    qv       (R, H, r, nbl)          beta Q_h x_i over tokens (rows i in lanes)
    ks, us   (R, H, n, r|rv)         K_h x_j, W_h x_j: scalars, broadcast against L rows
    gv       (R, H, rv, nbl)         normalised pulls g_i = sum_j w_ij u_j
    fv       (R, H, d, nbl)          head outputs f^h_i = O_h g_i
    rowv     (R, H, 3, nbl)          per token: row entropy, row energy, radial shadow a^h_i
    zs       (R, TRF, n)             the scores of TRF L rows against every column
    mask     (nbl)                   1 for a token, 0 for padding
"""

import functools
import math

import taichi as ti

from . import kernels
from .kernels import SLOTS_PER_HEAD, n_tok_slots

# Auto choice (Simulation(path="auto")): the fused path for ranks up to FUSED_MAX_RANK (its
# per-row accumulators live in registers) and no entropy rate (it needs a second pair pass the
# fused kernel does not have), while the pair work of an evaluation, n^2 H (r + rv + EXP_COST)
# multiply-add equivalents, stays under FUSED_MAX_WORK (float32), or n <= FUSED_MAX_N (float64,
# whose exp is libm per lane). Above it the tiled path, whose two threads per replica win once
# a step's pair work dwarfs its launches. Measured single-replica RK4, tiled / fused time:
# (1024, 3, 1) 1.74, (2048, 3, 1) 1.24, (1024, 8, 3) 1.21, (512, 16, 4) 1.35 (59e6 to 126e6);
# (1024, 16, 4) 0.81 (235e6).
FUSED_MAX_N = 256
FUSED_MAX_WORK = 150e6
EXP_COST = 24  # the float32 exp and the weight bookkeeping, in multiply-adds per pair
FUSED_MAX_RANK = 32
PATHS = ("auto", "fused", "tiled")
TRF = 2        # row vectors per register tile of the pair pass (measured: 4 at r = 3, 1 at r = 16 no faster)
CLAMP = -30.0  # float32 weights below e^-30 relative to the row maximum are rounded up to it
EXP_SQUARINGS = 5  # the float32 exp squares e^(z / 32): |z / 32| <= 0.94 for z >= CLAMP
EXP_DEGREE = 7     # Taylor degree of e^y there: truncation below the squarings' rounding for z >= -10


def pair_work(n: int, H: int, r: int, rv: int) -> float:
    """Multiply-add equivalents of one evaluation's pair pass (the auto path choice)."""
    return float(n) * n * H * (r + rv + EXP_COST)


def choose_path(path: str, n: int, H: int, r: int, rv: int, dtype: str, arch: str,
                entropy_rate: bool) -> str:
    """'fused' or 'tiled' for a requested path; raises for a fused request it cannot serve."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    reason = None
    if arch != "cpu":
        reason = "it runs on the CPU only"
    elif entropy_rate:
        reason = "it has no entropy-rate pass"
    if path == "fused":
        if reason:
            raise ValueError(f"path 'fused' is not available here: {reason}; use path 'tiled' or 'auto'")
        return "fused"
    small = n <= FUSED_MAX_N or (dtype == "float32" and pair_work(n, H, r, rv) <= FUSED_MAX_WORK)
    if path == "tiled" or reason or not small or max(r, rv) > FUSED_MAX_RANK:
        return "tiled"
    return "fused"


class FusedSteps:
    """The fused kernel and its scratch for R replicas of n tokens."""

    def __init__(self, rule, geometry: str, dtype: str, d: int, H: int, r: int, rv: int,
                 integrator: str, R: int, n: int):
        real = ti.f32 if dtype == "float32" else ti.f64
        L = 16 if dtype == "float32" else 8
        self.L, self.n = L, n
        nbl = -(-n // L)
        nblp = -(-nbl // TRF) * TRF  # row groups padded to whole register tiles (zero rows)
        vec = ti.types.vector(L, real)
        self.kernel = _fused_kernel(rule, geometry, dtype, d, H, r, rv, integrator, L)

        def varr(*shape):
            return ti.ndarray(vec, shape=shape)

        self.xt, self.st, self.kt, self.at = (varr(R, d, nbl) for _ in range(4))
        self.qv, self.gv = varr(R, H, r, nblp), varr(R, H, rv, nblp)
        self.ks = ti.ndarray(real, shape=(R, H, n, r))
        self.us = ti.ndarray(real, shape=(R, H, n, rv))
        self.fv = varr(R, H, d, nbl)
        self.rowv = varr(R, H, 3, nblp)  # entropy, row energy, radial a^h
        self.zs = varr(R, TRF, n)
        self.mask = varr(nbl)
        import numpy as np
        m = (np.arange(nbl * L) < n).astype(np.float32 if dtype == "float32" else np.float64)
        self.mask.from_numpy(m.reshape(nbl, L))
        self._compiled = False

    def __call__(self, sim, steps: int, observe_every: int, observe_now: bool, slot: int) -> None:
        """steps > 0: advance; steps == 0: xdot at the current state (observed if observe_now,
        reduced into batch slot ``slot``)."""
        args = (sim._x, sim._Q, sim._K, sim._W, sim._O, sim._beta, sim._xdot, sim._tok, sim._red,
                sim._sumx, self.xt, self.st, self.kt, self.at, self.qv, self.ks, self.us, self.gv,
                self.fv, self.rowv, self.zs, self.mask, sim.dt, int(steps), int(observe_every),
                int(sim.step_count), int(observe_now), int(slot))
        with kernels._compile_options(scalarize=False, active=not self._compiled):
            self.kernel(*args)
        self._compiled = True


def vector_helpers(real, L: int):
    """(c, splat, vabs, exp_clamped) for L-lane Taichi vectors compiled unscalarised (shared
    with kernels_wide)."""
    f32 = real == ti.f32
    vec = ti.types.vector(L, real)
    taylor = [1.0 / math.factorial(k) for k in range(EXP_DEGREE + 1)]

    @ti.func
    def c(value):
        return ti.cast(value, real)

    @ti.func
    def splat(value):
        return vec([c(value)] * L)

    @ti.func
    def vabs(v):
        return ti.max(v, v * c(-1))  # Taichi vectors have no abs (nor negation) unscalarised

    @ti.func
    def exp_clamped(zc):
        """e^zc for CLAMP <= zc <= 0, lane-wise. float32: e^zc = (e^(zc / 2^S))^(2^S), the inner
        exp by its Taylor polynomial of degree EXP_DEGREE on [-30 / 2^S, 0] (exact at 0), then S
        squarings: 20 vector operations, against ~48 for a Cody-Waite reduction whose 2^n has to
        be built by selects (Taichi vectors have no bit casts). The squarings double the
        rounding error five times: absolute error <= 1.4e-6, relative <= 3.4e-6 for zc >= -10
        (weights that count), within the float32 tolerance of a step (1e-5). float64: libm per lane."""
        result = zc
        if ti.static(f32):
            y = zc * c(1.0 / 2 ** EXP_SQUARINGS)
            p = splat(taylor[EXP_DEGREE])
            for k in ti.static(range(EXP_DEGREE - 1, -1, -1)):
                p = p * y + c(taylor[k])
            for _ in ti.static(range(EXP_SQUARINGS)):
                p = p * p
            result = p
        else:
            for k in range(L):
                result[k] = ti.exp(zc[k])
        return result

    return c, splat, vabs, exp_clamped


@functools.lru_cache(maxsize=None)
def _fused_kernel(rule, geometry: str, dtype: str, d: int, H: int, r: int, rv: int,
                  integrator: str, L: int):
    real = ti.f32 if dtype == "float32" else ti.f64
    f32 = dtype == "float32"
    sphere = geometry == "sphere"
    rk4 = integrator == "rk4"
    STAGES = 4 if rk4 else 1
    exponential = rule.exponential
    softmax_norm = rule.normalization == "softmax"
    kernel_fn = None if exponential else ti.func(rule.kernel)
    potential_fn = ti.func(rule.potential) if (rule.potential is not None and not exponential) else None
    with_potential = potential_fn is not None
    NEG_BIG = -3.0e38 if f32 else -1.0e300
    n_slots = n_tok_slots(H)
    vec = ti.types.vector(L, real)
    arr1 = ti.types.ndarray(dtype=real, ndim=1)
    arr3 = ti.types.ndarray(dtype=real, ndim=3)
    arr4 = ti.types.ndarray(dtype=real, ndim=4)
    f64arr4 = ti.types.ndarray(dtype=ti.f64, ndim=4)
    v1 = ti.types.ndarray(dtype=vec, ndim=1)
    v3 = ti.types.ndarray(dtype=vec, ndim=3)
    v4 = ti.types.ndarray(dtype=vec, ndim=4)
    c, splat, vabs, exp_clamped = vector_helpers(real, L)

    @ti.func
    def evaluate(b, y: ti.template(), out: ti.template(), Qf: ti.template(), Kf: ti.template(),
                 Wf: ti.template(), Of: ti.template(), beta: ti.template(), n, observe,
                 tok: ti.template(), qv: ti.template(), ks: ti.template(), us: ti.template(),
                 gv: ti.template(), fv: ti.template(), rowv: ti.template(), zs: ti.template(),
                 mask: ti.template()):
        """out = xdot at the state y (transposed), for replica b; with observe, the per-token
        observables into tok. Loops over heads and components run at run time (static
        unrolling multiplies Taichi's compile time); only the register accumulators are static."""
        nbl = mask.shape[0]
        bt = beta[b]
        # projections, L tokens at a time: beta q over rows (lanes), k and u per token (scalars)
        for jl in range(nbl):
            yv = [y[b, e, jl] for e in ti.static(range(d))]
            for h in range(H):
                for a in range(r):
                    sq = splat(0)
                    sk = splat(0)
                    for e in ti.static(range(d)):
                        sq += Qf[h, a, e] * yv[e]
                        sk += Kf[h, a, e] * yv[e]
                    qv[b, h, a, jl] = sq * bt
                    for k in range(L):
                        if jl * L + k < n:
                            ks[b, h, jl * L + k, a] = sk[k]
                for a in range(rv):
                    su = splat(0)
                    for e in ti.static(range(d)):
                        su += Wf[h, a, e] * yv[e]
                    for k in range(L):
                        if jl * L + k < n:
                            us[b, h, jl * L + k, a] = su[k]
        # the pair pass: TRF x L rows at a time (one per lane of TRF vectors) against one
        # column j at a time, so no reduction ever crosses lanes and each broadcast of k_j, u_j
        # serves TRF vectors; scores first (for the row maxima), then weights
        for h in range(H):
            for ip in range(qv.shape[3] // TRF):
                il0 = ip * TRF
                qa = [[qv[b, h, a, il0 + t] for a in ti.static(range(r))] for t in ti.static(range(TRF))]
                acc = [[splat(0) for _ in ti.static(range(rv))] for _ in ti.static(range(TRF))]
                wsum = [splat(0) for _ in ti.static(range(TRF))]
                ent = [splat(0) for _ in ti.static(range(TRF))]
                pot = [splat(0) for _ in ti.static(range(TRF))]
                m = [splat(0) for _ in ti.static(range(TRF))]
                if ti.static(exponential):
                    top = [splat(NEG_BIG) for _ in ti.static(range(TRF))]
                    for j in range(n):
                        kj = [ks[b, h, j, a] for a in ti.static(range(r))]
                        for t in ti.static(range(TRF)):
                            z = splat(0)
                            for a in ti.static(range(r)):
                                z += qa[t][a] * kj[a]
                            zs[b, t, j] = z
                            top[t] = ti.max(top[t], z)
                    for t in ti.static(range(TRF)):
                        m[t] = top[t]
                    for j in range(n):
                        uj = [us[b, h, j, a] for a in ti.static(range(rv))]
                        for t in ti.static(range(TRF)):
                            zc = zs[b, t, j] - m[t]
                            if ti.static(f32):
                                zc = ti.max(zc, c(CLAMP))
                            w = exp_clamped(zc)
                            wsum[t] += w
                            if observe:  # loop-invariant: LLVM unswitches it
                                ent[t] += w * zc
                            for a in ti.static(range(rv)):
                                acc[t][a] += w * uj[a]
                else:
                    for j in range(n):
                        kj = [ks[b, h, j, a] for a in ti.static(range(r))]
                        uj = [us[b, h, j, a] for a in ti.static(range(rv))]
                        for t in ti.static(range(TRF)):
                            z = splat(0)
                            for a in ti.static(range(r)):
                                z += qa[t][a] * kj[a]
                            w = splat(0)
                            for k in range(L):
                                w[k] = c(kernel_fn(z[k]))
                            wsum[t] += w
                            for a in ti.static(range(rv)):
                                acc[t][a] += w * uj[a]
                            if observe:
                                for k in range(L):
                                    if w[k] > 0:
                                        ent[t][k] += w[k] * ti.log(w[k])
                                    if ti.static(with_potential):
                                        pot[t][k] += c(potential_fn(z[k]))
                for t in ti.static(range(TRF)):
                    norm = splat(0)
                    for k in range(L):
                        if ti.static(softmax_norm):
                            if wsum[t][k] > 0:
                                norm[k] = c(1) / wsum[t][k]
                        elif ti.static(exponential):
                            norm[k] = ti.exp(m[t][k]) / c(n)
                        else:
                            norm[k] = c(1) / c(n)
                    for a in ti.static(range(rv)):
                        gv[b, h, a, il0 + t] = acc[t][a] * norm
                    if observe:
                        entropy = splat(0)
                        energy = pot[t]
                        for k in range(L):
                            if wsum[t][k] > 0:
                                lw = ti.log(wsum[t][k])
                                entropy[k] = lw - ent[t][k] / wsum[t][k]
                                if ti.static(exponential):
                                    energy[k] = m[t][k] + lw
                        rowv[b, h, 0, il0 + t] = entropy
                        rowv[b, h, 1, il0 + t] = energy
        # head outputs f = O g, their sum, the tangent projection, L tokens at a time
        for jl in range(nbl):
            yv = [y[b, e, jl] for e in ti.static(range(d))]
            v = [splat(0) for _ in ti.static(range(d))]
            v_radial = splat(0)
            for h in range(H):
                fe = [splat(0) for _ in ti.static(range(d))]
                for a in range(rv):
                    ga = gv[b, h, a, jl]
                    for e in ti.static(range(d)):
                        fe[e] += Of[h, e, a] * ga
                radial = splat(0)
                for e in ti.static(range(d)):
                    fv[b, h, e, jl] = fe[e]
                    v[e] += fe[e]
                    radial += fe[e] * yv[e]
                rowv[b, h, 2, jl] = radial
                if ti.static(sphere):
                    v_radial += radial
            kinetic = splat(0)
            for e in ti.static(range(d)):
                xde = v[e] - v_radial * yv[e]
                out[b, e, jl] = xde
                kinetic += xde * xde
            if observe:
                observe_group(b, jl, yv, v_radial, kinetic, fv, rowv, tok, n)

    @ti.func
    def lanes_to_tok(b, jl, slot, value, tok: ti.template(), n):
        for k in range(L):
            i = jl * L + k
            if i < n:
                tok[b, i, slot] = value[k]

    @ti.func
    def observe_group(b, jl, yv: ti.template(), v_radial, kinetic, fv: ti.template(),
                      rowv: ti.template(), tok: ti.template(), n):
        """The per-token observables of ``kernels.combine`` for L tokens, into tok."""
        abs_sum = splat(0)
        for h in range(H):
            abs_sum += vabs(rowv[b, h, 2, jl])
        lanes_to_tok(b, jl, 0, kinetic, tok, n)
        for h in range(H):
            ah = rowv[b, h, 2, jl]
            tangent = splat(0)
            for e in ti.static(range(d)):
                pe = fv[b, h, e, jl]
                if ti.static(sphere):
                    pe = pe - ah * yv[e]
                tangent += pe * pe
            cross = splat(0)
            for h2 in range(H):
                if h2 != h:
                    gram = splat(0)
                    for e in ti.static(range(d)):
                        gram += fv[b, h, e, jl] * fv[b, h2, e, jl]
                    cross += gram
            rp = splat(0)
            rap = splat(0)
            if ti.static(sphere):
                rp = ah * (v_radial - ah)
                rap = vabs(ah) * (abs_sum - vabs(ah))
            base = 1 + h * SLOTS_PER_HEAD
            lanes_to_tok(b, jl, base + kernels.SLOT_TANGENT, tangent, tok, n)
            lanes_to_tok(b, jl, base + kernels.SLOT_CROSS, cross, tok, n)
            lanes_to_tok(b, jl, base + kernels.SLOT_RADIAL_PAIR, rp, tok, n)
            lanes_to_tok(b, jl, base + kernels.SLOT_RADIAL_ABS_PAIR, rap, tok, n)
            lanes_to_tok(b, jl, base + kernels.SLOT_RADIAL, ah, tok, n)
            lanes_to_tok(b, jl, base + kernels.SLOT_ENTROPY, rowv[b, h, 0, jl], tok, n)
            lanes_to_tok(b, jl, base + kernels.SLOT_ROW_ENERGY, rowv[b, h, 1, jl], tok, n)

    @ti.func
    def reduce_into(b, slot, tok: ti.template(), y: ti.template(), red: ti.template(),
                    sumx: ti.template(), n):
        """As ``kernels.reduce`` for replica b: float64 sums over tokens in a fixed order."""
        for s in range(n_slots):
            total = ti.cast(0, ti.f64)
            lo = ti.cast(tok[b, 0, s], ti.f64)
            hi = lo
            for i in range(n):
                val = ti.cast(tok[b, i, s], ti.f64)
                total += val
                lo = ti.min(lo, val)
                hi = ti.max(hi, val)
            lse = ti.cast(0, ti.f64)
            if s >= 1 and (s - 1) % SLOTS_PER_HEAD == kernels.SLOT_ROW_ENERGY:
                for i in range(n):
                    lse += ti.exp(ti.cast(tok[b, i, s], ti.f64) - hi)
            red[slot, b, s, 0] = total
            red[slot, b, s, 1] = lo
            red[slot, b, s, 2] = hi
            red[slot, b, s, 3] = hi + ti.log(lse)
        for e in range(d):
            total = ti.cast(0, ti.f64)
            for i in range(n):
                il, k = i // L, i % L
                norm2 = ti.cast(0, ti.f64)
                for e2 in ti.static(range(d)):
                    norm2 += ti.cast(y[b, e2, il][k], ti.f64) ** 2
                if norm2 > 0:
                    total += ti.cast(y[b, e, il][k], ti.f64) / ti.sqrt(norm2)
            sumx[slot, b, e, 0] = total

    @ti.kernel
    def fused(x: arr3, Qf: arr3, Kf: arr3, Wf: arr3, Of: arr3, beta: arr1, xdot: arr3, tok: arr3,
              red: f64arr4, sumx: f64arr4, xt: v3, st: v3, kt: v3, at: v3, qv: v4, ks: arr4, us: arr4,
              gv: v4, fv: v4, rowv: v4, zs: v3, mask: v1, dt: real, steps: ti.i32,
              observe_every: ti.i32, start_step: ti.i32, observe_now: ti.i32, slot0: ti.i32):
        """``steps`` steps of every replica (or, with steps = 0, xdot at the current state).
        One evaluation site in a loop over (step, stage): each inlined copy costs compile time."""
        n = x.shape[1]
        nbl = mask.shape[0]
        ti.loop_config(block_dim=1)  # a replica is a whole task
        for b in range(x.shape[0]):
            for jl in range(nbl):  # into the transposed layout, zero padding
                for e in range(d):
                    v = splat(0)
                    for k in range(L):
                        if jl * L + k < n:
                            v[k] = x[b, jl * L + k, e]
                    xt[b, e, jl] = v
            slot = slot0
            evaluations = steps * STAGES if steps > 0 else 1
            for it in range(evaluations):
                s = it // STAGES
                stage = it % STAGES
                observe = observe_now != 0
                if steps > 0:
                    observe = stage == 0 and observe_every > 0 and \
                        (start_step + s) % ti.max(observe_every, 1) == 0
                if stage == 0:
                    for jl in range(nbl):
                        for e in ti.static(range(d)):
                            st[b, e, jl] = xt[b, e, jl]
                evaluate(b, st, kt, Qf, Kf, Wf, Of, beta, n, observe, tok, qv, ks, us, gv, fv, rowv,
                         zs, mask)
                if observe:
                    reduce_into(b, slot, tok, st, red, sumx, n)
                    slot += 1
                if steps > 0:
                    last = stage == STAGES - 1
                    # RK4: acc = k1 + 2 k2 + 2 k3 + k4, stage points x + (dt/2, dt/2, dt) k
                    keep = c(0) if stage == 0 else c(1)
                    weight = c(1) if (stage == 0 or last) else c(2)
                    reach = dt if stage == 2 else c(0.5) * dt
                    for jl in range(nbl):
                        for e in ti.static(range(d)):
                            if ti.static(rk4):
                                a_new = keep * at[b, e, jl] + weight * kt[b, e, jl]
                                at[b, e, jl] = a_new
                                if last:
                                    xt[b, e, jl] = xt[b, e, jl] + (dt / c(6)) * a_new
                                else:
                                    st[b, e, jl] = xt[b, e, jl] + reach * kt[b, e, jl]
                            else:
                                xt[b, e, jl] = xt[b, e, jl] + dt * kt[b, e, jl]
                    if ti.static(sphere):
                        if last:
                            for jl in range(nbl):
                                sq = splat(0)
                                for e in ti.static(range(d)):
                                    sq += xt[b, e, jl] * xt[b, e, jl]
                                sq = ti.select(mask[jl] > c(0), sq, c(1))
                                inv = splat(0)
                                for k in range(L):
                                    inv[k] = c(1) / ti.sqrt(sq[k])
                                for e in ti.static(range(d)):
                                    xt[b, e, jl] = xt[b, e, jl] * inv
            for jl in range(nbl):  # back to (n, d): the new state, or xdot
                for e in range(d):
                    v = xt[b, e, jl] if steps > 0 else kt[b, e, jl]
                    for k in range(L):
                        if jl * L + k < n:
                            if steps > 0:
                                x[b, jl * L + k, e] = v[k]
                            else:
                                xdot[b, jl * L + k, e] = v[k]

    return fused
