"""The writers of a run directory, as drive writers: log.csv (with cluster columns),
trajectory/, the live video.

Each declares its trigger and what it needs; ``particles.drive`` serves them.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from particles.drive import AT_END, NEVER, Every, Writer
from particles.clusters import cluster_labels, cluster_stats
from particles.normalisation import RADIAL
from particles.output import LogWriter, TrajectoryWriter
from render.panels import is_panel_column

PANEL_HISTORY_LIMIT = 20000


class LogCsv(Writer):
    """log.csv: a row per observed state (every ``log_every`` steps) and replica, plus
    ``min_cosine`` / ``clusters`` every ``clusters_every`` steps (the same labelling as the
    video's and the sweep's, at the scene's threshold)."""

    needs = frozenset({"tokens"})

    def __init__(self, path: Path, columns: list[str], log_every: int, clusters_every: int,
                 threshold: float, resume: tuple[int, int] | None = None):
        self.observe = Every(log_every)
        self.trigger = Every(clusters_every) if clusters_every > 0 else NEVER
        self.threshold = float(threshold)
        self.log = LogWriter(path, columns, resume=resume)
        self.extra: dict[tuple[int, int], dict] = {}
        self.last_step = None   # the step of the last row on disk (None: none this process)
        self.failed = False     # a write failed: later rows are not written (no gap in the log)

    @property
    def rows_written(self) -> int:
        return self.log.rows_written

    @property
    def bytes_written(self) -> int:
        return self.log.bytes_written

    def on_state(self, state):
        mins, counts = cluster_stats(state.tokens, self.threshold)
        for b in range(len(mins)):
            count = int(counts[b]) if np.isfinite(counts[b]) else math.nan
            self.extra[(state.step, b)] = {"min_cosine": float(mins[b]), "clusters": count}

    def on_rows(self, rows):
        for row in rows:
            extra = self.extra.pop((row["step"], row.get("replica", 0)), None)
            if extra:
                row.update(extra)
        if self.failed or not rows:
            return
        try:
            self.log.write(rows)
        except OSError:
            # a full disk: keep as many whole rows as fit, in order (the batch is all or none)
            self.failed = True
            for row in rows:
                try:
                    self.log.write([row])
                except OSError:
                    break
                self.last_step = row["step"]
            raise
        self.last_step = rows[-1]["step"]

    def flush(self):
        self.log.sync()

    def close(self):
        self.log.close()


class Trajectory(Writer):
    """trajectory/: the tokens every ``every`` steps, in chunks written atomically."""

    needs = frozenset({"tokens"})

    def __init__(self, folder: Path, meta: dict, every: int, ensemble: bool, first_chunk: int = 0,
                 first_frames: int = 0):
        self.trigger = Every(every)
        self.ensemble = ensemble
        self.writer = TrajectoryWriter(folder, meta, first_chunk=first_chunk, first_frames=first_frames)
        self.frames_added = int(first_frames)

    @property
    def current_rows(self) -> bool:
        """True when this state's frame completes a chunk: the rows computed so far are handed
        out (to log.csv) first, so that the log is never behind the trajectory on disk (on a
        disk that fills up, the rows get its room first)."""
        return self.frames_added - self.writer.frames_written + 1 >= self.writer.chunk_frames

    @property
    def folder(self) -> Path:
        return self.writer.folder

    @property
    def next_chunk(self) -> int:
        return self.writer.next_chunk

    @property
    def frames_written(self) -> int:
        return self.writer.frames_written

    def on_state(self, state):
        x = state.tokens if self.ensemble else state.tokens[0]
        self.frames_added += 1
        self.writer.add(state.step, state.time, x)

    def flush(self):
        self.writer.flush()

    def close(self):
        self.writer.close()


class Video(Writer):
    """The live video: a frame every ``frame_every`` steps and at the end; replica 0.

    Its panels show the log's curves up to the frame, so it observes the log's rows and asks
    for them to be current before each frame.
    """

    current_rows = True

    def __init__(self, animation, frame_every: int, log_every: int, ensemble: bool, per_token: bool,
                 cluster_threshold: float | None = None):
        self.anim = animation
        self.cluster_threshold = cluster_threshold   # colour by cluster: the log's labelling
        self.trigger = Every(frame_every) | AT_END
        self.observe = Every(log_every)
        self.ensemble = ensemble
        self.needs = frozenset({"tokens", "per_token"} if per_token else {"tokens"})
        self.history: dict[str, list] = {}

    def on_rows(self, rows):
        h = self.history
        for row in rows:
            if row.get("replica", 0) != 0:
                continue
            for key, value in row.items():
                if is_panel_column(key):
                    h.setdefault(key, []).append(value)
            if len(h["time"]) > PANEL_HISTORY_LIMIT:  # thin old points; the curve keeps its shape
                for key in h:
                    h[key] = h[key][::2]

    def on_state(self, state):
        x0 = state.tokens[0]
        values = None
        if state.per_token is not None:
            values = {k: (v[0] if self.ensemble else v) for k, v in state.per_token.items()}
        if self.cluster_threshold is not None:
            values = {**(values or {}), "cluster": cluster_labels(x0, self.cluster_threshold)}
        if getattr(self, "_directions", False):   # pre/peri-LN: draw the directions, the radius as the norm colour
            radius = np.linalg.norm(x0, axis=-1)
            values = {**(values or {}), "norm": radius}
            x0 = x0 / radius[:, None]
        log = {k: np.asarray(v) for k, v in self.history.items()}
        self.anim.add_frame(x0, state.step * self._dt, log, token_values=values)

    def start(self, sim, step, end):
        self._dt = sim.dt
        self._directions = sim.normalisation in RADIAL

    def close(self):
        if self.anim is not None:
            self.anim.__exit__(None, None, None)
            self.anim = None
