"""`Animation`: draw frames of a run and stream them into an .mp4 or .gif file.

    with Animation("run.mp4", RenderConfig(), info, t_end=10.0) as anim:
        for ...:
            anim.add_frame(tokens, time, log, token_values)

Each frame is drawn on a matplotlib Agg canvas (no pyplot) and sent to the encoder at once;
only the trails window is kept. Static parts (axes, ticks, shaded sphere, colour bar, titles)
are drawn into a cached background that is redrawn only when it changes (panel y-limits
widen, a flat view rescales); every frame restores it and draws the moving artists on top.
An exception inside the with-block still closes the writer, leaving a playable file with the
frames drawn so far.
"""

from __future__ import annotations

import collections
import warnings
from pathlib import Path
from typing import Mapping

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .colors import CLUSTER_LEGEND, TokenColorizer, cluster_count, singleton_count
from .config import RenderConfig, RunInfo
from .layout import compute_layout
from .panels import PanelSet, available_panels
from .views import make_view, plan_views, project, resolve_view, token_labels_note
from .writers import FORMATS, open_writer

STILL_MOVE = 2e-3                # a frame in which no token moved by this (of the unit sphere) is held back
DEFAULT_SIZE = (1280, 720)       # RenderConfig's default width, height
GIF_DEFAULT_SIZE = (800, 450)    # what a GIF gets when the size was left at the default


def _slope(m: float) -> str:
    """An ALiBi slope as the power of two it usually is (1/4, 1/256), else as a number."""
    if m > 0 and float(np.log2(1.0 / m)).is_integer():
        return f"1/{int(round(1.0 / m))}" if m < 1 else f"{m:g}"
    return f"{m:.3g}"


def effective_dpi(dpi: float, width: int, height: int) -> float:
    """The configured dpi sets the text and line scale of a 1280x720 frame; smaller frames
    shrink it (less than proportionally, to keep text legible) so the layout still fits."""
    shrink = min(1.0, width / 1280.0, height / 720.0) ** 0.7
    return dpi * shrink


class Animation:
    """Streams rendered frames into `path` (.mp4 or .gif, from the extension).

    t_end: the run's final time (else RunInfo.t_end) fixes the panels' time axis.
    final_tokens: (n, d) tokens at the end of the run, for projection="pca_final".
    Attributes: frames_written, frame_size (width, height), path, config, info.
    The file is opened with the first frame: an Animation closed without frames writes nothing.
    GIF frame delays are whole 1/100 s: round(100 / fps).
    """

    def __init__(self, path, config: RenderConfig | None = None, info: RunInfo | None = None,
                 t_end: float | None = None, final_tokens=None):
        self.path = Path(path)
        if self.path.suffix.lower() not in FORMATS:
            raise ValueError(f"unsupported video extension {self.path.suffix!r} for {str(self.path)!r}; "
                             f"allowed: {', '.join(FORMATS)}")
        config = RenderConfig() if config is None else config
        if not isinstance(config, RenderConfig):
            raise ValueError(f"config must be a RenderConfig, got {type(config).__name__}")
        if not isinstance(info, RunInfo):
            raise ValueError(f"info must be a RunInfo, got {type(info).__name__}")
        self.config, self.info = config, info
        if config.color_head >= info.n_heads:
            raise ValueError(f"RenderConfig.color_head={config.color_head} but the run has {info.n_heads} head(s)")
        resolve_view(config, info)                       # fail early on an impossible view
        if t_end is not None:
            t_end = float(t_end)
            if not np.isfinite(t_end):
                raise ValueError(f"t_end must be finite, got {t_end}")
        self.t_end = t_end if t_end is not None else info.t_end
        if final_tokens is not None:
            final_tokens = self._check_tokens(final_tokens, "final_tokens")
        elif isinstance(config.projection, str) and config.projection == "pca_final" and (
                resolve_view(config, info) == "pca" or (resolve_view(config, info) == "sphere" and info.d > 3)):
            raise ValueError("projection='pca_final' needs final_tokens=(n, d) array in Animation(...)")
        self._final_tokens = final_tokens
        self.frames_written = 0
        self.background_redraws = 0      # full redraws of the static parts (diagnostics)
        self.panel_redraws = 0           # single-panel redraws of the static parts
        self._writer = None
        self._fig = None
        self._closed = False
        w, h = config.width, config.height
        if self.path.suffix.lower() == ".gif" and (w, h) == DEFAULT_SIZE:
            w, h = GIF_DEFAULT_SIZE                       # a GIF at 1280 x 720 runs to ~10 MB
        if self.path.suffix.lower() == ".mp4":           # yuv420p needs even sizes
            w, h = w + (w % 2), h + (h % 2)
        self.frame_size = (w, h)
        self._history = None
        self._regions: dict = {}
        self.frames_skipped = 0          # frames held back: nothing visible had moved
        self._held = None                # the latest frame held back, drawn on close
        self._skipped = None             # [first, last] time passed over since the last frame drawn
        self._passed_over = None         # the caption's word on the latest times passed over
        self._last_drawn = None          # (tokens, layer, cluster labels) of the last frame drawn

    # ----------------------------------------------------------------- context manager
    def __enter__(self) -> "Animation":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            self.close()
        except Exception as close_exc:           # never hide the original exception
            if exc_type is None:
                raise
            warnings.warn(f"closing {self.path} after an error failed: {close_exc!r}")
        return False

    def close(self) -> None:
        """Finalise the file. Safe to call twice."""
        if self._closed:
            return
        if self._held is not None and self._writer is not None:   # the run's last state is shown
            held, self._held = self._held, None
            try:
                self._draw(*held)
            except Exception:
                self._closed = True
                writer, self._writer = self._writer, None
                if writer is not None:
                    writer.close()
                raise
        self._closed = True
        writer, self._writer = self._writer, None
        self._fig = None
        self._history = None
        if writer is not None:
            writer.close()

    # ----------------------------------------------------------------- frames
    def _check_tokens(self, tokens, what="tokens") -> np.ndarray:
        x = np.asarray(tokens, dtype=float)
        n, d = self.info.n, self.info.d
        if x.ndim == 3 and x.shape[1:] == (n, d):
            raise ValueError(f"{what} has shape {x.shape} (an ensemble); pass one member, e.g. tokens[0]")
        if x.shape != (n, d):
            raise ValueError(f"{what} must have shape (n, d) = ({n}, {d}), got {x.shape}")
        return x

    def add_frame(self, tokens, time: float, log: Mapping | None = None,
                  token_values: Mapping[str, np.ndarray] | None = None) -> None:
        """Draw one frame and send it to the writer, unless nothing visible moved since the
        last frame drawn (no token by STILL_MOVE of the view, the same clusters and layer):
        such a frame is held back, the next one drawn says which times were passed over, and
        the last frame of the run is always drawn (here when its time reaches t_end, else on
        close), so a film speeds through the end of the motion instead of repeating one frame.

        tokens (n, d); time: the simulation time shown in the title; log: the log columns
        so far (equal-length arrays including "time"); token_values: per-token arrays such as
        "radial_h0", "entropy_h0", "cluster" for colouring."""
        if self._closed:
            raise RuntimeError(f"Animation {self.path} is closed")
        x = self._check_tokens(tokens)
        time = float(time)
        log = {} if log is None else log
        if self._fig is not None and self._still(x, log, token_values) and not self._is_last(time):
            self._pass_over_held()
            self._held = (x, time, log, token_values)
            return
        self._pass_over_held()
        self._draw(x, time, log, token_values)

    def _pass_over_held(self) -> None:
        """The frame held back is superseded: its time joins the span passed over."""
        if self._held is None:
            return
        t = self._held[1]
        self._skipped = [t if self._skipped is None else self._skipped[0], t]
        self.frames_skipped += 1
        self._held = None

    def _is_last(self, time: float) -> bool:
        return self.t_end is not None and time >= self.t_end - 1e-9 * max(1.0, abs(self.t_end))

    def _still(self, x: np.ndarray, log: Mapping, token_values) -> bool:
        """Would this frame look like the last one drawn (up to the panels' growth)?"""
        last = self._last_drawn
        if last is None:
            return False
        x0, layer0, labels0, values0 = last
        fin = np.isfinite(x).all(axis=1) & np.isfinite(x0).all(axis=1)
        if not fin.all():
            return False
        scale = 1.0 if self.info.geometry == "sphere" else max(float(np.abs(x).max()), 1e-12)
        if float(np.abs(x - x0).max()) > STILL_MOVE * scale:
            return False
        layer = np.ravel(log.get("layer", []))
        if (int(layer[-1]) if layer.size else None) != layer0:
            return False
        if not all(view.settled(project(x, spec)) for view, spec in zip(self._views, self._specs)):
            return False
        labels = None if token_values is None else token_values.get("cluster")
        if labels is not None and labels0 is not None and not np.array_equal(np.asarray(labels), labels0):
            return False
        values = self._colour_values(x, token_values)
        if values is not None and values0 is not None:     # a colour that changed is motion too
            lo, hi = self._colorizer.limits
            with np.errstate(invalid="ignore"):
                if not np.array_equal(np.isfinite(values), np.isfinite(values0)) or \
                        np.nanmax(np.abs(values - values0), initial=0.0) > 0.01 * (hi - lo):
                    return False
        return True

    def _colour_values(self, x: np.ndarray, token_values):
        if self._colorizer.mode not in ("radial", "entropy", "norm"):
            return None
        return self._colorizer.values(x, token_values).copy()

    def _draw(self, x: np.ndarray, time: float, log: Mapping, token_values) -> None:
        self._held = None
        if self._fig is None:
            self._build(x, log, token_values)
        dirty = self._needs_redraw | self._colorizer.update(x, token_values)
        colors = self._colorizer.colors(x, token_values)
        coords = tuple(project(x, spec) for spec in self._specs)
        self._history.append(coords)
        layer = np.ravel(log.get("layer", []))
        causal = self.info.mask_in_force(int(layer[-1]) if layer.size else None) == "causal"
        for k, view in enumerate(self._views):
            hist = [c[k] for c in self._history]
            dirty |= bool(view.update(hist, colors, self.frames_written))
            if view.first_token is not None:
                dirty |= view.first_token.show(causal)
        panels_dirty = self._panels.update(log) if self._panels is not None else []
        stamp = f"t = {time:.3f}" if abs(time) < 1e5 else f"t = {time:.4g}"
        notes = []
        if layer.size:  # a layer schedule: which layer's heads (and rule, mask) drive this frame
            k = int(layer[-1])
            labels = self.info.layer_labels
            what = f": {labels[k]}" if labels and 0 <= k < len(labels) else ""
            stamp = f"layer {k}   {stamp}"
            notes.append(f"layer {k}{what}")
        if self._colorizer.mode == "cluster" and token_values is not None and "cluster" in token_values:
            k, alone = cluster_count(token_values["cluster"]), singleton_count(token_values["cluster"])
            notes.append(f"{k} cluster{'' if k == 1 else 's'}, {alone} singleton{'' if alone == 1 else 's'}")
        if self._colorizer.mode == "cluster":
            notes.append(CLUSTER_LEGEND)
        if self._skipped is not None:
            a, b = self._skipped
            span = f"t = {a:.3g}" if f"{a:.3g}" == f"{b:.3g}" else f"t = {a:.3g} to {b:.3g}"
            self._passed_over = (f"{span} passed over: no token moved by {STILL_MOVE:g}"
                                 + (" of its distance from the origin" if self.info.geometry == "flat" else ""))
            self._skipped = None
        if self._passed_over is not None:
            notes.append(self._passed_over)
        if self.info.alibi_slopes is not None:
            notes.append("ALiBi slopes m_h = " + ", ".join(_slope(m) for m in self.info.alibi_slopes))
        if (uniform := self._colorizer.note()) is not None:
            notes.append(uniform)
        if (unlabelled := token_labels_note(self.info)) is not None:
            notes.append(unlabelled)
        self._time_text.set_text(stamp)
        self._info_text.set_text("   \u00b7   ".join(notes))
        frame = self._render(dirty, panels_dirty)
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = open_writer(self.path, self.config.fps)
        self._writer.append(frame)
        self.frames_written += 1
        labels = None if token_values is None else token_values.get("cluster")
        self._last_drawn = (x.copy(), int(layer[-1]) if layer.size else None,
                            None if labels is None else np.asarray(labels).copy(),
                            self._colour_values(x, token_values))

    def _build(self, x: np.ndarray, log: Mapping, token_values) -> None:
        cfg, info = self.config, self.info
        self._specs = plan_views(cfg, info, x, self._final_tokens)
        self._colorizer = TokenColorizer(cfg, info)
        self._colorizer.prepare(x, token_values)
        panel_names = available_panels(cfg.panels, log, info)
        W, H = self.frame_size
        dpi = effective_dpi(cfg.dpi, W, H)
        fig = Figure(figsize=(W / dpi, H / dpi), dpi=dpi, facecolor="white")
        canvas = FigureCanvasAgg(fig)
        has_ticks = any(not s.sphere and s.dim == 2 for s in self._specs)
        layout = compute_layout(W, H, dpi, len(self._specs), len(panel_names),
                                colorbar=self._colorizer.mappable is not None,
                                view_titles=any(s.title for s in self._specs), view_ticks=has_ticks,
                                title_lines=3 if info.claim else 2)
        self._views = []
        for k, (spec, rect) in enumerate(zip(self._specs, layout.views)):
            ax = fig.add_axes(rect)
            self._views.append(make_view(ax, spec, cfg, info, layout.view_px, legend=k == 0))
        if layout.colorbar is not None:
            cax = fig.add_axes(layout.colorbar)
            index = self._colorizer.mode == "index"
            cb = fig.colorbar(self._colorizer.mappable, cax=cax, extend="neither" if index else "both")
            cb.set_label(self._colorizer.label, fontsize=9)
            if index:
                from matplotlib.ticker import MaxNLocator
                cb.locator = MaxNLocator(nbins=6, integer=True)
                cb.update_ticks()
            if hasattr(cb.formatter, "set_useOffset"):
                cb.formatter.set_useOffset(False)   # limits of one shared value read as numbers
                cb.update_ticks()
            cax.tick_params(labelsize=8)
            self._colorbar = cb
        if panel_names:
            axes = [fig.add_axes(r) for r in layout.panels]
            self._panels = PanelSet(axes, panel_names, list(log.keys()), info, self._t_span(log), first_log=log)
            # white boxes that erase one panel's slot when only that panel is redrawn
            self._slot_patches = [fig.add_artist(Rectangle(r[:2], r[2], r[3], transform=fig.transFigure,
                                                           facecolor="white", edgecolor="none",
                                                           animated=True))
                                  for r in layout.panel_slots]
        else:
            self._panels = None
        u = dpi / 100.0
        y_title = 1.0 - 24 * u / H
        fig.text(10 * u / W, y_title, info.title(), ha="left", va="center", fontsize=14, fontweight="bold")
        self._time_text = fig.text(1.0 - 14 * u / W, y_title, "", ha="right", va="center", fontsize=14,
                                   family="DejaVu Sans Mono", animated=True)
        # the second line: the layer in force (its rule and mask), the cluster count, what colours mean,
        # token labels left out
        y_info = y_title - 22 * u / H
        if info.claim:   # what the film exists to show, from the scene
            fig.text(10 * u / W, y_info, info.claim, ha="left", va="center", fontsize=10,
                     color=(0.05, 0.2, 0.45), style="italic")
            y_info -= 18 * u / H
        self._info_text = fig.text(10 * u / W, y_info, "", ha="left", va="center", fontsize=9,
                                   color="0.25", animated=True)
        self._fig, self._canvas = fig, canvas
        self._dynamic = [a for v in self._views for a in v.dynamic_artists()]
        if self._panels is not None:
            self._dynamic += self._panels.dynamic_artists()
        self._dynamic += [self._time_text, self._info_text]
        self._history = collections.deque(maxlen=cfg.trails + 1)
        self._needs_redraw = True
        self._background = None

    def _t_span(self, log: Mapping):
        if self.t_end is None:
            return None
        t = np.asarray(log.get("time", []), dtype=float).ravel()
        t0 = float(t[0]) if t.size else 0.0
        t0 = min(t0, 0.0) if t0 >= 0 and t0 <= 0.05 * self.t_end else t0
        if self.t_end <= t0:
            return None
        return (t0, self.t_end)

    def _render(self, dirty: bool, panels_dirty: list[int]) -> np.ndarray:
        canvas, fig = self._canvas, self._fig
        if dirty or self._background is None:
            canvas.draw()                                   # animated artists are skipped
            self._background = canvas.copy_from_bbox(fig.bbox)
            self._needs_redraw = False
            self.background_redraws += 1
        else:
            canvas.restore_region(self._background)
            if panels_dirty:                                # redraw only those panels' slots
                for i in panels_dirty:
                    fig.draw_artist(self._slot_patches[i])
                    fig.draw_artist(self._panels.panels[i].ax)   # skips its animated artists
                self._background = canvas.copy_from_bbox(fig.bbox)
                self.panel_redraws += len(panels_dirty)
        for artist in self._dynamic:
            fig.draw_artist(artist)
        if not self._regions:
            self._regions = self.regions()
        buf = np.asarray(canvas.buffer_rgba())
        W, H = self.frame_size
        frame = np.empty((H, W, 3), dtype=np.uint8)
        h, w = min(H, buf.shape[0]), min(W, buf.shape[1])
        if (h, w) != (H, W):
            frame[...] = 255
        frame[:h, :w] = buf[:h, :w, :3]
        return frame

    # ----------------------------------------------------------------- introspection
    def regions(self) -> dict[str, tuple[int, int, int, int]]:
        """Pixel boxes (x0, y0, x1, y1), origin top-left, of the frame's parts once the first
        frame is drawn: 'view0', 'view1', ... (particle panels) and 'panel:<name>' (time series)."""
        if self._fig is None:
            return dict(self._regions)
        H = self.frame_size[1]
        out = {}

        def box(ax):
            b = ax.get_window_extent()
            return (int(round(b.x0)), int(round(H - b.y1)), int(round(b.x1)), int(round(H - b.y0)))

        for k, v in enumerate(self._views):
            out[f"view{k}"] = box(v.ax)
        if self._panels is not None:
            for p in self._panels.panels:
                out[f"panel:{p.name}"] = box(p.ax)
        return out
