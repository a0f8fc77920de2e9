"""Parameter sweeps: a scene plus axes, expanded to replicas, batched into ensembles, streamed
to a results table that survives a kill.

    from particles.app.sweep import load_sweep, run_sweep
    table = run_sweep("phase_diagram_1head", "sweeps/pd1")       # -> sweeps/pd1/results.csv

A sweep file (TOML) is a scene plus two tables::

    scene = "quickstart"              # a bundled scene name, or a path relative to this file;
                                      # or no `scene` and the scene's own sections inline
    batch = 256                       # optional: at most this many replicas per work unit

    [dynamics]                        # optional: scene sections, merged onto `scene` key by key
    rule = "softmax"                  # ([heads] replaces the scene's heads whole)

    [axes]                            # the grid: the product of every axis, in file order
    "dynamics.beta" = {from = 0.1, to = 9.0, num = 90}      # linspace (log = true: geomspace)
    "tokens.seed"   = {count = 64}                          # 0..63 (start = s: s..s+63)
    "heads.count"   = [1, 2, 4, 8]                          # any list of values
    "heads.0.strength" = {from = 0.5, to = 2.0, step = 0.5} # an entry of [[heads]]

    [record]
    times = [0.0, 5.0, 20.0]          # or {from, to, num[, log]}; default: the end only
    observables = ["eps", "energy"]   # log columns (docs/LOG.md); default ["eps"]
    clusters = true                   # cluster count at each recorded time ...
    threshold = 0.99                  # ... cos > threshold (default: the scene's [log] one)
    clustering_time = {threshold = 1e-3, every = 1}   # first t with eps < threshold, or nan

Rules: axis keys are ``section.key`` of [tokens], [heads] (``heads.<i>.key`` for the i-th
[[heads]] table) or [dynamics]; ``tokens.replicas``, ``dynamics.betas``, ``dynamics.arch`` and
``dynamics.rule_file`` cannot be swept. An axis (or a sweep-file section) setting
``dynamics.t_end`` drops the scene's ``steps`` and vice versa; ``heads.strength`` and
``heads.strengths`` likewise. Integer-valued ranges (``from``/``to``/``step`` integers) give
integers. Record times are rounded to the nearest step (the ``time`` column is step * dt).
Every grid point is validated as a scene; a problem names the grid point (``at heads.count =
8: ...``). The output folder must hold this sweep or nothing: another sweep's folder is
refused (its ``sweep.json`` hash differs).

Every grid point is one replica. Replicas that share a compiled kernel and its arguments --
same n, d, heads, rule, geometry, dtype, dt, integrator, steps; differing only in their
initial tokens (seed, init, ...) and beta -- are batched into ONE ensemble ``Simulation``
(tokens (R, n, d), betas (R,)): a *work unit*, at most ``batch`` replicas. Any other
difference makes separate units. Replicas of an ensemble are independent (one thread per
replica, head and row; no atomics), so a replica's results do not depend on its batch.

The table's columns: ``unit``, ``point`` (grid index), each swept key that is not already a
fixed column (e.g. ``heads.count``; lists as JSON), ``tokens.n``, ``tokens.d``, ``H``,
``tokens.seed``, ``dynamics.beta``, ``step``, ``time``, the recorded observables (``nan`` where
a unit has no such column, e.g. ``energy_h3`` with H = 2, or where a replica blew up),
``min_cosine`` and ``clusters`` (if asked), ``clustering_time`` (if asked; the same on every
row of a replica). ``load_results`` returns them sorted by (point, step).

The output folder holds ``results.csv`` (one row per replica and recorded time),
``units_done.txt`` (the ledger), ``sweep.json`` (what the sweep is, for plots and resume) and
``sweep.toml`` (a copy of the file). The table is CSV, appended and fsync'ed as each unit
finishes: it streams, needs no extra dependency and opens anywhere (``load_results``,
pandas, numpy); Parquet was left out because a Parquet file is unreadable until its writer
closes it, which a killed sweep never does. A unit's rows are written first, then its
ledger line; on a rerun the rows of units missing from the ledger are dropped (they are
recomputed), so a kill at any point never loses a finished unit and never duplicates a row.
"""
from __future__ import annotations

import copy
import csv
import difflib
import hashlib
import io
import itertools
import json
import math
import os
import time
import tomllib
from pathlib import Path
from typing import Any, Callable

import numpy as np

import scenes as _scenes_pkg
from scenes import SceneError
from scenes import schema as _schema

SWEEP_LIBRARY = Path(_scenes_pkg.__file__).resolve().parent / "sweeps"   # the bundled sweeps
RESULTS = "results.csv"
LEDGER = "units_done.txt"
META = "sweep.json"
COPY = "sweep.toml"
DEFAULT_BATCH = 256
MAX_POINTS = 2_000_000
MAX_PROBLEMS = 25
# A test hook: "N" raises after the N-th unit of this invocation is ledgered; "N:rows" after
# its rows are written but before its ledger line (the worst moment for a kill).
ABORT_ENV = "PARTICLES_SWEEP_TEST_ABORT"

TOP_KEYS = ("name", "description", "scene", "batch", "axes", "record")
SCENE_SECTIONS = _schema.SECTIONS            # tokens, heads, dynamics, log, render, output
RECORD_KEYS = ("times", "observables", "clusters", "threshold", "clustering_time")
RANGE_KEYS = ("from", "to", "num", "step", "log", "count", "start")
AXIS_SECTIONS = ("tokens", "heads", "dynamics")
# keys a sweep owns (it makes its own replicas) or that cannot differ within one process
FORBIDDEN_AXES = {
    "tokens.replicas": "a sweep makes its own replicas: sweep \"tokens.seed\" = {count = R}",
    "dynamics.betas": "sweep \"dynamics.beta\" instead (one beta per grid point)",
    "dynamics.arch": "every unit of a sweep runs on one arch; set [dynamics] arch",
    "dynamics.rule_file": "set [dynamics] rule_file once and sweep \"dynamics.rule\"",
}
# setting one key removes the alternative one of the base scene
EXCLUSIVE = {"dynamics.t_end": "steps", "dynamics.steps": "t_end",
             "heads.strength": "strengths", "heads.strengths": "strength"}
# axes whose values vary within one ensemble (validated here; all other axes via the scene)
REPLICA_AXES = {"tokens.seed": _schema.integer(0),
                "dynamics.beta": _schema.number(0, lo_open=True)}
# columns every results table has (swept or not)
FIXED_COLUMNS = ("tokens.n", "tokens.d", "H", "tokens.seed", "dynamics.beta")
PATH_KEYS = {"tokens": ("path",), "dynamics": ("rule_file",),
             "heads": ("basis", "score", "value_matrix")}


class SweepError(SceneError):
    """A sweep that cannot run; ``problems`` lists each problem. Message style of SceneError::

        sweep file 'pd.toml': 2 problems:
          - [axes] "dynamics.beeta": unknown key 'beeta' in [dynamics]; did you mean 'beta'?
          - [record] times: 30 is after the end of the run (t = 20.0 = steps * dt)
    """

    def __init__(self, source: str, problems, is_file: bool = True, what: str | None = None):
        super().__init__(source, problems, is_file)
        label = what or ("sweep file" if is_file else "sweep")
        count = len(self.problems)
        head = f"{label} '{self.source}': {count} problem{'s' if count != 1 else ''}:"
        ValueError.__init__(self, "\n  - ".join([head] + self.problems))


class SweepAborted(RuntimeError):
    """Raised by the test hook ``PARTICLES_SWEEP_TEST_ABORT``."""


# ============================================================================ the sweep file

def bundled_sweeps() -> dict[str, tuple[Path, str]]:
    """Bundled sweep name -> (path, one-line description)."""
    from scenes.scene import library_listing
    return library_listing(SWEEP_LIBRARY)


def _find_sweep_file(name_or_path) -> Path:
    text = os.fspath(name_or_path)
    p = Path(text)
    if p.is_file():
        return p
    if not (text.endswith(".toml") or "/" in text or os.sep in text):
        library = bundled_sweeps()
        if text in library:
            return library[text][0]
        close = difflib.get_close_matches(text, list(library), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise SweepError(text, [f"no sweep file '{text}' and no bundled sweep of that name; "
                                f"{hint}bundled sweeps: {', '.join(library)}"], is_file=False)
    raise SweepError(text, [f"file not found: '{p.resolve()}'"])


def load_sweep(name_or_path) -> "Sweep":
    """A validated sweep from a .toml path or a bundled sweep name (``scenes/sweeps/``).
    Raises SweepError (a SceneError, a ValueError) listing every problem."""
    if isinstance(name_or_path, Sweep):
        return name_or_path
    path = _find_sweep_file(name_or_path)
    source = str(name_or_path)
    from scenes.scene import read_toml
    raw = read_toml(path, source, SweepError)
    return Sweep.from_dict(raw, source=source, base_dir=path.resolve().parent, path=path.resolve())


def _absolutize(raw: dict, base_dir: Path) -> dict:
    """A raw scene dict with its relative file paths made absolute (from its own folder)."""
    out = copy.deepcopy(raw)
    for section, keys in PATH_KEYS.items():
        tables = out.get(section)
        tables = tables if isinstance(tables, list) else [tables]
        for table in tables:
            if not isinstance(table, dict):
                continue
            for key in keys:
                v = table.get(key)
                if isinstance(v, str) and v and not Path(v).expanduser().is_absolute():
                    table[key] = str((base_dir / Path(v).expanduser()).resolve())
    return out


def _merge(base: dict, over: dict) -> dict:
    """Scene sections of the sweep file onto the base scene: tables key by key, heads whole."""
    out = copy.deepcopy(base)
    for section, value in over.items():
        if section == "heads" or not isinstance(value, dict) or not isinstance(out.get(section), dict):
            out[section] = copy.deepcopy(value)
            continue
        for key in value:
            other = EXCLUSIVE.get(f"{section}.{key}")
            if other:
                out[section].pop(other, None)
        out[section].update(copy.deepcopy(value))
    return out


def _show(v) -> str:
    return _schema.show(v)


def _label(assign: dict) -> str:
    return ", ".join(f"{k} = {_show(v)}" for k, v in assign.items())


def _integral(values: list) -> list:
    """Floats that are whole numbers (to 1e-9) become ints, so integer keys can take ranges."""
    out = []
    for v in values:
        r = round(v)
        if abs(v - r) > 1e-9 * max(1.0, abs(v)):
            return values
        out.append(int(r))
    return out


def _expand_values(spec, where: str, problems: list) -> list | None:
    """An axis' (or record.times') list of values from a list or a range table."""
    if isinstance(spec, list):
        if not spec:
            problems.append(f"{where}: the list of values is empty")
            return None
        seen = set()
        for v in spec:
            k = json.dumps(v, sort_keys=True, default=str)
            if k in seen:
                problems.append(f"{where}: the value {_show(v)} appears twice")
                return None
            seen.add(k)
        return list(spec)
    if not isinstance(spec, dict):
        problems.append(f"{where}: expected a list of values or a range table "
                        f"({{from, to, num}}, {{from, to, step}} or {{count}}), got {_show(spec)}")
        return None
    unknown = [k for k in spec if k not in RANGE_KEYS]
    if unknown:
        problems.append(f"{where}: unknown key '{unknown[0]}' in the range table; allowed: "
                        "{from, to, num[, log]}, {from, to, step} or {count[, start]}")
        return None
    ints_given = all(_schema._is_int(spec[k]) for k in ("from", "to", "step", "start") if k in spec)
    if "count" in spec:
        if set(spec) - {"count", "start"}:
            problems.append(f"{where}: {{count}} takes only 'start' besides it (values start.."
                            "start+count-1)")
            return None
        count, start = spec["count"], spec.get("start", 0)
        if not _schema._is_int(count) or count < 1 or not _schema._is_int(start):
            problems.append(f"{where}: count must be an integer >= 1 and start an integer, got "
                            f"count = {_show(count)}, start = {_show(start)}")
            return None
        return list(range(start, start + count))
    if "from" not in spec or "to" not in spec or ("num" in spec) == ("step" in spec):
        problems.append(f"{where}: a range table needs from, to and exactly one of num or step, "
                        f"got {{{', '.join(spec)}}}")
        return None
    lo, hi = spec["from"], spec["to"]
    if not (_schema._is_number(lo) and _schema._is_number(hi) and math.isfinite(lo) and math.isfinite(hi)):
        problems.append(f"{where}: from and to must be finite numbers, got {_show(lo)}, {_show(hi)}")
        return None
    log = spec.get("log", False)
    if not isinstance(log, bool):
        problems.append(f"{where}: log must be true or false, got {_show(log)}")
        return None
    if log and (lo <= 0 or hi <= 0):
        problems.append(f"{where}: log = true needs from > 0 and to > 0, got {lo:g}, {hi:g}")
        return None
    if "num" in spec:
        num = spec["num"]
        if not _schema._is_int(num) or num < 1:
            problems.append(f"{where}: num must be an integer >= 1, got {_show(num)}")
            return None
        if num > 1 and lo == hi:
            problems.append(f"{where}: from = to = {lo:g} with num = {num} repeats one value")
            return None
        values = (np.geomspace(lo, hi, num) if log else np.linspace(lo, hi, num)).tolist()
        values[0] = float(lo)
        values[-1] = float(hi) if num > 1 else values[-1]
    else:
        step = spec["step"]
        if log:
            problems.append(f"{where}: log = true goes with num, not step")
            return None
        if not _schema._is_number(step) or not step > 0 or hi < lo:
            problems.append(f"{where}: step must be a number > 0 and to >= from, got step = "
                            f"{_show(step)}, from = {lo:g}, to = {hi:g}")
            return None
        count = int(math.floor((hi - lo) / step + 1e-9)) + 1
        values = [lo + k * step for k in range(count)]
    if ints_given:
        values = _integral(values)
    return values


def _check_axis_key(key: str, raw: dict) -> str | None:
    """None if ``key`` names a sweepable scene key of ``raw``; else the problem."""
    if not isinstance(key, str) or "." not in key:
        return (f"expected 'section.key' (e.g. \"dynamics.beta\", \"tokens.seed\", "
                f"\"heads.count\"), got {_show(key)}")
    if key in FORBIDDEN_AXES:
        return f"cannot be swept: {FORBIDDEN_AXES[key]}"
    parts = key.split(".")
    section = parts[0]
    if section not in AXIS_SECTIONS:
        if section in SCENE_SECTIONS:
            return f"[{section}] does not change a sweep's results; sweep keys of " \
                   f"{', '.join(f'[{s}]' for s in AXIS_SECTIONS)}"
        close = difflib.get_close_matches(section, AXIS_SECTIONS, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return f"unknown section '{section}'{hint} (sweepable: {', '.join(AXIS_SECTIONS)})"
    allowed = _schema.SECTION_KEYS[section]
    rest = parts[1:]
    if section == "heads":
        heads = raw.get("heads")
        if isinstance(heads, list):
            if len(rest) != 2 or not rest[0].isdigit():
                return (f"the scene has {len(heads)} [[heads]] tables: name one by its index, "
                        f"e.g. \"heads.0.{rest[-1]}\"")
            if int(rest[0]) >= len(heads):
                return f"head index {rest[0]} out of range 0..{len(heads) - 1}"
            rest = rest[1:]
        elif len(rest) != 1:
            return ("the scene's heads are one [heads] table (or none): name a key of it, e.g. "
                    "\"heads.count\"")
    if len(rest) != 1:
        return f"expected '{section}.key', got {_show(key)}"
    if rest[0] not in allowed:
        close = difflib.get_close_matches(rest[0], allowed, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else f" (allowed: {', '.join(allowed)})"
        return f"unknown key '{rest[0]}' in [{section}]{hint}"
    return None


def _apply(raw: dict, assign: dict) -> dict:
    """``raw`` with each axis value set (creating [heads] / sections as needed)."""
    out = copy.deepcopy(raw)
    for key, value in assign.items():
        parts = key.split(".")
        section = parts[0]
        if section == "heads" and not isinstance(out.get("heads"), (dict, list)):
            out["heads"] = {"kind": "scalar"}        # the scene's default: one scalar head
        node = out.setdefault(section, {})
        for part in parts[1:-1]:
            node = node[int(part)] if isinstance(node, list) else node[part]
        last = parts[-1]
        alias = EXCLUSIVE.get(f"{section}.{last}")
        if alias and isinstance(node, dict):
            node.pop(alias, None)
        node[last] = copy.deepcopy(value)
    return out


def _cell(v) -> str:
    """A value as a CSV cell (full precision; lists as JSON)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        v = float(v)
        return "nan" if math.isnan(v) else repr(v)
    if isinstance(v, str):
        return v
    return json.dumps(v, separators=(",", ":"))


class Sweep:
    """A validated sweep: the grid (``points``), its work units (``units``), the record spec.

    points: one dict per grid point, in grid order (first axis slowest): ``index``, ``axes``
    (axis key -> value), ``seed``, ``beta``, ``unit``.
    units: the work units (plain dicts, picklable; ``run_unit`` in particles.sweep_executors
    runs one): id, scene (resolved tokens/heads/dynamics of the unit), tokens (one resolved
    [tokens] table per replica), betas, points, record.
    """

    def __init__(self, *, name, description, source, path, base_dir, raw, base_raw, axes,
                 record, batch, points, units, columns, unit_meta):
        self.name, self.description, self.source, self.path = name, description, source, path
        self.base_dir, self.raw, self.base_raw = base_dir, raw, base_raw
        self.axes: list[tuple[str, list]] = axes
        self.record, self.batch = record, batch
        self.points, self.units, self.columns, self.unit_meta = points, units, columns, unit_meta
        blob = json.dumps({"units": units, "columns": columns}, sort_keys=True, default=str)
        self.spec_hash = hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def n_replicas(self) -> int:
        return len(self.points)

    @property
    def axis_columns(self) -> list[str]:
        return [k for k, _ in self.axes if k not in FIXED_COLUMNS]

    def __repr__(self) -> str:
        axes = ", ".join(f"{k} x{len(v)}" for k, v in self.axes)
        return (f"Sweep({self.name!r}: {self.n_replicas} replicas in {len(self.units)} units; "
                f"axes {axes}; source={self.source!r})")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, raw: dict, source: str = "<dict>", base_dir=None,
                  path: Path | None = None) -> "Sweep":
        """Validate a sweep dict (as read from TOML); relative paths start at ``base_dir``."""
        is_file = path is not None
        problems: list[str] = []
        base_dir = Path(base_dir).resolve() if base_dir is not None else Path.cwd()
        if not isinstance(raw, dict):
            raise SweepError(source, [f"expected a table, got {_show(raw)}"], is_file)
        for key, value in raw.items():
            if key not in TOP_KEYS + SCENE_SECTIONS:
                allowed = TOP_KEYS + SCENE_SECTIONS
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else f" (allowed: {', '.join(allowed)})"
                problems.append(f"unknown {'section' if isinstance(value, dict) else 'top-level key'} "
                                f"'{key}'{hint}")
        name = raw.get("name", path.stem if path is not None else "sweep")
        if not isinstance(name, str) or not name.strip() or any(c in name for c in "/\\"):
            problems.append(f"top-level name: expected a non-empty string without '/' or '\\', "
                            f"got {_show(name)}")
            name = "sweep"
        description = raw.get("description", "")
        if not isinstance(description, str):
            problems.append(f"top-level description: expected a string, got {_show(description)}")
            description = ""
        batch = raw.get("batch", DEFAULT_BATCH)
        if not _schema._is_int(batch) or batch < 1:
            problems.append(f"top-level batch: expected an integer >= 1 (replicas per work "
                            f"unit), got {_show(batch)}")
            batch = DEFAULT_BATCH

        # the base scene: a bundled name or a path, then the sweep file's own sections
        base_raw: dict = {}
        if "scene" in raw:
            base_raw = _base_scene(raw["scene"], base_dir, problems)
        inline = {k: raw[k] for k in SCENE_SECTIONS if k in raw}
        if "scene" not in raw and "tokens" not in inline:
            problems.append("no scene: give scene = \"<bundled name or path>\" or the scene's "
                            "sections inline ([tokens] with n and d at least)")
        base_raw = _merge(base_raw, inline)
        for key in ("replicas",):
            if isinstance(base_raw.get("tokens"), dict) and base_raw["tokens"].get(key, 1) != 1:
                problems.append(f"[tokens] {key}: {FORBIDDEN_AXES['tokens.replicas']}")
        if isinstance(base_raw.get("dynamics"), dict) and "betas" in base_raw["dynamics"]:
            problems.append(f"[dynamics] betas: {FORBIDDEN_AXES['dynamics.betas']}")

        # the axes
        axes: list[tuple[str, list]] = []
        raw_axes = raw.get("axes", {})
        if not isinstance(raw_axes, dict):
            problems.append(f"[axes]: expected a table of \"section.key\" = values, got {_show(raw_axes)}")
            raw_axes = {}
        for key, spec in raw_axes.items():
            where = f"[axes] \"{key}\""
            bad = _check_axis_key(key, base_raw)
            if bad:
                problems.append(f"{where}: {bad}")
                continue
            values = _expand_values(spec, where, problems)
            if values is None:
                continue
            if key in REPLICA_AXES:
                spec_ = REPLICA_AXES[key]
                wrong = []
                for v in values:
                    try:
                        spec_.convert(v)
                    except _schema._Bad:
                        wrong.append(v)
                if wrong:
                    problems.append(f"{where}: expected values that are each {spec_.expected}, "
                                    f"got {_show(wrong[0])}")
                    continue
                if key == "dynamics.beta":
                    values = [float(v) for v in values]
            axes.append((key, values))
        size = math.prod(len(v) for _, v in axes)
        if size > MAX_POINTS:
            problems.append(f"[axes]: the grid has {size} points, more than {MAX_POINTS}")

        record_raw = raw.get("record", {})
        if not isinstance(record_raw, dict):
            problems.append(f"[record]: expected a table, got {_show(record_raw)}")
            record_raw = {}
        record = _record_spec(record_raw, problems)
        if problems:
            raise SweepError(source, problems[:MAX_PROBLEMS], is_file)

        points, units, columns, unit_meta = _expand(axes, base_raw, base_dir, record, batch,
                                                    problems)
        if problems:
            raise SweepError(source, _dedupe(problems)[:MAX_PROBLEMS], is_file)
        return cls(name=name, description=description, source=source, path=path,
                   base_dir=base_dir, raw=raw, base_raw=base_raw, axes=axes, record=record,
                   batch=batch, points=points, units=units, columns=columns, unit_meta=unit_meta)


def _dedupe(items):
    seen, out = set(), []
    for x in items:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def _base_scene(ref, base_dir: Path, problems: list) -> dict:
    from scenes import bundled_scenes
    if not isinstance(ref, str) or not ref.strip():
        problems.append(f"top-level scene: expected a bundled scene name or a path, got {_show(ref)}")
        return {}
    library = bundled_scenes()
    candidate = (base_dir / Path(ref).expanduser())
    if ref.endswith(".toml") or "/" in ref or os.sep in ref or candidate.is_file():
        path = candidate.resolve()
        if not path.is_file():
            problems.append(f"top-level scene: file not found: '{path}' (relative paths start at "
                            f"the sweep file's folder '{base_dir}')")
            return {}
    elif ref in library:
        path = library[ref][0]
    else:
        close = difflib.get_close_matches(ref, list(library), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        problems.append(f"top-level scene: no bundled scene '{ref}' and no file of that name; "
                        f"{hint}bundled scenes: {', '.join(library)}")
        return {}
    try:
        with open(path, "rb") as fh:
            base = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        problems.append(f"top-level scene: '{path}' is not valid TOML: {exc}")
        return {}
    except OSError as exc:
        problems.append(f"top-level scene: cannot read '{path}': {exc}")
        return {}
    return _absolutize(base, path.parent)


def _record_spec(raw: dict, problems: list) -> dict:
    for key in raw:
        if key not in RECORD_KEYS:
            close = difflib.get_close_matches(key, RECORD_KEYS, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f" (allowed: {', '.join(RECORD_KEYS)})"
            problems.append(f"unknown key '{key}' in [record]{hint}")
    rec: dict[str, Any] = {"times": None, "observables": ["eps"], "clusters": False,
                           "min_cosine": False, "threshold": None, "clustering_time": None,
                           "clustering_every": 1}
    if "times" in raw:
        times = _expand_values(raw["times"], "[record] times", problems)
        if times is not None:
            bad = [t for t in times if not _schema._is_number(t) or not math.isfinite(t) or t < 0]
            if bad:
                problems.append(f"[record] times: expected numbers >= 0 (time units), got {_show(bad[0])}")
            else:
                rec["times"] = sorted(float(t) for t in times)
    if "observables" in raw:
        obs = raw["observables"]
        if not isinstance(obs, list) or not all(isinstance(o, str) for o in obs):
            problems.append(f"[record] observables: expected a list of log column names "
                            f"(docs/LOG.md), got {_show(obs)}")
        elif len(set(obs)) != len(obs):
            problems.append("[record] observables: a name appears twice")
        else:
            obs = [o for o in obs if o not in ("step", "time")]
            if "clusters" in obs:
                rec["clusters"] = True
            if "min_cosine" in obs:
                rec["min_cosine"] = True
            rec["observables"] = [o for o in obs if o not in ("clusters", "min_cosine")]
    if "clusters" in raw:
        if not isinstance(raw["clusters"], bool):
            problems.append(f"[record] clusters: expected true or false, got {_show(raw['clusters'])}")
        else:
            rec["clusters"] = rec["clusters"] or raw["clusters"]
    if "threshold" in raw:
        thr = raw["threshold"]
        if not _schema._is_number(thr) or not -1 < thr < 1:
            problems.append(f"[record] threshold: expected a number in (-1, 1) (two tokens are in "
                            f"one cluster when their cosine exceeds it), got {_show(thr)}")
        else:
            rec["threshold"] = float(thr)
    if "clustering_time" in raw:
        ct = raw["clustering_time"]
        if ct is True:
            ct = {}
        if ct is False:
            pass
        elif not isinstance(ct, dict):
            problems.append(f"[record] clustering_time: expected a table {{threshold = 1e-3, "
                            f"every = 1}} or true/false, got {_show(ct)}")
        else:
            unknown = [k for k in ct if k not in ("threshold", "every")]
            thr, every = ct.get("threshold", 1e-3), ct.get("every", 1)
            if unknown:
                problems.append(f"[record] clustering_time: unknown key '{unknown[0]}' (allowed: "
                                "threshold, every)")
            elif not _schema._is_number(thr) or not 0 < thr <= 2:
                problems.append(f"[record] clustering_time: threshold: expected a number in (0, 2] "
                                f"(eps = 1 - mean cosine), got {_show(thr)}")
            elif not _schema._is_int(every) or every < 1:
                problems.append(f"[record] clustering_time: every: expected an integer >= 1 "
                                f"(steps between eps checks), got {_show(every)}")
            else:
                rec["clustering_time"], rec["clustering_every"] = float(thr), int(every)
    return rec


def _valid_observables(H: int) -> list[str]:
    from particles.observables import columns
    cols = columns(H, entropy_rate=True, clusters=False, ensemble=False)
    return [c for c in cols if c not in ("step", "time")]


def _expand(axes, base_raw, base_dir, record, batch, problems):
    """Grid points -> resolved replicas -> work units; problems appended, never raised."""
    from scenes import Scene

    keys = [k for k, _ in axes]
    slow_keys = [k for k in keys if k not in REPLICA_AXES]
    cache: dict[str, tuple[dict | None, str]] = {}     # slow assignment -> (resolved, group)
    groups: dict[str, dict] = {}                        # group key -> info + its points
    points = []
    for index, combo in enumerate(itertools.product(*[v for _, v in axes])):
        assign = dict(zip(keys, combo))
        slow = {k: assign[k] for k in slow_keys}
        ck = json.dumps(slow, sort_keys=True, default=str)
        if ck not in cache:
            raw = _apply(base_raw, slow)
            where = f"at {_label(slow)}: " if slow else ""
            try:
                scene = Scene.from_dict(raw, source="sweep", base_dir=base_dir)
            except SceneError as exc:
                problems.extend(where + p for p in exc.problems)
                cache[ck] = (None, "")
                continue
            data = scene.data
            dyn = {k: v for k, v in data["dynamics"].items() if k not in ("beta", "betas")}
            gkey = json.dumps({"n": data["tokens"]["n"], "d": data["tokens"]["d"],
                               "heads": data["heads"], "dynamics": dyn}, sort_keys=True, default=str)
            cache[ck] = (data, gkey)
            if gkey not in groups:
                groups[gkey] = {"data": data, "slow": slow, "points": [], "where": where}
        data, gkey = cache[ck]
        if data is None:
            continue
        tokens = dict(data["tokens"])
        tokens.pop("replicas", None)
        if "tokens.seed" in assign:
            tokens["seed"] = int(assign["tokens.seed"])
        beta = float(assign.get("dynamics.beta", data["dynamics"]["beta"]))
        point = {"index": index, "axes": assign, "seed": int(tokens.get("seed", 0)), "beta": beta,
                 "tokens": tokens, "unit": None}
        points.append(point)
        groups[gkey]["points"].append(point)
    if problems:
        return [], [], [], {}

    # record steps per group, observables per group
    all_valid: set[str] = set()
    H_values = set()
    units, unit_meta = [], {}
    for g in groups.values():
        data = g["data"]
        dyn = data["dynamics"]
        H = _n_heads(data)
        H_values.add(H)
        all_valid.update(_valid_observables(H))
        steps, dt = int(dyn["steps"]), float(dyn["dt"])
        t_end = steps * dt
        times = record["times"] if record["times"] is not None else [t_end]
        late = [t for t in times if t > t_end * (1 + 1e-9) + 1e-12]
        if late:
            problems.append(f"{g['where']}[record] times: {late[0]:g} is after the end of the run "
                            f"(t = {t_end:g} = steps * dt = {steps} * {dt:g})")
            continue
        rec_steps = sorted({min(steps, int(round(t / dt))) for t in times})
        threshold = record["threshold"]
        if threshold is None:
            threshold = float(data["log"].get("cluster_threshold", 0.99))
        unit_record = {"steps": rec_steps, "observables": list(record["observables"]),
                       "clusters": record["clusters"], "min_cosine": record["min_cosine"],
                       "threshold": threshold, "clustering_time": record["clustering_time"],
                       "clustering_every": record["clustering_every"]}
        scene_part = {"tokens": {"n": data["tokens"]["n"], "d": data["tokens"]["d"]},
                      "heads": data["heads"], "dynamics": data["dynamics"]}
        pts = g["points"]
        k = -(-len(pts) // batch)                      # units of near-equal size <= batch
        bounds = [round(i * len(pts) / k) for i in range(k + 1)]
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            chunk = pts[lo:hi]
            uid = f"u{len(units):05d}"
            for p in chunk:
                p["unit"] = uid
            units.append({"id": uid, "scene": scene_part,
                          "tokens": [p["tokens"] for p in chunk],
                          "betas": [p["beta"] for p in chunk],
                          "points": [p["index"] for p in chunk],
                          "record": unit_record})
            unit_meta[uid] = _unit_meta(data, H, unit_record, len(chunk))
    bad = [o for o in record["observables"] if o not in all_valid]
    if bad:
        hs = sorted(H_values)
        allowed = _valid_observables(1)
        close = difflib.get_close_matches(bad[0], sorted(all_valid), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        problems.append(
            f"[record] observables: '{bad[0]}' is not a log column of any unit; {hint}(heads per unit: "
            f"{', '.join(map(str, hs))}); allowed: {', '.join(c for c in allowed if not c.endswith('_h0'))}, "
            "the per-head columns <name>_h<h> with h < H (" +
            ", ".join(c[:-3] for c in allowed if c.endswith('_h0')) + "), clusters, min_cosine "
            "(see docs/LOG.md)")
    if problems:
        return [], [], [], {}
    columns = _columns(axes, record)
    for p in points:
        del p["tokens"]
    return points, units, columns, unit_meta


def _n_heads(data: dict) -> int:
    heads = data["heads"]
    entries = heads if isinstance(heads, list) else [heads]
    return sum(e.get("count", 1) for e in entries)


def _unit_meta(data: dict, H: int, record: dict, size: int) -> dict:
    """What plots need about a unit (the scalar-head strengths for the equiangular curve)."""
    heads = data["heads"]
    entries = heads if isinstance(heads, list) else [heads]
    strengths = []
    scalar = True
    for e in entries:
        count = e.get("count", 1)
        strengths += list(e.get("strengths") or [e.get("strength", 1.0)] * count)
        if e["kind"] != "scalar" or e.get("value", "aligned") != "aligned" or e.get("value_noise", 0.0):
            scalar = False
    tok, dyn = data["tokens"], data["dynamics"]
    return {"n": tok["n"], "d": tok["d"], "H": H, "init": tok.get("init", "random"),
            "gamma": tok.get("gamma"), "rule": dyn["rule"], "geometry": dyn["geometry"],
            "dt": dyn["dt"], "steps": dyn["steps"], "head_kinds": [e["kind"] for e in entries],
            "scalar_strengths": strengths if scalar else None, "replicas": size,
            "threshold": record["threshold"], "clustering_threshold": record["clustering_time"]}


def _columns(axes, record) -> list[str]:
    cols = ["unit", "point"]
    cols += [k for k, _ in axes if k not in FIXED_COLUMNS]
    cols += list(FIXED_COLUMNS) + ["step", "time"] + list(record["observables"])
    if record["min_cosine"]:
        cols.append("min_cosine")
    if record["clusters"]:
        cols.append("clusters")
    if record["clustering_time"] is not None:
        cols.append("clustering_time")
    return cols


# ============================================================================ the results store

def _read_ledger(path: Path) -> dict[str, dict]:
    """Finished units: id -> {rows, attempt, seconds}. Only complete (newline-ended) lines."""
    done: dict[str, dict] = {}
    if not path.is_file():
        return done
    text = path.read_text()
    for line in text.split("\n")[:-1]:          # the part after the last newline is incomplete
        parts = line.split("\t")
        if len(parts) < 2 or not parts[0] or parts[0].startswith("#"):
            continue
        try:
            done[parts[0]] = {"rows": int(parts[1]),
                              "attempt": int(parts[2]) if len(parts) > 2 else 0,
                              "seconds": float(parts[3]) if len(parts) > 3 else math.nan}
        except ValueError:
            continue
    return done


def _write_ledger(path: Path, done: dict[str, dict]) -> None:
    from particles.output import atomic_write_text
    atomic_write_text(path, "".join(f"{u}\t{v['rows']}\t{v['attempt']}\t{v['seconds']!r}\n"
                                    for u, v in done.items()))


class ResultStore:
    """results.csv + units_done.txt + sweep.json of one output folder.

    Rows of a unit are appended and fsync'ed, then its ledger line. Opening an existing folder
    drops every row whose unit is not in the ledger (a kill between the two writes, or in the
    middle of the rows) and checks each ledgered unit has all its rows.
    """

    def __init__(self, out_dir: Path, sweep: Sweep):
        self.dir = Path(out_dir)
        self.sweep = sweep
        self.results = self.dir / RESULTS
        self.ledger = self.dir / LEDGER
        self.meta_path = self.dir / META
        self.dir.mkdir(parents=True, exist_ok=True)
        meta = self._old_meta()
        if meta is not None and meta.get("hash") != sweep.spec_hash:
            raise SweepError(str(self.dir), [
                f"the folder holds results of a different sweep ('{meta.get('name')}', hash "
                f"{meta.get('hash')}; this sweep's is {sweep.spec_hash}): give another output "
                "folder, or delete this one to start over"], is_file=False, what="sweep output folder")
        self.attempt = int(meta.get("attempts", 0)) + 1 if meta else 1
        self.runs = list(meta.get("runs", [])) if meta else []    # one entry per invocation
        self.done = _read_ledger(self.ledger)
        self.done = {u: v for u, v in self.done.items() if u in sweep.unit_meta}
        if self.ledger.is_file():
            text = self.ledger.read_text()
            if text and not text.endswith("\n"):    # a line cut by a kill: drop it, then append
                _write_ledger(self.ledger, self.done)
        self._repair()
        self.started = time.time()
        self.write_meta("running")
        if sweep.path is not None:
            from particles.output import atomic_write_text
            atomic_write_text(self.dir / COPY, Path(sweep.path).read_text())
        self._fh = open(self.results, "a", newline="", encoding="utf-8")
        self._ledger_fh = open(self.ledger, "a", encoding="utf-8")
        self.units_written = 0

    def _old_meta(self) -> dict | None:
        if not self.meta_path.is_file():
            if self.results.exists() or self.ledger.exists():
                raise SweepError(str(self.dir), [f"{RESULTS} or {LEDGER} exists without {META}: "
                                                 "not a sweep folder this version wrote"],
                                 is_file=False, what="sweep output folder")
            return None
        try:
            return json.loads(self.meta_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise SweepError(str(self.dir), [f"cannot read {META}: {exc}"], is_file=False,
                             what="sweep output folder") from None

    def _repair(self) -> None:
        """Keep the header and the rows of ledgered units; rewrite the file if anything goes."""
        header = _csv_line(self.sweep.columns)
        from particles.output import atomic_write_text
        if not self.results.is_file():          # a fresh folder (or the table was deleted)
            atomic_write_text(self.results, header + "\n")
            atomic_write_text(self.ledger, "")
            self.done = {}
            return
        text = self.results.read_text(encoding="utf-8")
        lines = text.split("\n")
        complete, tail = lines[:-1], lines[-1]
        if not complete or complete[0] != header:
            raise SweepError(str(self.results), ["its header differs from this sweep's columns; "
                                                 "give another output folder"], is_file=False,
                             what="results table")
        keep = [complete[0]]
        counts: dict[str, int] = {}
        for line in complete[1:]:
            unit = line.split(",", 1)[0]
            if unit in self.done:
                keep.append(line)
                counts[unit] = counts.get(unit, 0) + 1
        short = [u for u, v in self.done.items() if counts.get(u, 0) != v["rows"]]
        if short:      # should not happen; recompute such units rather than trust them
            keep = [keep[0]] + [ln for ln in keep[1:] if ln.split(",", 1)[0] not in short]
            for u in short:
                del self.done[u]
            _write_ledger(self.ledger, self.done)
        if len(keep) != len(complete) or tail:
            atomic_write_text(self.results, "\n".join(keep) + "\n")

    def write_meta(self, status: str, extra: dict | None = None) -> None:
        from particles.output import write_json
        sw = self.sweep
        info = {"kind": "sweep", "name": sw.name, "description": sw.description,
                "source": str(sw.path or sw.source), "hash": sw.spec_hash, "status": status,
                "attempts": self.attempt, "replicas": sw.n_replicas, "units": len(sw.units),
                "units_done": len(self.done), "batch": sw.batch,
                "axes": [{"key": k, "values": v} for k, v in sw.axes],
                "record": sw.record, "columns": sw.columns, "unit_meta": sw.unit_meta,
                "runs": self.runs, "updated": time.strftime("%Y-%m-%dT%H:%M:%S")}
        info.update(extra or {})
        write_json(self.meta_path, info)

    def write_unit(self, result: dict) -> int:
        rows = _unit_rows(self.sweep, result)
        self._fh.write("".join(rows))
        self._fh.flush()
        os.fsync(self._fh.fileno())
        _maybe_abort(self.units_written + 1, "rows")
        line = f"{result['id']}\t{len(rows)}\t{self.attempt}\t{result.get('seconds', math.nan)!r}\n"
        self._ledger_fh.write(line)
        self._ledger_fh.flush()
        os.fsync(self._ledger_fh.fileno())
        self.done[result["id"]] = {"rows": len(rows), "attempt": self.attempt,
                                   "seconds": result.get("seconds", math.nan)}
        self.units_written += 1
        _maybe_abort(self.units_written, "ledger")
        return len(rows)

    def close(self) -> None:
        for fh in (self._fh, self._ledger_fh):
            try:
                fh.close()
            except OSError:
                pass


def _maybe_abort(count: int, stage: str) -> None:
    spec = os.environ.get(ABORT_ENV)
    if not spec:
        return
    n, _, where = spec.partition(":")
    if int(n) == count and (where or "ledger") == stage:
        raise SweepAborted(f"test abort after unit {count} ({stage} written)")


def _csv_line(values) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(values)
    return buf.getvalue().rstrip("\n")


def _unit_rows(sweep: Sweep, res: dict) -> list[str]:
    """CSV lines of one finished unit, in (point, step) order."""
    meta = sweep.unit_meta[res["id"]]
    obs_names = res["observables"]
    values = res["values"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    axis_cols = sweep.axis_columns
    lines = []
    for r, index in enumerate(res["points"]):
        p = sweep.points[index]
        head = [res["id"], index] + [_cell(p["axes"][k]) for k in axis_cols] + \
               [meta["n"], meta["d"], meta["H"], p["seed"], _cell(p["beta"])]
        for k, step in enumerate(res["steps"]):
            row = head + [step, _cell(res["times"][k])]
            row += [_cell(values[r, k, j]) for j in range(len(obs_names))]
            if res["min_cosine"] is not None:
                row.append(_cell(res["min_cosine"][r, k]))
            if res["clusters"] is not None:
                c = res["clusters"][r, k]
                row.append("nan" if math.isnan(c) else str(int(c)))
            if res["clustering_time"] is not None:
                row.append(_cell(res["clustering_time"][r]))
            w.writerow(row)
            lines.append(buf.getvalue())
            buf.seek(0)
            buf.truncate()
    return lines


# ============================================================================ running

def run_sweep(path, out_dir, executor: str = "local", address: str | None = None,
              workers: int | None = None, *, echo: Callable[[str], None] | None = None) -> Path:
    """Run (or continue) a sweep into ``out_dir``; returns the path of ``results.csv``.

    path: a sweep file, a bundled sweep name, or a ``Sweep``.
    executor: "local" (in this process when workers is None or 1, else a pool of ``workers``
    processes, each initialising Taichi once) or "ray" (``ray.init(address=address)``, or a
    local cluster with ``workers`` CPUs when address is None; each unit is one Ray task).
    Finished units (``units_done.txt``) are skipped, so rerunning a killed sweep continues it.
    """
    from . import executors as ex_mod
    sweep = load_sweep(path)
    if executor not in ("local", "ray"):
        raise SweepError("--executor", [f"expected 'local' or 'ray', got {executor!r}"],
                         is_file=False, what="sweep option")
    if address and executor != "ray":
        raise SweepError("--address", ["only the ray executor connects to a cluster address; "
                                       "add --executor ray"], is_file=False, what="sweep option")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise SweepError("--workers", [f"expected an integer >= 1, got {workers!r}"],
                         is_file=False, what="sweep option")
    say = echo or (lambda _msg: None)
    from particles.app.run_dir import RunDirLock
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    lock = RunDirLock(Path(out_dir), "sweep").acquire()   # two sweeps at once would double rows
    try:
        store = ResultStore(Path(out_dir), sweep)
    except BaseException:
        lock.release()
        raise
    todo = [u for u in sweep.units if u["id"] not in store.done]
    skipped = len(sweep.units) - len(todo)
    say(f"sweep '{sweep.name}': {sweep.n_replicas} replicas in {len(sweep.units)} units"
        + (f" ({skipped} already done)" if skipped else "")
        + f"; executor {executor}" + (f" at {address}" if address else "")
        + (f", {workers} workers" if workers else ""))
    t0 = time.perf_counter()
    status, replicas_run, compute_s = "incomplete", 0, 0.0
    runner = None
    try:
        if todo:
            runner = ex_mod.make_executor(executor, address=address, workers=workers)
            for res in runner.map_unordered(todo):
                rows = store.write_unit(res)
                replicas_run += len(res["points"])
                compute_s += res.get("seconds", 0.0)
                say(f"  unit {res['id']}: {len(res['points'])} replicas, {rows} rows, "
                    f"{res.get('seconds', math.nan):.2f} s ({len(store.done)}/{len(sweep.units)} done, "
                    f"{time.perf_counter() - t0:.1f} s elapsed)")
        status = "completed" if len(store.done) == len(sweep.units) else "incomplete"
    finally:
        wall = time.perf_counter() - t0
        if runner is not None:
            runner.close()
        store.close()
        run = {"attempt": store.attempt, "started": time.strftime("%Y-%m-%dT%H:%M:%S",
                                                                  time.localtime(store.started)),
               "executor": executor, "address": address, "workers": workers,
               "units_run": store.units_written, "replicas_run": replicas_run,
               "wall_seconds": wall, "unit_seconds": compute_s,
               "replicas_per_second": replicas_run / wall if wall > 0 and replicas_run else None}
        store.runs.append(run)
        store.write_meta(status, {"last_run": run})
        lock.release()
    return store.results


# ============================================================================ reading results

def load_results(path) -> dict[str, np.ndarray]:
    """The results table as columns sorted by (point, step): numeric columns as float arrays,
    the others (unit, string-valued axes) as str arrays. ``path``: results.csv or its folder."""
    p = Path(path)
    if p.is_dir():
        p = p / RESULTS
    with open(p, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        rows = [r for r in reader if len(r) == len(header)]
    cols: dict[str, np.ndarray] = {}
    for j, name in enumerate(header):
        raw = [r[j] for r in rows]
        try:
            cols[name] = np.array([float(v) for v in raw], dtype=float)
        except ValueError:
            cols[name] = np.array(raw, dtype=str)
    if rows:
        order = np.lexsort((cols["step"], cols["point"]))
        cols = {k: v[order] for k, v in cols.items()}
    return cols


def read_meta(sweep_dir) -> dict:
    """The sweep.json of a sweep output folder."""
    return json.loads((Path(sweep_dir) / META).read_text())


def is_sweep_dir(path) -> bool:
    """True when ``path`` is a folder a sweep wrote (it holds sweep.json of kind "sweep")."""
    p = Path(path) / META
    if not p.is_file():
        return False
    try:
        return json.loads(p.read_text()).get("kind") == "sweep"
    except (OSError, json.JSONDecodeError, AttributeError):
        return False


# ============================================================================ the CLI hook

def default_out_dir(sweep: Sweep) -> Path:
    """sweeps/<name> under the current folder: fixed, so rerunning the command resumes."""
    return Path("sweeps") / sweep.name


def cli_sweep(args) -> int:
    """`particles sweep SWEEP_FILE [--executor local|ray] [--address ADDR] [--out DIR]
    [--workers N]`: args has sweep_file, executor, address, out, workers. Prints progress and a
    summary; returns 0 when every unit is done, 130 on Ctrl-C. User mistakes raise SweepError
    (a SceneError); Ray missing raises SweepError too."""
    sweep = load_sweep(args.sweep_file)
    out = Path(args.out) if getattr(args, "out", None) else default_out_dir(sweep)
    executor = getattr(args, "executor", None) or "local"
    t0 = time.perf_counter()
    try:
        table = run_sweep(sweep, out, executor=executor, address=getattr(args, "address", None),
                          workers=getattr(args, "workers", None), echo=print)
    except KeyboardInterrupt:
        print(f"interrupted; finished units are saved in {out}. Run the same command again to "
              "continue (finished units are skipped).")
        return 130
    meta = read_meta(out)
    last = meta.get("last_run", {})
    wall = time.perf_counter() - t0
    rate = last.get("replicas_per_second")
    lines = [f"sweep {meta['status']}: {meta['units_done']}/{meta['units']} units, "
             f"{meta['replicas']} replicas ({last.get('replicas_run', 0)} run now in {wall:.1f} s"
             + (f", {rate:.1f} replicas/s" if rate else "") + ")",
             f"  results: {table}",
             f"  ledger:  {out / LEDGER}",
             f"  plot:    particles plot {out}"]
    print("\n".join(lines))
    return 0 if meta["status"] == "completed" else 1


__all__ = ["Sweep", "SweepError", "load_sweep", "run_sweep", "load_results", "read_meta",
           "is_sweep_dir", "cli_sweep", "bundled_sweeps", "default_out_dir", "SweepAborted"]
