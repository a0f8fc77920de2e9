"""Taichi's CPU pool threads pinned one per core (particles/affinity.py): when it applies, and
that the threads pinned are the ones that run a parallel kernel."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from particles import affinity


@pytest.fixture
def two_cpus(monkeypatch):
    calls = []
    monkeypatch.setattr(affinity.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(affinity.os, "sched_setaffinity", lambda tid, cpus: calls.append((tid, set(cpus))),
                        raising=False)
    monkeypatch.delenv(affinity.ENV, raising=False)
    return calls


def test_the_last_threads_init_started_are_pinned_one_per_cpu(two_cpus):
    assert affinity.pin_pool([11, 12, 13, 14], pool_size=2) == {13: 0, 14: 1}
    assert two_cpus == [(13, {0}), (14, {1})]


@pytest.mark.parametrize("pool_size, started, why", [
    (1, [11, 12], "a one-thread pool (a sweep's worker)"),
    (3, [11, 12, 13], "more pool threads than CPUs this process may use"),
    (2, [11], "fewer new threads than the pool"),
])
def test_nothing_is_pinned_where_it_does_not_apply(two_cpus, pool_size, started, why):
    assert affinity.pin_pool(started, pool_size) == {}, why
    assert two_cpus == []


@pytest.mark.parametrize("value", ["0", "false", "No", " off "])
def test_the_environment_switches_it_off(two_cpus, monkeypatch, value):
    monkeypatch.setenv(affinity.ENV, value)
    assert affinity.pin_pool([11, 12], 2) == {}
    assert two_cpus == []


def test_a_refused_pin_leaves_every_thread_to_the_os(monkeypatch):
    calls = []

    def refuse_the_second(tid, cpus):
        calls.append((tid, set(cpus)))
        if tid == 12 and len(cpus) == 1:
            raise PermissionError("not allowed here")
    monkeypatch.setattr(affinity.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(affinity.os, "sched_setaffinity", refuse_the_second, raising=False)
    monkeypatch.delenv(affinity.ENV, raising=False)
    assert affinity.pin_pool([11, 12], 2) == {}
    assert calls[-2:] == [(11, {0, 1}), (12, {0, 1})]


PROBE = textwrap.dedent("""
    import json, os
    import taichi as ti
    from particles import affinity, backend

    def ticks(tid):
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])   # utime + stime

    @ti.kernel
    def burn(a: ti.types.ndarray(dtype=ti.f32, ndim=1), iters: ti.i32):
        for w in range(a.shape[0]):   # 1024 items: Taichi's CPU blocks give every pool thread some
            acc = ti.cast(w, ti.f32)
            for k in range(iters):
                acc = ti.sin(acc + ti.cast(k, ti.f32) * ti.cast(1e-3, ti.f32))
            a[w] = acc

    import numpy as np
    backend.init("cpu")
    a = np.zeros(1024, np.float32)
    burn(a, 10)   # compiled before the count starts
    start = {t: ticks(t) for t in affinity.thread_ids()}
    burn(a, 100_000)
    used = {t: ticks(t) - start.get(t, 0) for t in affinity.thread_ids()}
    pinned = backend.pinned_threads()
    print(json.dumps({"pinned": {str(t): c for t, c in pinned.items()},
                      "affinity": {str(t): sorted(os.sched_getaffinity(t)) for t in pinned},
                      "used": {str(t): n for t, n in used.items()}}))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
                    reason="pinning applies on Linux with two CPUs or more")
def test_the_pinned_threads_are_the_ones_that_run_a_parallel_kernel(tmp_path):
    # a fresh interpreter: Taichi's default pool (one thread per CPU), as a user's run has it;
    # a file, since Taichi reads a kernel's source
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k not in ("TI_CPU_MAX_NUM_THREADS", affinity.ENV)}
    out = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    cpus = sorted(os.sched_getaffinity(0))
    assert sorted(got["pinned"].values()) == cpus           # one thread on each CPU
    assert all(got["affinity"][t] == [c] for t, c in got["pinned"].items())
    total = sum(got["used"].values())
    on_pinned = [got["used"][t] for t in got["pinned"]]
    assert total > 0 and sum(on_pinned) >= 0.8 * total, got["used"]
    assert min(on_pinned) > 0, got["used"]                   # every pinned thread worked
