"""Where everything goes in a frame: fixed axes rectangles computed in pixels.

No constrained/tight layout: the rectangles are computed once, so every frame has the same
layout and the static background can be cached.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

Rect = tuple[float, float, float, float]          # figure fractions: left, bottom, width, height


@dataclass
class FrameLayout:
    views: list[Rect] = field(default_factory=list)
    view_px: float = 0.0                             # side of one particle panel in pixels
    panels: list[Rect] = field(default_factory=list)
    panel_slots: list[Rect] = field(default_factory=list)   # panel + its titles and tick labels
    colorbar: Rect | None = None


def compute_layout(width: int, height: int, dpi: int, n_views: int, n_panels: int,
                   colorbar: bool, view_titles: bool, view_ticks: bool, title_lines: int = 2) -> FrameLayout:
    W, H = float(width), float(height)
    u = dpi / 100.0                        # text sizes are in points: scale pixel pads with dpi
    margin = 10 * u
    title_band = (44 + 24 * max(title_lines - 2, 0)) * u   # title, [claim,] caption
    top = H - title_band
    out = FrameLayout()

    def frac(x, y, w, h) -> Rect:
        return (x / W, y / H, w / W, h / H)

    # time-series column on the right
    left_w = W - 2 * margin
    if n_panels:
        col_w = max(0.36 * W, min(0.5 * W, 300 * u))
        col_x = W - col_w
        pad_l, pad_r, pad_t, pad_b, gap = 58 * u, 40 * u, 22 * u, 36 * u, 22 * u
        avail = top - margin - pad_b - n_panels * pad_t - (n_panels - 1) * gap
        ph = max(avail / n_panels, 10.0)
        y = top - pad_t
        for i in range(n_panels):
            y0 = y - ph
            out.panels.append(frac(col_x + pad_l, y0, col_w - pad_l - pad_r, ph))
            below = gap if i < n_panels - 1 else y0        # down to the next panel's title band
            spill = 24 * u                                  # tick labels wider than pad_l
            out.panel_slots.append(frac(col_x - spill, y0 - below, col_w + spill, ph + pad_t + below))
            y = y0 - gap - pad_t
        left_w = col_x - margin
    # particle grid on the left (and the colour bar right of it)
    cbar_w = 86 * u if colorbar else 0.0
    area_w = max(left_w - cbar_w, 10.0)
    area_h = top - margin
    cell_title = 20 * u if view_titles else 0.0
    tick_l, tick_b = (46 * u, 34 * u) if view_ticks else (0.0, 0.0)
    best = None
    for cols in range(1, n_views + 1):
        rows = math.ceil(n_views / cols)
        side = min(area_w / cols - tick_l - 4 * u, area_h / rows - cell_title - tick_b - 4 * u)
        if best is None or side > best[0]:
            best = (side, cols, rows)
    side, cols, rows = best
    side = max(side, 10.0)
    cell_w, cell_h = side + tick_l + 4 * u, side + cell_title + tick_b + 4 * u
    grid_w, grid_h = cols * cell_w, rows * cell_h
    gx = margin + (area_w - grid_w) / 2
    gy = margin + (area_h - grid_h) / 2
    for k in range(n_views):
        r, c = divmod(k, cols)
        x = gx + c * cell_w + tick_l + 2 * u
        yb = gy + (rows - 1 - r) * cell_h + tick_b + 2 * u
        out.views.append(frac(x, yb, side, side))
    out.view_px = side
    if colorbar:
        cb_h = 0.6 * min(grid_h, area_h)
        cb_x = gx + grid_w + 14 * u
        out.colorbar = frac(cb_x, margin + (area_h - cb_h) / 2, 14 * u, cb_h)
    return out
