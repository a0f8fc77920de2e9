"""Adaptive stepping: an embedded Runge-Kutta pair under a PI step-size controller, each
replica with its own step.

The engine stays step-based: the simulation's ``dt`` is the grid on which the drive loop's
writers fire, and ``advance(k)`` integrates exactly over k dt. Inside, the interval is cut at
the grid points that are observed (log rows) or switch layers; each piece is integrated with
as many steps as the controller needs, the last one clipped to land exactly on its end, so
every fixed time is hit exactly and the arithmetic depends only on where the pieces end.

Per attempt, every still-running replica r takes its own step h_r (a finished replica has
h_r = 0 and is left as it is, though the velocity pass still computes it):

    stages       x_s = x + h_r sum_j a[s][j] k_j,  k_s = v(x_s)      (the last point of a
                 first-same-as-last pair is the new state, retracted, so k_S is the next k_1)
    new state    x_new = retract(x + h_r sum_j b_j k_j)
    error        err_r = sqrt(mean over (i, c) of (h_r sum_j (b_j - b_hat_j) k_j
                                                   / (atol + rtol max(|x|, |x_new|)))^2)
                 (Hairer's norm; a non-finite stage or state makes err_r infinite)
    accept       err_r <= 1: x_r <- x_new,r (a rejected step is never written)
    next step    PI control (Hairer's DOPRI5): h <- h / clip(err^(1/(q+1) - 0.75 B) /
                 err_prev^B / 0.9, 1/10, 5), B = 0.04, q = min(order, b_hat order); after a
                 rejection h <- h / min(5, err^(1/(q+1)) / 0.9) (h / 5 when not finite), and
                 no growth right after one

On the fused path a whole attempt of a first-same-as-last pair (stages 2..S, the new state,
the error norms, the accept) is one launch of the fused kernel (``FusedSteps.attempt``), with
the per-replica steps in and the error sums out as host arrays; elsewhere each evaluation,
stage combination, the error norms and the accept are launches of their own.

Everything a replica computes reads only its own rows, so a replica of an ensemble takes the
steps it would take alone, to the bit. The controller's state (the proposed step and the
last accepted error per replica) is what a checkpoint keeps (``state``/``restore``), so a
resumed run that stops where the uninterrupted one stops continues bitwise.
"""
import dataclasses
import math

import numpy as np
import taichi as ti

from . import paths
from .errors import BlowUpError, ParticlesUserError
from .integrators import Adaptive

MAX_STAGES = 7      # slope arguments of the combination kernels (DOPRI5 has 7 stages)
SAFETY = 0.9        # the controller aims at 0.9 of the tolerance
GROW_MAX = 10.0     # a step grows at most 10x ...
SHRINK_MAX = 5.0    # ... and shrinks at most 5x per attempt
PI_BETA = 0.04      # the weight of the previous error (Gustafsson's PI control, as in DOPRI5)
ERR_FLOOR = 1e-4    # the previous error is taken as at least this (Hairer's start value)
STEP_FLOOR = 1e-12  # with dt_min = 0, a step below this fraction of the grid dt stops the run


_KERNELS: dict = {}


class Evaluator:
    """The velocity at any point into any buffer, on the simulation's path: the per-kernel
    passes, or the fused kernel's evaluation (a launch of zero steps reads ``x`` and writes
    ``xdot`` of the operands it is given). ``observe``: the point is the current state, whose
    row is recorded (the first stage)."""

    def __init__(self, sim):
        self.sim = sim
        self._operands = {}   # (layer, x, xdot) -> the layer's operands pointed at them

    def __call__(self, x, xdot, observe: bool) -> None:
        sim = self.sim
        if sim._fused is None:
            sim._ops.evaluate(x, xdot, observe)
            sim._ops.after_first_stage(observe)
            return
        key = (sim.layer, id(x), id(xdot))
        ops = self._operands.get(key)
        if ops is None:
            ops = self._operands[key] = dataclasses.replace(sim._operands, x=x, xdot=xdot)
        sim._fused(ops, sim.dt, sim.step_count, 0, 0, observe, len(sim._pending) if observe else 0)
        if observe:
            sim._logged_fused(sim.step_count, 1, 1)


def _kernels(real, d: int, serial: bool):
    """serial: the O(n d) loops on one CPU thread, cheaper than a parallel dispatch (~80 us)
    at the sizes the adaptive path serves (as kernels.axpy)."""
    key = (real, d, serial)
    if key in _KERNELS:
        return _KERNELS[key]
    arr3 = ti.types.ndarray(dtype=real, ndim=3)
    arr1 = ti.types.ndarray(dtype=real, ndim=1)
    f64_1 = ti.types.ndarray(dtype=ti.f64, ndim=1)
    f64_2 = ti.types.ndarray(dtype=ti.f64, ndim=2)
    i32_1 = ti.types.ndarray(dtype=ti.i32, ndim=1)

    @ti.func
    def term(coef: ti.template(), j: ti.template(), nterms, k: ti.template(), b, i, e):
        v = ti.cast(0, real)
        if j < nterms and coef[j] != 0:
            v = coef[j] * k[b, i, e]
        return v

    @ti.func
    def combination(out: ti.template(), x: ti.template(), h: ti.template(), coef: ti.template(), nterms,
                    k0: ti.template(), k1: ti.template(), k2: ti.template(), k3: ti.template(),
                    k4: ti.template(), k5: ti.template(), k6: ti.template()):
        """out = x + h_r sum_{j < nterms} coef_j k_j per replica r (out = x where h_r = 0)."""
        ti.loop_config(serialize=serial)
        for b, i in ti.ndrange(out.shape[0], out.shape[1]):
            hb = h[b]
            for e in ti.static(range(d)):
                v = x[b, i, e]
                if hb != 0:
                    s = (term(coef, 0, nterms, k0, b, i, e) + term(coef, 1, nterms, k1, b, i, e)
                         + term(coef, 2, nterms, k2, b, i, e) + term(coef, 3, nterms, k3, b, i, e)
                         + term(coef, 4, nterms, k4, b, i, e) + term(coef, 5, nterms, k5, b, i, e)
                         + term(coef, 6, nterms, k6, b, i, e))
                    v = x[b, i, e] + hb * s
                out[b, i, e] = v

    # a launch costs ~8 us per array argument on the CPU: the early stages, which read few
    # slopes, take kernels with fewer (the slots past nterms are never read)
    @ti.kernel
    def combine3(out: arr3, x: arr3, h: arr1, coef: arr1, nterms: ti.i32, k0: arr3, k1: arr3, k2: arr3):
        combination(out, x, h, coef, nterms, k0, k1, k2, k0, k0, k0, k0)

    @ti.kernel
    def combine5(out: arr3, x: arr3, h: arr1, coef: arr1, nterms: ti.i32, k0: arr3, k1: arr3, k2: arr3,
                 k3: arr3, k4: arr3):
        combination(out, x, h, coef, nterms, k0, k1, k2, k3, k4, k0, k0)

    @ti.kernel
    def combine7(out: arr3, x: arr3, h: arr1, coef: arr1, nterms: ti.i32, k0: arr3, k1: arr3, k2: arr3,
                 k3: arr3, k4: arr3, k5: arr3, k6: arr3):
        combination(out, x, h, coef, nterms, k0, k1, k2, k3, k4, k5, k6)

    def combine(out, x, h, coef, nterms: int, *ks):
        """combination() over the first nterms of the MAX_STAGES slopes ks."""
        if nterms <= 3:
            combine3(out, x, h, coef, nterms, *ks[:3])
        elif nterms <= 5:
            combine5(out, x, h, coef, nterms, *ks[:5])
        else:
            combine7(out, x, h, coef, nterms, *ks)

    @ti.func
    def term64(coef: ti.template(), j: ti.template(), nterms, k: ti.template(), b, i, e):
        v = ti.cast(0, ti.f64)
        if j < nterms:
            kv = ti.cast(k[b, i, e], ti.f64)
            v = kv - kv    # NaN for a non-finite slope: such a stage rejects the step
            if coef[j] != 0:
                v += coef[j] * kv
        return v

    @ti.func
    def token_error(x: ti.template(), x_new: ti.template(), hb, coef: ti.template(), nterms, rtol, atol,
                    k0: ti.template(), k1: ti.template(), k2: ti.template(), k3: ti.template(),
                    k4: ti.template(), k5: ti.template(), k6: ti.template(), b, i):
        """Token i's sum over components of (h sum_j coef_j k_j / scale)^2, in float64; +inf
        where a slope or the new state is not finite (0 for a replica that is done, h = 0)."""
        acc = ti.cast(0, ti.f64)
        if hb != 0:
            for e in ti.static(range(d)):
                s = (term64(coef, 0, nterms, k0, b, i, e) + term64(coef, 1, nterms, k1, b, i, e)
                     + term64(coef, 2, nterms, k2, b, i, e) + term64(coef, 3, nterms, k3, b, i, e)
                     + term64(coef, 4, nterms, k4, b, i, e) + term64(coef, 5, nterms, k5, b, i, e)
                     + term64(coef, 6, nterms, k6, b, i, e))
                xo = ti.cast(x[b, i, e], ti.f64)
                xn = ti.cast(x_new[b, i, e], ti.f64)
                scale = atol + rtol * ti.max(ti.abs(xo), ti.abs(xn))
                q = hb * s / scale + (xn - xn)   # NaN for a non-finite new state
                acc += q * q
            if ti.math.isnan(acc) or ti.math.isinf(acc):
                acc = ti.math.inf
        return acc

    @ti.kernel
    def error_rows(out: f64_2, x: arr3, x_new: arr3, h: arr1, coef: f64_1, nterms: ti.i32,
                   rtol: ti.f64, atol: ti.f64, k0: arr3, k1: arr3, k2: arr3, k3: arr3, k4: arr3,
                   k5: arr3, k6: arr3):
        """Per token: sum over components of (h_r sum_j coef_j k_j / scale)^2, in float64;
        +inf where a slope or the new state is not finite."""
        ti.loop_config(serialize=serial)
        for b, i in ti.ndrange(out.shape[0], out.shape[1]):
            out[b, i] = token_error(x, x_new, ti.cast(h[b], ti.f64), coef, nterms, rtol, atol,
                                    k0, k1, k2, k3, k4, k5, k6, b, i)

    @ti.kernel
    def error_sums(rows: f64_2, out: f64_1):
        """Per replica, the sum over its tokens in token order (serial within a replica:
        the same bits whatever the other replicas hold)."""
        ti.loop_config(serialize=serial)
        for b in range(rows.shape[0]):
            s = ti.cast(0, ti.f64)
            for i in range(rows.shape[1]):
                s += rows[b, i]
            out[b] = s

    @ti.kernel
    def error_norms(out: f64_1, x: arr3, x_new: arr3, h: arr1, coef: f64_1, nterms: ti.i32,
                    rtol: ti.f64, atol: ti.f64, k0: arr3, k1: arr3, k2: arr3, k3: arr3, k4: arr3,
                    k5: arr3, k6: arr3):
        """error_rows and error_sums in one launch (the same sums, token by token in order):
        on one CPU thread, where the per-token rows need not be kept."""
        ti.loop_config(serialize=serial)
        for b in range(x.shape[0]):
            total = ti.cast(0, ti.f64)
            hb = ti.cast(h[b], ti.f64)
            for i in range(x.shape[1]):
                total += token_error(x, x_new, hb, coef, nterms, rtol, atol, k0, k1, k2, k3, k4, k5, k6, b, i)
            out[b] = total

    @ti.kernel
    def accept(x: arr3, x_new: arr3, k_first: arr3, k_last: arr3, flags: i32_1, copy_slope: ti.i32):
        """x_r <- x_new,r (and k_first,r <- k_last,r) for each replica r whose flag is set."""
        ti.loop_config(serialize=serial)
        for b, i in ti.ndrange(x.shape[0], x.shape[1]):
            if flags[b] != 0:
                for e in ti.static(range(d)):
                    x[b, i, e] = x_new[b, i, e]
                    if copy_slope:
                        k_first[b, i, e] = k_last[b, i, e]

    _KERNELS[key] = out = (combine, error_rows, error_sums, error_norms, accept)
    return out


class Stepper:
    """A Simulation's adaptive stepping (engine-internal: built by ``Simulation`` when its
    integrator is an ``Adaptive``); see the module."""

    def __init__(self, sim, settings: Adaptive):
        tableau = settings.method
        if tableau.stages > MAX_STAGES:
            raise ParticlesUserError(f"adaptive stepping takes tableaux of at most {MAX_STAGES} "
                                     f"stages; {tableau.name!r} has {tableau.stages}")
        eps = float(np.finfo(sim.dtype).eps)
        if settings.rtol < 4 * eps:
            raise ParticlesUserError(f"rtol = {settings.rtol:g} is below what {sim.dtype} resolves "
                                     f"(4 eps = {4 * eps:.2g}); use a larger rtol or dtype float64")
        self.sim, self.settings, self.tableau = sim, settings, tableau
        R, n, d = sim.n_replicas, sim.n, sim.d
        real = ti.f32 if sim.dtype == "float32" else ti.f64
        self.np_real = np.float32 if sim.dtype == "float32" else np.float64
        self.serial = sim.arch == "cpu"
        self.kern = _kernels(real, d, self.serial)
        S = tableau.stages
        self.slopes = [sim._xdot] + [ti.ndarray(real, shape=(R, n, d)) for _ in range(S - 1)]
        self.point = sim._stage_x
        self.x_new = ti.ndarray(real, shape=(R, n, d))
        self.fsal = tableau.fsal
        self.fresh = None if self.fsal else ti.ndarray(real, shape=(R, n, d))
        # the per-attempt vectors live on the host and are handed to the kernels as external
        # arrays: no copy launch each way (a from_numpy or to_numpy of R numbers costs a launch,
        # ~70 us on the CPU; on a GPU taichi copies them with the launch)
        self.h_host = np.zeros(R, dtype=self.np_real)
        self.flags = np.zeros(R, dtype=np.int32)
        self.err_sums = np.zeros(R)
        self.err_rows = None if self.serial else ti.ndarray(ti.f64, shape=(R, n))

        def padded(terms, dtype):
            a = np.zeros(MAX_STAGES, dtype=dtype)
            for coefficient, j in terms:
                a[j] = coefficient
            dev = ti.ndarray(ti.f64 if dtype == np.float64 else real, shape=(MAX_STAGES,))
            dev.from_numpy(a)
            return dev

        # stage s's point for s = 1..S-1; the new state (b); the error (b - b_hat)
        attempt = tableau.attempt
        self.stage_coef = [padded(terms, self.np_real) for terms in attempt.points]
        self.b_coef = padded(zip(attempt.b, range(S)), self.np_real)
        self.err_coef = padded(zip(attempt.error, range(S)), np.float64)
        q = min(tableau.order, tableau.b_hat_order)
        self.expo = 1.0 / (q + 1) - 0.75 * PI_BETA
        self.expo_reject = 1.0 / (q + 1)
        self.h_next = None                          # proposed step per replica (float64)
        self.err_prev = np.full(R, ERR_FLOOR)
        self.after_reject = np.zeros(R, dtype=bool)
        self.accepted = np.zeros(R, dtype=np.int64)
        self.rejected = np.zeros(R, dtype=np.int64)
        self.evaluations = 0
        self.first_slope_at = None   # (step, layer) whose velocity the first slope holds
        self.observed_at = None      # (step, layer) whose row sim.observe() has recorded
        self.evaluate = Evaluator(sim)
        # the fused path takes a whole attempt of a first-same-as-last pair in one launch
        # (``FusedSteps.attempt``): its stages, new state, error norms and accept
        self.attempt = None
        if sim._fused is not None and self.fsal:
            self.attempt = paths.factory(sim.plan.implementations[0].name)(
                sim.rule, sim.geometry, sim.dtype, d, sim.n_heads, sim.score_rank, sim.value_rank,
                tableau, R, n, attempt=True)
            self.h64 = np.zeros(R)
            self.err_tokens = np.zeros((R, n + 1))   # per token, then their sum per replica
        self._warm_up()

    def _warm_up(self) -> None:
        """Compile the kernels now (h = 0 and no flag: nothing changes)."""
        if self.attempt is not None:
            self.attempt.attempt(self.sim._operands, self.h64, self.err_tokens, 1e-6, 1e-6)
            return
        combine, accept = self.kern[0], self.kern[-1]
        ks = self.slopes + [self.slopes[0]] * (MAX_STAGES - len(self.slopes))
        for nterms in sorted({min(s, 3) if s <= 3 else min(s, 5) if s <= 5 else 7
                              for s in range(1, len(self.slopes) + 1)}):   # the variants used
            combine(self.x_new, self.sim._x, self.h_host, self.b_coef, nterms, *ks)
        self._error_norms(1, 1e-6, 1e-6, ks)
        accept(self.sim._x, self.x_new, self.slopes[0], self.slopes[-1], self.flags, 0)

    def _error_norms(self, nterms: int, rtol: float, atol: float, ks) -> None:
        """err_sums[r] = sum over (i, c) of replica r's scaled error squared (see the module)."""
        _, error_rows, error_sums, error_norms, _ = self.kern
        x = self.sim._x
        if self.serial:
            error_norms(self.err_sums, x, self.x_new, self.h_host, self.err_coef, nterms, rtol, atol, *ks)
        else:
            error_rows(self.err_rows, x, self.x_new, self.h_host, self.err_coef, nterms, rtol, atol, *ks)
            error_sums(self.err_rows, self.err_sums)

    # -- the controller's state, for checkpoints ---------------------------------------------
    def state(self) -> dict:
        return {"h_next": None if self.h_next is None else self.h_next.tolist(),
                "err_prev": self.err_prev.tolist(), "after_reject": self.after_reject.tolist(),
                "accepted": self.accepted.tolist(), "rejected": self.rejected.tolist(),
                "evaluations": int(self.evaluations)}

    def restore(self, state: dict) -> None:
        """The state ``state()`` returned; ValueError naming what does not fit."""
        R = self.sim.n_replicas

        def floats(key, lo):
            v = np.asarray(state.get(key), dtype=np.float64)
            if v.shape != (R,) or not np.all(np.isfinite(v)) or np.any(v <= lo):
                raise ParticlesUserError(f"adaptive controller state: {key!r} must hold {R} finite "
                                         f"numbers > {lo}, got {state.get(key)!r}")
            return v

        h = state.get("h_next")
        self.h_next = None if h is None else floats("h_next", 0.0)
        self.err_prev = floats("err_prev", 0.0)
        counts = {}
        for key in ("after_reject", "accepted", "rejected"):
            v = state.get(key)
            if not isinstance(v, list) or len(v) != R or not all(type(c) in (int, bool) and c >= 0 for c in v):
                raise ParticlesUserError(f"adaptive controller state: {key!r} must hold {R} whole "
                                         f"numbers >= 0, got {v!r}")
            counts[key] = v
        self.after_reject = np.array(counts["after_reject"], dtype=bool)
        self.accepted = np.array(counts["accepted"], dtype=np.int64)
        self.rejected = np.array(counts["rejected"], dtype=np.int64)
        ev = state.get("evaluations")
        if type(ev) is not int or ev < 0:
            raise ParticlesUserError(f"adaptive controller state: 'evaluations' must be a whole "
                                     f"number >= 0, got {ev!r}")
        self.evaluations = ev
        self.forget()

    def stats(self) -> dict:
        """Accepted and rejected steps per replica, velocity evaluations (all replicas share
        each), and the step each replica would take next."""
        return {"accepted": self.accepted.tolist(), "rejected": self.rejected.tolist(),
                "evaluations": int(self.evaluations),
                "dt_next": None if self.h_next is None else self.h_next.tolist()}

    def forget(self, keep_row: bool = False) -> None:
        """The state or the heads changed (or the first slope was overwritten, ``keep_row``:
        the current state's row stays recorded): the first slope is evaluated again."""
        self.first_slope_at = None
        if not keep_row:
            self.observed_at = None

    def observed(self) -> None:
        """``sim.observe()`` just evaluated the current state's velocity into the first slope
        and recorded its row: the step from it uses both."""
        sim = self.sim
        self.evaluations += 1
        self.first_slope_at = self.observed_at = (sim.step_count, sim.layer)

    # -- stepping ------------------------------------------------------------------------------
    def advance(self, steps: int, observe_every: int) -> None:
        """Integrate over ``steps`` grid steps, observing the grid states that are multiples of
        ``observe_every`` (before stepping from them)."""
        sim = self.sim
        start, end = sim.step_count, sim.step_count + steps
        cuts = {end}
        if observe_every > 0:
            cuts.update(range((start // observe_every + 1) * observe_every, end, observe_every))
        if sim.scheduled:
            cuts.update(s for s in sim.schedule.starts if start < s < end)
        for stop in sorted(cuts):
            sim._use_layer(sim.schedule.layer_at(sim.step_count))
            observe = observe_every > 0 and sim.step_count % observe_every == 0
            self._piece((stop - sim.step_count) * sim.dt, observe)
            sim.step_count = stop

    def _evaluate(self, x, k, observe: bool) -> None:
        self.evaluate(x, k, observe)
        self.evaluations += 1

    def _piece(self, length: float, observe: bool) -> None:
        """Every replica from here over ``length`` in time, its last step clipped onto the end."""
        sim, kern, st = self.sim, self.kern, self.settings
        combine, accept = kern[0], kern[-1]
        R = sim.n_replicas
        k = self.slopes
        ks = k + [k[0]] * (MAX_STAGES - len(k))
        S = len(k)
        here = (sim.step_count, sim.layer)
        if observe and self.observed_at != here:
            self._evaluate(sim._x, k[0], True)   # and the row of this state
            self.first_slope_at = here
        elif self.first_slope_at != here:
            self._evaluate(sim._x, k[0], False)
            self.first_slope_at = here
        self.observed_at = None
        if self.h_next is None:
            self.h_next = np.full(R, min(sim.dt, st.dt_max))
        floor = max(st.dt_min, STEP_FLOOR * sim.dt)
        t = np.zeros(R)
        running = np.ones(R, dtype=bool)
        retract = sim._ops.retract
        while running.any():
            remaining = length - t
            clipped = running & (self.h_next >= remaining - 1e-12 * length)
            h = np.where(clipped, remaining, np.minimum(self.h_next, remaining))
            h = np.where(running, h, 0.0)
            np.copyto(self.h_host, h, casting="unsafe")
            if self.attempt is not None:
                np.copyto(self.h64, self.h_host)
                self.attempt.attempt(sim._operands, self.h64, self.err_tokens, st.rtol, st.atol)
                self.evaluations += S - 1
                err = np.sqrt(self.err_tokens[:, sim.n] / (sim.n * sim.d))
                ok = running & (err <= 1.0)   # the kernel accepted these (h != 0 where running)
                self._control(self.h64.copy(), err, ok, running & ~ok, clipped)
                t = np.where(ok, t + h, t)
                t[ok & clipped] = length
                running &= ~(ok & clipped)
                self._check_floor(running, floor, t)
                continue
            last = S - 1 if self.fsal else S
            for s in range(1, last):
                combine(self.point, sim._x, self.h_host, self.stage_coef[s - 1], s, *ks)
                self._evaluate(self.point, k[s], False)
            combine(self.x_new, sim._x, self.h_host, self.b_coef, S, *ks)
            retract(self.x_new)
            if self.fsal:   # the last stage's point is the new state
                self._evaluate(self.x_new, k[S - 1], False)
            self._error_norms(S, st.rtol, st.atol, ks)
            err = np.sqrt(self.err_sums / (sim.n * sim.d))
            ok = running & (err <= 1.0)
            self._control(self.h_host.astype(np.float64), err, ok, running & ~ok, clipped)
            if ok.any():
                np.copyto(self.flags, ok, casting="unsafe")
                accept(sim._x, self.x_new, k[0], k[S - 1], self.flags, int(self.fsal))
                if not self.fsal:   # the next first slope, for the replicas that moved
                    self._evaluate(sim._x, self.fresh, False)
                    accept(k[0], self.fresh, k[0], k[0], self.flags, 0)
            t = np.where(ok, t + h, t)
            t[ok & clipped] = length
            running &= ~(ok & clipped)
            self._check_floor(running, floor, t)

    def _check_floor(self, running, floor: float, t) -> None:
        """BlowUpError when a running replica's next step falls below the floor."""
        sim, st = self.sim, self.settings
        low = running & (self.h_next < floor)
        if low.any():
            r = int(np.argmax(low))
            where = f"replica {r}, " if sim.ensemble else ""
            raise BlowUpError(
                f"adaptive step underflow at step {sim.step_count} (+{t[r]:.6g} in time): {where}the "
                f"controller needs a step of {self.h_next[r]:.3g}, below dt_min = {floor:.3g}. The "
                f"flow is too stiff (or not finite) for rtol = {st.rtol:g}, atol = {st.atol:g}: "
                "loosen the tolerances, lower dt_min, or check the heads and beta",
                sim.step_count, r, -1)

    def _control(self, h, err, ok, bad, clipped) -> None:
        """The next proposed step of every replica that attempted one (see the module)."""
        st = self.settings
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            fac11 = err ** self.expo_reject
            fac = np.clip(err ** self.expo / self.err_prev ** PI_BETA / SAFETY, 1 / GROW_MAX,
                          SHRINK_MAX)
            grown = h / fac
            grown = np.where(self.after_reject, np.minimum(grown, h), grown)
            grown = np.where(clipped, np.maximum(grown, self.h_next), grown)   # clipping is not error
            finite = np.isfinite(err)
            shrunk = np.where(finite, h / np.minimum(SHRINK_MAX, fac11 / SAFETY), h / SHRINK_MAX)
        proposal = np.where(ok, grown, np.where(bad, shrunk, self.h_next))
        self.h_next = np.minimum(proposal, st.dt_max)
        self.err_prev = np.where(ok, np.maximum(err, ERR_FLOOR), self.err_prev)
        self.after_reject = np.where(ok, False, np.where(bad, True, self.after_reject))
        self.accepted += ok
        self.rejected += bad
