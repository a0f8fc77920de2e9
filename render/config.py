"""Settings of a rendered video (`RenderConfig`) and facts about the run (`RunInfo`).

Both validate their values on construction and raise `ValueError` with a message
that names the field and the allowed values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

VIEWS = ("auto", "circle", "sphere", "pca", "heads")
COLOR_BY = ("index", "cluster", "radial", "entropy", "norm")
PROJECTIONS = ("pca_initial", "pca_final")
PANELS = ("energy", "energy_rate", "radial_dominance", "entropy", "gamma_bar")
GEOMETRIES = ("sphere", "flat")


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


@dataclass
class RenderConfig:
    """How to draw a video.

    view        "auto" (circle for d=2, sphere for d=3, pca for d>3), "circle", "sphere",
                "pca" or "heads" (one panel per head, tokens projected on its subspace).
    color_by    "index", "cluster", "radial" (per-token radial shadow a^h_i of head
                `color_head`), "entropy" (per-token attention entropy H^h_i) or "norm"
                (|x_i|, what tells tokens apart in flat space).
    color_head  head whose per-token observable colours the tokens.
    trails      number of past frames drawn as fading trails (0 = none).
    rotate      slowly turn the camera (3-D views).
    projection  "pca_initial", "pca_final" (needs the final tokens, passed to
                `Animation(..., final_tokens=...)`) or a (d x 2) / (d x 3) basis array.
    panels      time-series panels beside the particles, drawn where the run has what
                they show (render.panels.available_panels): "energy", "energy_rate" (dE/dt
                and the kinetic term, where Theorem 11's identity holds), "radial_dominance"
                (two or more heads on the sphere), "entropy", "gamma_bar"; at most
                MAX_PANELS, in the order given.
    fps         frames per second of the video.
    width, height  frame size in pixels (an odd size is padded to even for .mp4; a .gif left at
                the default 1280x720 is drawn at 800x450, which keeps the file to ~40% of that).
    dpi         text and line scale at 1280x720 (points -> pixels); frames smaller than
                that scale it down by min(1, width/1280, height/720) ** 0.7 so the layout fits.
    color_limits  fixed (low, high) for the colour bar of "radial"/"entropy"/"norm";
                None = from the first frame with a margin, widened as the values leave it.
    """

    view: str = "auto"
    color_by: str = "index"
    color_head: int = 0
    trails: int = 0
    rotate: bool = False
    projection: Any = "pca_initial"
    panels: Sequence[str] = PANELS
    fps: float = 30
    dpi: int = 100
    width: int = 1280
    height: int = 720
    color_limits: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if self.view not in VIEWS:
            raise ValueError(f"RenderConfig.view must be one of {VIEWS}, got {self.view!r}")
        if self.color_by not in COLOR_BY:
            raise ValueError(f"RenderConfig.color_by must be one of {COLOR_BY}, got {self.color_by!r}")
        if not _is_int(self.color_head) or self.color_head < 0:
            raise ValueError(f"RenderConfig.color_head must be an integer >= 0, got {self.color_head!r}")
        if not _is_int(self.trails) or self.trails < 0:
            raise ValueError(f"RenderConfig.trails must be an integer >= 0, got {self.trails!r}")
        if not isinstance(self.rotate, (bool, np.bool_)):
            raise ValueError(f"RenderConfig.rotate must be True or False, got {self.rotate!r}")
        self.rotate = bool(self.rotate)
        if isinstance(self.projection, str):
            if self.projection not in PROJECTIONS:
                raise ValueError(
                    f"RenderConfig.projection must be one of {PROJECTIONS} or a (d x 2) / (d x 3) "
                    f"basis array, got {self.projection!r}")
        else:
            try:
                basis = np.array(self.projection, dtype=float)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"RenderConfig.projection is neither a name nor a numeric array: {exc}") from None
            if basis.ndim != 2 or basis.shape[1] not in (2, 3) or basis.shape[0] < basis.shape[1]:
                raise ValueError(
                    "RenderConfig.projection as an array must have shape (d, 2) or (d, 3) with d >= columns, "
                    f"got shape {basis.shape}")
            if not np.all(np.isfinite(basis)):
                raise ValueError("RenderConfig.projection contains non-finite values")
            if np.linalg.matrix_rank(basis) < basis.shape[1]:
                raise ValueError("RenderConfig.projection basis columns are linearly dependent")
            self.projection = basis
        if isinstance(self.panels, str):
            raise ValueError(f"RenderConfig.panels must be a sequence of names from {PANELS}, "
                             f"got the string {self.panels!r} (write ({self.panels!r},))")
        panels = tuple(self.panels)
        for p in panels:
            if p not in PANELS:
                raise ValueError(f"RenderConfig.panels: unknown panel {p!r}; allowed: {PANELS}")
        if len(set(panels)) != len(panels):
            raise ValueError(f"RenderConfig.panels has duplicates: {panels}")
        self.panels = panels
        if not _is_real(self.fps) or not (0 < self.fps <= 240) or not math.isfinite(self.fps):
            raise ValueError(f"RenderConfig.fps must be a number in (0, 240], got {self.fps!r}")
        if not _is_int(self.dpi) or not (10 <= self.dpi <= 1000):
            raise ValueError(f"RenderConfig.dpi must be an integer in [10, 1000], got {self.dpi!r}")
        for name in ("width", "height"):
            v = getattr(self, name)
            if not _is_int(v) or not (64 <= v <= 8192):
                raise ValueError(f"RenderConfig.{name} must be an integer number of pixels in [64, 8192], got {v!r}")
        if self.color_limits is not None:
            try:
                lo, hi = (float(v) for v in self.color_limits)
            except (TypeError, ValueError):
                raise ValueError(f"RenderConfig.color_limits must be (low, high) or None, got {self.color_limits!r}") from None
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise ValueError(f"RenderConfig.color_limits needs finite low < high, got {self.color_limits!r}")
            self.color_limits = (lo, hi)


@dataclass
class RunInfo:
    """Facts about the simulated run, shown in the title and used for the layout.

    head_bases: optional list, one per head, of (d x k) arrays whose k columns are an
    orthonormal basis of that head's subspace, most important direction first (needed by
    view="heads": k = 3 is drawn in 3-D, otherwise the first 2 columns; k = 1 is completed
    with the tokens' main direction orthogonal to it).
    t_end: the run's final time if known (fixes the panels' time axis).
    token_labels: optional, one string per token (a text scene's tokenizer strings); the
    frames label each token with its string when n is small enough to read them.
    claim: what the film exists to show, one line under the title (the scene's [render] claim).
    c_star: c*(H) of Theorem 19, drawn beside rho = 1 in the radial-dominance panel.
    theory: {log column: [(times, values, label), ...]}: curves the theory predicts for a
    column, drawn whole (dashed) in its panel from the first frame, e.g. the equiangular ODE
    for "gamma_bar".
    gradient_flow: Theorem 11's identity dE/dt = (1/n) sum |xdot_i|^2 holds, so the film draws
    the energy's rate and the kinetic term on one axis ("energy_rate" panel).
    alibi_slopes: the heads' ALiBi slopes m_h, named in the caption.
    tangent_floor: rho_h is drawn only while T_h >= tangent_floor x T_h at the first row: below
    it the tokens have stopped and rho_h, a ratio of round-off, says nothing (the summary judges
    Condition 8 by the same floor).
    """

    name: str
    beta: float
    rule: str
    n_heads: int
    n: int
    d: int
    geometry: str = "sphere"
    head_bases: list | None = None
    t_end: float | None = None
    layer_labels: tuple | None = None   # a layer schedule: what each layer runs ("rule = relu, causal")
    mask: str | tuple = "none"   # the heads' mask ("mixed" where they differ), or one per layer
    token_labels: tuple | None = None
    claim: str | None = None
    c_star: float | None = None
    theory: dict | None = None
    gradient_flow: bool = False
    alibi_slopes: tuple | None = None
    tangent_floor: float | None = None
    log_n: float = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ValueError(f"RunInfo.name must be a string, got {self.name!r}")
        if not isinstance(self.rule, str):
            raise ValueError(f"RunInfo.rule must be a string, got {self.rule!r}")
        if not _is_real(self.beta) or not math.isfinite(float(self.beta)):
            raise ValueError(f"RunInfo.beta must be a finite number, got {self.beta!r}")
        self.beta = float(self.beta)
        for name, low in (("n_heads", 1), ("n", 1), ("d", 2)):
            v = getattr(self, name)
            if not _is_int(v) or v < low:
                raise ValueError(f"RunInfo.{name} must be an integer >= {low}, got {v!r}")
            setattr(self, name, int(v))
        if self.geometry not in GEOMETRIES:
            raise ValueError(f"RunInfo.geometry must be one of {GEOMETRIES}, got {self.geometry!r}")
        if self.t_end is not None:
            if not _is_real(self.t_end) or not (math.isfinite(float(self.t_end)) and self.t_end > 0):
                raise ValueError(f"RunInfo.t_end must be a positive number or None, got {self.t_end!r}")
            self.t_end = float(self.t_end)
        if self.head_bases is not None:
            bases = list(self.head_bases)
            if len(bases) != self.n_heads:
                raise ValueError(f"RunInfo.head_bases has {len(bases)} bases for n_heads={self.n_heads}")
            checked = []
            for h, b in enumerate(bases):
                b = np.array(b, dtype=float)
                if b.ndim == 1 and b.shape[0] == self.d:
                    b = b[:, None]
                if b.ndim != 2 or b.shape[0] != self.d or not (1 <= b.shape[1] <= self.d):
                    raise ValueError(
                        f"RunInfo.head_bases[{h}] must have shape (d={self.d}, k) with 1 <= k <= d, got {b.shape}")
                gram = b.T @ b
                if not np.allclose(gram, np.eye(b.shape[1]), atol=1e-4):
                    raise ValueError(f"RunInfo.head_bases[{h}] columns are not orthonormal "
                                     f"(max |B^T B - I| = {np.abs(gram - np.eye(b.shape[1])).max():.2g})")
                checked.append(b)
            self.head_bases = checked
        masks = (self.mask,) if isinstance(self.mask, str) else tuple(self.mask)
        if not masks or not all(isinstance(m, str) for m in masks):
            raise ValueError(f"RunInfo.mask must be a mask name or one per layer, got {self.mask!r}")
        if not isinstance(self.mask, str):
            if self.layer_labels is not None and len(masks) != len(self.layer_labels):
                raise ValueError(f"RunInfo.mask has {len(masks)} layers' masks, layer_labels {len(self.layer_labels)}")
            self.mask = masks
        if self.token_labels is not None:
            labels = (self.token_labels,) if isinstance(self.token_labels, str) else tuple(self.token_labels)
            if len(labels) != self.n or not all(isinstance(s, str) for s in labels):
                raise ValueError(f"RunInfo.token_labels must be one string per token (n = {self.n}), "
                                 f"got {self.token_labels!r:.200}")
            self.token_labels = labels
        if self.claim is not None and not isinstance(self.claim, str):
            raise ValueError(f"RunInfo.claim must be a string or None, got {self.claim!r}")
        self.claim = self.claim.strip() or None if self.claim is not None else None
        if self.c_star is not None:
            if not _is_real(self.c_star) or not 0 < float(self.c_star) <= 1:
                raise ValueError(f"RunInfo.c_star must be a number in (0, 1] or None, got {self.c_star!r}")
            self.c_star = float(self.c_star)
        theory = {}
        for column, curves in (self.theory or {}).items():
            checked = []
            for curve in curves:
                try:
                    t, y, label = curve
                    t, y = np.asarray(t, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
                except (TypeError, ValueError):
                    raise ValueError(f"RunInfo.theory[{column!r}]: each curve is (times, values, label), "
                                     f"got {curve!r:.200}") from None
                if t.size != y.size or not isinstance(label, str):
                    raise ValueError(f"RunInfo.theory[{column!r}]: times and values of one length and a "
                                     f"string label, got {t.size} times, {y.size} values, {label!r}")
                checked.append((t, y, label))
            theory[str(column)] = checked
        self.theory = theory
        self.gradient_flow = bool(self.gradient_flow)
        if self.alibi_slopes is not None:
            slopes = tuple(float(m) for m in self.alibi_slopes)
            if len(slopes) != self.n_heads or not all(math.isfinite(m) and m >= 0 for m in slopes):
                raise ValueError(f"RunInfo.alibi_slopes must be one slope >= 0 per head (H = {self.n_heads}), "
                                 f"got {self.alibi_slopes!r}")
            self.alibi_slopes = slopes
        self.log_n = math.log(self.n)

    def mask_in_force(self, layer: int | None = None) -> str:
        """The mask of the heads driving a frame (``layer``: the log's layer column there)."""
        if isinstance(self.mask, str):
            return self.mask
        return self.mask[layer] if layer is not None and 0 <= layer < len(self.mask) else self.mask[0]

    @property
    def ever_causal(self) -> bool:
        """Is every head causal in some layer (so that token 0 is the one every token sees)?"""
        return "causal" in ((self.mask,) if isinstance(self.mask, str) else self.mask)

    def title(self) -> str:
        """'name   beta=..., rule=..., H=..., n=..., d=...' (geometry named when flat)."""
        geo = ", flat" if self.geometry == "flat" else ""
        rule = "by layer" if self.layer_labels else self.rule   # the frame's stamp names the layer's
        return (f"{self.name}    \u03b2 = {self.beta:g},  rule = {rule},  H = {self.n_heads},  "
                f"n = {self.n},  d = {self.d}{geo}")
