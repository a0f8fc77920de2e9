"""Fixed-step integrators as data: explicit Runge-Kutta tableaux, each step followed by the
geometry's retraction.

Every path reads the same tableau, so an integrator defined here (or by a user) runs the same
way on the fused small-n kernel and on the per-kernel paths; no path matches on a name.

The engine keeps two state-sized buffers for the stages (one stage point, one running sum),
so a tableau's stage s may use only the previous stage's slope: stage point
x_s = x + reach[s-1] dt k_{s-1}, and the step x <- retract(x + dt/denominator sum_s weights[s] k_s).
Euler, Heun, the midpoint rule and classical RK4 are of that form (their Butcher matrix has
only the sub-diagonal).

On the per-kernel paths, ``step`` sees only ``ops``: ``evaluate(x, xdot, observe)`` writes
the velocity at x, ``axpy(out, x, a, y)`` sets out = x + a y, ``accumulate(acc, a, y, first)``
and ``retract(x)``. ``observe`` is passed to the first stage, whose point is the current state.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExplicitRK:
    """An explicit Runge-Kutta method whose stage s uses the slope of stage s - 1 only.

    name: what scenes and ``Simulation(integrator=...)`` call it.
    reach: c_2..c_S, the stage points' distance in units of dt (S - 1 numbers).
    weights: b_1..b_S times ``denominator`` (integers keep RK4's sums exact, as written by hand).
    order: the global order of accuracy, which the tests hold it to.
    """

    name: str
    reach: tuple
    weights: tuple
    denominator: float
    order: int

    def __post_init__(self):
        if len(self.weights) != len(self.reach) + 1 or not self.weights:
            raise ValueError(f"integrator {self.name!r}: {len(self.weights)} weights need "
                             f"{len(self.weights) - 1} stage reaches, got {len(self.reach)}")
        if abs(sum(self.weights) - self.denominator) > 1e-12 * abs(self.denominator):
            raise ValueError(f"integrator {self.name!r}: the weights {self.weights} must sum to "
                             f"the denominator {self.denominator} (a consistent method)")
        object.__setattr__(self, "reach", tuple(float(a) for a in self.reach))
        object.__setattr__(self, "weights", tuple(float(b) for b in self.weights))
        object.__setattr__(self, "denominator", float(self.denominator))

    @property
    def stages(self) -> int:
        return len(self.weights)

    def step(self, ops, dt: float, observe: bool) -> None:
        """One step on the per-kernel paths (the fused kernel unrolls the same tableau)."""
        x, k = ops.x, ops.xdot
        ops.evaluate(x, k, observe)
        ops.after_first_stage(observe)
        if self.stages == 1:
            ops.axpy(x, x, dt * (self.weights[0] / self.denominator), k)
        else:
            xs, acc = ops.stage_x, ops.stage_acc
            ops.accumulate(acc, self.weights[0], k, 1)
            for reach, weight in zip(self.reach, self.weights[1:]):
                ops.axpy(xs, x, reach * dt, k)
                ops.evaluate(xs, k, False)
                ops.accumulate(acc, weight, k, 0)
            ops.axpy(x, x, dt / self.denominator, acc)
        ops.retract(x)


# On the sphere the field v - <v, x> x keeps |x| = 1 invariant, so the stages leave the
# sphere by O(dt^(p+1)) per step; renormalising at the end keeps the constraint without
# lowering the order.
EULER = ExplicitRK("euler", reach=(), weights=(1,), denominator=1, order=1)
RK4 = ExplicitRK("rk4", reach=(0.5, 0.5, 1.0), weights=(1, 2, 2, 1), denominator=6, order=4)

INTEGRATORS = {m.name: m for m in (EULER, RK4)}


def get_integrator(integrator) -> ExplicitRK:
    """An ``ExplicitRK`` as given, or the built-in one of that name."""
    if isinstance(integrator, ExplicitRK):
        return integrator
    if isinstance(integrator, str) and integrator in INTEGRATORS:
        return INTEGRATORS[integrator]
    raise ValueError(f"integrator must be one of {tuple(INTEGRATORS)} or a "
                     f"particles.ExplicitRK, got {integrator!r}")
