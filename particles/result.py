"""Results as NumPy arrays: what ``Simulation.run`` returns and ``load_trajectory`` reads."""
from __future__ import annotations

import importlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from tqdm.auto import tqdm as auto_tqdm
from tqdm.std import tqdm as text_tqdm

from . import display
from .drive import AT_END, Every, Writer
from .errors import ParticlesUserError

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
    ``trajectory``: the kept tokens (``sim.run(..., trajectory_every=k)``), else None;
    ``meta``: the run's parameters as ``Simulation.run`` knows them (``n``, ``d``, ``n_heads``,
    ``rule``, ``beta`` one per replica, ``geometry``, ``dt``), empty for a log read from a file.

        res.summary()            # the figure `particles plot` draws, from memory
    """

    data: dict = field(default_factory=dict)
    final_tokens: np.ndarray | None = None
    trajectory: "Trajectory | None" = None
    meta: dict = field(default_factory=dict)   # the run's parameters (n, d, n_heads, rule, beta, ...)

    @classmethod
    def from_rows(cls, rows: list[dict], final_tokens=None, meta: dict | None = None) -> "Result":
        names: list[str] = []
        for row in rows:
            names += [k for k in row if k not in names]
        data = {}
        for name in names:
            values = [row.get(name, math.nan) for row in rows]
            integral = name in ("step", "replica", "clusters") and all(isinstance(v, int) for v in values)
            data[name] = np.asarray(values, dtype=np.int64 if integral else np.float64)
        return cls(data, final_tokens, meta=dict(meta or {}))

    @property
    def columns(self) -> list[str]:
        return list(self.data)

    @property
    def betas(self) -> np.ndarray | None:
        """beta of each replica (one value without an ensemble), from ``meta``; None when unknown."""
        beta = self.meta.get("beta") if isinstance(self.meta, Mapping) else None
        return None if beta is None else np.atleast_1d(np.asarray(beta, dtype=np.float64))

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
        return _app("result_to_xarray")(self)

    def plot(self, *columns: str, ax=None):
        """Columns against time, one panel each (per-head quantities by base name, e.g. "energy_rate"
        draws energy_rate_h0, energy_rate_h1, ...); default eps, energy and clusters where logged.
        Returns the matplotlib figure (or that of ``ax``): a notebook shows it once, as the cell's
        value; it is not left open in pyplot (a script saves it with ``fig.savefig``)."""
        return _app("plot_columns")(self, *columns, ax=ax)

    def animate(self, **options):
        """The film of ``trajectory`` (``sim.run(..., trajectory_every=k)``) with this log's
        panels, inline: ``Trajectory.animate(log=self, **options)``."""
        if self.trajectory is None:
            raise ParticlesUserError("Result.animate: no tokens were kept; run with trajectory_every=k "
                                     "(sim.run(steps, every, trajectory_every=k))")
        return self.trajectory.animate(log=self, **options)

    def summary(self, title: str | None = None, replica: int = 0):
        """The figure `particles plot RUN` draws (every logged quantity against time, per-head
        columns together), from this Result in memory; a notebook shows it as the cell's value.
        An ensemble draws ``replica``. Returns the matplotlib Figure."""
        return _app("summary_figure")(self, title=title, replica=replica)

    def to_pandas(self):
        """The columns as a pandas DataFrame (pandas is optional: ImportError names it)."""
        return _app("result_to_pandas")(self)


def _app(name: str):
    """A function of the application layer (particles.app.notebook), which alone may use the
    renderer and the optional converters: the core imports neither, so these methods are the
    notebook's door to them (as ``particles.run_scene`` is), imported on first use."""
    return getattr(importlib.import_module("particles.app.notebook"), name)


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

    def animate(self, log=None, replica: int = 0, max_frames: int = 150, fps: int = 15, **render):
        """The run's film as `particles run` draws it (tokens on the sphere or circle or in a
        PCA view, coloured by cluster, with the energy, rho and entropy panels of ``log``:
        a Result, e.g. ``res.animate()``, or ``particles.load_log(run)``), as an inline HTML5
        video for a notebook; at most ``max_frames`` frames, evenly picked. ``render``: any
        [render] setting (``view``, ``color_by`` 'index' or 'cluster', ``panels``, ``width``,
        ...). Returns an object Jupyter displays (``str()`` gives the HTML)."""
        return _app("film_html")(self, log, replica=replica, max_frames=max_frames, fps=fps, **render)

    def to_html(self, path, log=None, replica: int = 0, max_frames: int = 200, **render):
        """One self-contained HTML file (plotly, its script inlined: opens offline) with the
        tokens on a translucent sphere (circle for d = 2, PCA axes above d = 3), a play button
        and a time slider, rotation by mouse, coloured as in the film. Returns the path."""
        return _app("write_html")(self, path, log, replica=replica, max_frames=max_frames, **render)


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


PROGRESS_UPDATES = 100   # a bar moves at most this many times in a run (each is a stop of the loop)


def progress_bar(steps: int):
    """A drive writer showing a progress bar over ``steps`` steps (``sim.run(..., progress=True)``):
    tqdm's notebook widget where Jupyter has ipywidgets, its text bar otherwise; it closes
    itself at the run's last state."""
    class _Progress(Writer):
        trigger = Every(max(1, steps // PROGRESS_UPDATES)) | AT_END

        def start(self, sim, step, end):
            try:
                self.bar = auto_tqdm(total=end - step, unit="step", desc="particles")
            except ImportError:   # a notebook without ipywidgets: tqdm.auto cannot draw its widget
                self.bar = text_tqdm(total=end - step, unit="step", desc="particles")
            self.first, self.end = step, end

        def on_state(self, state):
            self.bar.update(state.step - self.first - self.bar.n)
            if state.step >= self.end:
                self.bar.close()

    return _Progress()
