"""Running a sweep: the units not yet in the ledger, through an executor, into the store."""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable

from particles.app.run_dir import RunDirLock, refuse_other_kind

from .format import SweepError
from . import executors as ex_mod
from .spec import load_sweep
from .store import ResultStore


def run_sweep(path, out_dir, executor: str = "local", address: str | None = None,
              workers: int | None = None, *, echo: Callable[[str], None] | None = None,
              verbose: bool = False) -> Path:
    """Run (or continue) a sweep into ``out_dir``; returns the path of ``results.csv``.

    path: a sweep file, a bundled sweep name, or a ``Sweep``.
    executor: "local" (in this process when workers is None or 1, else a pool of ``workers``
    processes, each initialising Taichi once) or "ray" (``ray.init(address=address)``, or a
    local cluster with ``workers`` CPUs when address is None; each unit is one Ray task).
    Finished units (``units_done.txt``) are skipped, so rerunning a killed sweep continues it.
    verbose: Ray's own messages (banners, warnings) too; without it only its errors.
    """
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
    _check_sizes(sweep.units)   # refused here, with the figures, before any unit allocates
    say = echo or (lambda _msg: None)
    for rule_file in dict.fromkeys(u["scene"]["dynamics"].get("rule_file") for u in sweep.units):
        if rule_file:   # as `particles run` does: a file that is executed is said so
            say(f"executing rule file {rule_file} (named by the scene) in every unit")
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    lock = RunDirLock(Path(out_dir), "sweep").acquire()   # two sweeps at once would double rows
    try:
        refuse_other_kind(Path(out_dir), "sweep")   # a run's folder holds that run only
    except BaseException:
        lock.release()
        raise
    try:
        store = ResultStore(Path(out_dir), sweep)
    except BaseException:
        lock.release()
        raise
    try:
        tiles = _sweep_tiles(store)
    except BaseException:
        store.close()
        lock.release()
        raise
    todo = [dict(u, tiles=tiles) for u in sweep.units if u["id"] not in store.done]
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
            runner = ex_mod.make_executor(executor, address=address, workers=workers, verbose=verbose)
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


def _sweep_tiles(store: ResultStore) -> dict:
    """The wide pass's tiles every unit of the sweep takes, in every attempt: those sweep.json
    records, else ``tuning.tiles_now()`` (recorded at once). Workers that measured or read the
    cache each for themselves could pick differently, and other tiles change the bits."""
    from particles import tuning
    if store.tiles is None:
        store.tiles = tuning.tiles_now()
        store.write_meta("running")
    return tuning.check_pins(store.tiles, f"{str(store.meta_path)!r} key 'tiles'")


def _check_sizes(units) -> None:
    """Every unit passes the size and memory check a run passes (``build.check_size``)."""
    from scenes.scene import build_heads
    seen = set()
    for unit in units:
        scene = unit["scene"]
        key = (scene["tokens"]["n"], scene["tokens"]["d"], len(unit["tokens"]),
               scene["dynamics"].get("dtype"), scene["dynamics"].get("arch"), repr(scene["heads"]))
        if key in seen:
            continue
        seen.add(key)
        ex_mod.check_unit_size(unit, len(build_heads(scene["heads"], scene["tokens"]["d"])))
