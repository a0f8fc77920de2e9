"""Drawing the tokens: what to show (`plan_views`) and how (`Disk2DView`, `Ball3DView`).

Every view creates its artists once; `update` only changes their data. Artists returned by
`dynamic_artists()` are drawn every frame over a cached background; `update` returns True
when the background itself must be redrawn (axis limits of a flat-geometry view changed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from matplotlib import patheffects
from matplotlib.collections import LineCollection

from .colors import blend
from .config import RenderConfig, RunInfo
from .sphere import SPHERE_RGB, Camera, shaded_disk, wireframe

EDGE_RGBA = (0.08, 0.08, 0.12, 0.55)
FIRST_TOKEN_LABEL = "token 0, seen by every token (causal mask)"
ROTATION_DEG_PER_S = 12.0         # camera turn rate with rotate=True (a turn in 30 s)
FOLLOW_RATE = 0.12                # without rotate: the share of the way to the tokens' centre turned per frame
FOLLOW_MIN_MEAN = 0.2             # |mean token| below this: no one side to face, the camera holds
FOLLOW_TILT = 30.0                # degrees above the tokens' centre: a cluster in front, its antipode not hidden behind it
TOKEN_LABELS_MAX = 48             # more tokens' strings than this overlap into an unreadable blot
TOKEN_LABEL_CHARS = 12


# --------------------------------------------------------------------------- planning
@dataclass
class SubviewSpec:
    """One particle panel: tokens @ basis (None = the tokens themselves) drawn in `dim` dims."""
    basis: np.ndarray | None
    dim: int                        # 2 or 3
    sphere: bool                    # sphere geometry: draw the unit circle / shaded sphere
    title: str = ""
    axis_labels: tuple[str, str] | None = None


def pca_basis(tokens: np.ndarray, k: int) -> np.ndarray:
    """(d x k) orthonormal principal axes of the tokens (centred), deterministic signs.

    Degenerate inputs (fewer distinct tokens than k) are completed with coordinate axes."""
    x = np.nan_to_num(np.asarray(tokens, float), nan=0.0, posinf=0.0, neginf=0.0)
    d = x.shape[1]
    xc = x - x.mean(axis=0)
    _, s, vt = np.linalg.svd(xc, full_matrices=False)
    keep = int(np.sum(s > 1e-9 * max(s[0] if s.size else 0.0, 1e-300))) if s.size else 0
    cols = [vt[i] for i in range(min(k, keep))]
    for e in np.eye(d):                                   # complete with coordinate axes
        if len(cols) >= k:
            break
        v = e - sum(np.dot(e, c) * c for c in cols) if cols else e.copy()
        nv = np.linalg.norm(v)
        if nv > 1e-6:
            cols.append(v / nv)
    B = np.stack(cols, axis=1)
    idx = np.argmax(np.abs(B), axis=0)
    B *= np.sign(B[idx, np.arange(B.shape[1])])
    return B


def _orthogonal_pca_axis(tokens: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Unit vector orthogonal to b: the main direction of the tokens with b projected out."""
    x = np.nan_to_num(np.asarray(tokens, float))
    resid = x - np.outer(x @ b, b)
    v = pca_basis(np.vstack([resid, np.zeros_like(b)]), 1)[:, 0]   # (zero row: the origin counts)
    v = v - (v @ b) * b
    nv = np.linalg.norm(v)
    if nv < 1e-8:                                       # fall back to any axis orthogonal to b
        e = np.eye(b.size)[int(np.argmin(np.abs(b)))]
        v = e - (e @ b) * b
        nv = np.linalg.norm(v)
    return v / nv


def resolve_view(config: RenderConfig, info: RunInfo) -> str:
    """The concrete view name ('circle', 'sphere', 'pca', 'heads'); ValueError if impossible."""
    view = config.view
    if view == "auto":
        view = "circle" if info.d == 2 else "sphere" if info.d == 3 else "pca"
    if view == "sphere" and info.d < 3:
        raise ValueError(f"view='sphere' needs d >= 3, the run has d={info.d}; use 'circle' or 'auto'")
    if view == "circle" and info.d != 2:
        raise ValueError(f"view='circle' needs d=2, the run has d={info.d}; use 'pca' or 'auto'")
    if view == "heads" and not info.head_bases:
        raise ValueError("view='heads' needs RunInfo.head_bases (one orthonormal d x k basis per head)")
    if not isinstance(config.projection, str):
        if config.projection.shape[0] != info.d:
            raise ValueError(f"RenderConfig.projection has {config.projection.shape[0]} rows, the run has d={info.d}")
        if view == "sphere" and config.projection.shape[1] != 3 and info.d > 3:
            raise ValueError("view='sphere' with a given projection needs a (d x 3) basis")
    return view


def plan_views(config: RenderConfig, info: RunInfo, first_tokens: np.ndarray,
               final_tokens: np.ndarray | None = None) -> list[SubviewSpec]:
    """The particle panels of the video (fixed for the whole video)."""
    view = resolve_view(config, info)
    sphere = info.geometry == "sphere"
    if view == "circle":
        return [SubviewSpec(None, 2, sphere)]
    if view == "heads":
        specs = []
        for h, B in enumerate(info.head_bases):
            k = B.shape[1]
            if k == 1:                       # complete a rank-1 head with a direction of the tokens
                B = np.column_stack([B[:, 0], _orthogonal_pca_axis(first_tokens, B[:, 0])])
                sub = "1-dim subspace + PCA axis"
            else:
                sub = f"{k}-dim subspace" + ("" if k <= 3 else ", first 2 axes")
            dim = 3 if k == 3 else 2
            specs.append(SubviewSpec(B[:, :dim], dim, sphere, title=f"head {h}  ({sub})"))
        return specs
    # sphere (d=3 directly, d>3 through a 3-column projection) or pca
    want = 3 if view == "sphere" else 2
    if view == "sphere" and info.d == 3 and isinstance(config.projection, str):
        return [SubviewSpec(None, 3, sphere)]
    if isinstance(config.projection, str):
        if config.projection == "pca_final":
            if final_tokens is None:
                raise ValueError("projection='pca_final' needs the final tokens: "
                                 "Animation(..., final_tokens=array of shape (n, d))")
            source, what = final_tokens, "final"
        else:
            source, what = first_tokens, "initial"
        B = pca_basis(source, want)
        labels = (f"PC 1 ({what})", f"PC 2 ({what})")
    else:
        B = config.projection
        labels = ("projection axis 1", "projection axis 2")
    dim = B.shape[1]
    if info.d == dim and view == "pca" and isinstance(config.projection, str):
        labels = ("PC 1", "PC 2")
    return [SubviewSpec(B, dim, sphere, axis_labels=labels if dim == 2 else None)]


def project(tokens: np.ndarray, spec: SubviewSpec) -> np.ndarray:
    return tokens if spec.basis is None else tokens @ spec.basis


def base_point_size(n: int, axes_px: float) -> float:
    """Marker area (points^2) for n tokens in a panel `axes_px` pixels wide."""
    s = float(np.clip(7000.0 / max(n, 1), 7.0, 70.0))
    return max(2.0, s * (axes_px / 620.0) ** 2)


TRAIL_BANDS = 3      # a trail is drawn as up to 3 polylines per token, fading band by band


def trail_segments(history: Sequence[np.ndarray], colors: np.ndarray, max_alpha: float = 0.65,
                   depth: Sequence[np.ndarray] | None = None):
    """Fading trails from a list of (n, 2) positions (oldest first, current last).

    Each token's trail is split into up to TRAIL_BANDS age bands, one polyline each, alpha
    rising toward the present (few paths: matplotlib builds one Path object per polyline).
    Returns (polylines as a list of (m, 2) arrays, RGBA colours, mean depth per polyline or
    None) where depth, if given, is a list of (n,) depths matching history."""
    H = np.stack(history)                                     # (T+1, n, 2)
    T, n = H.shape[0] - 1, H.shape[1]
    nb = min(T, TRAIL_BANDS)
    edges = np.linspace(0, T, nb + 1).round().astype(int)
    lines, cols, depths = [], [], []
    D = np.stack(depth) if depth is not None else None
    for b in range(nb):
        s0, s1 = edges[b], edges[b + 1]
        lines.extend(np.swapaxes(H[s0:s1 + 1], 0, 1))          # n polylines of s1 - s0 + 1 points
        age = (s0 + s1) / 2.0 / T + 0.5 / T                    # ~ 1/T (oldest) .. 1 (newest)
        c = colors.copy()
        c[:, 3] = max_alpha * min(age, 1.0) ** 1.5
        cols.append(c)
        if D is not None:
            depths.append(D[s0:s1 + 1].mean(axis=0))
    return lines, np.concatenate(cols), (np.concatenate(depths) if D is not None else None)


class FirstTokenMarker:
    """A ring around token 0 with a legend entry, shown while the mask in force is causal (token 0
    is then the one key every token sees, and it sees only itself)."""

    def __init__(self, ax, point_size: float, legend: bool):
        (self.ring,) = ax.plot([], [], ls="none", marker="o", ms=max(9.0, 2.2 * np.sqrt(point_size)),
                               mfc="none", mec="black", mew=1.6, zorder=6, label=FIRST_TOKEN_LABEL)
        self.legend = (ax.legend([self.ring], [FIRST_TOKEN_LABEL], loc="lower left", fontsize=8,
                                 frameon=False, borderaxespad=0.2, markerscale=0.6, handletextpad=0.5) if legend else None)
        self.ring.set_animated(True)     # animated only now: the legend's handle copies the flag

    def place(self, xy, behind: bool = False) -> None:
        self.ring.set_data([xy[0]], [xy[1]])
        self.ring.set_alpha(0.45 if behind else 1.0)

    def show(self, on: bool) -> bool:
        """Show or hide it; True if that changed the static part (its legend)."""
        changed = self.ring.get_visible() != on
        self.ring.set_visible(on)
        if self.legend is not None:
            self.legend.set_visible(on)
        return changed and self.legend is not None


def token_labels_shown(info: RunInfo) -> bool:
    """Are the tokens' strings drawn beside them (known, and few enough to read)?"""
    return info.token_labels is not None and info.n <= TOKEN_LABELS_MAX


def token_labels_note(info: RunInfo) -> str | None:
    """The caption's word on strings known but not drawn (too many tokens), else None."""
    if info.token_labels is None or token_labels_shown(info):
        return None
    return f"token labels are shown only up to {TOKEN_LABELS_MAX} tokens (n = {info.n})"


def clip_label(text: str, chars: int = TOKEN_LABEL_CHARS) -> str:
    return text if len(text) <= chars else text[:chars - 1] + "\u2026"


class TokenLabels:
    """Each token's string beside its dot: small, offset up and right of it by a few points,
    outlined in white so it reads on the shaded sphere; faded for tokens behind it. Tokens on
    one spot (a cluster) share one label, the first one's string and how many more: "cat +3"."""

    FONT_PT = 7.0

    def __init__(self, ax, strings: Sequence[str]):
        self.ax = ax
        self.strings = [clip_label(s) for s in strings]
        outline = [patheffects.withStroke(linewidth=2.0, foreground="white")]
        self.texts = [ax.annotate(s, (0.0, 0.0), xytext=(3, 3), textcoords="offset points",
                                  fontsize=self.FONT_PT, color="0.1", ha="left", va="bottom",
                                  zorder=7, annotation_clip=False, parse_math=False,
                                  path_effects=outline, animated=True)
                      for s in self.strings]

    def place(self, xy: np.ndarray, behind: np.ndarray | None = None) -> None:
        xy = np.asarray(xy, dtype=float)
        finite = np.all(np.isfinite(xy), axis=1)
        pix = self.ax.transData.transform(np.where(finite[:, None], xy, 0.0))
        merge_px = 0.5 * self.FONT_PT * self.ax.figure.dpi / 72.0
        anchors: list[int] = []
        joined = np.zeros(len(xy), dtype=int)      # per anchor: how many tokens share its spot
        for k in np.flatnonzero(finite):
            near = [a for a in anchors if np.abs(pix[k] - pix[a]).max() <= merge_px]
            if near:
                joined[near[0]] += 1
            else:
                anchors.append(int(k))
        shown = set(anchors)
        for k, text in enumerate(self.texts):
            text.set_visible(k in shown)
            if k in shown:
                text.xy = (float(xy[k, 0]), float(xy[k, 1]))
                text.set_text(self.strings[k] + (f" +{joined[k]}" if joined[k] else ""))
                text.set_alpha(0.45 if behind is not None and behind[k] else 1.0)


# --------------------------------------------------------------------------- 2-D
class Disk2DView:
    """2-D scatter. Sphere geometry: fixed limits with the unit circle; flat: auto limits."""

    def __init__(self, ax, spec: SubviewSpec, n: int, axes_px: float, trails: int,
                 first_token: FirstTokenMarker | None = None, labels: TokenLabels | None = None):
        self.ax = ax
        self.spec = spec
        self.size = base_point_size(n, axes_px)
        self.flat = not spec.sphere
        self._lims = None
        if self.flat:
            ax.tick_params(labelsize=8, length=3)
            ax.grid(True, color="0.9", lw=0.6)
            ax.set_axisbelow(True)
        else:
            ax.set_axis_off()
            ax.set_xlim(-1.1, 1.1)
            ax.set_ylim(-1.1, 1.1)
            t = np.linspace(0, 2 * np.pi, 361)
            on_circle = spec.basis is None
            ax.fill(np.cos(t), np.sin(t), color=(0.95, 0.96, 0.98), zorder=0)
            ax.plot(np.cos(t), np.sin(t), color="0.55" if on_circle else "0.75",
                    lw=1.2 if on_circle else 0.8, ls="-" if on_circle else "--", zorder=1)
            ax.plot([-1, 1], [0, 0], color="0.88", lw=0.6, zorder=1)
            ax.plot([0, 0], [-1, 1], color="0.88", lw=0.6, zorder=1)
        ax.set_aspect("equal", adjustable="box")
        if spec.axis_labels is not None:
            if self.flat:
                ax.set_xlabel(spec.axis_labels[0], fontsize=9)
                ax.set_ylabel(spec.axis_labels[1], fontsize=9)
            else:
                ax.text(0.5, 0.005, spec.axis_labels[0], transform=ax.transAxes, ha="center", va="bottom",
                        fontsize=9, color="0.35")
                ax.text(0.005, 0.5, spec.axis_labels[1], transform=ax.transAxes, ha="left", va="center",
                        rotation=90, fontsize=9, color="0.35")
        if spec.title:
            ax.set_title(spec.title, fontsize=10)
        self.trails = LineCollection([], linewidths=1.1, animated=True, zorder=3) if trails else None
        if self.trails is not None:
            ax.add_collection(self.trails)
        self.scatter = ax.scatter(np.zeros(n), np.zeros(n), s=self.size, edgecolors=[EDGE_RGBA],
                                  linewidths=0.4, animated=True, zorder=4)
        self.first_token = first_token
        self.labels = labels

    def dynamic_artists(self):
        ring = self.first_token.ring if self.first_token is not None else None
        texts = self.labels.texts if self.labels is not None else []
        return [a for a in (self.trails, self.scatter, ring) if a is not None] + texts

    def settled(self, pts: np.ndarray) -> bool:
        return True

    def _auto_limits(self, pts: np.ndarray) -> bool:
        fin = pts[np.all(np.isfinite(pts), axis=1)]
        if fin.size == 0:
            return False
        lo, hi = fin.min(axis=0), fin.max(axis=0)
        c = (lo + hi) / 2
        r = float(max((hi - lo).max() / 2, 1e-3 * (1 + np.abs(c).max())))
        if self._lims is not None:
            cc, half = self._lims
            inside = np.all(np.abs(fin - cc) <= 0.98 * half)
            if inside and r > 0.5 * half:
                return False
        half = 1.3 * r
        self._lims = (c, half)
        self.ax.set_xlim(c[0] - half, c[0] + half)
        self.ax.set_ylim(c[1] - half, c[1] + half)
        return True

    def update(self, history: list[np.ndarray], colors: np.ndarray, frame: int) -> bool:
        pts = history[-1]
        dirty = self._auto_limits(pts) if self.flat else False
        if self.trails is not None and len(history) > 1:
            seg, cols, _ = trail_segments(history, colors)
            self.trails.set_segments(seg)
            self.trails.set_color(cols)
        self.scatter.set_offsets(pts[::-1])        # token 0 on top: a cluster shows its first token's colour
        self.scatter.set_facecolors(colors[::-1])
        if self.first_token is not None:
            self.first_token.place(pts[0])
        if self.labels is not None:
            self.labels.place(pts)
        return dirty


# --------------------------------------------------------------------------- 3-D
class Ball3DView:
    """Own orthographic 3-D on a 2-D axes: shaded sphere image (static), wireframe split into
    back and front, depth-sorted scatter with back points smaller and faded toward the sphere."""

    def __init__(self, ax, spec: SubviewSpec, n: int, axes_px: float, trails: int,
                 rotate: bool, fps: float, elev: float = 20.0, azim: float = -60.0,
                 first_token: FirstTokenMarker | None = None, labels: TokenLabels | None = None):
        self.ax = ax
        self.spec = spec
        self.size = base_point_size(n, axes_px)
        self.flat = not spec.sphere
        self.camera = Camera(elev, azim)
        self.azim0 = azim
        self.step = ROTATION_DEG_PER_S / fps if rotate else 0.0
        # tokens on the sphere itself, camera not spinning: it turns to face where the tokens
        # gather, so that the final cluster ends on the front of the sphere, not behind it
        self.follow = not rotate and spec.basis is None and spec.sphere
        self._wire_azim = None
        self._center = None
        self._half = None
        ax.set_axis_off()
        ax.set_aspect("equal", adjustable="box")
        lim = 1.06
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-lim, lim)
        if spec.title:
            ax.set_title(spec.title, fontsize=10)
        if not self.flat:
            res = int(np.clip(axes_px * 1.5, 128, 1024))
            ax.imshow(shaded_disk(res), extent=(-1, 1, -1, 1), interpolation="bilinear", zorder=0,
                      origin="upper")
            t = np.linspace(0, 2 * np.pi, 361)
            ax.plot(np.cos(t), np.sin(t), color=(0.45, 0.52, 0.62), lw=1.0, zorder=1)
            self.wire_back = LineCollection([], colors=[(0.45, 0.55, 0.68, 0.25)], linewidths=0.6,
                                            animated=True, zorder=1.5)
            self.wire_front = LineCollection([], colors=[(0.25, 0.33, 0.45, 0.45)], linewidths=0.7,
                                             animated=True, zorder=3)
            ax.add_collection(self.wire_back)
            ax.add_collection(self.wire_front)
        else:
            self.wire_back = self.wire_front = None
            t = np.linspace(0, 2 * np.pi, 361)
            ax.plot(np.cos(t), np.sin(t), color="0.75", lw=0.8, ls="--", zorder=1)
            self.scale_text = ax.text(0.5, 0.0, "", transform=ax.transAxes, ha="center", va="bottom",
                                      fontsize=8, color="0.4")
            # axis tripod in the lower-left corner, turning with the camera
            self.tripod = LineCollection([], colors=["#d62728", "#2ca02c", "#1f77b4"], linewidths=1.5,
                                         animated=True, zorder=5)
            ax.add_collection(self.tripod)
            self.tripod_labels = [ax.text(0, 0, f"$x_{i + 1}$", fontsize=8, ha="center", va="center",
                                          animated=True, zorder=5) for i in range(3)]
        self.back = ax.scatter(np.zeros(n), np.zeros(n), s=self.size, edgecolors="none",
                               animated=True, zorder=2)
        self.trails = LineCollection([], linewidths=1.1, animated=True, zorder=2.5) if trails else None
        if self.trails is not None:
            ax.add_collection(self.trails)
        self.front = ax.scatter(np.zeros(n), np.zeros(n), s=self.size, edgecolors=[EDGE_RGBA],
                                linewidths=0.4, animated=True, zorder=4)
        self.first_token = first_token
        self.labels = labels

    def dynamic_artists(self):
        arts = [self.wire_back, self.back, self.trails, self.wire_front, self.front,
                self.first_token.ring if self.first_token is not None else None]
        if self.flat:
            arts += [self.tripod, *self.tripod_labels]
        if self.labels is not None:
            arts += self.labels.texts
        return [a for a in arts if a is not None]

    def _flat_frame(self, pts: np.ndarray) -> bool:
        """Flat geometry: centre and scale of the cloud (with hysteresis), applied before
        projecting; the dashed circle has radius `half` around the centre. True if rescaled."""
        fin = pts[np.all(np.isfinite(pts), axis=1)]
        if fin.size == 0:
            if self._center is None:
                self._center, self._half = np.zeros(pts.shape[1]), 1.0
                return True
            return False
        c = (fin.min(axis=0) + fin.max(axis=0)) / 2
        r = float(max(np.linalg.norm(fin - c, axis=1).max(), 1e-9 * (1 + np.abs(c).max())))
        if self._center is not None:
            dist = np.linalg.norm(fin - self._center, axis=1).max()
            if dist <= 0.98 * self._half and r > 0.5 * self._half:
                return False
        self._center, self._half = c, 1.15 * r
        self.scale_text.set_text(f"dashed circle: radius {self._half:.3g} around ({', '.join(f'{v:.2g}' for v in c)})")
        return True

    def _update_tripod(self) -> None:
        origin = np.array([-0.85, -0.85])
        axes2d = self.camera.project(np.eye(3))[:, :2] * 0.14
        self.tripod.set_segments([np.stack([origin, origin + a]) for a in axes2d])
        for label, a in zip(self.tripod_labels, axes2d):
            label.set_position(origin + a * 1.35)

    def _turn_to_face(self, pts: np.ndarray) -> tuple[float, float]:
        """(azimuth, elevation) still to turn to face the tokens' centre; (0, 0) without one."""
        if not self.follow:
            return 0.0, 0.0
        fin = pts[np.all(np.isfinite(pts), axis=1)]
        if not fin.size:
            return 0.0, 0.0
        m = fin.mean(axis=0)
        r = float(np.linalg.norm(m))
        if r < FOLLOW_MIN_MEAN:
            return 0.0, 0.0
        elev = np.degrees(np.arcsin(np.clip(m[2] / r, -1.0, 1.0))) + FOLLOW_TILT
        elev = float(np.clip(elev, -75.0, 75.0))
        azim = float(np.degrees(np.arctan2(m[1], m[0])))
        return (azim - self.camera.azim + 180.0) % 360.0 - 180.0, elev - self.camera.elev

    def settled(self, pts: np.ndarray) -> bool:
        """Is the camera where it means to be (within a degree)? A frame that would still turn
        it is not a still frame."""
        return max(abs(v) for v in self._turn_to_face(pts)) < 1.0

    def _face_the_tokens(self, pts: np.ndarray, frame: int) -> None:
        rate = 1.0 if frame == 0 else FOLLOW_RATE
        turn, rise = self._turn_to_face(pts)
        self.camera.azim += rate * turn
        self.camera.elev += rate * rise

    def update(self, history: list[np.ndarray], colors: np.ndarray, frame: int) -> bool:
        if self.follow:
            self._face_the_tokens(history[-1], frame)
        else:
            self.camera.azim = self.azim0 + self.step * frame
        dirty = False
        if self.flat:
            dirty = self._flat_frame(history[-1])
            shift, scale = self._center, 1.0 / self._half
            hist = [(h - shift) * scale for h in history]
            self._update_tripod()
        else:
            hist = history
        if self.wire_front is not None and (self.camera.azim, self.camera.elev) != self._wire_azim:
            front, back = wireframe(self.camera)
            self.wire_front.set_segments(front)
            self.wire_back.set_segments(back)
            self._wire_azim = (self.camera.azim, self.camera.elev)
        proj = self.camera.project(hist[-1])
        depth = proj[:, 2]
        order = np.lexsort((-np.arange(depth.size), depth))   # back to front; on one spot token 0 on top
        d_sorted = depth[order]
        split = int(np.searchsorted(d_sorted, 0.0))
        bi, fi = order[:split], order[split:]
        # back: smaller and faded toward the sphere colour; front: grows slightly toward the viewer.
        # Points on the sphere (d=3): every back point is behind the surface, equally faded.
        # Projections (inside the ball): the fade grows with the depth behind the centre.
        dnorm = np.clip(depth, -1.0, 1.0)
        self.back.set_offsets(proj[bi, :2])
        if self.spec.basis is None:
            self.back.set_facecolors(blend(colors[bi], SPHERE_RGB, 0.6))
            self.back.set_sizes(self.size * (0.55 + 0.15 * (1 + dnorm[bi])))
        else:
            fade = np.clip(-dnorm[bi] / 0.7, 0.0, 1.0)
            cols = colors[bi].copy()
            cols[:, :3] = (1 - 0.6 * fade[:, None]) * cols[:, :3] + 0.6 * fade[:, None] * SPHERE_RGB
            self.back.set_facecolors(cols)
            self.back.set_sizes(self.size * (0.85 - 0.3 * fade))
        self.front.set_offsets(proj[fi, :2])
        self.front.set_facecolors(colors[fi])
        self.front.set_sizes(self.size * (0.85 + 0.25 * dnorm[fi]))
        if self.first_token is not None:
            self.first_token.place(proj[0, :2], behind=bool(depth[0] < 0))
        if self.labels is not None:
            self.labels.place(proj[:, :2], behind=depth < 0)
        if self.trails is not None and len(hist) > 1:
            P = [self.camera.project(h) for h in hist]
            seg, cols, seg_depth = trail_segments([p[:, :2] for p in P], colors,
                                                  depth=[p[:, 2] for p in P])
            backseg = seg_depth < 0
            cols[backseg] = blend(cols[backseg], SPHERE_RGB, 0.6)
            cols[backseg, 3] *= 0.5
            self.trails.set_segments(seg)
            self.trails.set_color(cols)
        return dirty


def make_view(ax, spec: SubviewSpec, config: RenderConfig, info: RunInfo, axes_px: float,
              legend: bool = True):
    """The view of one particle panel; where a layer's mask is causal, token 0 is ringed (the
    legend entry in the panel with ``legend``); known token strings label the tokens."""
    first = (FirstTokenMarker(ax, base_point_size(info.n, axes_px), legend) if info.ever_causal
             else None)
    labels = TokenLabels(ax, info.token_labels) if token_labels_shown(info) else None
    if spec.dim == 3:
        return Ball3DView(ax, spec, info.n, axes_px, config.trails, config.rotate, config.fps,
                          first_token=first, labels=labels)
    return Disk2DView(ax, spec, info.n, axes_px, config.trails, first_token=first, labels=labels)
