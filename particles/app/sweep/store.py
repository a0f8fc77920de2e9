"""The results store of a sweep folder: results.csv (rows streamed and fsync'ed per unit), the
ledger units_done.txt, sweep.json; repair after a kill; reading the table back."""
from __future__ import annotations

import csv
import io
import json
import math
import os
import time
from pathlib import Path

import numpy as np

from particles.atomic import atomic_write_text, open_append
from particles.output import write_json

from .format import COPY, LEDGER, META, RESULTS, SweepError
from .spec import Sweep


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
        self.tiles = meta.get("tiles") if meta else None   # the wide pass's tiles every unit takes
        self.done = _read_ledger(self.ledger)
        self.done = {u: v for u, v in self.done.items() if u in sweep.unit_meta}
        self._check_header()   # refused before anything is written
        self.started = time.time()
        # sweep.json first: a fault in any later write (a full disk) leaves a folder that
        # running the same sweep again continues
        self.write_meta("running")
        if self.ledger.is_file():
            text = self.ledger.read_text()
            if text and not text.endswith("\n"):    # a line cut by a kill: drop it, then append
                _write_ledger(self.ledger, self.done)
        self._repair()
        if sweep.path is not None:
            atomic_write_text(self.dir / COPY, Path(sweep.path).read_text())
        self._fh = open_append(self.results, newline="", encoding="utf-8")
        self._ledger_fh = open_append(self.ledger, encoding="utf-8")
        self.units_written = 0

    def _old_meta(self) -> dict | None:
        if not self.meta_path.is_file():
            if _read_ledger(self.ledger):
                raise SweepError(str(self.dir), [f"{LEDGER} lists finished units but {META} is "
                                                 "missing: not a sweep folder this version wrote"],
                                 is_file=False, what="sweep output folder")
            return None   # nothing finished (e.g. the first unit met a full disk): start afresh
        try:
            return json.loads(self.meta_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise SweepError(str(self.dir), [f"cannot read {META}: {exc}"], is_file=False,
                             what="sweep output folder") from None

    def _check_header(self) -> None:
        """SweepError when results.csv exists with another header (another sweep's table)."""
        if self.results.is_file():
            with open(self.results, encoding="utf-8", newline="") as fh:
                first = fh.readline()
            if first.rstrip("\n") != _csv_line(self.sweep.columns) or not first.endswith("\n"):
                raise SweepError(str(self.results), ["its header differs from this sweep's "
                                                     "columns; give another output folder"],
                                 is_file=False, what="results table")

    def _repair(self) -> None:
        """Keep the header and the rows of ledgered units; rewrite the file if anything goes."""
        header = _csv_line(self.sweep.columns)
        if not self.results.is_file():          # a fresh folder (or the table was deleted)
            atomic_write_text(self.results, header + "\n")
            atomic_write_text(self.ledger, "")
            self.done = {}
            return
        text = self.results.read_text(encoding="utf-8")
        lines = text.split("\n")
        complete, tail = lines[:-1], lines[-1]
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
        sw = self.sweep
        info = {"kind": "sweep", "name": sw.name, "description": sw.description,
                "source": str(sw.path or sw.source), "hash": sw.spec_hash, "status": status,
                "attempts": self.attempt, "replicas": sw.n_replicas, "units": len(sw.units),
                "units_done": len(self.done), "batch": sw.batch,
                "axes": [{"key": k, "values": v} for k, v in sw.axes],
                "record": sw.record, "columns": sw.columns, "unit_meta": sw.unit_meta,
                "runs": self.runs, "tiles": self.tiles, "updated": time.strftime("%Y-%m-%dT%H:%M:%S")}
        info.update(extra or {})
        write_json(self.meta_path, info)

    def write_unit(self, result: dict) -> int:
        """Append a finished unit: its rows (fsync'ed), then its ledger line (fsync'ed)."""
        rows = _unit_rows(self.sweep, result)
        self._append_rows(rows)
        line = f"{result['id']}\t{len(rows)}\t{self.attempt}\t{result.get('seconds', math.nan)!r}\n"
        self._append_ledger(line)
        self.done[result["id"]] = {"rows": len(rows), "attempt": self.attempt,
                                   "seconds": result.get("seconds", math.nan)}
        self.units_written += 1
        return len(rows)

    def _append_rows(self, rows: list[str]) -> None:
        self._fh.write("".join(rows))
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def _append_ledger(self, line: str) -> None:
        self._ledger_fh.write(line)
        self._ledger_fh.flush()
        os.fsync(self._ledger_fh.fileno())

    def close(self) -> None:
        for fh in (self._fh, self._ledger_fh):
            try:
                fh.close()
            except OSError:
                pass


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
    stops = "stop_reason" in sweep.columns   # the unit's stop time and reason on each of its rows
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
            if stops:
                row += [_cell(res.get("stop_time", math.nan)), res.get("stop_reason", "")]
            w.writerow(row)
            lines.append(buf.getvalue())
            buf.seek(0)
            buf.truncate()
    return lines


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
