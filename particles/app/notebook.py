"""What a notebook draws from an in-memory run, through the project's renderer: the summary
figure of a `Result`, the film of a `Trajectory` (an inline HTML5 video) and its turnable
HTML view. `Result.summary`, `Trajectory.animate` and `Trajectory.to_html` call these (the
core imports no renderer); `particles render RUN --html` writes the same page for a run."""
from __future__ import annotations

import base64
import dataclasses
import math
import re
import tempfile
from pathlib import Path

import numpy as np

from render.animation import Animation
from render.colors import cluster_count
from render.config import RenderConfig, RunInfo
from render.figures import summary_figure as draw_summary

from particles.clusters import cluster_labels
from particles.errors import ParticlesUserError

from .figures import references
from .summary import TANGENT_FLOOR

NOTEBOOK_SIZE = (960, 540)   # the film in a notebook cell: wide enough for its panels
CLUSTER_THRESHOLD = 0.99     # the scenes' default [log] cluster_threshold


class InlineHtml:
    """HTML that Jupyter displays (``_repr_html_``); ``str()`` gives the markup."""

    def __init__(self, markup: str):
        self.markup = markup

    def _repr_html_(self) -> str:
        return self.markup

    def __str__(self) -> str:
        return self.markup

    def __repr__(self) -> str:
        return f"<inline animation: {len(self.markup)} characters of HTML; display it in Jupyter>"


def _replica_rows(log, replica: int) -> dict:
    columns = {k: np.asarray(v) for k, v in dict(log).items()}
    if "replica" in columns:
        keep = columns["replica"] == replica
        if not keep.any():
            raise ParticlesUserError(f"replica {replica} is not in the log (replicas "
                                     f"{sorted(set(columns['replica'].tolist()))})")
        columns = {k: v[keep] for k, v in columns.items() if k != "replica"}
    return columns


def _scene_of(meta: dict) -> dict:
    """A scene's data as far as a run's parameters tell it (for the theory values)."""
    beta = meta.get("beta", 1.0)
    return {"name": meta.get("scene", "simulation"), "tokens": {"n": meta.get("n"), "d": meta.get("d")},
            "dynamics": {"rule": meta.get("rule", "exp"), "geometry": meta.get("geometry", "sphere"),
                         "beta": beta[0] if isinstance(beta, (list, tuple)) and beta else beta,
                         "dtype": meta.get("dtype", "float32")}}


def summary_figure(result, title: str | None = None, replica: int = 0):
    """`particles plot`'s summary figure of an in-memory Result (an ensemble: ``replica``),
    with the theory values its parameters allow (c*(H), ln n); the matplotlib Figure, which a
    notebook shows as the cell's value."""
    import matplotlib.pyplot as plt
    plt.close(plt.figure())   # pyplot's backend loaded, as Result.plot does: Jupyter's inline one shows a Figure
    columns = _replica_rows(result, replica)
    meta = dict(getattr(result, "meta", {}) or {})
    if title is None and meta.get("n"):
        betas = np.atleast_1d(meta.get("beta", [math.nan]))
        beta = betas[replica] if replica < len(betas) else betas[0]
        title = (f"{meta.get('scene', 'simulation')}    n = {meta['n']}, d = {meta.get('d')}, "
                 f"H = {meta.get('n_heads')}, rule = {meta.get('rule')}, \u03b2 = {float(beta):g}"
                 + (", flat" if meta.get("geometry") == "flat" else "")
                 + (f"  (replica {replica})" if "replica" in result else ""))
    refs = references(_scene_of(meta), columns) if meta.get("n") else []
    # the kinetic identity needs the scene's heads (V = M, symmetric): not known from memory
    refs = [r for r in refs if r.quantity != "kinetic"]
    return draw_summary(columns, title=title, references=refs)


def _frames(trajectory, replica: int, max_frames: int):
    x = np.asarray(trajectory.tokens, dtype=np.float64)
    if x.ndim == 4:
        x = x[:, replica]
    if x.ndim != 3 or len(x) == 0:
        raise ParticlesUserError(f"no frames to draw (tokens of shape {np.shape(trajectory.tokens)})")
    pick = np.unique(np.linspace(0, len(x) - 1, min(len(x), max_frames)).round().astype(int))
    return x[pick], np.asarray(trajectory.times, dtype=np.float64)[pick]


def _info(meta: dict, x: np.ndarray, replica: int, t_end: float, n_heads: int | None) -> RunInfo:
    betas = np.atleast_1d(meta.get("beta", [1.0]))
    return RunInfo(name=str(meta.get("scene", "simulation")), beta=float(betas[min(replica, len(betas) - 1)]),
                   rule=str(meta.get("rule", "?")), n_heads=int(meta.get("n_heads") or n_heads or 1),
                   n=x.shape[1], d=x.shape[2], geometry=meta.get("geometry", "sphere"),
                   t_end=t_end if t_end > 0 else None, tangent_floor=TANGENT_FLOOR)


def _config(x: np.ndarray, geometry: str, **render) -> RenderConfig:
    """The notebook's film settings: clusters coloured, the panels the log has; ``render``
    overrides any of them (radial and entropy colours need the heads: not from memory)."""
    if render.get("color_by") in ("radial", "entropy"):
        raise ParticlesUserError(f"color_by={render['color_by']!r} needs the heads' per-token values, which a "
                                 "Trajectory does not hold; use 'index' or 'cluster' here (or particles render RUN)")
    settings = dict(color_by="cluster" if geometry == "sphere" else "index",
                    width=NOTEBOOK_SIZE[0], height=NOTEBOOK_SIZE[1], dpi=80)
    settings.update(render)
    if "panels" in settings:
        settings["panels"] = tuple(settings["panels"])
    return RenderConfig(**settings)


def _token_values(config: RenderConfig, frame: np.ndarray, threshold: float):
    return {"cluster": cluster_labels(frame, threshold)} if config.color_by == "cluster" else None


def film_html(trajectory, log=None, replica: int = 0, max_frames: int = 150, fps: int = 15,
              threshold: float = CLUSTER_THRESHOLD, **render) -> InlineHtml:
    """The film `particles run` draws, from memory: an MP4 written to a temporary folder by the
    project's Animation, returned inline as an HTML5 <video> (base64; nothing left on disk)."""
    x, times = _frames(trajectory, replica, max_frames)
    columns = _replica_rows(log, replica) if log is not None else None
    meta = dict(trajectory.meta or {})
    heads = [k for k in (columns or {}) if k.startswith("energy_h")]
    settings = {"fps": fps} if columns is not None else {"fps": fps, "panels": ()}   # panels draw the log
    config = _config(x, meta.get("geometry", "sphere"), **{**settings, **render})
    info = _info(meta, x, replica, float(times[-1] - times[0]) if len(times) > 1 else 0.0, len(heads) or None)
    keys = list(columns or ())
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "film.mp4"
        with Animation(path, config, info, t_end=float(times[-1]) if times[-1] > 0 else None,
                       final_tokens=x[-1]) as anim:
            for frame, t in zip(x, times):
                upto = ({k: columns[k][columns["time"] <= t + 1e-12] for k in keys} if columns
                        else {"time": np.array([t])})
                anim.add_frame(frame, float(t), upto, token_values=_token_values(config, frame, threshold))
        data = base64.b64encode(path.read_bytes()).decode("ascii")
    w, h = anim.frame_size
    return InlineHtml(f'<video controls loop playsinline width="{w}" height="{h}" '
                 f'src="data:video/mp4;base64,{data}"></video>')


def page_html(trajectory, log=None, replica: int = 0, max_frames: int = 200, fps: int = 10,
              threshold: float = CLUSTER_THRESHOLD, token_labels=None, **render) -> str:
    """The turnable view's page (render.interactive) of a trajectory, coloured as the film."""
    from render.interactive import interactive_html
    x, times = _frames(trajectory, replica, max_frames)
    meta = dict(trajectory.meta or {})
    config = _config(x, meta.get("geometry", "sphere"), **render)
    info = _info(meta, x, replica, float(times[-1]), None)
    if token_labels is not None:
        info = RunInfo(info.name, info.beta, info.rule, info.n_heads, info.n, info.d, geometry=info.geometry,
                       token_labels=tuple(token_labels))
    values = [_token_values(config, frame, threshold) for frame in x]
    captions = None
    if config.color_by == "cluster":
        captions = [f"{cluster_count(v['cluster'])} clusters of 2 or more tokens (cos > {threshold:g}); "
                    "grey: a token in no cluster" for v in values]
    return interactive_html(times, x, info, config, token_values=values, captions=captions, fps=fps)


def write_html(trajectory, path, log=None, replica: int = 0, max_frames: int = 200, **render) -> Path:
    """`page_html` written to ``path`` (atomically; a link there is refused). Returns the path."""
    from particles.atomic import atomic_write_text
    path = Path(path)
    if path.suffix.lower() not in (".html", ".htm"):
        raise ParticlesUserError(f"Trajectory.to_html: {str(path)!r} must end in .html")
    atomic_write_text(path, page_html(trajectory, log, replica=replica, max_frames=max_frames, **render))
    return path


def run_html(run_dir, out=None, trust_rule_file: bool = False, max_frames: int = 200, **overrides) -> Path:
    """`particles render RUN --html`: the turnable view of a finished run (RUN/view.html unless
    ``out``), coloured by its scene's [render] color_by (or ``overrides``), radial shadows and
    entropies evaluated from the saved tokens as the re-rendered video does."""
    from scenes import load_scene
    from particles.output import load_log, load_trajectory, refuse_link
    from .build import build_simulation
    from .rerender import UntrustedRuleFile
    run_dir = Path(run_dir)
    scene = load_scene(run_dir / "scene.toml")
    trajectory = load_trajectory(run_dir)
    log = load_log(run_dir)
    path = Path(out) if out else run_dir / "view.html"
    if path.suffix.lower() not in (".html", ".htm"):
        raise ParticlesUserError(f"output {str(path)!r}: an interactive view is an .html file")
    refuse_link(path)
    color_by = overrides.pop("color_by", None) or scene.render.color_by
    x, times = _frames(trajectory, 0, max_frames)
    meta = dict(trajectory.meta or {})
    config = _config(x, meta.get("geometry", "sphere"), color_by="index" if color_by in ("radial", "entropy")
                     else color_by, **{k: v for k, v in overrides.items() if v is not None})
    threshold = float(scene.log.cluster_threshold)
    values = [_token_values(config, frame, threshold) for frame in x]
    if color_by in ("radial", "entropy"):
        rule_file = scene.data["dynamics"].get("rule_file")
        if rule_file and not trust_rule_file:
            raise UntrustedRuleFile(f"colouring by {color_by} needs the run's rule, defined by the Python file "
                                    f"{rule_file} named in {run_dir / 'scene.toml'}; pass --trust-rule-file if "
                                    "you trust it, or --color-by index or cluster")
        sim = build_simulation(scene, tokens=x[0], beta=meta["beta"][0], entropy_rate=False,
                               echo=print if rule_file else None)
        values = []
        for frame in x:
            sim.set_tokens(frame)
            sim.observe()
            sim.take_rows()
            values.append(sim.per_token())
        config = dataclasses.replace(config, color_by=color_by, color_head=scene.render.color_head)
    from render.interactive import interactive_html
    from .rerender import run_info
    info = run_info(scene, scene.build_heads(), meta["beta"][0])
    captions = None
    if color_by == "cluster":
        captions = [f"{cluster_count(v['cluster'])} clusters of 2 or more tokens (cos > {threshold:g}); "
                    "grey: a token in no cluster" for v in values]
    from particles.atomic import atomic_write_text
    atomic_write_text(path, interactive_html(times, x, info, config, token_values=values, captions=captions,
                                             fps=max(1, min(scene.render.fps, 20))))
    return path


# ----------------------------------------------------------------------------- a Result's
# columns drawn and converted (Result.plot, to_pandas, to_xarray)

PER_HEAD = re.compile(r"^(.+)_h(\d+)$")   # a per-head column: <quantity>_h<head>
LINE_STYLES = ("-", "--", ":", "-.")   # per column when replicas take the colours


def plot_columns(result, *columns: str, ax=None):
    """Columns against time, one panel each (per-head quantities by base name, e.g. "energy_rate"
    draws energy_rate_h0, energy_rate_h1, ...); default eps, energy and clusters where logged.
    Returns the matplotlib figure (or that of ``ax``): a notebook shows it once, as the cell's
    value; it is not left open in pyplot (a script saves it with ``fig.savefig``)."""
    columns = columns or tuple(c for c in ("eps", "energy", "clusters") if c in result.data
                               and np.isfinite(result.data[c]).any())
    if not columns:
        raise ParticlesUserError(f"Result.plot: name columns to draw; columns: {', '.join(result.data)}")
    panels = []
    for c in columns:
        names = [c] if c in result.data else sorted(
            (k for k in result.data if (m := PER_HEAD.match(k)) and m.group(1) == c),
            key=lambda k: int(PER_HEAD.match(k).group(2)))
        if not names:
            raise ParticlesUserError(f"Result.plot: no column {c!r}; columns: {', '.join(result.data)}")
        panels.append((c, names))
    if ax is None:
        import matplotlib.pyplot as plt
        # made by pyplot, which loads the backend (in Jupyter the inline one, which displays a
        # figure that is a cell's value), then let go of, so it is not displayed a second time
        fig = plt.figure(figsize=(6, 2.2 * len(panels)), layout="constrained")   # labels kept inside
        plt.close(fig)
        axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    else:
        axes = np.atleast_1d(ax)
        fig = axes[0].figure
    x = result.data.get("time", np.arange(len(result)))
    members = _replica_lines(result)
    for a, (c, names) in zip(axes, panels):
        positive = True
        for i, k in enumerate(names):
            for rows, label, color in members:
                y = result.data[k][rows]
                ok = np.isfinite(y)
                positive &= bool((y[ok] > 0).all())
                parts = [p for p in (k if len(names) > 1 else None, label) if p]
                a.plot(x[rows][ok], y[ok], label=", ".join(parts) or None, color=color,
                       ls=LINE_STYLES[i % len(LINE_STYLES)] if color is not None else "-")
        a.set_ylabel(c)
        if c in ("eps", "clusters") and positive:
            a.set_yscale("log")
        if len(names) * len(members) > 1:
            a.legend(fontsize=7, ncol=1 if len(names) * len(members) <= 6 else 2)
    axes[-1].set_xlabel("time" if "time" in result.data else "row")
    return fig


def _replica_lines(result) -> list[tuple[np.ndarray | slice, str | None, object]]:
    """(rows, label, colour) per replica: 'β = 3' where the betas are known (colours ordered
    by beta on a sequential map), else 'replica r'; one entry (all rows, no label, the
    default colour) without an ensemble."""
    if "replica" not in result.data:
        return [(slice(None), None, None)]
    from matplotlib import colormaps
    replica = result.data["replica"]
    ids = np.unique(replica)
    betas = result.betas
    known = betas is not None and len(betas) > int(ids.max())
    order = np.argsort(np.argsort(betas[ids])) if known else np.arange(len(ids))
    shades = colormaps["viridis"](np.linspace(0.0, 0.85, max(len(ids), 2)))
    return [(replica == r, f"\u03b2 = {betas[r]:g}" if known else f"replica {r}", shades[order[i]])
            for i, r in enumerate(ids)]


def result_to_pandas(result):
    """The columns as a pandas DataFrame (pandas is optional: ImportError names it)."""
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("Result.to_pandas needs pandas (pip install pandas); the columns are "
                          "NumPy arrays in result[name] without it") from None
    return pd.DataFrame(result.data)


def result_to_xarray(result):
    """The columns as an xarray Dataset with dims (step[, replica][, head]): per-head columns
    ``<q>_h<h>`` become one variable ``q`` along ``head``; ``time`` is a coordinate of ``step``.
    xarray is optional: ImportError names it."""
    try:
        import xarray as xr
    except ImportError:
        raise ImportError("Result.to_xarray needs xarray (pip install xarray); the columns are "
                          "NumPy arrays in result[name] without it") from None
    steps = np.unique(result.data["step"]) if "step" in result.data else np.arange(len(result))
    ensemble = "replica" in result.data
    replicas = np.unique(result.data["replica"]) if ensemble else None
    shape = (len(steps), len(replicas)) if ensemble else (len(steps),)
    dims = ("step", "replica") if ensemble else ("step",)
    if int(np.prod(shape)) != len(result):
        raise ParticlesUserError(f"Result.to_xarray: {len(result)} rows do not form a (step, replica) grid {shape}")
    heads: dict[str, dict[int, np.ndarray]] = {}
    variables = {}
    for name, values in result.data.items():
        if name in ("step", "replica", "time"):
            continue
        m = PER_HEAD.match(name)
        if m:
            heads.setdefault(m.group(1), {})[int(m.group(2))] = values.reshape(shape)
        else:
            variables[name] = (dims, values.reshape(shape))
    for base, per in heads.items():
        H = max(per) + 1
        stack = np.stack([per.get(h, np.full(shape, np.nan)) for h in range(H)], axis=-1)
        variables[base] = (dims + ("head",), stack)
    coords = {"step": steps}
    if "time" in result.data:
        coords["time"] = ("step", result.data["time"].reshape(shape)[(slice(None),) + (0,) * (len(shape) - 1)])
    if ensemble:
        coords["replica"] = replicas
    betas = result.betas
    if betas is not None and ensemble and len(betas) > int(replicas.max()):
        coords["beta"] = ("replica", betas[replicas])   # each replica's inverse temperature
    elif betas is not None and not ensemble and len(betas) == 1:
        coords["beta"] = float(betas[0])
    if heads:
        coords["head"] = np.arange(max(max(p) + 1 for p in heads.values()))
    return xr.Dataset(variables, coords=coords)
