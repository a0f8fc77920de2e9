"""Taichi's CPU pool threads, one per core (Linux).

Two threads share a fused launch through spin-then-yield barriers (``kernels_fused``). On a
2-vCPU VM the OS sometimes runs both of Taichi's pool threads on one core while the other
idles; the launch then runs at one thread's speed, so the same step took one of two times
(RK4 at (128, 16, 4) between other work: 373-707 us per step, median 544). Pinned one per
CPU, as OpenMP's OMP_PROC_BIND does, the same loop read 373-408 us (benchmarks/README,
"Pinned pool threads").

Pinned only where the pool is meant to use every CPU the process has: on Linux, when the
pool has exactly one thread per CPU this process may run on (a sweep's one-thread workers, or
a process given fewer CPUs than the pool, are left alone), and not with
PARTICLES_PIN_THREADS=0 (or false, no, off): beside other busy processes a pinned thread
cannot move to a core they leave free. Taichi starts no interface to
its pool, so the pool is found as the last threads ``ti.init`` started (Taichi 1.7 creates
its CPU thread pool last); ``tests/test_affinity.py`` checks that those are the threads that
run a parallel kernel.
"""
from __future__ import annotations

import os

ENV = "PARTICLES_PIN_THREADS"
OFF = ("0", "false", "no", "off")


def thread_ids() -> list[int]:
    """This process's threads (Linux task ids), oldest first; [] where /proc is not readable."""
    try:
        return sorted(int(tid) for tid in os.listdir("/proc/self/task"))
    except (OSError, ValueError):
        return []


def pool_cpus(pool_size: int) -> list[int]:
    """The CPUs to pin a pool of ``pool_size`` threads to, one each, or [] where pinning
    does not apply (switched off, not Linux, a pool that is not one thread per allowed CPU)."""
    if os.environ.get(ENV, "1").strip().lower() in OFF or not hasattr(os, "sched_setaffinity"):
        return []
    cpus = sorted(os.sched_getaffinity(0))
    if pool_size < 2 or pool_size != len(cpus):
        return []
    return cpus


def pin_pool(started: list[int], pool_size: int) -> dict[int, int]:
    """Pin the last ``pool_size`` of the threads in ``started`` (those ``ti.init`` started,
    oldest first) one per CPU; returns {thread id: cpu}, empty where nothing was pinned."""
    cpus = pool_cpus(pool_size)
    if not cpus or len(started) < pool_size:
        return {}
    pinned = dict(zip(started[-pool_size:], cpus))
    try:
        for tid, cpu in pinned.items():
            os.sched_setaffinity(tid, {cpu})
    except OSError:   # a thread gone, or a container that forbids it: leave the OS to place them
        for tid in pinned:
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:
                pass
        return {}
    return pinned
