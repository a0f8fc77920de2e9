"""The exact step on the sphere: Lie-group integrators that move each token by rotations, so
tokens stay on the sphere by construction (``Simulation(retraction="exp")``).

On the sphere token i moves along u_i = P_x v_i, the action on x_i of the rotation generator
A_i = u_i x_i^T - x_i u_i^T (u_i is tangent at x_i). exp(c A_i) rotates in the plane of
(x_i, u_i) by the angle c |u_i| and leaves the rest of R^d alone, so applied to any z:

    exp(c A(y, u)) z = z + (cos t - 1)(<z, y> y + <z, e> e) + sin t (<z, y> e - <z, e> y),
    t = c |u|, e = u / |u|                                            (O(d) per token)

Two methods, each needing no d x d matrix:

    Lie-Euler (integrator 'euler', order 1):   x <- exp(h A(x)) x = cos(|u| h) x + sin(|u| h) u/|u|
    commutator-free Heun (integrator 'heun', order 2; Celledoni, Marthinsen and Owren 2003):
        Y = exp(h A(x)) x,   x <- exp(h/2 A(Y)) exp(h/2 A(x)) x

The velocity passes are the engine's own (the tiled or plain path); the observables of a
logged state come from the first evaluation, as with the Runge-Kutta stepping.
"""
import numpy as np
import taichi as ti

from .adaptive import Evaluator
from .errors import ParticlesUserError

_KERNELS: dict = {}


def _rotate_kernel(real, d: int):
    if (real, d) in _KERNELS:
        return _KERNELS[real, d]
    arr3 = ti.types.ndarray(dtype=real, ndim=3)

    @ti.kernel
    def rotate(out: arr3, z: arr3, y: arr3, u: arr3, c: real):
        """out_i = exp(c A(y_i, u_i)) z_i per token (out may be z)."""
        for b, i in ti.ndrange(out.shape[0], out.shape[1]):
            uu = ti.cast(0, real)
            for e in ti.static(range(d)):
                uu += u[b, i, e] * u[b, i, e]
            norm = ti.sqrt(uu)
            if norm > 0:
                zy = ti.cast(0, real)
                ze = ti.cast(0, real)
                for e in ti.static(range(d)):
                    zy += z[b, i, e] * y[b, i, e]
                    ze += z[b, i, e] * u[b, i, e]
                ze /= norm
                angle = c * norm
                cm1 = ti.cos(angle) - 1
                s = ti.sin(angle)
                for e in ti.static(range(d)):
                    ev = u[b, i, e] / norm
                    out[b, i, e] = z[b, i, e] + cm1 * (zy * y[b, i, e] + ze * ev) + s * (zy * ev - ze * y[b, i, e])
            else:
                for e in ti.static(range(d)):
                    out[b, i, e] = z[b, i, e]

    _KERNELS[real, d] = rotate
    return rotate


class LieStepper:
    """A Simulation's exact steps on the sphere (engine-internal; see the module)."""

    def __init__(self, sim, method):
        if sim.geometry != "sphere":
            raise ParticlesUserError("retraction 'exp' rotates tokens on the sphere; flat space "
                                     "needs none (use retraction 'normalise')")
        if getattr(sim, "normalisation", "post") != "post":
            raise ParticlesUserError(f"retraction 'exp' keeps tokens on the sphere; normalisation "
                                     f"{sim.normalisation!r} moves them off it (use 'post')")
        if method.name not in ("euler", "heun"):
            raise ParticlesUserError(f"retraction 'exp' steps with integrator 'euler' (Lie-Euler) or "
                                     f"'heun' (its commutator-free Lie-group form, order 2), got "
                                     f"{method.name!r}")
        self.sim, self.two_stage = sim, method.name == "heun"
        real = ti.f32 if sim.dtype == "float32" else ti.f64
        self.rotate = _rotate_kernel(real, sim.d)
        shape = (sim.n_replicas, sim.n, sim.d)
        self.v0 = sim._xdot
        self.y = ti.ndarray(real, shape=shape) if self.two_stage else None
        self.v1 = ti.ndarray(real, shape=shape) if self.two_stage else None
        self.evaluations = 0
        self.observed_at = None
        self.evaluate = Evaluator(sim)
        self.rotate(sim._stage_x, sim._x, sim._x, self.v0, 0.0)   # compile now (c = 0: a copy)

    def forget(self, keep_row: bool = False) -> None:
        if not keep_row:
            self.observed_at = None

    def observed(self) -> None:
        sim = self.sim
        self.evaluations += 1
        self.observed_at = (sim.step_count, sim.layer)

    def stats(self) -> dict:
        return {"evaluations": int(self.evaluations)}

    def state(self) -> dict:
        return {}

    def restore(self, state: dict) -> None:
        self.forget()

    def advance(self, steps: int, observe_every: int) -> None:
        sim, h = self.sim, self.sim.dt
        for _ in range(steps):
            if sim.scheduled:
                sim._use_layer(sim.schedule.layer_at(sim.step_count))
            observe = observe_every > 0 and sim.step_count % observe_every == 0
            if not (observe and self.observed_at == (sim.step_count, sim.layer)):
                self.evaluate(sim._x, self.v0, observe)
                self.evaluations += 1
            self.observed_at = None
            x = sim._x
            if self.two_stage:
                self.rotate(self.y, x, x, self.v0, h)
                self.evaluate(self.y, self.v1, False)
                self.evaluations += 1
                self.rotate(x, x, x, self.v0, 0.5 * h)
                self.rotate(x, x, self.y, self.v1, 0.5 * h)
            else:
                self.rotate(x, x, x, self.v0, h)
            sim.step_count += 1
