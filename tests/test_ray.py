"""`particles sweep --executor ray`: the table it gives, Ray's banners, a local cluster under an
address-space limit (issue 39.4) and after a SIGKILL of its driver. Every Ray start costs ~10-20 s
on a 2-core machine (more under load), so the checks share starts: one quiet run under a 6 GB
limit whose table must equal the local executor's, one verbose run beside it, one killed run.

Issue 39.4: Ray's default object store (30% of the memory) cannot be mapped under `prlimit
--as=6G`, and the sweep ended in "internal error" after 32 s. The local cluster's store is sized
to what the process may map, and where the limit leaves no room the sweep says so in one
paragraph, naming what fixes it."""
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from particles.app.sweep import LEDGER, run_sweep
from particles.app.sweep.executors import (RAY_PROCESS_BYTES, RAY_STORE_MIN, LocalClusterError,
                                           object_store_bytes)
from test_sweep import SMALL, assert_same_table, table

ROOT = Path(__file__).resolve().parent.parent
GiB = 2**30

SWEEP = """
name = "small"
[tokens]
n = 8
d = 3
[heads]
kind = "scalar"
[dynamics]
rule = "softmax"
dt = 0.1
steps = 5
[axes]
"dynamics.beta" = [0.5, 2.0]
[record]
times = [0.0, 0.5]
observables = ["eps"]
"""

# units that run until killed: the SIGKILL test finds the cluster while a task computes
SLOW_UNITS = """
name = "slow"
batch = 1
[tokens]
n = 512
d = 3
[heads]
kind = "scalar"
count = 1
[dynamics]
rule = "softmax"
dt = 0.1
steps = 50000
[axes]
"dynamics.beta" = [0.5, 2.0]
"tokens.seed" = {count = 2}
[record]
times = [0.0, 500.0]
observables = ["eps", "energy"]
"""


def _sweep_process(args, cwd, limit=None) -> subprocess.Popen:
    """`python -m particles sweep ARGS` started in ``cwd`` (output piped), its address space
    limited to ``limit`` bytes when given."""
    preexec = None if limit is None else (lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    return subprocess.Popen([sys.executable, "-m", "particles", "sweep", *map(str, args)], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=preexec,
                            env=dict(os.environ, MPLBACKEND="Agg", PYTHONPATH=str(ROOT)))


def _finish(process, timeout) -> tuple[str, str]:
    try:
        return process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def test_the_object_store_fits_the_address_space_limit():
    assert object_store_bytes(resource.RLIM_INFINITY, 20 * GiB) is None     # Ray's own default
    store = object_store_bytes(6 * 10**9, 20 * GiB)                          # the prlimit --as=6G
    assert store == (6 * 10**9 - RAY_PROCESS_BYTES) // 2 and 1.4 * GiB < store < 1.6 * GiB
    assert store + RAY_PROCESS_BYTES < 6 * 10**9
    assert object_store_bytes(6 * 10**9, 2 * GiB) == int(0.3 * 2 * GiB)     # little memory free
    with pytest.raises(LocalClusterError) as err:
        object_store_bytes(2 * 10**9, 20 * GiB)
    text = str(err.value)
    assert "may use 1.86 GiB of address space (ulimit -v, prlimit --as)" in text
    assert "ray start --head --object-store-memory=BYTES" in text and "--executor local" in text
    assert object_store_bytes(RAY_PROCESS_BYTES + 2 * RAY_STORE_MIN, None) == RAY_STORE_MIN


def test_a_limit_too_small_for_ray_is_one_paragraph_not_a_crash(tmp_path):
    pytest.importorskip("ray")
    (tmp_path / "s.toml").write_text(SWEEP)
    proc = _sweep_process(["s.toml", "--out", "out", "--executor", "ray", "--workers", "2"], tmp_path,
                          limit=2 * 10**9)
    _, stderr = _finish(proc, timeout=300)
    assert proc.returncode == 2, stderr[-3000:]
    err = " ".join(stderr.split())
    assert "Ray's local cluster cannot start here" in err and "Traceback" not in err, err
    assert "StackTrace" not in stderr and "internal error" not in err, err


@pytest.mark.ray
@pytest.mark.slow
def test_ray_gives_the_local_table_under_a_six_gigabyte_limit_and_its_banners_only_if_verbose(tmp_path):
    """Two local clusters at once (a Ray start is mostly waiting): the quiet run, under
    `prlimit --as=6G`, must give the table of the local executor (3 units on 2 workers) without
    Ray's banners or warnings; the verbose run must show them."""
    pytest.importorskip("ray")
    (tmp_path / "small.toml").write_text(textwrap.dedent(SMALL.format(batch=4)))
    (tmp_path / "s.toml").write_text(SWEEP)
    quiet = _sweep_process(["small.toml", "--executor", "ray", "--workers", "2", "--out", "q"], tmp_path,
                           limit=6 * 10**9)
    loud = _sweep_process(["s.toml", "--executor", "ray", "--workers", "1", "--out", "v", "--verbose"],
                          tmp_path)
    try:
        # the reference meanwhile, in this process: the same sweep in one unit, local executor
        (tmp_path / "ref.toml").write_text(textwrap.dedent(SMALL.format(batch=256)))
        reference = table(run_sweep(tmp_path / "ref.toml", tmp_path / "ref"))
        out, err = _finish(quiet, timeout=600)
        assert quiet.returncode == 0, err[-3000:]
        assert "WARNING" not in out + err and "Token authentication" not in out + err, err[-2000:]
        assert "Started a local Ray instance" not in out + err
        assert_same_table(table(tmp_path / "q" / "results.csv"), reference)
        assert len((tmp_path / "q" / LEDGER).read_text().splitlines()) == 3
        out, err = _finish(loud, timeout=300)
    finally:
        for process in (quiet, loud):
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert loud.returncode == 0 and "Started a local Ray instance" in out + err, err[-2000:]
    assert (tmp_path / "v" / "results.csv").read_text().count("\n") == 5


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="the watchdog reads /proc")
def test_the_local_ray_cluster_does_not_outlive_a_sigkill_of_its_driver(tmp_path):
    """Ray's agents outlived a killed driver by about 60 s (and its GCS, raylet and workers
    die with it): within a few seconds none of the driver's processes is left."""
    pytest.importorskip("ray")
    from particles.app.sweep.executors import _processes_below
    (tmp_path / "slow.toml").write_text(SLOW_UNITS)
    cluster = []
    driver = _sweep_process(["slow.toml", "--executor", "ray", "--workers", "2", "--out", "s"], tmp_path)
    try:
        cluster = _cluster_when_running(driver, _processes_below)
    finally:
        if driver.poll() is None and not cluster:
            driver.kill()
    assert driver.poll() is None and cluster, "the sweep did not start its Ray tasks"
    driver.send_signal(signal.SIGKILL)
    driver.communicate(timeout=30)

    def alive(pid, started):
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19] == started
        except OSError:
            return False

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(alive(*p) for p in cluster):
        time.sleep(0.2)
    left = [(pid, Path(f"/proc/{pid}/comm").read_text().strip()) for pid, s in cluster if alive(pid, s)]
    for pid, _ in left:   # never leave them behind, whatever the test says
        os.kill(pid, signal.SIGKILL)
    assert not left, left


def _cluster_when_running(driver, processes_below):
    """The driver's processes once a Ray task runs (the whole local cluster is up)."""
    deadline = time.monotonic() + 120
    cluster = []
    while time.monotonic() < deadline and driver.poll() is None:
        cluster = processes_below(driver.pid)
        names = []
        for pid, _ in cluster:
            try:
                names.append(Path(f"/proc/{pid}/comm").read_text())
            except OSError:
                pass
        if any("_ray_task" in n for n in names):
            return cluster
        time.sleep(0.2)
    return []
