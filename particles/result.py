"""Results as NumPy arrays: what ``Simulation.run`` returns and ``load_trajectory`` reads."""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from . import display
from .drive import AT_END, Every, Writer

_PER_HEAD = re.compile(r"^(.+)_h(\d+)$")


@dataclass(frozen=True, eq=False)
class Result(Mapping):
    """Observed states as one NumPy array per log column, in order (step, then replica).

        res = sim.run(200, every=10)
        res["eps"][-1]          # eps of the final state (always observed)
        res.step, res.time      # attribute access works for every column (and tab-completes)
        res.to_pandas()         # a DataFrame with the columns of log.csv (needs pandas)
        res.to_xarray()         # a Dataset with dims (step, replica, head) (needs xarray)
        res.plot("eps", "energy")   # matplotlib panels against time

    A read-only mapping column -> array (``dict(res)``, ``res.items()``, ``"eps" in res``);
    ``len(res)`` is the number of rows. ``particles.load_log`` returns one too.
    ``final_tokens``: the tokens after the last step, float64, (n, d) or (R, n, d);
    ``trajectory``: the kept tokens (``sim.run(..., trajectory_every=k)``), else None.
    """

    data: dict = field(default_factory=dict)
    final_tokens: np.ndarray | None = None
    trajectory: "Trajectory | None" = None

    @classmethod
    def from_rows(cls, rows: list[dict], final_tokens=None) -> "Result":
        names: list[str] = []
        for row in rows:
            names += [k for k in row if k not in names]
        data = {}
        for name in names:
            values = [row.get(name, math.nan) for row in rows]
            integral = name in ("step", "replica", "clusters") and all(isinstance(v, int) for v in values)
            data[name] = np.asarray(values, dtype=np.int64 if integral else np.float64)
        return cls(data, final_tokens)

    @property
    def columns(self) -> list[str]:
        return list(self.data)

    def __getitem__(self, name: str) -> np.ndarray:
        try:
            return self.data[name]
        except KeyError:
            raise KeyError(f"no column {name!r}; columns: {', '.join(self.data)}") from None

    def __getattr__(self, name: str) -> np.ndarray:
        data = self.__dict__.get("data", {})
        if name in data:
            return data[name]
        raise AttributeError(f"Result has no column or attribute {name!r}")

    def __dir__(self):
        return sorted(set(super().__dir__()) | {c for c in self.data if c.isidentifier()})

    def __iter__(self):
        return iter(self.data)

    def __len__(self) -> int:
        return len(next(iter(self.data.values()))) if self.data else 0

    def __repr__(self) -> str:
        return display.text("Result", display.result_fields(self)) + \
            f"\n  columns: {', '.join(self.data)}"

    def _repr_html_(self) -> str:
        return display.html_table("Result", display.result_fields(self),
                                  note="columns: " + ", ".join(self.data))

    def to_xarray(self):
        """The columns as an xarray Dataset with dims (step[, replica][, head]): per-head columns
        ``<q>_h<h>`` become one variable ``q`` along ``head``; ``time`` is a coordinate of ``step``.
        xarray is optional: ImportError names it."""
        try:
            import xarray as xr
        except ImportError:
            raise ImportError("Result.to_xarray needs xarray (pip install xarray); the columns are "
                              "NumPy arrays in result[name] without it") from None
        steps = np.unique(self.data["step"]) if "step" in self.data else np.arange(len(self))
        ensemble = "replica" in self.data
        replicas = np.unique(self.data["replica"]) if ensemble else None
        shape = (len(steps), len(replicas)) if ensemble else (len(steps),)
        dims = ("step", "replica") if ensemble else ("step",)
        if int(np.prod(shape)) != len(self):
            raise ValueError(f"Result.to_xarray: {len(self)} rows do not form a (step, replica) grid {shape}")
        heads: dict[str, dict[int, np.ndarray]] = {}
        variables = {}
        for name, values in self.data.items():
            if name in ("step", "replica", "time"):
                continue
            m = _PER_HEAD.match(name)
            if m:
                heads.setdefault(m.group(1), {})[int(m.group(2))] = values.reshape(shape)
            else:
                variables[name] = (dims, values.reshape(shape))
        for base, per in heads.items():
            H = max(per) + 1
            stack = np.stack([per.get(h, np.full(shape, np.nan)) for h in range(H)], axis=-1)
            variables[base] = (dims + ("head",), stack)
        coords = {"step": steps}
        if "time" in self.data:
            coords["time"] = ("step", self.data["time"].reshape(shape)[(slice(None),) + (0,) * (len(shape) - 1)])
        if ensemble:
            coords["replica"] = replicas
        if heads:
            coords["head"] = np.arange(max(max(p) + 1 for p in heads.values()))
        return xr.Dataset(variables, coords=coords)

    def plot(self, *columns: str, ax=None):
        """Columns against time, one panel each (per-head quantities by base name, e.g. "energy_rate"
        draws energy_rate_h0, energy_rate_h1, ...); default eps, energy and clusters where logged.
        Returns the matplotlib figure (or that of ``ax``): a notebook shows it once, as the cell's
        value; it is not left open in pyplot (a script saves it with ``fig.savefig``)."""
        columns = columns or tuple(c for c in ("eps", "energy", "clusters") if c in self.data
                                   and np.isfinite(self.data[c]).any())
        if not columns:
            raise ValueError(f"Result.plot: name columns to draw; columns: {', '.join(self.data)}")
        panels = []
        for c in columns:
            names = [c] if c in self.data else sorted(
                (k for k in self.data if (m := _PER_HEAD.match(k)) and m.group(1) == c),
                key=lambda k: int(_PER_HEAD.match(k).group(2)))
            if not names:
                raise ValueError(f"Result.plot: no column {c!r}; columns: {', '.join(self.data)}")
            panels.append((c, names))
        if ax is None:
            import matplotlib.pyplot as plt
            # made by pyplot, which loads the backend (in Jupyter the inline one, which displays a
            # figure that is a cell's value), then let go of, so it is not displayed a second time
            fig = plt.figure(figsize=(6, 2.2 * len(panels)))
            plt.close(fig)
            axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
        else:
            axes = np.atleast_1d(ax)
            fig = axes[0].figure
        x = self.data.get("time", np.arange(len(self)))
        keep = (self.data["replica"] == 0) if "replica" in self.data else slice(None)
        for a, (c, names) in zip(axes, panels):
            for k in names:
                y = self.data[k][keep]
                ok = np.isfinite(y)
                a.plot(x[keep][ok], y[ok], label=k if len(names) > 1 else None)
            a.set_ylabel(c)
            if c in ("eps", "clusters") and all((self.data[k][keep][np.isfinite(self.data[k][keep])] > 0).all()
                                                for k in names):
                a.set_yscale("log")
            if len(names) > 1:
                a.legend(fontsize=7)
        axes[-1].set_xlabel("time" if "time" in self.data else "row")
        return fig

    def to_pandas(self):
        """The columns as a pandas DataFrame (pandas is optional: ImportError names it)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("Result.to_pandas needs pandas (pip install pandas); the columns are "
                              "NumPy arrays in result[name] without it") from None
        return pd.DataFrame(self.data)


class Trajectory(NamedTuple):
    """A run's saved trajectory: ``steps`` (frames,), ``times`` (frames,), ``tokens`` (frames, n, d)
    or (frames, R, n, d) for an ensemble, and ``meta`` (the run's parameters). Unpacks as the
    4-tuple it used to be: ``steps, times, tokens, meta = load_trajectory(run_dir)``."""

    steps: np.ndarray
    times: np.ndarray
    tokens: np.ndarray
    meta: dict

    def __repr__(self) -> str:
        return display.text("Trajectory", display.trajectory_fields(self))

    def _repr_html_(self) -> str:
        return display.html_table("Trajectory", display.trajectory_fields(self))

    def animate(self, replica: int = 0, max_frames: int = 200, fps: int = 10):
        """An inline animation for a notebook (matplotlib's JavaScript player, no files): tokens
        in their first two coordinates (three on a 3-D axis for d = 3), one frame per saved step
        (at most ``max_frames``, evenly picked). Returns an object Jupyter displays as HTML."""
        from matplotlib.animation import FuncAnimation
        from matplotlib.figure import Figure
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        x = np.asarray(self.tokens, dtype=np.float64)
        if x.ndim == 4:
            x = x[:, replica]
        if x.ndim != 3 or len(x) == 0:
            raise ValueError(f"Trajectory.animate: no frames to draw (tokens of shape {np.shape(self.tokens)})")
        pick = np.unique(np.linspace(0, len(x) - 1, min(len(x), max_frames)).round().astype(int))
        fig = Figure(figsize=(4.5, 4.5), dpi=80)
        FigureCanvasAgg(fig)
        three = x.shape[2] == 3
        ax = fig.add_subplot(projection="3d" if three else None)
        lim = 1.05 * max(1.0, float(np.nanmax(np.abs(x[..., :3]))))
        for setter in (ax.set_xlim, ax.set_ylim) + ((ax.set_zlim,) if three else ()):
            setter(-lim, lim)
        colors = np.arange(x.shape[1])
        first = x[pick[0]]
        dots = (ax.scatter(first[:, 0], first[:, 1], first[:, 2], c=colors, cmap="hsv", s=12) if three
                else ax.scatter(first[:, 0], first[:, min(1, x.shape[2] - 1)], c=colors, cmap="hsv", s=12))
        title = ax.set_title("")

        def draw(k):
            f = x[pick[k]]
            if three:
                dots._offsets3d = (f[:, 0], f[:, 1], f[:, 2])
            else:
                dots.set_offsets(f[:, :2])
            title.set_text(f"t = {float(self.times[pick[k]]):g}  (step {int(self.steps[pick[k]])})")
            return dots, title

        anim = FuncAnimation(fig, draw, frames=len(pick), interval=1000 / fps, blit=False)
        return _Html(anim.to_jshtml(fps=fps, default_mode="once"))


class _Html:
    """HTML that Jupyter displays (``_repr_html_``); ``str()`` gives the markup."""

    def __init__(self, markup: str):
        self.markup = markup

    def _repr_html_(self) -> str:
        return self.markup

    def __str__(self) -> str:
        return self.markup

    def __repr__(self) -> str:
        return f"<inline animation: {len(self.markup)} characters of HTML; display it in Jupyter>"


__all__ = ["Result", "Trajectory"]


def token_keeper(every: int, ensemble: bool, meta: dict):
    """A drive writer that keeps the tokens every ``every`` steps and at the end, in memory
    (``sim.run(..., trajectory_every=k)``); ``.trajectory()`` gives them as a Trajectory."""
    class _Keep(Writer):
        trigger = Every(every) | AT_END
        needs = frozenset({"tokens"})

        def __init__(self):
            self.steps, self.times, self.frames = [], [], []

        def on_state(self, state):
            if self.steps and self.steps[-1] == state.step:
                return
            x = np.asarray(state.tokens, dtype=np.float64)
            self.steps.append(state.step)
            self.times.append(state.time)
            self.frames.append(x if ensemble else x[0])

        def trajectory(self) -> Trajectory:
            return Trajectory(np.asarray(self.steps, dtype=np.int64), np.asarray(self.times, dtype=np.float64),
                              np.stack(self.frames) if self.frames else np.zeros((0,)), dict(meta))

    return _Keep()
