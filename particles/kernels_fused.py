"""The small-n path: k whole steps in one kernel launch, no launch floor.

For systems that fit in cache, the ~25 launches of an RK4 step (about 80 us each) cost far
more than the arithmetic. ``FusedSteps`` advances k steps in ONE launch: every integrator
stage, the retraction, and the observables of the logged steps (reduced on the device into
the Simulation's batch buffer).

Threads: from PARALLEL_MIN_WORK of pair work the CPU's threads share the launch in phases
(rows: finish an evaluation for a group of L tokens, update them, project them for the next;
pairs: one head on one row group; reduce: one replica's observables), each ending at a
barrier. Units are claimed from the phase's counter, so whichever threads turn up do the
work (one thread alone finishes it too). A thread that spins at a barrier for SPIN_LIMIT
turns leaves the launch to the others: Taichi's pool threads sleep between launches and the
OS sometimes wakes two on one core, where a spinning thread would hold the core for a whole
time slice (~3 ms) while the thread it waits for cannot run. Which thread runs a unit
changes no number.

SIMD: Taichi 1.7 runs LLVM's IR optimisation with a generic x86-64 cost model (128-bit
vectors, what the loop vectoriser picks), while the JIT's code generator targets the host
CPU (AVX-512 here). So the full width comes only from explicit Taichi vectors compiled
unscalarised: the state lives transposed, ``L`` tokens per vector (16 float32 / 8 float64
= 512 bits), and every loop over tokens is a loop over such vectors. Taichi cannot cast,
bit-cast or call exp on those vectors, so the float32 exp is a polynomial of e^(z / 32)
squared five times (``kernel_math.vector_helpers``).

Layout (e < d, a < rank, jl < nbl groups of L tokens, TR row vectors per register tile):
    xt, st, at  (R, d, nbl)          state, stage state, the weighted sum of slopes (transposed)
    kt       (R, S d, nbl)           the stages' slopes, S buffers (``ExplicitRK.slope_slots``)
    qv       (R, H, r, nblp)         beta Q_h x_i (rows i in lanes), nblp = nbl padded to TR
    ks, us   (R, H, n, ceil(r/L))    K_h x_j, W_h x_j per token, the rank in lanes
    kw, ww   (H, d, ceil(r/L))       K_h, W_h by columns, the rank in lanes
    gv       (R, H, rv, nblp)        normalised pulls g_i = sum_j w_ij u_j
    fv       (R, H, d, nbl)          head outputs f^h_i = O_h g_i
    rowv     (R, H, 3, nblp)         per token: row entropy, row energy, radial shadow a^h_i
    zs       (workers, TR, npad)     a worker's scores, then weights, of TR L rows
    mask     (nbl)                   1 for a token, 0 for padding
    sync     (i64)                   per phase: claimed, done (a cache line each); spin slots
"""

import functools
import os

import numpy as np

import taichi as ti

from . import backend, kernel_math, kernels, paths
from .kernel_math import lane_columns, vector_helpers
from .layout import n_tok_slots
from .machine import cpu_identity
from .paths import pair_work

JB = 6         # columns per score tile of the pair pass (with TR = 3: 18 accumulators, as kernels_wide)
VECTOR_BITS = cpu_identity()["vector_width_bits"]  # decides the register tiles (tile_shape)
PARALLEL_MIN_WORK = 1.5e6  # the replicas' pair work per evaluation from which threads share it
MAX_SHARED_STEPS = 256  # steps per launch shared by threads (their phase counters are zeroed per launch)
SHARED_LAUNCH_WORK = 1.5e9  # pair work per shared launch: ~10 ms on 2 cores (launch cost ~0.2 ms)
SPIN_LIMIT = 50_000     # ~0.5 ms spinning at a barrier, then the worker leaves the launch (barrier)


def available_threads() -> int:
    """Threads worth starting: the CPUs this process may run on, at most Taichi's pool size
    (``cpu_max_num_threads``, which a sweep lowers for its workers)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cpus, backend.cpu_pool_size()))


def fused_workers(n: int, H: int, r: int, rv: int, R: int) -> int:
    """Threads sharing a fused launch: one below PARALLEL_MIN_WORK of pair work per evaluation
    (measured on 2 cores: at (64, 3, 2) and (128, 3, 2) two threads were slower, their barriers
    and the lines crossing cores costing more than the halved arithmetic; from (256, 3, 1) up
    1.6-1.8x faster)."""
    if R * pair_work(n, H, r, rv) < PARALLEL_MIN_WORK:
        return 1
    return available_threads()


def tile_shape(nbl: int, rv: int, vector_bits: int | None = 512) -> tuple:
    """(TR, AC): row vectors per register tile, 4, 3 or 2, whichever pads the nbl row vectors
    least (the larger on a tie; 1 for a single vector), and value components per accumulator
    tile (8, or rv when smaller). Measured at n = 64 to 256 with 512-bit vectors: TR = 4 beats
    3 by 5-10%. With narrower vectors (a 16-lane vector is two of the CPU's 16 registers, not
    one of 32) TR = 2: on an AVX2 Zen 3, 0.88-1.00 of TR = 4's time (benchmarks/README.md)."""
    if nbl == 1:
        return 1, min(8, rv)
    rows = (4, 3, 2) if (vector_bits or 0) >= 512 else (2,)
    return min(rows, key=lambda t: (-(-nbl // t) * t, -t)), min(8, rv)


class FusedSteps:
    """The fused kernel and its scratch for R replicas of n tokens."""

    def __init__(self, rule, geometry: str, dtype: str, d: int, H: int, r: int, rv: int,
                 integrator, R: int, n: int, attempt: bool = False):
        """attempt: the kernel takes one adaptive attempt per launch (``attempt``), not steps."""
        real = ti.f32 if dtype == "float32" else ti.f64
        L = 16 if dtype == "float32" else 8
        self.L, self.n = L, n
        nbl = -(-n // L)
        TR, AC = tile_shape(nbl, rv, VECTOR_BITS)
        nblp = -(-nbl // TR) * TR  # row groups padded to whole register tiles (zero rows)
        npad = -(-n // JB) * JB    # columns padded to whole score tiles
        rvp = -(-rv // AC) * AC    # value components padded to whole accumulator tiles
        vec = ti.types.vector(L, real)

        def varr(*shape):
            return ti.ndarray(vec, shape=shape)

        self.xt, self.st, self.at = (varr(R, d, nbl) for _ in range(3))
        self.kt = varr(R, (integrator.stages if attempt else integrator.slope_buffers) * d, nbl)
        self.qv, self.gv = varr(R, H, r, nblp), varr(R, H, rvp, nblp)
        self.ks = varr(R, H, npad, -(-r // L))   # per token, the rank over lanes
        self.us = varr(R, H, n, -(-rvp // L))
        self.kw = varr(H, d, -(-r // L))         # K_h, W_h by columns, the rank over lanes
        self.ww = varr(H, d, -(-rvp // L))
        np_real = np.float32 if dtype == "float32" else np.float64
        for padded in (self.qv, self.gv, self.ks, self.us):  # padding stays zero
            padded.from_numpy(np.zeros(tuple(padded.shape) + tuple(padded.element_shape), np_real))
        self.fv = varr(R, H, d, nbl)
        self.rowv = varr(R, H, 3, nblp)  # entropy, row energy, radial a^h
        self.workers = workers = fused_workers(n, H, r, rv, R)
        # an attempt of one worker runs on the launching thread: a parallel dispatch wakes a pool
        # thread and waits for it (~100 us and more on a loaded machine), where an attempt at
        # n = 64 computes for ~200 us
        self.kernel = _fused_kernel(rule, geometry, dtype, d, H, r, rv, integrator, L, TR, AC, attempt,
                                    attempt and workers == 1)
        self.zs = varr(workers, TR, npad)
        # per launch: short enough (~10 ms) that a launch whose threads lost each other (one
        # left at a barrier, see ``barrier``) costs little; None: one thread, any length
        stages = integrator.stages
        self.max_steps = None if workers == 1 else \
            max(4, min(MAX_SHARED_STEPS, int(SHARED_LAUNCH_WORK / (R * pair_work(n, H, r, rv) * stages))))
        phases = 4 * (MAX_SHARED_STEPS * stages + 1) + 1 if workers > 1 else 1  # per evaluation
        # per phase: claimed and done on lines of their own (a thread spinning on "done" must
        # not take the line that the working thread claims from); then a spin slot per worker
        self.sync = ti.ndarray(ti.i64, shape=(16 * phases + 8 * (workers + 1),))
        self.mask = varr(nbl)
        m = (np.arange(nbl * L) < n).astype(np.float32 if dtype == "float32" else np.float64)
        self.mask.from_numpy(m.reshape(nbl, L))
        self._no_attempt = (ti.ndarray(ti.f64, shape=(1,)), ti.ndarray(ti.f64, shape=(1, 1)))
        self._compiled = False

    def __call__(self, ops, dt: float, step_count: int, steps: int, observe_every: int,
                 observe_now: bool, slot: int) -> None:
        """steps > 0: advance ops.x from step ``step_count``; steps == 0: ops.xdot at the current
        state (observed if observe_now, reduced into batch slot ``slot``). ops: ``layout.Operands``."""
        if self.max_steps is not None and steps > self.max_steps:  # the phase counters' size
            raise ValueError(f"a shared fused launch takes at most {self.max_steps} steps, got {steps}")
        self._launch(ops, dt, step_count, steps, observe_every, observe_now, slot, *self._no_attempt, 0.0, 0.0)

    def attempt(self, ops, h, err, rtol: float, atol: float) -> None:
        """One adaptive attempt of every replica r of an embedded first-same-as-last pair from
        ops.x with its first slope in ops.xdot, step h[r] (float64, 0: left as it is): the
        other stages, the new state (retracted), per token its sum over components of the
        scaled squared error into err[r, :n] and their sum in token order into err[r, n]
        (``adaptive``'s norm, +inf where not finite); where sqrt(err[r, n] / (n d)) <= 1 and
        h[r] != 0, ops.x and ops.xdot take the new state and its slope."""
        self._launch(ops, 0.0, 0, 1, 0, False, 0, h, err, rtol, atol)

    def _launch(self, ops, dt, step_count, steps, observe_every, observe_now, slot, h, err, rtol, atol):
        args = (ops.x, ops.Q, ops.K, ops.W, ops.O, ops.beta, ops.xdot, ops.tok, ops.red,
                ops.sumx, self.xt, self.st, self.kt, self.at, self.qv, self.ks, self.us, self.kw, self.ww, self.gv,
                self.fv, self.rowv, self.zs, self.mask, self.sync, dt, int(steps),
                int(observe_every), int(step_count), int(observe_now), int(slot), self.workers,
                h, err, float(rtol), float(atol))
        if self._compiled:
            self._direct(*args)
            return
        with kernels.compile_options(scalarize=False, active=True):
            self.kernel(*args)
        self._compiled = True
        self._direct = direct_launch(self.kernel, args)


def direct_launch(kernel, args):
    """kernel's launch for arguments of the types of ``args`` (after its first call): the
    compiled instance looked up once. Taichi's call hashes every argument's type for that
    lookup on each launch, ~80 us of the fused kernel's ~210 us launch at n = 8; the launch
    itself is Taichi's own. The ordinary call where Taichi lacks these internals."""
    try:
        primal = kernel._primal
        compiled = primal.compiled_kernels[primal.ensure_compiled(*args)]
        launch = primal.launch_kernel
    except (AttributeError, KeyError, TypeError):
        return kernel
    return lambda *a: launch(compiled, *a)


@functools.lru_cache(maxsize=None)
def _fused_kernel(rule, geometry: str, dtype: str, d: int, H: int, r: int, rv: int,
                  integrator, L: int, TR: int, AC: int, attempt: bool = False, serial: bool = False):
    real = ti.f32 if dtype == "float32" else ti.f64
    f32 = dtype == "float32"
    sphere = geometry == "sphere"
    PROGRAM = integrator.program        # the tableau, unrolled (integrators.ExplicitRK.program)
    STAGES = integrator.stages
    WEIGHTS, DENOMINATOR = integrator.weights, integrator.denominator
    SLOT = tuple(stage.slot for stage in PROGRAM)  # stage s's slope lives in kt[b, SLOT[s] d + e]
    # one slope buffer: stage s + 1's point is x + REACH[s] dt k_s, its only term (or none)
    CHAIN = integrator.slope_buffers == 1
    REACH = [sum(v for v, _ in stage.point) for stage in PROGRAM[1:]] + [0.0]
    # ATTEMPT: one adaptive attempt (``FusedSteps.attempt``): evaluation e is stage e + 1, the
    # first slope given; every slope kept for the embedded error (``ExplicitRK.attempt``)
    ATTEMPT, FIRST = attempt, int(attempt)
    POINTS, ERROR = integrator.attempt.points, integrator.attempt.error
    if ATTEMPT:
        SLOT, CHAIN = tuple(range(STAGES)), False
    exponential = rule.exponential
    softmax_norm = rule.normalization == "softmax"
    with_potential = rule.potential is not None and not exponential
    weight_fn, potential_fn = (None, None) if exponential else kernel_math.rule_lift(rule, real)
    add_weight, _ = kernel_math.kernel_entropy(real)
    row_norm = kernel_math.normalisation(real, softmax_norm, exponential)
    finish_row = kernel_math.row_finish(real, exponential)
    NEG_BIG = -3.0e38 if f32 else -1.0e300
    RVP = -(-rv // AC) * AC
    n_slots = n_tok_slots(H)
    vec = ti.types.vector(L, real)
    arr1, _, arr3, _ = kernel_math.ndarrays(real)
    f64arr1, f64arr2, _, f64arr4 = kernel_math.ndarrays(ti.f64)
    v1, _, v3, v4 = kernel_math.ndarrays(vec)
    i64arr1 = ti.types.ndarray(dtype=ti.i64, ndim=1)
    c, splat, vabs, _ = vector_helpers(real, L)
    column = lane_columns(real, L)

    @ti.func
    def query(qv: ti.template(), b, h, a, row):
        return qv[b, h, a, row]

    @ti.func
    def token(ks: ti.template(), b, h, j, a):  # the rank over lanes
        return ks[b, h, j, a // L][a % L]

    scores, weigh, weighted_sum = kernel_math.lane_tiles(real, L, TR, JB, AC, query, token, token)

    @ti.func
    def rows_project(b, jl, y: ti.template(), Qf: ti.template(), kw: ti.template(),
                     ww: ti.template(), beta: ti.template(), n, qv: ti.template(),
                     ks: ti.template(), us: ti.template()):
        """Projections of the L tokens of group jl at the state y: beta Q_h y with rows in
        lanes (qv); K_h y_j and W_h y_j per token with the rank in lanes (ks, us), read back
        one component at a time in the pair pass (a lane-by-lane scatter cost as much as the
        score tiles)."""
        bt = beta[b]
        yv = [y[b, e, jl] for e in ti.static(range(d))]
        for h in range(H):
            for a in range(r):
                sq = splat(0)
                for e in ti.static(range(d)):
                    sq += Qf[h, a, e] * yv[e]
                qv[b, h, a, jl] = sq * bt
        for k in range(ti.min(L, n - jl * L)):  # at run time: a static unroll of L x d
            i = jl * L + k                       # multiplied the compile time by 5
            yk = [y[b, e, jl][k] for e in ti.static(range(d))]
            for h in range(H):
                for cc in range(ks.shape[3]):
                    sk = splat(0)
                    for e in ti.static(range(d)):
                        sk += yk[e] * kw[h, e, cc]
                    ks[b, h, i, cc] = sk
                for cc in range(us.shape[3]):
                    su = splat(0)
                    for e in ti.static(range(d)):
                        su += yk[e] * ww[h, e, cc]
                    us[b, h, i, cc] = su

    @ti.func
    def pair_group(b, h, ip, worker, observe, n, qv: ti.template(), ks: ti.template(),
                   us: ti.template(), gv: ti.template(), rowv: ti.template(), zs: ti.template()):
        """g = the normalised pulls of head h on the TR x L rows of group ip (and their row
        entropy and energy when observed); zs[worker] is the worker's scratch."""
        # the pair pass, a group of TR x L rows (rows in lanes) at a time, in three sweeps over
        # the columns: scores by register tiles (TR row vectors x JB columns, the rank
        # innermost), the weights in place of the scores, the weighted sum of u by register
        # tiles (TR row vectors x AC components). Separate sweeps keep each inner loop a few
        # independent chains (one fused sweep ran latency-bound at 1/4 of the FMA rate).
        npad = ks.shape[2]
        il0 = ip * TR
        wsum = [splat(0) for _ in ti.static(range(TR))]
        ent = [splat(0) for _ in ti.static(range(TR))]
        pot = [splat(0) for _ in ti.static(range(TR))]
        top_w = [splat(0) for _ in ti.static(range(TR))]  # kernel rules: the largest weight,
        wpos = [splat(0) for _ in ti.static(range(TR))]   # the positive weights' sum
        top = [splat(NEG_BIG) for _ in ti.static(range(TR))]
        for j0i in range(npad // JB):
            scores(qv, ks, zs, top, b, h, il0, worker, j0i * JB, j0i * JB, n, r)
        m = top
        for j in range(n):
            if ti.static(exponential):
                weigh(zs, worker, j, m, wsum, ent, observe)
            else:
                for t in ti.static(range(TR)):
                    z = zs[worker, t, j]
                    w = splat(0)
                    for k in range(L):
                        w[k] = weight_fn(z[k], 0, 0, n)
                    zs[worker, t, j] = w
                    wsum[t] += w
                    if observe:
                        for k in range(L):
                            ent[t][k], wpos[t][k], top_w[t][k] = add_weight(w[k], ent[t][k], wpos[t][k],
                                                                            top_w[t][k])
                            if ti.static(with_potential):
                                pot[t][k] += potential_fn(z[k])
        norm = [splat(0) for _ in ti.static(range(TR))]
        for t in ti.static(range(TR)):
            for k in range(L):
                norm[t][k] = row_norm(wsum[t][k], m[t][k], c(n))
        for a0i in range(RVP // AC):
            a0 = a0i * AC
            part = [[splat(0) for _ in ti.static(range(AC))] for _ in ti.static(range(TR))]
            weighted_sum(zs, worker, us, b, h, 0, n, a0, part)
            for t in ti.static(range(TR)):
                for cc in ti.static(range(AC)):
                    gv[b, h, a0 + cc, il0 + t] = part[t][cc] * norm[t]
        if observe:
            for t in ti.static(range(TR)):
                entropy = splat(0)
                energy = splat(0)
                for k in range(L):
                    stats = finish_row(m[t][k], wsum[t][k], ent[t][k], wpos[t][k], top_w[t][k], pot[t][k])
                    entropy[k] = stats[0]
                    energy[k] = stats[1]
                rowv[b, h, 0, il0 + t] = entropy
                rowv[b, h, 1, il0 + t] = energy

    @ti.func
    def slope_base(stage):
        """The first row of stage ``stage``'s slope in kt (0 for a one-buffer tableau)."""
        base = 0
        if ti.static(not CHAIN):
            for s in ti.static(range(STAGES)):
                if stage == s:
                    base = SLOT[s] * d
        return base

    @ti.func
    def rows_output(b, jl, y: ti.template(), out: ti.template(), base, Of: ti.template(), observe, n,
                    gv: ti.template(), fv: ti.template(), rowv: ti.template(), tok: ti.template()):
        """out[b, base + e] = xdot of the L tokens of group jl (head outputs f = O g, their sum,
        the tangent projection); with observe, their per-token observables into tok."""
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
            out[b, base + e, jl] = xde
            kinetic += xde * xde
        if observe:
            observe_group(fv, y, rowv, rowv, tok, b, jl, n, v_radial, kinetic)


    @ti.func
    def zero():
        return splat(0)

    @ti.func
    def head_output(fv: ti.template(), b, h, jl, e):
        return fv[b, h, e, jl]

    @ti.func
    def point(y: ti.template(), b, jl, e):
        return y[b, e, jl]

    @ti.func
    def radial_shadow(rowv: ti.template(), b, h, jl):
        return rowv[b, h, 2, jl]

    @ti.func
    def row_stat(rowv: ti.template(), b, h, jl, k):
        return rowv[b, h, k, jl]  # (entropy, energy)

    @ti.func
    def set_point(y: ti.template(), b, jl, e, value):
        y[b, e, jl] = value

    @ti.func
    def padded(mask: ti.template(), jl, sq):
        return ti.select(mask[jl] > c(0), sq, c(1))   # padding lanes (0) stay 0

    retract_group = kernel_math.retraction(real, d, L, zero, point, set_point, padded)

    @ti.func
    def lanes_to_tok(tok: ti.template(), b, jl, n, slot, value):
        for k in range(L):
            i = jl * L + k
            if i < n:
                tok[b, i, slot] = value[k]

    # the per-token observables of L tokens in lanes, into tok
    observe_group = kernel_math.token_observables(H, d, sphere, zero, vabs, head_output, point,
                                                  radial_shadow, row_stat, lanes_to_tok)

    @ti.func
    def lane_point(y: ti.template(), b, i, e):
        return y[b, e, i // L][i % L]

    _, direction_total = kernel_math.direction_sum(ti.f64, d, lane_point)

    @ti.func
    def reduce_into(b, s, slot, tok: ti.template(), y: ti.template(), red: ti.template(),
                    sumx: ti.template(), n):
        """Unit s of replica b's reductions: column s (``kernel_math.reduce_slot``), or for
        s = n_slots the sum of x_i / |x_i|. Each unit sums over the tokens in order, so the
        units can be shared by threads."""
        if s < n_slots:
            kernel_math.reduce_slot(tok, b, s, n, red, slot)
        else:
            total = direction_total(y, b, n)
            for e in ti.static(range(d)):
                sumx[slot, b, e, 0] = total[e]

    @ti.func
    def rows_advance(b, jl, stage, dt, xt: ti.template(), st: ti.template(), kt: ti.template(),
                     at: ti.template(), mask: ti.template()):
        """The integrator's update of the L tokens of group jl after evaluation ``stage``, the
        program ``ExplicitRK.step`` runs too: acc = sum_s weight_s k_s, the next stage's point
        x + sum (coefficient dt) k_slot; at the last stage x + (dt / DENOMINATOR) acc, then the
        retraction. A one-buffer tableau (RK4) takes its weight and reach at run time: unrolled
        per stage, the same operations moved its last bits (1 ulp in 10 steps; Euler's too)."""
        last = stage == STAGES - 1
        if ti.static(ATTEMPT):  # stage s + 1's point x + h sum_j a[s + 1][j] k_j (as adaptive's
            for s in ti.static(range(STAGES - 1)):     # combinations); the last, the new state
                # (ExplicitRK.attempt.points)
                if stage == s:
                    for e in ti.static(range(d)):
                        acc = splat(0)
                        for coefficient, j in ti.static(POINTS[s]):
                            acc = acc + c(coefficient) * kt[b, j * d + e, jl]
                        st[b, e, jl] = xt[b, e, jl] + dt * acc
                    if ti.static(sphere and s == STAGES - 2):
                        retract_group(st, mask, b, jl)
        elif ti.static(CHAIN):  # one slope buffer: the stage's weight and reach chosen at run time
            keep = c(0) if stage == 0 else c(1)
            weight = c(PROGRAM[0].weight)
            reach = c(REACH[0]) * dt
            for s in ti.static(range(1, STAGES)):
                if stage == s:
                    weight = c(PROGRAM[s].weight)
                    reach = c(REACH[s]) * dt
            for e in ti.static(range(d)):
                if ti.static(STAGES > 1):
                    a_new = keep * at[b, e, jl] + weight * kt[b, e, jl]
                    at[b, e, jl] = a_new
                    if last:
                        xt[b, e, jl] = xt[b, e, jl] + (dt / c(DENOMINATOR)) * a_new
                    else:
                        st[b, e, jl] = xt[b, e, jl] + reach * kt[b, e, jl]
                else:
                    xt[b, e, jl] = xt[b, e, jl] + (dt * c(WEIGHTS[0] / DENOMINATOR)) * kt[b, e, jl]
        else:  # after stage s: acc += weight_s k_s, then stage s + 1's point (or the new state)
            for s in ti.static(range(STAGES)):
                if stage == s:
                    for e in ti.static(range(d)):
                        a_new = c(PROGRAM[s].weight) * kt[b, SLOT[s] * d + e, jl]
                        if ti.static(s > 0):
                            a_new = at[b, e, jl] + a_new
                        at[b, e, jl] = a_new
                        if ti.static(s == STAGES - 1):
                            xt[b, e, jl] = xt[b, e, jl] + (dt / c(DENOMINATOR)) * a_new
                        else:
                            point = xt[b, e, jl]
                            for coefficient, slot in ti.static(PROGRAM[s + 1].point):
                                point = point + (c(coefficient) * dt) * kt[b, slot * d + e, jl]
                            st[b, e, jl] = point
        if ti.static(sphere):
            if last:
                retract_group(xt, mask, b, jl)

    @ti.func
    def token_errors(b, jl, xt: ti.template(), st: ti.template(), kt: ti.template(), h, rtol, atol,
                     err: ti.template(), n):
        """err[b, i] for the L tokens of group jl: the sum over components of
        (h sum_j ERROR_j k_j / (atol + rtol max(|x|, |x_new|)))^2 in float64, +inf where a slope
        or the new state is not finite, 0 where h = 0 (``adaptive``'s token_error, in lanes)."""
        hb = ti.cast(h, ti.f64)
        for k in range(L):
            i = jl * L + k
            if i < n:
                acc = ti.cast(0, ti.f64)
                if hb != 0:
                    for e in ti.static(range(d)):
                        s = ti.cast(0, ti.f64)
                        for j in ti.static(range(STAGES)):
                            kv = ti.cast(kt[b, j * d + e, jl][k], ti.f64)
                            v = kv - kv    # NaN for a non-finite slope: such a stage rejects the step
                            if ti.static(ERROR[j] != 0):
                                v += ti.cast(ERROR[j], ti.f64) * kv
                            s += v
                        xo = ti.cast(xt[b, e, jl][k], ti.f64)
                        xn = ti.cast(st[b, e, jl][k], ti.f64)
                        scale = atol + rtol * ti.max(ti.abs(xo), ti.abs(xn))
                        q = hb * s / scale + (xn - xn)   # NaN for a non-finite new state
                        acc += q * q
                    if ti.math.isnan(acc) or ti.math.isinf(acc):
                        acc = ti.math.inf
                err[b, i] = acc

    @ti.func
    def claim(sync: ti.template(), phase, u, workers):
        """The worker's next unit of the phase after unit u (u = -1: its first), marking u
        done. One worker takes them in order, touching no counter."""
        nxt = u + 1
        if workers > 1:
            if u >= 0:
                ti.atomic_add(sync[16 * phase + 8], ti.cast(1, ti.i64))
            nxt = ti.cast(ti.atomic_add(sync[16 * phase], ti.cast(1, ti.i64)), ti.i32)
        return nxt

    @ti.func
    def barrier(sync: ti.template(), phase, total, workers, worker):
        """Wait until the phase's ``total`` units are done; False when the worker gave up after
        SPIN_LIMIT spins and must leave the launch (it holds no unit, so the others finish).
        The counter is read by a plain load (a locked read would take its line from the
        thread about to add to it); an atomic on the worker's own line keeps the compiler
        from hoisting the load or moving the next phase's loads above it."""
        ok = True
        if workers > 1:
            spins = 0
            while sync[16 * phase + 8] < total:
                ti.atomic_add(sync[sync.shape[0] - 8 * (workers + 1) + 8 * worker], ti.cast(1, ti.i64))
                spins += 1
                if spins > SPIN_LIMIT:
                    ok = False
                    break
        return ok

    @ti.kernel
    def fused(x: arr3, Qf: arr3, Kf: arr3, Wf: arr3, Of: arr3, beta: arr1, xdot: arr3, tok: arr3,
              red: f64arr4, sumx: f64arr4, xt: v3, st: v3, kt: v3, at: v3, qv: v4, ks: v4, us: v4, kw: v3, ww: v3,
              gv: v4, fv: v4, rowv: v4, zs: v3, mask: v1, sync: i64arr1, dt: real, steps: ti.i32,
              observe_every: ti.i32, start_step: ti.i32, observe_now: ti.i32, slot0: ti.i32,
              workers: ti.i32, hstep: f64arr1, err: f64arr2, rtol: ti.f64, atol: ti.f64):
        """``steps`` steps of every replica (or, with steps = 0, xdot at the current state).

        ``workers`` threads share the work of every replica in phases (rows: the update and
        projections of a group of L tokens; pairs: one head on one row group; reduce: one
        replica's observables), each ending at a barrier; units are claimed from the phase's
        counter, so whichever threads turn up finish, and a thread that waits too long leaves
        (``barrier``)."""
        if workers > 1:
            evaluations = steps * STAGES if steps > 0 else 1
            if ti.static(ATTEMPT):
                evaluations = STAGES - 1
            for p in range(ti.min(4 * (evaluations + 1) + 1, (sync.shape[0] - 8 * (workers + 1)) // 16)):
                sync[16 * p] = ti.cast(0, ti.i64)
                sync[16 * p + 8] = ti.cast(0, ti.i64)
        ti.loop_config(block_dim=1, serialize=serial)  # a worker is a whole task
        for w in range(workers):
            R, n = x.shape[0], x.shape[1]
            nbl = mask.shape[0]
            ngroups = qv.shape[3] // TR
            rows_total = R * nbl
            pairs_total = R * H * ngroups
            evaluations = steps * STAGES if steps > 0 else 1
            if ti.static(ATTEMPT):
                evaluations = STAGES - 1
            phase = 0
            active = True  # False once this worker has left the launch
            slot = slot0
            observed_before = False  # evaluation e - 1 is observed
            u = claim(sync, phase, -1, workers)
            while u < H:  # K_h and W_h by columns, the rank over lanes
                for e in range(d):
                    for cc in range(kw.shape[2]):
                        kw[u, e, cc] = column(Kf, u, e, cc, r)
                    for cc in range(ww.shape[2]):
                        ww[u, e, cc] = column(Wf, u, e, cc, rv)
                u = claim(sync, phase, u, workers)
            active = barrier(sync, phase, H, workers, w)
            phase += 1
            for e in range(evaluations + 1):
                if not active:
                    break
                observe = observe_now != 0
                if steps > 0:
                    observe = e % STAGES == 0 and observe_every > 0 and \
                        (start_step + e // STAGES) % ti.max(observe_every, 1) == 0
                # rows: finish evaluation e - 1 (xdot, observables), then, unless its
                # observables still need the state, update and project for evaluation e
                for rounds in range(2):
                    if active and (rounds == 0 or observed_before):
                        u = claim(sync, phase, -1, workers)
                        while u < rows_total:
                            b, jl = u // nbl, u % nbl
                            step = dt
                            if ti.static(ATTEMPT):
                                step = ti.cast(hstep[b], real)
                            if rounds == 0:
                                if e == 0:
                                    for comp in range(d):  # into the transposed layout
                                        v = splat(0)
                                        v1 = splat(0)
                                        for k in range(L):
                                            if jl * L + k < n:
                                                v[k] = x[b, jl * L + k, comp]
                                                if ti.static(ATTEMPT):  # the first slope
                                                    v1[k] = xdot[b, jl * L + k, comp]
                                        xt[b, comp, jl] = v
                                        if ti.static(ATTEMPT):
                                            kt[b, comp, jl] = v1
                                else:
                                    rows_output(b, jl, st, kt, slope_base((e - 1 + FIRST) % STAGES), Of,
                                                observed_before, n, gv, fv, rowv, tok)
                            if rounds == 1 or not observed_before:
                                if (e > 0 or ATTEMPT) and steps > 0 and (e < evaluations or not ATTEMPT):
                                    rows_advance(b, jl, (e - 1 + FIRST) % STAGES, step, xt, st, kt, at, mask)
                                if e < evaluations:
                                    if not ATTEMPT and e % STAGES == 0:
                                        for comp in ti.static(range(d)):
                                            st[b, comp, jl] = xt[b, comp, jl]
                                    rows_project(b, jl, st, Qf, kw, ww, beta, n, qv, ks, us)
                                elif ti.static(ATTEMPT):
                                    token_errors(b, jl, xt, st, kt, step, rtol, atol, err, n)
                                else:  # back to (n, d): the new state, or xdot
                                    for comp in range(d):
                                        v = xt[b, comp, jl] if steps > 0 else kt[b, comp, jl]
                                        for k in range(L):
                                            if jl * L + k < n:
                                                if steps > 0:
                                                    x[b, jl * L + k, comp] = v[k]
                                                else:
                                                    xdot[b, jl * L + k, comp] = v[k]
                            u = claim(sync, phase, u, workers)
                        active = barrier(sync, phase, rows_total, workers, w)
                        phase += 1
                    if active and rounds == 0 and observed_before:
                        # reduce: the observables of evaluation e - 1, one column of one
                        # replica per unit (one replica per unit left a thread waiting)
                        u = claim(sync, phase, -1, workers)
                        while u < R * (n_slots + 1):
                            reduce_into(u // (n_slots + 1), u % (n_slots + 1), slot, tok, st, red, sumx, n)
                            u = claim(sync, phase, u, workers)
                        active = barrier(sync, phase, R * (n_slots + 1), workers, w)
                        phase += 1
                        slot += 1
                if active and e < evaluations:  # pairs: one head on one row group per unit
                    u = claim(sync, phase, -1, workers)
                    while u < pairs_total:
                        b, rest = u // (H * ngroups), u % (H * ngroups)
                        pair_group(b, rest // ngroups, rest % ngroups, w, observe, n, qv, ks, us,
                                   gv, rowv, zs)
                        u = claim(sync, phase, u, workers)
                    active = barrier(sync, phase, pairs_total, workers, w)
                    phase += 1
                observed_before = observe
            if ti.static(ATTEMPT):  # per replica: the error norm; accepted, back to (n, d)
                if active:
                    u = claim(sync, phase, -1, workers)
                    while u < R:
                        total = ti.cast(0, ti.f64)
                        for i in range(n):   # in token order: the same bits whatever the threads
                            total += err[u, i]
                        err[u, n] = total
                        if hstep[u] != 0 and ti.sqrt(total / (n * d)) <= 1.0:
                            for i in range(n):
                                for comp in ti.static(range(d)):
                                    x[u, i, comp] = st[u, comp, i // L][i % L]
                                    xdot[u, i, comp] = kt[u, (STAGES - 1) * d + comp, i // L][i % L]
                        u = claim(sync, phase, u, workers)

    return fused


paths.register("fused", FusedSteps)  # FusedSteps(rule, geometry, dtype, d, H, r, rv, integrator, R, n)
