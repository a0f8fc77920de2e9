"""Running a sweep's work units: ``run_unit`` (one ensemble Simulation), and the executors
that call it -- in this process, on a local process pool, or as Ray tasks.

A work unit is a plain dict (see ``particles.app.sweep.Sweep``); its result is a dict of NumPy
arrays. Both travel by pickle, so the same unit gives the same result wherever it runs.
Taichi is initialised once per process (``particles.backend.init``, called by Simulation);
a pool or Ray worker sets ``TI_CPU_MAX_NUM_THREADS`` before its first unit so that workers
sharing a machine do not each start a thread per core.
"""
from __future__ import annotations

import math
import os
import time
from contextlib import nullcontext
from typing import Iterable, Iterator

import numpy as np

from particles import tuning
from particles.drive import AT_END, NEVER, At, Every, Writer, drive
from particles.clock import step_time
from particles.clusters import cluster_stats
from particles.stop import StopRules, StopWriter
from particles.theory import eps_of_tokens

from ..build import build_simulation


# ============================================================================ one unit

class _Record(Writer):
    """The unit's record steps: observables (their rows), cluster counts, min cosine. With
    stop rules (``stops``) the unit may end before its last record steps: the state where it
    ended is recorded too, and ``fill_after_stop`` gives those steps its values (the flow has
    stopped there; the table's stop_time says from when)."""

    def __init__(self, rec: dict, R: int, stops: bool = False):
        self.steps = [int(s) for s in rec["steps"]]
        self.where = {s: k for k, s in enumerate(self.steps)}
        self.names = list(rec["observables"])
        self.threshold = rec["threshold"]
        self.trigger = At(self.steps) | AT_END if stops else At(self.steps)
        self.observe = self.trigger if self.names else NEVER
        self.needs = frozenset({"tokens"}) if (rec["clusters"] or rec["min_cosine"]) else frozenset()
        T = len(self.steps)
        # slot T: the final state (with stop rules)
        self.values = np.full((R, T + 1, len(self.names)), np.nan)
        self.clusters = np.full((R, T + 1), np.nan) if rec["clusters"] else None
        self.min_cos = np.full((R, T + 1), np.nan) if rec["min_cosine"] else None
        self.end_step = None

    def _slots(self, step: int) -> list[int]:
        return ([self.where[step]] if step in self.where else []) + ([len(self.steps)] if step == self.end_step else [])

    def on_state(self, state):
        if state.step == state.end:
            self.end_step = state.step   # before its row: rows of a state come after it is served
        if state.tokens is None:
            return
        mc, count = cluster_stats(state.tokens, self.threshold)
        for k in self._slots(state.step):
            if self.clusters is not None:
                self.clusters[:, k] = count
            if self.min_cos is not None:
                self.min_cos[:, k] = mc

    def on_rows(self, rows):
        for row in rows:
            for k in self._slots(row["step"]):
                self.values[row["replica"], k] = [row.get(o, math.nan) for o in self.names]

    def fill_after_stop(self, stop_step: int) -> None:
        """Record steps after ``stop_step`` (where a stop rule ended the unit) take the values
        of that final state."""
        later = [k for k, s in enumerate(self.steps) if s > stop_step]
        for arr in (self.values, self.clusters, self.min_cos):
            if arr is not None and later:
                arr[:, later] = arr[:, [len(self.steps)]]

    def recorded(self, arr):
        return None if arr is None else arr[:, :len(self.steps)]


class _ClusteringTime(Writer):
    """The first recorded time at which eps < threshold, per replica (nan: never)."""

    needs = frozenset({"tokens"})

    def __init__(self, rec: dict, R: int):
        self.threshold = rec["clustering_time"]
        self.trigger = Every(int(rec.get("clustering_every", 1))) | At(rec["steps"]) | AT_END
        self.first = np.full(R, np.nan)

    def on_state(self, state):
        newly = np.isnan(self.first) & (eps_of_tokens(state.tokens) < self.threshold)
        self.first[newly] = state.time


def check_unit_size(unit: dict, n_heads: int) -> None:
    """The run's size and memory check (``build.check_size``) for a unit's stacked replicas."""
    from particles.app.build import check_size
    scene = unit["scene"]
    check_size(scene, n_heads, shape=(len(unit["tokens"]), int(scene["tokens"]["n"]),
                                      int(scene["tokens"]["d"])))


def run_unit(unit: dict) -> dict:
    """Run one work unit: one ensemble Simulation of its replicas (tokens (R, n, d), one beta
    each), recording observables / clusters at the record steps and the first step where
    eps < the clustering threshold. Returns a dict of arrays (see ``particles.app.sweep``)."""
    t0 = time.perf_counter()
    from scenes.scene import build_heads, build_tokens

    scene, rec = unit["scene"], unit["record"]
    heads = build_heads(scene["heads"], scene["tokens"]["d"])
    check_unit_size(unit, len(heads))   # before the replicas' tokens are stacked
    tokens = np.stack([build_tokens(dict(t, replicas=1)) for t in unit["tokens"]])
    obs = list(rec["observables"])
    # the sweep's tiles (runner._sweep_tiles), none measured here: every worker sums alike
    pins = unit.get("tiles")
    with tuning.pinned(pins, measure=False, why="kept by the sweep") if pins is not None else nullcontext():
        sim = build_simulation(scene, tokens=tokens, heads=heads,
                               beta=np.asarray(unit["betas"], dtype=np.float64),
                               entropy_rate=any(o.startswith("entropy_rate_h") for o in obs))
    stop_cfg = rec.get("stop")   # the scene's stop rules: the unit ends where its flow stops
    record = _Record(rec, sim.n_replicas, stops=stop_cfg is not None)
    writers = [record]
    clustering = None
    if rec.get("clustering_time") is not None:
        clustering = _ClusteringTime(rec, sim.n_replicas)
        writers.append(clustering)
    if stop_cfg is not None:
        rules = StopRules.from_dynamics(scene["dynamics"], stop_cfg["cluster_threshold"])
        writers.append(StopWriter(rules, stop_cfg["every"], sim.n_heads))
    driver = drive(sim, writers, int(scene["dynamics"]["steps"]))
    stopped = driver.end_reason is not None   # a stop rule ended the unit at sim.step_count
    if stopped:
        record.fill_after_stop(sim.step_count)
    x = sim.native_tokens()
    nonfinite = ~np.isfinite(x).all(axis=(1, 2))
    out = {"id": unit["id"], "points": list(unit["points"]), "steps": record.steps,
           "times": [step_time(s, sim.dt) for s in record.steps], "observables": obs,
           "values": record.recorded(record.values),
           "clusters": record.recorded(record.clusters), "min_cosine": record.recorded(record.min_cos),
           "clustering_time": clustering.first if clustering is not None else None,
           "nonfinite": int(nonfinite.sum()), "arch": sim.arch, "tuning": sim.tuning, "pid": os.getpid(),
           "seconds": time.perf_counter() - t0}
    if stop_cfg is not None:
        out.update(stop_step=sim.step_count if stopped else None,
                   stop_time=step_time(sim.step_count, sim.dt) if stopped else math.nan,
                   stop_reason=driver.end_reason or "")
    return out


# ============================================================================ executors

def _threads_env(threads: int) -> None:
    os.environ.setdefault("TI_CPU_MAX_NUM_THREADS", str(max(1, int(threads))))


def _pool_init(threads: int) -> None:
    _threads_env(threads)


def _ray_task(unit: dict, threads: int) -> dict:
    _threads_env(threads)
    return run_unit(unit)


class LocalExecutor:
    """Units in this process (workers None or 1), or on a spawn-started process pool."""

    def __init__(self, workers: int | None = None):
        self.workers = int(workers or 1)
        self._pool = None

    def map_unordered(self, units: Iterable[dict]) -> Iterator[dict]:
        units = list(units)
        if self.workers <= 1 or len(units) <= 1:
            for unit in units:
                yield run_unit(unit)
            return
        import multiprocessing as mp
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
        threads = max(1, (os.cpu_count() or 1) // self.workers)
        self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=mp.get_context("spawn"),
                                         initializer=_pool_init, initargs=(threads,))
        pending = {self._pool.submit(run_unit, u) for u in units}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                yield fut.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


RAY_STORE_MIN = 75 * 2**20     # Ray refuses a smaller object store
# A Ray process's own address space besides the object store it maps: a worker after
# particles.backend.init measured 1.8 GiB (Python, NumPy, Ray's core worker, Taichi's LLVM).
RAY_PROCESS_BYTES = int(2.5 * 2**30)


def object_store_bytes(limit=None, available=None) -> int | None:
    """The object store of a local Ray cluster under an address-space limit (ulimit -v,
    prlimit --as), which every Ray process (driver, raylet, workers) maps besides its own
    RAY_PROCESS_BYTES: Ray's default, 30% of the memory, cannot be mapped there (the raylet
    timed out starting; a smaller limit aborted the driver in C++). Half of what the limit
    leaves, at most 30% of the memory available; None without a limit (Ray's default).
    ``LocalClusterError`` where the limit leaves no room for Ray's smallest store."""
    import resource
    from particles.validation import available_bytes
    if limit is None:
        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY or limit <= 0:
        return None
    available = available_bytes() if available is None else available
    size = (limit - RAY_PROCESS_BYTES) // 2
    if available:
        size = min(size, int(available * 0.3))
    if size < RAY_STORE_MIN:
        raise LocalClusterError(local_cluster_failure(None, None, limit))
    return int(size)


class LocalClusterError(RuntimeError):
    """A local Ray cluster that cannot start here (the paragraph says why and what fixes it)."""


def local_cluster_failure(exc: Exception | None, store: int | None, limit=None) -> str:
    """One paragraph for a local Ray cluster that did not (or cannot) start, with the setting
    that fixes it."""
    import resource
    if limit is None:
        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if exc is None:
        head = "Ray's local cluster cannot start here"
    else:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        head = f"Ray's local cluster did not start ({lines[-1][:200] if lines else type(exc).__name__})"
    if limit != resource.RLIM_INFINITY and limit > 0:
        need = (RAY_PROCESS_BYTES + 2 * RAY_STORE_MIN) / 2**30
        store_said = f", {store / 2**30:.2f} GiB here" if store else ""
        why = (f": this process may use {limit / 2**30:.2f} GiB of address space (ulimit -v, "
               f"prlimit --as), and each Ray process needs about {RAY_PROCESS_BYTES / 2**30:.1f} GiB "
               f"of its own besides the object store it maps{store_said} (at least "
               f"{RAY_STORE_MIN // 2**20} MiB). Raise the limit (to {need:.1f} GiB at the very least; "
               "ulimit -v unlimited), or start a cluster outside the limit with a store that fits "
               "(ray start --head --object-store-memory=BYTES) and pass --address 127.0.0.1:6379, "
               "or use --executor local")
    else:
        why = (". Check the memory and the disk space free for Ray (/tmp/ray), or start a cluster "
               "yourself (ray start --head) and pass --address, or use --executor local")
    return head + why


def _shutdown_quietly(ray) -> None:
    try:
        ray.shutdown()
    except Exception:  # noqa: BLE001 - what a failed start left behind, best effort
        pass


class RayExecutor:
    """Units as Ray tasks (one CPU each). ``address``: an existing cluster (``ray.init(address)``);
    None: a local cluster with ``workers`` CPUs (default: all). At most ``workers`` tasks are in
    flight when given. A cluster this executor started is shut down by ``close``."""

    def __init__(self, address: str | None = None, workers: int | None = None, verbose: bool = False):
        try:
            import ray
        except ImportError:
            from particles.app.sweep.format import SweepError
            raise SweepError("--executor ray", [
                "the ray executor needs Ray: pip install 'ray>=2.9' (or the package's [ray] "
                "extra: pip install -e '.[ray]')"], is_file=False, what="sweep option") from None
        self.ray = ray
        self.workers = workers
        self._started = False
        self._watchdog = None
        if not ray.is_initialized():
            # Ray's banners and warnings (e.g. "Token authentication is enabled") only when asked
            kwargs = dict(include_dashboard=False, logging_level="INFO" if verbose else "ERROR",
                          log_to_driver=False, configure_logging=True)
            if address:
                _check_reachable(address)
                try:
                    ray.init(address=address, **kwargs)
                except (ConnectionError, RuntimeError) as exc:
                    from particles.app.sweep.format import SweepError
                    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                    cause = exc.__cause__
                    lines = [ln.strip() for ln in str(cause or "").splitlines() if ln.strip()]
                    detail = f" ({lines[-1][:200]})" if lines else ""   # the root error, last line
                    raise SweepError("--address", [
                        f"could not connect to the Ray cluster at {address!r}: {first}{detail}. "
                        "Check the address (ray status on the head node prints it) and, if the "
                        "cluster uses token authentication, that this machine has its token"],
                        is_file=False, what="sweep option") from None
            else:
                from particles.app.sweep.format import SweepError
                try:
                    store = object_store_bytes()
                except LocalClusterError as exc:
                    raise SweepError("--executor ray", [str(exc)], is_file=False,
                                     what="sweep option") from None
                if store is not None:
                    kwargs["object_store_memory"] = store
                try:
                    ray.init(num_cpus=int(workers or os.cpu_count() or 1), **kwargs)
                except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception on a failed start
                    _shutdown_quietly(ray)
                    raise SweepError("--executor ray", [local_cluster_failure(exc, store)],
                                     is_file=False, what="sweep option") from None
                self._watchdog = _start_watchdog()
            self._started = True
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.threads = 1 if address else max(1, (os.cpu_count() or 1) // max(1, workers or cpus))
        self._task = ray.remote(num_cpus=1, max_retries=1)(_ray_task)
        self._pending: list = []

    def map_unordered(self, units: Iterable[dict]) -> Iterator[dict]:
        ray = self.ray
        queue = list(units)
        limit = self.workers or len(queue) or 1
        queue.reverse()
        try:
            while queue or self._pending:
                while queue and len(self._pending) < limit:
                    self._pending.append(self._task.remote(queue.pop(), self.threads))
                done, self._pending = ray.wait(self._pending, num_returns=1)
                yield ray.get(done[0])
        finally:
            for ref in self._pending:
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # noqa: BLE001 - best effort on the way out
                    pass
            self._pending = []

    def close(self) -> None:
        if self._watchdog is not None:   # a clean end: the watchdog leaves the cluster to shutdown
            try:
                self._watchdog.communicate(b"done", timeout=5)
            except Exception:  # noqa: BLE001 - best effort; shutdown below ends the cluster
                pass
            self._watchdog = None
        if self._started:
            self.ray.shutdown()
            self._started = False


# Ray fate-shares its GCS and raylet with the driver (SIGKILL on the parent's death) and the
# workers die with the raylet, but the raylet's agents (DashboardAgent, RuntimeEnvAgent) first
# report the raylet's death to the dead GCS, with a fixed 60 s timeout (ray 2.x,
# process_watcher.report_raylet_error_logs). The watchdog, a process of its own, holds a pipe
# from the driver: at its end without "done" (the driver was killed) it kills the processes the
# local cluster had when it started. Linux (/proc) only; elsewhere Ray's own fate-sharing.
_WATCHDOG = """
import os, signal, sys, time
def start(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None
if sys.stdin.buffer.read() != b"done":
    time.sleep(0.5)
    for pair in sys.argv[1:]:
        pid, started = pair.split(":")
        if start(pid) == started:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
"""


def _processes_below(root: int) -> list[tuple[int, str]]:
    """(pid, start time) of every descendant of ``root`` (Linux /proc)."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            table[int(name)] = (int(fields[1]), fields[19])   # ppid, starttime
    found, frontier = [], {root}
    while frontier:
        frontier = {pid for pid, (ppid, _) in table.items() if ppid in frontier}
        found += [(pid, table[pid][1]) for pid in frontier]
    return found


def _start_watchdog():
    """The watchdog of the local cluster this driver started (None where /proc is missing)."""
    import subprocess
    import sys
    if not os.path.isdir("/proc/self"):
        return None
    pairs = [f"{pid}:{started}" for pid, started in _processes_below(os.getpid())]
    return subprocess.Popen([sys.executable, "-c", _WATCHDOG, *pairs], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


CONNECT_SECONDS = 10.0   # an unreachable Ray address is refused within this time


def _check_reachable(address: str, seconds: float = None) -> None:
    """SweepError (exit 2) within ``CONNECT_SECONDS`` when nothing answers at host:port (Ray's
    own connect retries for minutes); 'auto' and addresses without a port are left to Ray."""
    import socket
    from urllib.parse import urlsplit
    seconds = CONNECT_SECONDS if seconds is None else seconds
    if address in ("auto", "local"):
        return
    parts = urlsplit(address if "://" in address else f"ray://{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if not host or not port:
        return
    try:
        with socket.create_connection((host, port), timeout=seconds):
            return
    except OSError as exc:
        from particles.app.sweep.format import SweepError
        raise SweepError("--address", [
            f"nothing answers at the Ray address {address!r} within {seconds:g} s "
            f"({exc.strerror or exc}). Check the address (ray status on the head node prints "
            "it) and that the head node is up"], is_file=False, what="sweep option") from None


def make_executor(kind: str, address: str | None = None, workers: int | None = None,
                  verbose: bool = False):
    if kind == "ray":
        return RayExecutor(address, workers, verbose)
    return LocalExecutor(workers)


__all__ = ["run_unit", "LocalExecutor", "RayExecutor", "make_executor"]
