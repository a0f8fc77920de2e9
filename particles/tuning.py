"""Speed choices measured on this machine, not written in the code.

A choice that changes only speed (never which arithmetic is done, only its order) is picked
the first time a shape class is used: each of a few candidates is compiled and timed on the
real shape (interleaved rounds, best of each, so a burst of load elsewhere hits all alike),
another than the default is kept only when it is clearly faster (MARGIN), and the pick is
cached on disk under a key holding the CPU
(``machine.describe``), so a laptop and a cluster node each keep their own. Every candidate
computes the same numbers to the dtype's tolerance (tests hold each to the float64 reference).

Today one choice is tuned: the register tiles of the large-n CPU pass (``kernels_wide``):
lanes per vector (8 or 16 float32, i.e. 256- or 512-bit), row vectors per tile and columns
per score tile. 512-bit vectors win where the FMA units are 512 bits wide (Zen 5); on CPUs
that split or down-clock 512-bit work, 256-bit vectors can win.

``PARTICLES_TUNING`` overrides, for tests and benchmarks:
    measure (default)   measure once per shape class and machine, then use the cache
    off                 the built-in defaults, nothing measured or read
    wide=8x3x6          these tiles (lanes x rows x columns) for every wide pass
``PARTICLES_TUNING_CACHE`` names the cache file (default: ``particles/tuning.json`` in the
user's cache folder, beside Taichi's offline cache).
"""
from __future__ import annotations

import json
import os
import stat
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import backend, machine
from .atomic import atomic_write_text
from .errors import ParticlesUserError

ENV = "PARTICLES_TUNING"
CACHE_ENV = "PARTICLES_TUNING_CACHE"
ROUNDS = 3      # timed passes per candidate, interleaved
MARGIN = 0.9    # another candidate replaces the default when it takes less than this fraction
SETTLE_S = 0.2  # a pause before timing: OpenBLAS's threads spin ~0.1 s after NumPy's last matmul


@dataclass(frozen=True)
class WideTiles:
    """Register tiles of the wide pass: `lanes` per vector, `rows` row vectors by `cols`
    columns per score tile (rows * lanes must be a multiple of cols)."""
    lanes: int
    rows: int
    cols: int

    @property
    def label(self) -> str:
        return f"{self.lanes}x{self.rows}x{self.cols}"

    @classmethod
    def parse(cls, text: str) -> "WideTiles":
        try:
            lanes, rows, cols = (int(p) for p in text.split("x"))
        except ValueError:
            raise ParticlesUserError(f"{ENV}: wide tiles are LANESxROWSxCOLS (e.g. 16x3x6), got {text!r}") from None
        tiles = cls(lanes, rows, cols)
        if lanes not in (4, 8, 16) or not 1 <= rows <= 4 or not 1 <= cols <= 8 or (rows * lanes) % cols:
            raise ParticlesUserError(f"{ENV}: wide tiles {text!r} are not allowed: lanes 4, 8 or 16, "
                                     "rows 1 to 4, columns 1 to 8 dividing rows x lanes")
        return tiles


# by dtype: the default first (measured best on a Zen 5 EPYC), then the alternatives tried
WIDE_CANDIDATES = {
    "float32": (WideTiles(16, 3, 6), WideTiles(8, 3, 6), WideTiles(16, 2, 4)),
    "float64": (WideTiles(8, 3, 6), WideTiles(4, 3, 6), WideTiles(8, 2, 4)),
}


@dataclass(frozen=True)
class Choice:
    tiles: WideTiles
    how: str   # "default", "set by PARTICLES_TUNING", "measured", "cached"

    def describe(self) -> str:
        return f"wide {self.tiles.label} ({self.how})"


def cache_path() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "particles" / "tuning.json"


def shape_class(dtype: str, d: int, r: int, rv: int, softmax: bool, n: int) -> str:
    """The key a pick is cached under: the CPU, then the pass's compile-time shape and n to the
    next power of two (the tiles' efficiency changes slowly with n)."""
    bucket = 1 << max(0, (n - 1).bit_length())
    return (f"{machine.describe(backend.fingerprint())} | wide {dtype} d={d} r={r} rv={rv} "
            f"{'softmax' if softmax else 'exp'} n~{bucket}")


def pass_class(key: str) -> str:
    """A shape class without the machine: what a run or sweep records of its tiles."""
    return key.rsplit(" | ", 1)[-1]


_PINS: list = []   # the innermost ``pinned`` scope: (tiles by pass class, measure, why, chosen)


@contextmanager
def pinned(tiles: dict | None = None, *, measure: bool = True, why: str = "kept"):
    """Within it a wide pass whose class (``pass_class``) is in ``tiles`` (or any class, under
    "*") takes those tiles, whatever the cache or PARTICLES_TUNING says; with measure=False
    the others take the default instead of being measured. Yields the choices made, class ->
    label, for the caller to record: a run (or a sweep) keeps the tiles it started with, so
    that its resume is bitwise whatever was measured since (other tiles sum in another order)."""
    chosen: dict[str, str] = {}
    _PINS.append((dict(tiles or {}), measure, why, chosen))
    try:
        yield chosen
    finally:
        _PINS.pop()


def tiles_now() -> dict[str, str]:
    """The tiles a sweep starts with, pass class -> label ("*": every class), by
    PARTICLES_TUNING: 'off' none (the defaults), 'wide=...' those, else this machine's cached
    picks (a class not cached takes the default: a sweep's workers measure nothing)."""
    mode = os.environ.get(ENV, "").strip() or "measure"
    if mode == "off":
        return {}
    if mode.startswith("wide="):
        return {"*": WideTiles.parse(mode[len("wide="):]).label}
    mine = machine.describe(backend.fingerprint()) + " | "
    return {pass_class(key): entry["choice"] for key, entry in _read(cache_path()).items()
            if key.startswith(mine) and isinstance(entry, dict) and isinstance(entry.get("choice"), str)}


def check_pins(tiles, where: str) -> dict[str, str]:
    """Recorded tiles (a run's or sweep's JSON) as class -> label; ParticlesUserError naming
    ``where`` when they are not."""
    if not isinstance(tiles, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in tiles.items()):
        raise ParticlesUserError(f"{where} must map pass classes to tiles such as \"16x3x6\", "
                                 f"got {json.dumps(tiles)[:80]}")
    for label in tiles.values():
        try:
            WideTiles.parse(label)
        except ParticlesUserError:
            raise ParticlesUserError(f"{where} holds tiles {label!r}, not LANESxROWSxCOLS with lanes "
                                     "4, 8 or 16, rows 1 to 4, columns 1 to 8 dividing rows x lanes") from None
    return dict(tiles)


def wide_tiles(dtype: str, key: str, prepare: Callable[[WideTiles], Callable[[], None]]) -> Choice:
    """The tiles for one wide pass: pinned (``pinned``), overridden, cached, or measured now
    (``prepare(tiles)`` compiles a candidate and returns one synchronous pass of it to time)."""
    if not _PINS:
        return _wide_tiles(dtype, key, prepare)
    tiles, measure, why, chosen = _PINS[-1]
    label = tiles.get(pass_class(key), tiles.get("*"))
    if label is not None:
        choice = Choice(WideTiles.parse(label), why)
    elif measure:
        choice = _wide_tiles(dtype, key, prepare)
    else:
        choice = Choice(WIDE_CANDIDATES[dtype][0], "default")
    chosen[pass_class(key)] = choice.tiles.label
    return choice


def _wide_tiles(dtype: str, key: str, prepare) -> Choice:
    mode = os.environ.get(ENV, "").strip() or "measure"   # set but empty: as unset
    default = WIDE_CANDIDATES[dtype][0]
    if mode == "off":
        return Choice(default, "default")
    if mode.startswith("wide="):
        return Choice(WideTiles.parse(mode[len("wide="):]), f"set by {ENV}")
    if mode != "measure":
        raise ParticlesUserError(f"{ENV}={mode!r} is not allowed: 'measure' (the default), 'off', "
                                 "or 'wide=LANESxROWSxCOLS'")
    entry = _read(cache_path()).get(key)
    label = entry.get("choice") if isinstance(entry, dict) else None
    by_label = {t.label: t for t in WIDE_CANDIDATES[dtype]}
    if isinstance(label, str) and label in by_label:   # anything else: measured again
        return Choice(by_label[label], "cached")
    seconds = best_times(WIDE_CANDIDATES[dtype], prepare)
    fastest = min(WIDE_CANDIDATES[dtype], key=lambda t: seconds[t.label])
    best = fastest if seconds[fastest.label] < MARGIN * seconds[default.label] else default
    cache = _read(cache_path())   # another process may have written meanwhile
    cache[key] = {"choice": best.label, "seconds_per_pass": seconds,
                  "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
    _write(cache_path(), cache)
    return Choice(best, "measured")


def best_times(candidates, prepare) -> dict[str, float]:
    """Seconds per pass of each candidate: compiled and run once, then ROUNDS interleaved
    timed passes, the best of each."""
    passes = {}
    for tiles in candidates:
        passes[tiles.label] = prepare(tiles)
        passes[tiles.label]()   # the first run compiles
    seconds = {label: float("inf") for label in passes}
    time.sleep(SETTLE_S)
    for _ in range(ROUNDS):
        for label, one_pass in passes.items():
            t0 = time.perf_counter()
            one_pass()
            seconds[label] = min(seconds[label], time.perf_counter() - t0)
    return seconds


CACHE_LIMIT = 4_000_000   # bytes: a cache holds a few hundred bytes per shape class and CPU


def _read(path: Path) -> dict:
    """The cache's entries; {} (so measured again) when it is absent, damaged, nested too deeply
    to parse, larger than CACHE_LIMIT, or not a regular file (a FIFO is not waited on, a device
    such as /dev/zero is not read)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError):
        return {}
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > CACHE_LIMIT:
            return {}
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = json.loads(fh.read(CACHE_LIMIT + 1))
    except (OSError, ValueError, RecursionError):   # damaged: measure again
        return {}
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else {}


def _storable(cache: dict) -> dict:
    """The entries that are standard JSON: one holding NaN or Infinity (Python's json reads
    them, other readers do not) or nested too deeply to write is dropped, measured again when
    next needed."""
    kept = {}
    for key, entry in cache.items():
        try:
            json.dumps(entry, indent=1, allow_nan=False)
        except (ValueError, TypeError, RecursionError):
            continue
        kept[key] = entry
    return kept


def _write(path: Path, data: dict) -> None:
    """Best effort: the cache is written only where nothing or a regular file stands (never a
    device, FIFO, folder or link: PARTICLES_TUNING_CACHE=/dev/null must not replace the device);
    a cache that cannot be written costs a measurement next time, nothing else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    except (OSError, ValueError):
        return
    else:
        if not stat.S_ISREG(st.st_mode):
            return
    try:
        text = json.dumps(_storable(data), indent=1, sort_keys=True, allow_nan=False)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)
    except (OSError, ValueError, RecursionError):   # SymlinkRefused included
        pass
