"""Fixed-step integrators over an explicit state, each followed by the geometry's retraction.

An integrator only sees ``ops``: ``evaluate(x, xdot, observe)`` writes the velocity at x,
``axpy(out, x, a, y)`` sets out = x + a y, ``accumulate(acc, a, y, first)`` and
``retract(x)``. It does not know who logs: ``observe`` is passed to the first stage,
whose evaluation point is the current state.
"""
from __future__ import annotations


class Euler:
    """Explicit Euler, x <- retract(x + dt xdot(x)). Global order 1.

    On the sphere the retraction keeps |x_i| = 1 exactly (to rounding) after every step.
    """

    name = "euler"
    order = 1
    stages = 1

    def step(self, ops, dt: float, observe: bool) -> None:
        ops.evaluate(ops.x, ops.xdot, observe)
        ops.after_first_stage(observe)
        ops.axpy(ops.x, ops.x, dt, ops.xdot)
        ops.retract(ops.x)


class RK4:
    """Classical fourth-order Runge-Kutta in the ambient space, then the retraction. Global order 4.

    The sphere's vector field v - <v, x> x keeps |x| = 1 invariant, so the stages may
    leave the sphere by O(dt^5) per step; renormalising at the end of the step keeps the
    constraint exactly without lowering the order.
    """

    name = "rk4"
    order = 4
    stages = 4

    def step(self, ops, dt: float, observe: bool) -> None:
        x, xs, k, acc = ops.x, ops.stage_x, ops.xdot, ops.stage_acc
        ops.evaluate(x, k, observe)
        ops.after_first_stage(observe)
        ops.accumulate(acc, 1.0, k, 1)
        ops.axpy(xs, x, 0.5 * dt, k)
        ops.evaluate(xs, k, False)
        ops.accumulate(acc, 2.0, k, 0)
        ops.axpy(xs, x, 0.5 * dt, k)
        ops.evaluate(xs, k, False)
        ops.accumulate(acc, 2.0, k, 0)
        ops.axpy(xs, x, dt, k)
        ops.evaluate(xs, k, False)
        ops.accumulate(acc, 1.0, k, 0)
        ops.axpy(x, x, dt / 6.0, acc)
        ops.retract(x)


INTEGRATORS = {"euler": Euler, "rk4": RK4}
