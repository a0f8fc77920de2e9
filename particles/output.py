"""Writers for a run directory: the CSV log, the chunked trajectory, atomic small files.

Everything is written as the run goes, so an interrupted run keeps what it computed:
the log is flushed after every batch of rows; the trajectory is a folder of compressed
.npz chunks, each written atomically (temporary file, then rename).

No write follows a symbolic link (particles.atomic refuses a target that is one, and the log
is opened with O_NOFOLLOW), and a sub-folder that is a link is refused. A file that cannot be
read back (empty, truncated) raises RunFileError naming it.
"""
from __future__ import annotations

import io
import json
import math
import os
import stat
from pathlib import Path

import numpy as np

from .result import Result, Trajectory
from .atomic import atomic_write_bytes, atomic_write_text, open_append  # noqa: F401 (one writer)
from .atomic import refuse_symlink as refuse_link  # noqa: F401 (the one link check)
from .atomic import SymlinkRefused, refuse_hard_link

TRAJECTORY_SCHEMA = 1
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


from .errors import MissingFileError, RunFileError  # noqa: E402  (a missing or corrupt run file: the one family)




def real_folder(path: Path, create: bool = True) -> Path:
    """``path`` as a real folder (created if missing): never a link, never a file."""
    path = refuse_link(path)
    if create and not path.exists():
        path.mkdir(parents=True, exist_ok=True)
        refuse_link(path)
    if path.exists() and not path.is_dir():
        raise RunFileError(f"{str(path)!r} is a file, but a folder is needed there")
    return path


def remove_file(path: Path) -> None:
    """Remove a file or link (a link itself, never its target); a missing one is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def open_run_file(path: Path, what: str = ""):
    """A run file opened for reading (binary): FileNotFoundError if absent, RunFileError if it
    is not a regular file (a FIFO would be waited on for ever, a device such as /dev/zero read
    without end), checked on the open descriptor; opened non-blocking so a FIFO does not wait."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a folder" if stat.S_ISDIR(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket")
        raise RunFileError(f"{what}{str(path)!r} is not a regular file ({kind}); a run's files "
                           "are plain files")
    return os.fdopen(fd, "rb")


def _read_run_text(path: Path, what: str, missing: Exception) -> str:
    """A run file's text; ``missing`` raised if it does not exist, RunFileError if it cannot be
    read or is not a regular file (``what`` prefixes the path in that message)."""
    try:
        with open_run_file(path, what) as fh:
            return fh.read().decode("utf-8")
    except FileNotFoundError:
        raise missing from None
    except IsADirectoryError:
        raise RunFileError(f"{what}{str(path)!r} is not a regular file (a folder); a run's files "
                           "are plain files") from None
    except (OSError, UnicodeDecodeError) as err:
        raise RunFileError(f"{what}{str(path)!r} cannot be read: {err}") from None


def read_json(path: Path) -> dict:
    """A JSON object from a run file, or RunFileError saying what is wrong with it."""
    path = Path(path)
    text = _read_run_text(path, "", RunFileError(f"{str(path)!r} is missing"))
    if not text.strip():
        raise RunFileError(f"{str(path)!r} is empty (the run that wrote it was cut off)")
    try:
        obj = json.loads(text)
    except ValueError as err:
        raise RunFileError(f"{str(path)!r} is not valid JSON ({err}); it is truncated or corrupt") from None
    if not isinstance(obj, dict):
        raise RunFileError(f"{str(path)!r} should hold a JSON object, got {type(obj).__name__}")
    return obj


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
    """One CSV row per logged step (and replica). Opens with pandas.read_csv or numpy.genfromtxt.

    ``rows_written`` and ``bytes_written`` count the whole file, across resumes: a checkpoint
    records them, and ``resume=(rows, bytes)`` cuts the file back to exactly that point.
    """

    def __init__(self, path: Path, columns: list[str], resume: tuple[int, int] | None = None):
        self.path = refuse_link(Path(path))
        self.columns = list(columns)
        header = (",".join(self.columns) + "\n").encode()
        if resume is None:
            try:
                refuse_hard_link(self.path)
            except SymlinkRefused:      # a new log: drop this name's link, the other file stays
                os.unlink(self.path)
        else:
            refuse_hard_link(self.path)   # cutting back or appending would reach the other link
        if resume is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o644)
            self.rows_written, self.bytes_written = 0, 0
            self._append(header, 0)
        else:
            rows, size = (int(v) for v in resume)
            check_log_prefix(self.path, self.columns, rows, size)
            self._fd = os.open(self.path, os.O_WRONLY | _NOFOLLOW)
            os.ftruncate(self._fd, size)   # rows after the checkpoint will be computed again, identically
            self.rows_written, self.bytes_written = rows, size

    def _append(self, data: bytes, rows: int) -> None:
        """Whole rows or none: a failed write (disk full) is cut back to the last whole row."""
        view, offset = memoryview(data), self.bytes_written
        try:
            while view:
                done = os.pwrite(self._fd, view, offset)
                view, offset = view[done:], offset + done
        except OSError:
            try:
                os.ftruncate(self._fd, self.bytes_written)
            except OSError:
                pass
            raise
        self.rows_written += rows
        self.bytes_written = offset

    def write(self, rows: list[dict]) -> None:
        if not rows:
            return
        lines = [",".join(_format(row.get(c, math.nan)) for c in self.columns) for row in rows]
        self._append(("\n".join(lines) + "\n").encode(), len(rows))

    def sync(self) -> None:
        """Everything written so far is on disk (before a checkpoint that counts it)."""
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def check_log_prefix(path: Path, columns: list[str], rows: int, size: int) -> None:
    """RunFileError unless the first ``size`` bytes of the log are its header and ``rows`` rows."""
    path = refuse_link(Path(path))
    header = (",".join(columns) + "\n").encode()
    try:
        fh = open_run_file(path)
    except FileNotFoundError:
        raise RunFileError(f"{str(path)!r} is missing") from None
    with fh:
        first = fh.read(len(header))
        if first != header[:size] or size < len(header):
            raise RunFileError(f"{str(path)!r} does not start with this run's header of "
                               f"{len(columns)} columns")
        seen, newlines, last = len(first), 1, first[-1:]
        while seen < size:               # in blocks: a long run's log can be large
            block = fh.read(min(1 << 20, size - seen))
            if not block:
                break
            seen, newlines, last = seen + len(block), newlines + block.count(b"\n"), block[-1:]
    if seen < size:
        raise RunFileError(f"{str(path)!r} holds {seen} bytes, fewer than the {size} the "
                           "checkpoint counts (it was truncated or replaced)")
    if last != b"\n" or newlines != rows + 1:
        raise RunFileError(f"{str(path)!r} does not hold the {rows} complete rows the checkpoint "
                           f"counts in its first {size} bytes")


def chunk_name(index: int) -> str:
    return f"chunk_{index:05d}.npz"


class TrajectoryWriter:
    """Tokens at chosen steps, as compressed chunks trajectory/chunk_NNNNN.npz
    (arrays ``steps``, ``times``, ``tokens``) plus trajectory/meta.json (run parameters).

    ``frames_written`` counts every frame on disk, across resumes (``first_frames``)."""

    def __init__(self, folder: Path, meta: dict, chunk_frames: int = 50, first_chunk: int = 0,
                 first_frames: int = 0):
        self.folder = real_folder(Path(folder))
        write_json(self.folder / "meta.json", {"schema": TRAJECTORY_SCHEMA, **meta})
        self.chunk_frames = int(chunk_frames)
        self.next_chunk = int(first_chunk)
        self._steps: list[int] = []
        self._times: list[float] = []
        self._tokens: list[np.ndarray] = []
        self.frames_written = int(first_frames)

    def add(self, step: int, time: float, tokens: np.ndarray) -> None:
        self._steps.append(int(step))
        self._times.append(float(time))
        self._tokens.append(np.array(tokens, copy=True))
        if len(self._steps) >= self.chunk_frames:
            self.flush()

    def flush(self) -> None:
        if not self._steps:
            return
        buf = io.BytesIO()
        np.savez_compressed(buf, steps=np.array(self._steps, dtype=np.int64),
                            times=np.array(self._times), tokens=np.stack(self._tokens))
        atomic_write_bytes(self.folder / chunk_name(self.next_chunk), buf.getvalue())
        self.frames_written += len(self._steps)
        self.next_chunk += 1
        self._steps, self._times, self._tokens = [], [], []

    def close(self) -> None:
        self.flush()


def read_chunk(chunk: Path, keys=("steps", "times", "tokens")) -> dict:
    """The arrays ``keys`` of one trajectory chunk file (RunFileError if it is missing, a link,
    corrupt, or its arrays differ in length)."""
    refuse_link(chunk)
    try:
        fh = open_run_file(chunk, "trajectory chunk ")
    except FileNotFoundError:
        raise RunFileError(f"trajectory chunk {str(chunk)!r} is missing") from None
    try:
        with fh, np.load(fh, allow_pickle=False) as data:
            out = {k: data[k] for k in keys}
    except Exception as err:  # noqa: BLE001 - a zip, a header or an array can be broken in many ways
        raise RunFileError(f"trajectory chunk {str(chunk)!r} is corrupt or truncated "
                           f"({type(err).__name__}: {err})") from None
    n = len(out.get("steps", ()))
    if any(np.ndim(v) < 1 or len(v) != n for v in out.values()):
        raise RunFileError(f"trajectory chunk {str(chunk)!r} holds arrays of different lengths")
    return out


def trajectory_chunks(folder: Path) -> list[Path]:
    """The chunk files of a trajectory folder, in order; a gap in the numbering is an error."""
    chunks = sorted(Path(folder).glob("chunk_*.npz"))
    for i, chunk in enumerate(chunks):
        if chunk.name != chunk_name(i):
            raise RunFileError(f"trajectory {str(folder)!r}: expected {chunk_name(i)}, found "
                               f"{chunk.name} (a chunk is missing)")
    return chunks


def count_frames(folder: Path, chunks: int) -> int:
    """Frames in the first ``chunks`` chunk files (RunFileError if one is missing or corrupt)."""
    total = 0
    for i in range(chunks):
        path = Path(folder) / chunk_name(i)
        total += len(read_chunk(path, ("steps",))["steps"])
    return total


def load_trajectory(path: str | Path):
    """The trajectory of a run directory (or its trajectory folder) as a named result:
    ``.steps``, ``.times``, ``.tokens``, ``.meta`` (it also unpacks as that 4-tuple).

    tokens has shape (frames, n, d), or (frames, R, n, d) for an ensemble.
    """
    folder = Path(path)
    if (folder / "trajectory").is_dir():
        folder = folder / "trajectory"
    if not (folder / "meta.json").is_file():
        raise MissingFileError(f"no trajectory in {str(path)!r} (expected trajectory/meta.json)")
    meta = read_json(folder / "meta.json")
    chunks = trajectory_chunks(folder)
    if not chunks:
        raise MissingFileError(f"trajectory in {str(folder)!r} has no chunks yet")
    parts = [read_chunk(chunk) for chunk in chunks]
    shapes = {p["tokens"].shape[1:] for p in parts}
    if len(shapes) > 1:
        raise RunFileError(f"trajectory {str(folder)!r} mixes token shapes {sorted(shapes)}: its "
                           "chunks come from different runs")
    steps = np.concatenate([p["steps"] for p in parts])
    if np.any(np.diff(steps) <= 0):
        raise RunFileError(f"trajectory {str(folder)!r}: steps are not increasing; its chunks come "
                           "from different runs or an older version of one")
    return Trajectory(steps, np.concatenate([p["times"] for p in parts]),
                      np.concatenate([p["tokens"] for p in parts]), meta)


def load_log(path: str | Path) -> Result:
    """The CSV log as a ``particles.Result`` (a mapping column -> array, as ``sim.run`` returns;
    step, replica and layer as integers, every other column float64): the one log reader (NumPy
    only; pandas.read_csv works too). ``path``: log.csv or the run directory holding it."""
    path = Path(path)
    if path.is_dir():
        path = path / "log.csv"
    text = _read_run_text(path, "log ", FileNotFoundError(f"no log at {str(path)!r}"))
    lines = text.splitlines()
    if not lines or not lines[0].strip():
        raise RunFileError(f"log {str(path)!r} is empty: it has no header row")
    names = lines[0].split(",")
    width = len(names)
    bad = [i + 2 for i, line in enumerate(lines[1:]) if len(line.split(",")) != width]
    if bad:
        raise RunFileError(f"log {str(path)!r}: line {bad[0]} does not have the header's {width} "
                           f"columns ({len(bad)} such lines); the file is truncated or mixed")
    try:
        values = np.array([[float(v) for v in line.split(",")] for line in lines[1:]],
                          dtype=np.float64).reshape(len(lines) - 1, width)
    except ValueError as err:
        raise RunFileError(f"log {str(path)!r} holds a value that is not a number ({err})") from None
    return Result({name: values[:, j].astype(np.int64) if name in ("step", "replica", "layer")
                   else values[:, j].copy() for j, name in enumerate(names)})
