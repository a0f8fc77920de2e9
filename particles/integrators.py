"""Fixed-step integrators as data: explicit Runge-Kutta tableaux, each step followed by the
geometry's retraction.

Every path reads the same tableau, so an integrator defined here (or by a user) runs the same
way on the fused small-n kernel and on the per-kernel paths; no path matches on a name.

A tableau is its strictly lower-triangular matrix ``a`` (stage s's point is
x_s = x + dt sum_{j<s} a[s][j] k_j), its weights b = weights / denominator (the step
x <- retract(x + dt/denominator sum_s weights[s] k_s); integers keep RK4's sums exact, as
written by hand) and, for an embedded pair, the weights ``b_hat`` of the lower-order solution
(also times the denominator). Any explicit tableau runs: the engine keeps one slope buffer per
stage whose slope a later stage still reads (``slope_slots``: a buffer is reused once its
slope is read for the last time), so Euler, Heun, the midpoint rule and classical RK4 (whose
matrix has only the sub-diagonal) keep one, Kutta's 3/8 rule three.

On the per-kernel paths, ``step`` sees only ``ops``: ``evaluate(x, xdot, observe)`` writes
the velocity at x, ``axpy(out, x, a, y)`` sets out = x + a y, ``accumulate(acc, a, y, first)``
and ``retract(x)``; ``ops.slopes`` holds the slope buffers (the first is the simulation's
xdot). ``observe`` is passed to the first stage, whose point is the current state.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

from .errors import ParticlesUserError


@dataclass(frozen=True)
class ExplicitRK:
    """An explicit Runge-Kutta method.

    name: what scenes and ``Simulation(integrator=...)`` call it.
    reach: c_2..c_S for a method whose stage s uses only the slope of stage s - 1 (the
        sub-diagonal of ``a``); give either reach or ``a``.
    weights: b_1..b_S times ``denominator``.
    order: the global order of accuracy, which the tests hold it to.
    a: the rows 2..S of the Butcher matrix, row s holding a[s][1..s-1] (s - 1 numbers).
    b_hat: an embedded pair's second weights, times ``denominator`` (read by adaptive
        stepping; a fixed step uses ``weights``).
    b_hat_order: the order of the ``b_hat`` solution (default ``order - 1``); the step-size
        controller's exponent is 1 / (min(order, b_hat_order) + 1).
    """

    name: str
    reach: tuple = ()
    weights: tuple = ()
    denominator: float = 1.0
    order: int = 1
    a: tuple | None = None
    b_hat: tuple | None = None
    b_hat_order: int | None = None

    def __post_init__(self):
        stages = len(self.weights)
        if not stages:
            raise ParticlesUserError(f"integrator {self.name!r}: at least one weight is needed")
        if self.a is None:
            if len(self.reach) != stages - 1:
                raise ParticlesUserError(f"integrator {self.name!r}: {stages} weights need "
                                         f"{stages - 1} stage reaches, got {len(self.reach)}")
            a = tuple((0.0,) * (s - 1) + (float(c),) for s, c in enumerate(self.reach, start=1))
        else:
            if self.reach:
                raise ParticlesUserError(f"integrator {self.name!r}: give the stage reaches or the "
                                         "matrix a, not both")
            a = tuple(tuple(float(v) for v in row) for row in self.a)
            shape = [len(row) for row in a]
            if shape != list(range(1, stages)):
                raise ParticlesUserError(f"integrator {self.name!r}: {stages} weights need the rows "
                                         f"2..{stages} of a strictly lower-triangular matrix, with "
                                         f"{list(range(1, stages))} entries; got rows of {shape}")
        for label, ws in (("weights", self.weights), ("b_hat", self.b_hat)):
            if ws is None:
                continue
            if len(ws) != stages:
                raise ParticlesUserError(f"integrator {self.name!r}: {label} has {len(ws)} entries, "
                                         f"the tableau {stages} stages")
            if abs(sum(ws) - self.denominator) > 1e-12 * abs(self.denominator):
                raise ParticlesUserError(f"integrator {self.name!r}: the {label} {tuple(ws)} must sum "
                                         f"to the denominator {self.denominator} (a consistent method)")
        object.__setattr__(self, "a", a)
        object.__setattr__(self, "reach", tuple(math.fsum(row) for row in a))
        object.__setattr__(self, "weights", tuple(float(b) for b in self.weights))
        object.__setattr__(self, "denominator", float(self.denominator))
        if self.b_hat is not None:
            object.__setattr__(self, "b_hat", tuple(float(b) for b in self.b_hat))
            if self.b_hat_order is None:
                object.__setattr__(self, "b_hat_order", self.order - 1)

    @property
    def fsal(self) -> bool:
        """First same as last: the last stage's point is the new state (its row of ``a`` is
        b and its weight 0), so its slope is the next step's first."""
        b = [w / self.denominator for w in self.weights]
        return (self.stages > 1 and b[-1] == 0
                and all(abs(v - w) <= 1e-15 for v, w in zip(self.a[-1], b[:-1])))

    @property
    def stages(self) -> int:
        return len(self.weights)

    @property
    def c(self) -> tuple:
        """The stages' times in units of dt, c_1 = 0."""
        return (0.0,) + self.reach

    def terms(self, s: int) -> tuple:
        """Stage s's point as (a[s][j], j) over the slopes it reads (nonzero entries)."""
        return tuple((v, j) for j, v in enumerate(self.a[s - 1]) if v != 0) if s > 0 else ()

    @property
    def slope_slots(self) -> tuple:
        """The slope buffer of each stage: a buffer is reused by the first stage after the last
        one whose point reads its slope (that stage's point is formed before its slope is
        written), so a method using only the previous slope needs one buffer."""
        last_read = list(range(self.stages))
        for s in range(1, self.stages):
            for _, j in self.terms(s):
                last_read[j] = max(last_read[j], s)
        slots, held_until = [], []
        for s in range(self.stages):
            free = next((q for q, until in enumerate(held_until) if until <= s), None)
            if free is None:
                free = len(held_until)
                held_until.append(0)
            held_until[free] = last_read[s]
            slots.append(free)
        return tuple(slots)

    @property
    def slope_buffers(self) -> int:
        return max(self.slope_slots) + 1

    @functools.cached_property
    def program(self) -> tuple:
        """The tableau as both interpreters run it (``step`` here, the fused kernel's
        ``rows_advance``): per stage a ``Stage`` (its point's terms over slope buffers, its
        weight, the buffer its slope lands in)."""
        slots = self.slope_slots
        return tuple(Stage(tuple((v, slots[j]) for v, j in self.terms(s)), self.weights[s], slots[s])
                     for s in range(self.stages))

    @functools.cached_property
    def attempt(self) -> "Attempt":
        """The tableau as an adaptive attempt runs it (``adaptive.Stepper``'s combinations and
        the fused kernel's attempt branch): every slope kept, stage j's in buffer j."""
        b = tuple(w / self.denominator for w in self.weights)
        b_hat = b if self.b_hat is None else tuple(w / self.denominator for w in self.b_hat)
        points = [self.terms(s) for s in range(1, self.stages)]
        if self.fsal:   # the last stage's point is the new state
            points[-1] = tuple((v, j) for j, v in enumerate(b[:-1]) if v != 0)
        return Attempt(tuple(points), b, tuple(u - v for u, v in zip(b, b_hat)))

    def step(self, ops, dt: float, observe: bool) -> None:
        """One step on the per-kernel paths: acc = sum_s weight_s k_s, stage s's point
        x + sum (coefficient dt) k_slot, then x + (dt / denominator) acc and the retraction."""
        x = ops.x
        first, *rest = self.program
        ops.evaluate(x, ops.slopes[first.slot], observe)
        ops.after_first_stage(observe)
        if not rest:
            ops.axpy(x, x, dt * (first.weight / self.denominator), ops.slopes[first.slot])
        else:
            xs, acc = ops.stage_x, ops.stage_acc
            ops.accumulate(acc, first.weight, ops.slopes[first.slot], 1)
            for stage in rest:
                point = x
                for coefficient, slot in stage.point:
                    ops.axpy(xs, point, coefficient * dt, ops.slopes[slot])
                    point = xs
                ops.evaluate(point, ops.slopes[stage.slot], False)
                ops.accumulate(acc, stage.weight, ops.slopes[stage.slot], 0)
            ops.axpy(x, x, dt / self.denominator, acc)
        ops.retract(x)


class Stage(NamedTuple):
    """One stage of ``ExplicitRK.program``: its point x + dt sum coefficient k_slot over
    ``point``'s (coefficient, slot) terms (none for the first), its ``weight`` (times the
    denominator) and the ``slot`` of the slope buffer its slope is written to."""

    point: tuple
    weight: float
    slot: int


class Attempt(NamedTuple):
    """``ExplicitRK.attempt``: ``points[s - 1]`` is stage s's point x + h sum coefficient k_j
    over its (coefficient, j) terms, s = 1..S-1 (of a first-same-as-last pair the last is the
    new state); ``b`` the new state's weights (x + h sum b_j k_j); ``error`` b - b_hat, the
    weights of the error estimate (zero without b_hat)."""

    points: tuple
    b: tuple
    error: tuple


# On the sphere the field v - <v, x> x keeps |x| = 1 invariant, so the stages leave the
# sphere by O(dt^(p+1)) per step; renormalising at the end keeps the constraint without
# lowering the order.
EULER = ExplicitRK("euler", reach=(), weights=(1,), denominator=1, order=1)
RK4 = ExplicitRK("rk4", reach=(0.5, 0.5, 1.0), weights=(1, 2, 2, 1), denominator=6, order=4)
# Heun's method (explicit trapezoid); with retraction 'exp' its commutator-free Lie-group form
HEUN = ExplicitRK("heun", reach=(1.0,), weights=(1, 1), denominator=2, order=2)
# Full lower-triangular tableaux (not offered to scenes; Simulation(integrator=...) takes them)
KUTTA_38 = ExplicitRK("kutta_3/8", a=((1 / 3,), (-1 / 3, 1), (1, -1, 1)), weights=(1, 3, 3, 1),
                      denominator=8, order=4)
_R5 = math.sqrt(5.0)
RALSTON_4 = ExplicitRK(   # Ralston (1962): the fourth-order tableau of least truncation error
    "ralston4",
    a=((0.4,),
       ((-2889 + 1428 * _R5) / 1024, (3785 - 1620 * _R5) / 1024),
       ((-3365 + 2094 * _R5) / 6040, (-975 - 3046 * _R5) / 2552, (467040 + 203968 * _R5) / 240845)),
    weights=((263 + 24 * _R5) / 1812, (125 - 1000 * _R5) / 3828, (3426304 + 1661952 * _R5) / 5924787,
             (30 - 4 * _R5) / 123),
    order=4)
# Embedded pairs, for adaptive stepping (both first same as last).
# Bogacki and Shampine (1989): third order, b_hat second.
BOGACKI_SHAMPINE = ExplicitRK("bs32", a=((1 / 2,), (0, 3 / 4), (2 / 9, 1 / 3, 4 / 9)),
                              weights=(2 / 9, 1 / 3, 4 / 9, 0), order=3,
                              b_hat=(7 / 24, 1 / 4, 1 / 3, 1 / 8))
BS32 = BOGACKI_SHAMPINE
# Dormand and Prince (1980), as in Hairer, Norsett and Wanner's DOPRI5: fifth order, b_hat fourth.
DOPRI5 = ExplicitRK(
    "dopri5",
    a=((1 / 5,),
       (3 / 40, 9 / 40),
       (44 / 45, -56 / 15, 32 / 9),
       (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
       (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656),
       (35 / 384, 0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84)),
    weights=(35 / 384, 0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0), order=5,
    b_hat=(5179 / 57600, 0, 7571 / 16695, 393 / 640, -92097 / 339200, 187 / 2100, 1 / 40))


@dataclass(frozen=True)
class Adaptive:
    """An embedded pair stepped with error control (``particles.adaptive``): each replica takes
    the steps its own error allows, and the simulation's ``dt`` is only the grid on which
    rows, frames, checkpoints and layer switches land (steps are clipped to land on it).

    method: an ``ExplicitRK`` with ``b_hat`` ("dopri5", "bs32" or a user's pair).
    rtol, atol: a step is accepted when the RMS over a replica's components of
        err / (atol + rtol max(|x|, |x_new|)) is at most 1 (Hairer's norm).
    dt_min: a step the controller wants below it stops the run (BlowUpError); 0: only the
        float floor stops it. dt_max: no step is longer (default: unbounded).
    """

    method: ExplicitRK | str = "dopri5"
    rtol: float = 1e-6
    atol: float = 1e-6
    dt_min: float = 0.0
    dt_max: float = math.inf

    def __post_init__(self):
        method = self.method
        if isinstance(method, str):
            method = EMBEDDED_PAIRS.get(method)
            if method is None:
                raise ParticlesUserError(f"Adaptive: method must be one of {tuple(EMBEDDED_PAIRS)} or a "
                                         f"particles.ExplicitRK with b_hat, got {self.method!r}")
        if not isinstance(method, ExplicitRK) or method.b_hat is None:
            raise ParticlesUserError(f"Adaptive: {getattr(method, 'name', method)!r} has no embedded "
                                     "weights b_hat, so its error cannot be estimated; use 'dopri5', "
                                     "'bs32' or a tableau with b_hat")
        object.__setattr__(self, "method", method)
        for key in ("rtol", "atol", "dt_min", "dt_max"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                raise ParticlesUserError(f"Adaptive: {key} must be a number, got {value!r}")
            object.__setattr__(self, key, float(value))
        if not 0 < self.rtol < 1 or not math.isfinite(self.rtol):
            raise ParticlesUserError(f"Adaptive: rtol must lie in (0, 1), got {self.rtol!r}")
        if not 0 <= self.atol < math.inf:
            raise ParticlesUserError(f"Adaptive: atol must be >= 0 and finite, got {self.atol!r}")
        if not 0 <= self.dt_min < math.inf:
            raise ParticlesUserError(f"Adaptive: dt_min must be >= 0 and finite, got {self.dt_min!r}")
        if not self.dt_max > self.dt_min:
            raise ParticlesUserError(f"Adaptive: dt_max ({self.dt_max!r}) must exceed dt_min "
                                     f"({self.dt_min!r})")

    @property
    def name(self) -> str:
        return self.method.name


EMBEDDED_PAIRS = {m.name: m for m in (DOPRI5, BS32)}
# The names scenes and Simulation(integrator=...) take; an embedded pair named here steps
# adaptively (the tableau object itself, e.g. integrators.DOPRI5, steps at the fixed dt).
INTEGRATORS = {**{m.name: m for m in (EULER, RK4, HEUN)},
               **{name: Adaptive(m) for name, m in EMBEDDED_PAIRS.items()}}


def get_integrator(integrator) -> ExplicitRK | Adaptive:
    """An ``ExplicitRK`` or ``Adaptive`` as given, or the built-in one of that name."""
    if isinstance(integrator, (ExplicitRK, Adaptive)):
        return integrator
    if isinstance(integrator, str) and integrator in INTEGRATORS:
        return INTEGRATORS[integrator]
    raise ParticlesUserError(f"integrator must be one of {tuple(INTEGRATORS)}, a "
                             f"particles.ExplicitRK or a particles.Adaptive, got {integrator!r}")


def split(integrator) -> tuple[ExplicitRK, Adaptive | None]:
    """The tableau that runs and, for adaptive stepping, its settings."""
    method = get_integrator(integrator)
    return (method.method, method) if isinstance(method, Adaptive) else (method, None)
