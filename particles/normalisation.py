"""Where the LayerNorm sits: the normalisation placements as dynamics (docs/MODEL.md,
"Normalisation placements").

Every placement evaluates the same attention pull v_i = sum_h f^h_i, at the tokens'
directions y_i = x_i / |x_i|, with the pair pass of whichever implementation the plan chose
(compiled for the sphere, so the per-head observables are the sphere's at the directions);
a placement is a per-token transform around that pass:

- ``post`` (the paper's sphere, the default): xdot = P_x v, state on the unit sphere.
- ``pre``: xdot = v (no projection), state in R^d; |x_i| is each token's radius, logged.
- ``peri``: xdot = v / |v| (the block's output normalised too), state in R^d, radius logged.
- ``ngpt``: xdot = alpha P_x (v / |v|), state on the sphere (the normalised update of nGPT
  with its step scale alpha).

``post`` never reaches this module: its arithmetic is the engine's own, bitwise.
"""

from functools import lru_cache

import numpy as np
import taichi as ti

from .errors import ParticlesUserError
from .layout import SLOT_KINETIC
from .observables import RADIUS_COLUMNS
from .vocabulary import NORMALISATIONS

# placements whose state leaves the sphere: the radius |x_i| is state and is logged
RADIAL = ("pre", "peri")
_CODE = {"pre": 0, "peri": 1, "ngpt": 2}


def check(normalisation: str, geometry: str, alpha) -> tuple[str, float]:
    """The placement and nGPT's step scale, validated (clear errors, the API's and the scene's)."""
    if normalisation not in NORMALISATIONS:
        raise ParticlesUserError(f"normalisation must be one of {NORMALISATIONS}, got {normalisation!r}")
    if normalisation != "post" and geometry != "sphere":
        raise ParticlesUserError(f"normalisation {normalisation!r} places a LayerNorm, which needs "
                                 "geometry 'sphere' (flat space has no normalisation); got geometry "
                                 f"{geometry!r}")
    try:
        a = float(alpha)
    except (TypeError, ValueError):
        raise ParticlesUserError(f"ngpt_alpha must be a positive number, got {alpha!r}") from None
    if not np.isfinite(a) or a <= 0:
        raise ParticlesUserError(f"ngpt_alpha must be a positive finite number, got {alpha!r}")
    if a != 1.0 and normalisation != "ngpt":
        raise ParticlesUserError(f"ngpt_alpha is nGPT's step scale; it applies only with "
                                 f"normalisation 'ngpt', not {normalisation!r}")
    return normalisation, a


@lru_cache(maxsize=None)
def _kernels(d: int, dtype: str):
    real = ti.f32 if dtype == "float32" else ti.f64
    arr3 = ti.types.ndarray(dtype=real, ndim=3)
    arr4 = ti.types.ndarray(dtype=real, ndim=4)

    # runtime loops over the d components (no d-vectors): a placement compiles as fast at
    # d = 384 (MiniLM) as at d = 3
    @ti.kernel
    def directions(x: arr3, y: arr3):
        """y_i = x_i / |x_i| (the LayerNorm without centring or gain, onto radius 1)."""
        for b, i in ti.ndrange(x.shape[0], x.shape[1]):
            s = ti.cast(0, real)
            for e in range(d):
                s += x[b, i, e] * x[b, i, e]
            inv = ti.cast(1, real) / ti.sqrt(s)
            for e in range(d):
                y[b, i, e] = x[b, i, e] * inv

    @ti.kernel
    def transform(y: arr3, f: arr4, xdot: arr3, tok: arr3, kind: ti.template(), alpha: real,
                  observe: ti.template()):
        """xdot from the pull v_i = sum_h f^h_i at the directions y (see the module's list);
        with observe, the kinetic slot holds |xdot_i|^2 (the state's own speed)."""
        for b, i in ti.ndrange(y.shape[0], y.shape[1]):
            norm2, radial = ti.cast(0, real), ti.cast(0, real)
            for e in range(d):
                ve = ti.cast(0, real)
                for h in range(f.shape[1]):
                    ve += f[b, h, i, e]
                xdot[b, i, e] = ve
                norm2 += ve * ve
                radial += ve * y[b, i, e]
            scale = ti.cast(1, real)
            if ti.static(kind != 0):
                scale = ti.cast(0, real)   # a pull of zero stays zero
                if norm2 > 0:
                    scale = 1 / ti.sqrt(norm2)
            if ti.static(kind == 2):
                scale *= alpha
            kinetic = ti.cast(0, real)
            for e in range(d):
                ve = xdot[b, i, e] * scale
                if ti.static(kind == 2):   # the tangent part at the direction
                    ve -= radial * scale * y[b, i, e]
                xdot[b, i, e] = ve
                kinetic += ve * ve
            if ti.static(observe):
                tok[b, i, SLOT_KINETIC] = kinetic

    @ti.kernel
    def radii(x: arr3, out: ti.types.ndarray(dtype=ti.f64, ndim=3), slot: ti.i32):
        """out[slot, b] = (mean, min, max) over tokens of |x_i|, in float64, a fixed order."""
        ti.loop_config(serialize=True)
        for b in range(x.shape[0]):
            total, low, high = 0.0, 0.0, 0.0
            for i in range(x.shape[1]):
                s = 0.0
                for e in range(d):
                    s += ti.cast(x[b, i, e], ti.f64) ** 2
                radius = ti.sqrt(s)
                total += radius
                low = radius if i == 0 else ti.min(low, radius)
                high = ti.max(high, radius)
            out[slot, b, 0] = total / x.shape[1]
            out[slot, b, 1] = low
            out[slot, b, 2] = high

    return directions, transform, radii


class Placement:
    """The per-token transforms of one placement (not ``post``) for a Simulation's arrays."""

    def __init__(self, normalisation: str, alpha: float, R: int, n: int, d: int, dtype: str,
                 batch: int, arr):
        self.name, self.alpha = normalisation, float(alpha)
        self.kind = _CODE[normalisation]
        self.radial = normalisation in RADIAL
        self._directions, self._transform, self._radii = _kernels(d, dtype)
        self.y = arr(R, n, d)   # the directions of the point being evaluated
        self.radius = ti.ndarray(ti.f64, shape=(batch, R, 3)) if self.radial else None

    def evaluate(self, x, xdot, observe: bool, pass_at, f, tok) -> None:
        """The placement's velocity at x: ``pass_at`` (the pair passes and combine) at the
        directions, then the per-token transform of the pull from the head outputs f it left;
        tok: the per-token observables (the kinetic slot)."""
        self._directions(x, self.y)
        pass_at(self.y, xdot, observe)
        self._transform(self.y, f, xdot, tok, self.kind, self.alpha, observe)

    def retract(self, kern):
        """The step's retraction: the sphere's for nGPT; none where the radius is state."""
        return _keep if self.radial else kern.retract

    def observe(self, x, slot: int) -> None:
        if self.radial:
            self._radii(x, self.radius, slot)

    def radius_rows(self) -> np.ndarray | None:
        """The observed slots' (mean, min, max) radius per replica, or None (no radius)."""
        return self.radius.to_numpy() if self.radial else None

    @staticmethod
    def add_radius(rows: list[dict], radius) -> None:
        """The radius columns of one observed state's rows (one per replica)."""
        for b, row in enumerate(rows):
            row.update(zip(RADIUS_COLUMNS, (float(v) for v in radius[b])))


def _keep(x) -> None:
    """No retraction: the state's radius is its own."""
