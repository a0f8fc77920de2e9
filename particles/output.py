"""Writers for a run directory: the CSV log, the chunked trajectory, atomic small files.

Everything is written as the run goes, so an interrupted run keeps what it computed:
the log is flushed after every batch of rows; the trajectory is a folder of compressed
.npz chunks, each written atomically (temporary file, then rename).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from .result import Trajectory
from .atomic import atomic_write_bytes, atomic_write_text, open_append  # noqa: F401 (one writer)

TRAJECTORY_SCHEMA = 1


def write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"cannot write {type(o).__name__} to JSON")


def _format(value) -> str:
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    value = float(value)
    if math.isnan(value):
        return "nan"
    return repr(value)  # shortest string that round-trips exactly


class LogWriter:
    """One CSV row per logged step (and replica). Opens with pandas.read_csv or numpy.genfromtxt."""

    def __init__(self, path: Path, columns: list[str], append: bool = False):
        self.path = Path(path)
        self.columns = list(columns)
        exists = append and self.path.exists()
        if not exists:
            atomic_write_text(self.path, "")
        self._fh = open_append(self.path, newline="")
        if not exists:
            self._fh.write(",".join(self.columns) + "\n")
            self._fh.flush()
        self.rows_written = 0

    def write(self, rows: list[dict]) -> None:
        if not rows:
            return
        lines = [",".join(_format(row.get(c, math.nan)) for c in self.columns) for row in rows]
        self._fh.write("\n".join(lines) + "\n")
        self._fh.flush()
        self.rows_written += len(rows)

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()


class TrajectoryWriter:
    """Tokens at chosen steps, as compressed chunks trajectory/chunk_NNNNN.npz
    (arrays ``steps``, ``times``, ``tokens``) plus trajectory/meta.json (run parameters)."""

    def __init__(self, folder: Path, meta: dict, chunk_frames: int = 50, first_chunk: int = 0):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        write_json(self.folder / "meta.json", {"schema": TRAJECTORY_SCHEMA, **meta})
        self.chunk_frames = int(chunk_frames)
        self.next_chunk = int(first_chunk)
        self._steps: list[int] = []
        self._times: list[float] = []
        self._tokens: list[np.ndarray] = []
        self.frames_written = 0

    def add(self, step: int, time: float, tokens: np.ndarray) -> None:
        self._steps.append(int(step))
        self._times.append(float(time))
        self._tokens.append(np.array(tokens, copy=True))
        if len(self._steps) >= self.chunk_frames:
            self.flush()

    def flush(self) -> None:
        if not self._steps:
            return
        import io
        buf = io.BytesIO()
        np.savez_compressed(buf, steps=np.array(self._steps, dtype=np.int64),
                            times=np.array(self._times), tokens=np.stack(self._tokens))
        atomic_write_bytes(self.folder / f"chunk_{self.next_chunk:05d}.npz", buf.getvalue())
        self.frames_written += len(self._steps)
        self.next_chunk += 1
        self._steps, self._times, self._tokens = [], [], []

    def close(self) -> None:
        self.flush()


def load_trajectory(path: str | Path):
    """The trajectory of a run directory (or its trajectory folder) as a named result:
    ``.steps``, ``.times``, ``.tokens``, ``.meta`` (it also unpacks as that 4-tuple).

    tokens has shape (frames, n, d), or (frames, R, n, d) for an ensemble.
    """
    folder = Path(path)
    if (folder / "trajectory").is_dir():
        folder = folder / "trajectory"
    if not (folder / "meta.json").is_file():
        raise FileNotFoundError(f"no trajectory in {str(path)!r} (expected trajectory/meta.json)")
    meta = json.loads((folder / "meta.json").read_text())
    chunks = sorted(folder.glob("chunk_*.npz"))
    if not chunks:
        raise FileNotFoundError(f"trajectory in {str(folder)!r} has no chunks yet")
    steps, times, tokens = [], [], []
    for chunk in chunks:
        with np.load(chunk) as data:
            steps.append(data["steps"]); times.append(data["times"]); tokens.append(data["tokens"])
    return Trajectory(np.concatenate(steps), np.concatenate(times), np.concatenate(tokens), meta)


def load_log(path: str | Path) -> dict[str, np.ndarray]:
    """The CSV log as a dict column -> float array: the one log reader (NumPy only;
    pandas.read_csv works too). ``path``: log.csv or the run directory holding it."""
    import warnings
    path = Path(path)
    if path.is_dir():
        path = path / "log.csv"
    if not path.is_file():
        raise FileNotFoundError(f"log file not found: {str(path)!r}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")               # a header-only file warns "empty input"
        data = np.genfromtxt(path, delimiter=",", names=True, dtype=np.float64, deletechars="",
                             autostrip=True)
    if data.dtype.names is None:
        raise ValueError(f"{str(path)!r} has no header row of column names")
    data = np.atleast_1d(data)
    return {name: np.asarray(data[name], dtype=np.float64).ravel() for name in data.dtype.names}
