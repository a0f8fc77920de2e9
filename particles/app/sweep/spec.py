"""Reading and validating a sweep file into a ``Sweep`` (the format: ``particles.app.sweep.format``)."""
from __future__ import annotations

import copy
import difflib
import hashlib
import json
import math
import os
import tomllib
from pathlib import Path
from typing import Any

from scenes import schema as _schema
from scenes.specs import BadValue, is_int, is_number, show

from .format import (AXIS_SECTIONS, DEFAULT_BATCH, EXCLUSIVE, FIXED_COLUMNS, FORBIDDEN_AXES, MAX_POINTS,
    MAX_PROBLEMS, PATH_KEYS, RECORD_KEYS, REPLICA_AXES, SCENE_SECTIONS, SWEEP_LIBRARY,
    TOP_KEYS, SweepError)
from .grid import expand_grid, expand_values


def _dedupe(items):
    seen, out = set(), []
    for x in items:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


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


def _check_axis_key(key: str, raw: dict) -> str | None:
    """None if ``key`` names a sweepable scene key of ``raw``; else the problem."""
    if not isinstance(key, str) or "." not in key:
        return (f"expected 'section.key' (e.g. \"dynamics.beta\", \"tokens.seed\", "
                f"\"heads.count\"), got {show(key)}")
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
        return f"expected '{section}.key', got {show(key)}"
    if rest[0] not in allowed:
        close = difflib.get_close_matches(rest[0], allowed, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else f" (allowed: {', '.join(allowed)})"
        return f"unknown key '{rest[0]}' in [{section}]{hint}"
    return None


class Sweep:
    """A validated sweep: the grid (``points``), its work units (``units``), the record spec.

    points: one dict per grid point, in grid order (first axis slowest): ``index``, ``axes``
    (axis key -> value), ``seed``, ``beta``, ``unit``.
    units: the work units (plain dicts, picklable; ``run_unit`` in particles.app.sweep.executors
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
            raise SweepError(source, [f"expected a table, got {show(raw)}"], is_file)
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
                            f"got {show(name)}")
            name = "sweep"
        description = raw.get("description", "")
        if not isinstance(description, str):
            problems.append(f"top-level description: expected a string, got {show(description)}")
            description = ""
        batch = raw.get("batch", DEFAULT_BATCH)
        if not is_int(batch) or batch < 1:
            problems.append(f"top-level batch: expected an integer >= 1 (replicas per work "
                            f"unit), got {show(batch)}")
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
            problems.append(f"[axes]: expected a table of \"section.key\" = values, got {show(raw_axes)}")
            raw_axes = {}
        for key, spec in raw_axes.items():
            where = f"[axes] \"{key}\""
            bad = _check_axis_key(key, base_raw)
            if bad:
                problems.append(f"{where}: {bad}")
                continue
            values = expand_values(spec, where, problems)
            if values is None:
                continue
            if key in REPLICA_AXES:
                spec_ = REPLICA_AXES[key]
                wrong = []
                for v in values:
                    try:
                        spec_.convert(v)
                    except BadValue:
                        wrong.append(v)
                if wrong:
                    problems.append(f"{where}: expected values that are each {spec_.expected}, "
                                    f"got {show(wrong[0])}")
                    continue
                if key == "dynamics.beta":
                    values = [float(v) for v in values]
            axes.append((key, values))
        size = math.prod(len(v) for _, v in axes)
        if size > MAX_POINTS:
            problems.append(f"[axes]: the grid has {size} points, more than {MAX_POINTS}")

        record_raw = raw.get("record", {})
        if not isinstance(record_raw, dict):
            problems.append(f"[record]: expected a table, got {show(record_raw)}")
            record_raw = {}
        record = _record_spec(record_raw, problems)
        if problems:
            raise SweepError(source, problems[:MAX_PROBLEMS], is_file)

        points, units, columns, unit_meta = expand_grid(axes, base_raw, base_dir, record, batch,
                                                    problems)
        if problems:
            raise SweepError(source, _dedupe(problems)[:MAX_PROBLEMS], is_file)
        return cls(name=name, description=description, source=source, path=path,
                   base_dir=base_dir, raw=raw, base_raw=base_raw, axes=axes, record=record,
                   batch=batch, points=points, units=units, columns=columns, unit_meta=unit_meta)


def _base_scene(ref, base_dir: Path, problems: list) -> dict:
    from scenes import bundled_scenes
    if not isinstance(ref, str) or not ref.strip():
        problems.append(f"top-level scene: expected a bundled scene name or a path, got {show(ref)}")
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
        times = expand_values(raw["times"], "[record] times", problems)
        if times is not None:
            bad = [t for t in times if not is_number(t) or not math.isfinite(t) or t < 0]
            if bad:
                problems.append(f"[record] times: expected numbers >= 0 (time units), got {show(bad[0])}")
            else:
                rec["times"] = sorted(float(t) for t in times)
    if "observables" in raw:
        obs = raw["observables"]
        if not isinstance(obs, list) or not all(isinstance(o, str) for o in obs):
            problems.append(f"[record] observables: expected a list of log column names "
                            f"(docs/LOG.md), got {show(obs)}")
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
            problems.append(f"[record] clusters: expected true or false, got {show(raw['clusters'])}")
        else:
            rec["clusters"] = rec["clusters"] or raw["clusters"]
    if "threshold" in raw:
        thr = raw["threshold"]
        if not is_number(thr) or not -1 < thr < 1:
            problems.append(f"[record] threshold: expected a number in (-1, 1) (two tokens are in "
                            f"one cluster when their cosine exceeds it), got {show(thr)}")
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
                            f"every = 1}} or true/false, got {show(ct)}")
        else:
            unknown = [k for k in ct if k not in ("threshold", "every")]
            thr, every = ct.get("threshold", 1e-3), ct.get("every", 1)
            if unknown:
                problems.append(f"[record] clustering_time: unknown key '{unknown[0]}' (allowed: "
                                "threshold, every)")
            elif not is_number(thr) or not 0 < thr <= 2:
                problems.append(f"[record] clustering_time: threshold: expected a number in (0, 2] "
                                f"(eps = 1 - mean cosine), got {show(thr)}")
            elif not is_int(every) or every < 1:
                problems.append(f"[record] clustering_time: every: expected an integer >= 1 "
                                f"(steps between eps checks), got {show(every)}")
            else:
                rec["clustering_time"], rec["clustering_every"] = float(thr), int(every)
    return rec
