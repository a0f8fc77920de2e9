"""A view you can turn: a run's tokens as one self-contained HTML file (plotly, its script
inlined, so it opens offline), with a play button and a time slider, rotation and zoom by
mouse, tokens coloured as in the film (the same `TokenColorizer`).

d = 3: the tokens on a translucent sphere with a wireframe; d = 2: on the unit circle; d > 3:
the first frame's three principal axes (the film's pca_initial view), the sphere's shadow
drawn as a reference. plotly is imported here only: the rest of render does not need it.
"""
from __future__ import annotations

import html
import math
from typing import Mapping, Sequence

import numpy as np

from .colors import TokenColorizer
from .config import RenderConfig, RunInfo
from .views import pca_basis

SPHERE_RGB = "rgb(205, 214, 230)"      # the film's pale sphere
WIRE_RGB = "rgba(120, 130, 150, 0.45)"
MARKER_LINE = "rgba(40, 40, 40, 0.6)"


def _rgba(colors: np.ndarray) -> list[str]:
    c = np.clip(np.asarray(colors, dtype=float), 0.0, 1.0)
    return [f"rgba({int(round(255 * r))},{int(round(255 * g))},{int(round(255 * b))},{a:.3f})" for r, g, b, a in c]


def _sphere_traces(go, three: bool) -> list:
    """A translucent unit sphere and its wireframe (5 latitudes, 12 meridians), or the circle."""
    if not three:
        s = np.linspace(0.0, 2.0 * np.pi, 181)
        return [go.Scatter(x=np.cos(s), y=np.sin(s), mode="lines", line=dict(color=WIRE_RGB, width=2),
                           hoverinfo="skip", showlegend=False)]
    u, v = np.meshgrid(np.linspace(0, 2 * np.pi, 49), np.linspace(0, np.pi, 25))
    surface = go.Surface(x=np.cos(u) * np.sin(v), y=np.sin(u) * np.sin(v), z=np.cos(v), opacity=0.18,
                         colorscale=[[0, SPHERE_RGB], [1, SPHERE_RGB]], showscale=False, hoverinfo="skip",
                         lighting=dict(ambient=0.9, diffuse=0.3, specular=0.05))
    xs, ys, zs = [], [], []
    s = np.linspace(0.0, 2.0 * np.pi, 97)
    for lat in np.linspace(-60, 60, 5) * np.pi / 180:
        xs += list(np.cos(lat) * np.cos(s)) + [None]
        ys += list(np.cos(lat) * np.sin(s)) + [None]
        zs += list(np.full(s.size, np.sin(lat))) + [None]
    t = np.linspace(0.0, np.pi, 49)
    for lon in np.arange(12) * np.pi / 6:
        xs += list(np.sin(t) * np.cos(lon)) + [None]
        ys += list(np.sin(t) * np.sin(lon)) + [None]
        zs += list(np.cos(t)) + [None]
    wire = go.Scatter3d(x=xs, y=ys, z=zs, mode="lines", line=dict(color=WIRE_RGB, width=1.5),
                        hoverinfo="skip", showlegend=False)
    return [surface, wire]


def interactive_html(times, tokens, info: RunInfo, config: RenderConfig | None = None,
                     token_values: Sequence[Mapping[str, np.ndarray] | None] | None = None,
                     captions: Sequence[str] | None = None, fps: int = 10) -> str:
    """The HTML page (a string) of frames ``tokens`` (F, n, d) at ``times`` (F,): the first
    frame shown, the slider and play button over all of them. ``token_values``: per frame, the
    per-token arrays the colour needs (``{"cluster": labels}`` for color_by "cluster", as the
    film is given them); ``captions``: per frame, a line under the title (e.g. the cluster
    count). No network at any point: plotly's script is in the page."""
    import plotly.graph_objects as go
    config = RenderConfig() if config is None else config
    x = np.asarray(tokens, dtype=float)
    t = np.asarray(times, dtype=float).ravel()
    if x.ndim != 3 or x.shape[1:] != (info.n, info.d) or len(x) != len(t) or not len(x):
        raise ValueError(f"interactive_html: tokens must be (frames, n, d) = (F, {info.n}, {info.d}) with one "
                         f"time per frame, got tokens {x.shape} and {t.size} times")
    values = list(token_values) if token_values is not None else [None] * len(x)
    if len(values) != len(x):
        raise ValueError(f"interactive_html: {len(values)} token_values for {len(x)} frames")
    three = info.d >= 3
    basis = np.eye(info.d)[:, :3] if info.d == 3 else pca_basis(x[0], 3) if three else np.eye(2)
    shown = x @ basis if info.d != 2 else x
    colorizer = TokenColorizer(config, info)
    colorizer.prepare(x[0], values[0])
    colors = []
    for frame, vals in zip(x, values):
        colorizer.update(frame, vals)
        colors.append(_rgba(colorizer.colors(frame, vals)))
    labels = [str(i) for i in range(info.n)] if info.token_labels is None else \
        [f"{i}: {html.escape(s)}" for i, s in enumerate(info.token_labels)]
    size = float(np.clip(70.0 / math.sqrt(info.n), 3.0, 10.0))   # 8.75 px at n = 64

    def token_trace(k: int):
        p = shown[k].astype(np.float32)   # plotly stores arrays as binary: float32 halves the page's data
        marker = dict(color=colors[k], size=size, line=dict(color=MARKER_LINE, width=0.6))
        hover = "token %{text}<extra></extra>"
        if three:
            return go.Scatter3d(x=p[:, 0], y=p[:, 1], z=p[:, 2], mode="markers", marker=marker, text=labels,
                                hovertemplate=hover, showlegend=False, name="tokens")
        return go.Scatter(x=p[:, 0], y=p[:, 1], mode="markers", marker=dict(marker, size=size + 3), text=labels,
                          hovertemplate=hover, showlegend=False, name="tokens")

    def heading(k: int) -> str:
        line = f"{info.title()}<br><sub>t = {t[k]:.4g}"
        if captions is not None and captions[k]:
            line += "   \u00b7   " + html.escape(captions[k])
        return line + "</sub>"

    background = _sphere_traces(go, three)
    token_index = len(background)
    frames = [go.Frame(data=[token_trace(k)], traces=[token_index], name=str(k),
                       layout=dict(title=dict(text=heading(k)))) for k in range(len(x))]
    duration = int(round(1000 / max(fps, 1)))
    play = dict(label="\u25b6 play", method="animate",
                args=[None, dict(frame=dict(duration=duration, redraw=True), fromcurrent=True,
                                 transition=dict(duration=0), mode="immediate")])
    pause = dict(label="\u275a\u275a pause", method="animate",
                 args=[[None], dict(frame=dict(duration=0, redraw=True), mode="immediate",
                                    transition=dict(duration=0))])
    slider = dict(active=0, x=0.08, len=0.9, y=0.02, currentvalue=dict(prefix="t = ", font=dict(size=13)),
                  steps=[dict(label=f"{t[k]:.3g}", method="animate",
                              args=[[str(k)], dict(mode="immediate", frame=dict(duration=0, redraw=True),
                                                   transition=dict(duration=0))]) for k in range(len(x))])
    axis = dict(range=[-1.15, 1.15], showbackground=False, zeroline=False, title="", showspikes=False,
                gridcolor="rgb(235,235,235)")
    names = ("x", "y", "z") if info.d == 3 else ("PC 1", "PC 2", "PC 3")
    layout = dict(title=dict(text=heading(0), x=0.02, font=dict(size=15)), height=720,
                  margin=dict(l=10, r=10, t=80, b=10),
                  updatemenus=[dict(type="buttons", direction="left", x=0.0, y=0.02, xanchor="right",
                                    yanchor="top", pad=dict(r=10, t=30), buttons=[play, pause])],
                  sliders=[slider], paper_bgcolor="white", template="none")   # no template: a smaller page
    if three:
        layout["scene"] = dict(xaxis=dict(axis, title=names[0]), yaxis=dict(axis, title=names[1]),
                               zaxis=dict(axis, title=names[2]), aspectmode="cube",
                               camera=dict(eye=dict(x=1.5, y=1.5, z=1.0)))
    else:
        layout["xaxis"] = dict(range=[-1.2, 1.2], zeroline=False, constrain="domain")
        layout["yaxis"] = dict(range=[-1.2, 1.2], zeroline=False, scaleanchor="x")
        layout["plot_bgcolor"] = "white"
    fig = go.Figure(data=background + [token_trace(0)], frames=frames, layout=layout)
    # the script inlined and nothing fetched: no MathJax, no topojson, no link to plotly's cloud
    return fig.to_html(include_plotlyjs=True, include_mathjax=False, full_html=True, auto_play=False,
                       config=dict(displaylogo=False, showSendToCloud=False,
                                   topojsonURL="", responsive=True))
