"""Token colours: by index, by cluster, or by a per-token observable with a colour bar."""

from __future__ import annotations

from typing import Mapping

import numpy as np
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import ListedColormap, Normalize, to_rgba_array

from .config import RenderConfig, RunInfo

SINGLETON_GREY = (0.55, 0.55, 0.55, 1.0)
NAN_GREY = (0.75, 0.75, 0.75, 1.0)
MIN_SPAN = 0.2   # automatic colour limits span at least this fraction of the values' magnitude


def lch_to_rgb(lightness, chroma, hue_deg) -> np.ndarray:
    """CIE L*C*h (D65) to sRGB in [0, 1] (clipped to the gamut); broadcasts, returns (..., 3)."""
    L = np.asarray(lightness, float)
    h = np.deg2rad(np.asarray(hue_deg, float))
    a = chroma * np.cos(h)
    b = chroma * np.sin(h)
    fy = (L + 16.0) / 116.0
    fx = fy + a / 500.0
    fz = fy - b / 200.0

    def finv(f):
        return np.where(f > 6.0 / 29.0, f ** 3, 3 * (6.0 / 29.0) ** 2 * (f - 4.0 / 29.0))

    X = 0.95047 * finv(fx)
    Y = 1.00000 * finv(fy)
    Z = 1.08883 * finv(fz)
    xyz = np.stack(np.broadcast_arrays(X, Y, Z), axis=-1)
    m = np.array([[3.2404542, -1.5371385, -0.4985314],
                  [-0.9692660, 1.8760108, 0.0415560],
                  [0.0556434, -0.2040259, 1.0572252]])
    lin = np.clip(xyz @ m.T, 0.0, 1.0)
    return np.where(lin <= 0.0031308, 12.92 * lin, 1.055 * lin ** (1 / 2.4) - 0.055)


INDEX_CMAP = "viridis"   # sequential: early tokens dark, late ones light; token 0 and n-1 never alike


def index_colors(n: int) -> np.ndarray:
    """(n, 4) RGBA along a sequential map (viridis up to its light green-yellow, which still
    reads on the pale sphere), so that the colour tells a token's position in the sequence
    and which positions merged: a cyclic hue wheel gave token 0 and token n-1 one colour."""
    return colormaps[INDEX_CMAP](np.linspace(0.0, 0.93, n) if n > 1 else np.zeros(1))


def qualitative_palette(k: int) -> np.ndarray:
    """(k, 4) RGBA distinct colours: tab10 without its grey, then golden-angle hues."""
    base = [c for i, c in enumerate(colormaps["tab10"].colors) if i != 7]
    cols = to_rgba_array(base)
    if k <= len(cols):
        return cols[:k]
    extra = k - len(cols)
    j = np.arange(extra)
    hues = (137.50776 * j + 15.0) % 360.0
    light = np.where(j % 2 == 0, 50.0, 68.0)
    rgb = lch_to_rgb(light, 55.0, hues)
    return np.concatenate([cols, np.concatenate([rgb, np.ones((extra, 1))], axis=1)])


TAB10_HEADS = 10


def head_colors(n_heads: int) -> np.ndarray:
    """(H, 4) RGBA, one distinct colour per head: tab10 up to 10 heads, beyond that the
    qualitative palette (tab10 without its grey, then golden-angle hues), never a repeat."""
    if n_heads <= TAB10_HEADS:
        return to_rgba_array(colormaps["tab10"].colors[:n_heads])
    return qualitative_palette(n_heads)


def head_color(h: int, n_heads: int | None = None):
    """Colour of head h of n_heads in the time-series panels (tab10 when n_heads <= 10)."""
    if n_heads is None or n_heads <= TAB10_HEADS:
        return colormaps["tab10"].colors[h % TAB10_HEADS]
    return tuple(head_colors(n_heads)[h])


def cluster_colors(labels: np.ndarray) -> np.ndarray:
    """(n, 4) RGBA: clusters with >= 2 members get palette colours in order of their smallest
    member index (stable while clusters merge); singletons and negative labels are grey."""
    labels = np.asarray(labels).astype(np.int64, copy=False).ravel()
    n = labels.size
    out = np.tile(np.array(SINGLETON_GREY), (n, 1))
    valid = labels >= 0
    if not valid.any():
        return out
    uniq, first, inverse, counts = np.unique(labels[valid], return_index=True, return_inverse=True,
                                             return_counts=True)
    order = np.argsort(first, kind="stable")          # clusters by smallest member index
    multi = counts[order] >= 2
    rank = np.full(uniq.size, -1)
    rank[order[multi]] = np.arange(int(multi.sum()))
    pal = qualitative_palette(max(int(multi.sum()), 1))
    r = rank[inverse]
    idx = np.flatnonzero(valid)
    has = r >= 0
    out[idx[has]] = pal[r[has]]
    return out


CLUSTER_LEGEND = "colour: a cluster of >= 2 tokens (cos > threshold); grey: a singleton"


def cluster_count(labels) -> int:
    """Clusters in a frame's labels: groups of two or more tokens (a singleton, drawn grey, is
    no cluster; the log's `clusters` column counts components, singletons included)."""
    labels = np.asarray(labels).astype(np.int64, copy=False).ravel()
    _, counts = np.unique(labels[labels >= 0], return_counts=True)
    return int((counts >= 2).sum())


def singleton_count(labels) -> int:
    """Tokens in no cluster (alone in their component)."""
    labels = np.asarray(labels).astype(np.int64, copy=False).ravel()
    _, counts = np.unique(labels[labels >= 0], return_counts=True)
    return int((counts == 1).sum())


SAME_VALUE_RTOL = 1e-6     # tokens whose values agree to this share one value (a symmetric start)


class TokenColorizer:
    """Turns a frame's tokens (and optional per-token values) into (n, 4) RGBA colours.

    index    a sequential map of the position i
    cluster  the run's labels: a colour per cluster of >= 2 tokens, grey singletons
    radial   a^h_i, signed: a diverging map centred on 0
    entropy  H^h_i, sequential, up to the ceiling ln n
    norm     |x_i| (flat space, where there is no sphere to shadow), sequential

    The colour limits follow the data: config.color_limits when given, else from the first
    frame with a margin, widened (never narrowed) when a frame's values leave them; `update`
    says when the colour bar must be redrawn. `uniform` is the one value every token shares
    in this frame (a symmetric configuration), else None: colour then carries nothing."""

    def __init__(self, config: RenderConfig, info: RunInfo):
        self.mode = config.color_by
        self.info = info
        self.head = config.color_head
        self.fixed = config.color_limits is not None
        self.limits = config.color_limits
        self.mappable: ScalarMappable | None = None
        self.uniform: float | None = None
        self._index = index_colors(info.n)
        self.key = None
        if self.mode in ("radial", "entropy"):
            self.key = f"{self.mode}_h{self.head}"
        if self.mode in ("radial", "entropy", "norm"):
            name = {"radial": "RdBu_r", "entropy": "viridis", "norm": "cividis"}[self.mode]
            self.cmap = colormaps[name].with_extremes(bad=NAN_GREY)
        if self.mode == "index" and info.n > 1:   # which positions move together: a bar of indices
            self.cmap = ListedColormap(self._index, name="token_index")
            self.norm = Normalize(-0.5, info.n - 0.5)
            self.mappable = ScalarMappable(norm=self.norm, cmap=self.cmap)
            self.mappable.set_array(np.array([0, info.n - 1]))

    @property
    def label(self) -> str:
        if self.mode == "index":
            return "token index i"
        if self.mode == "radial":
            return f"radial shadow $a^{{{self.head}}}_i$ (head {self.head})"
        if self.mode == "entropy":
            return f"attention entropy $H^{{{self.head}}}_i$ (head {self.head})"
        if self.mode == "norm":
            return r"distance from the origin $|x_i|$"
        return ""

    def values(self, tokens: np.ndarray, token_values: Mapping[str, np.ndarray] | None) -> np.ndarray:
        """The per-token quantity the colour shows (radial, entropy, norm)."""
        if self.mode == "norm":   # given where the drawn points are directions (a radius is state)
            if token_values is not None and "norm" in token_values:
                return np.asarray(token_values["norm"], float).ravel()
            return np.linalg.norm(np.asarray(tokens, float), axis=1)
        if token_values is None or self.key not in token_values:
            have = sorted(token_values) if token_values else []
            raise ValueError(f"color_by={self.mode!r} needs token_values[{self.key!r}] "
                             f"(per-token array of length n={self.info.n}); got keys {have}")
        v = np.asarray(token_values[self.key], float).ravel()
        if v.size != self.info.n:
            raise ValueError(f"token_values[{self.key!r}] has {v.size} values, expected n={self.info.n}")
        return v

    def prepare(self, tokens: np.ndarray, token_values) -> None:
        """Called once with the first frame: the colour limits and the colour bar's mappable."""
        if self.mode not in ("radial", "entropy", "norm"):
            return
        v = self.values(tokens, token_values)
        if self.limits is None:
            self.limits = self._auto_limits(v)
        self.limits = self._shaped(self.limits)
        self.norm = Normalize(*self.limits, clip=False)
        self.mappable = ScalarMappable(norm=self.norm, cmap=self.cmap)
        self.mappable.set_array(np.array(self.limits))

    def _shaped(self, limits) -> tuple[float, float]:
        lo, hi = limits
        if self.mode == "radial" and not self.fixed:     # signed: white is 0
            m = max(abs(lo), abs(hi))
            return (-m, m)
        return (lo, hi)

    def update(self, tokens: np.ndarray, token_values) -> bool:
        """Widen the limits to a frame's values (with headroom); True if the colour bar changed."""
        if self.mode not in ("radial", "entropy", "norm"):
            return False
        v = self.values(tokens, token_values)
        fin = v[np.isfinite(v)]
        self.uniform = None
        if fin.size > 1:
            mid = float(np.median(fin))
            if float(fin.max() - fin.min()) <= SAME_VALUE_RTOL * max(abs(mid), 1e-12):
                self.uniform = mid
        if self.fixed or not fin.size:
            return False
        lo, hi = self.limits
        vlo, vhi = float(fin.min()), float(fin.max())
        if vlo >= lo and vhi <= hi:
            return False
        span = max(hi - lo, vhi - vlo)
        new = (min(lo, vlo - 0.25 * span) if vlo < lo else lo, max(hi, vhi + 0.25 * span) if vhi > hi else hi)
        if self.mode == "entropy" and self.info.log_n > 0:
            new = (max(new[0], 0.0), max(new[1], self.info.log_n) if vhi > self.info.log_n else self.info.log_n)
        self.limits = self._shaped(new)
        self.norm.vmin, self.norm.vmax = self.limits
        self.mappable.set_clim(*self.limits)
        return True

    def _auto_limits(self, v: np.ndarray) -> tuple[float, float]:
        """Limits from the first frame with a 25% margin, never narrower than ``MIN_SPAN`` of the
        values' size (so tokens that all share one value give a legible bar, not a 1e-7 span with
        an offset label); entropy's upper limit is the ceiling ln n, its span at least a quarter of it."""
        fin = v[np.isfinite(v)]
        if fin.size == 0:
            lo, hi = 0.0, 1.0
        else:
            lo, hi = float(fin.min()), float(fin.max())
        scale = max(abs(lo), abs(hi))
        floor = MIN_SPAN * scale if scale > 0 else 1.0
        if hi - lo < floor:
            mid = 0.5 * (lo + hi)
            lo, hi = mid - 0.5 * floor, mid + 0.5 * floor
        span = hi - lo
        lo, hi = lo - 0.25 * span, hi + 0.25 * span
        if self.mode == "entropy":
            if self.info.log_n > 0:
                hi = self.info.log_n
                lo = min(lo, hi - 0.25 * self.info.log_n)
            lo = max(lo, 0.0)
            hi = max(hi, lo + 1e-6)
        if self.mode == "norm":
            lo = max(lo, 0.0)
        return lo, hi

    def note(self) -> str | None:
        """The caption's word when colour carries nothing in this frame (every token alike)."""
        if self.uniform is None:
            return None
        what = {"radial": f"a^{self.head}_i", "entropy": f"H^{self.head}_i", "norm": "|x_i|"}[self.mode]
        return f"every token has the same {what} = {self.uniform:.4g} (a symmetric configuration)"

    def colors(self, tokens: np.ndarray, token_values: Mapping[str, np.ndarray] | None) -> np.ndarray:
        if self.mode == "index":
            return self._index
        if self.mode == "cluster":
            if token_values is None or "cluster" not in token_values:
                raise ValueError("color_by='cluster' needs token_values['cluster']: a cluster label "
                                 f"per token (n={self.info.n}), as the run's log labels them")
            labels = np.asarray(token_values["cluster"]).ravel()
            if labels.size != self.info.n:
                raise ValueError(f"token_values['cluster'] has {labels.size} labels, expected n={self.info.n}")
            return cluster_colors(labels)
        v = self.values(tokens, token_values)
        return self.cmap(self.norm(np.ma.masked_invalid(v)))


def blend(colors: np.ndarray, target, amount: float) -> np.ndarray:
    """Mix RGBA colours toward an RGB target by `amount` in [0, 1] (alpha kept)."""
    out = colors.copy()
    out[:, :3] = (1.0 - amount) * colors[:, :3] + amount * np.asarray(target[:3])
    return out


__all__ = ["TokenColorizer", "index_colors", "head_colors", "cluster_count", "singleton_count", "qualitative_palette", "cluster_colors", "head_color", "lch_to_rgb", "blend"]
