"""Sweeps on faults (issue 27): a folder left by a failed first unit (a full disk) is continued
by running the same sweep again."""
from __future__ import annotations

import errno
import textwrap
from pathlib import Path

import numpy as np
import pytest

import particles.app.sweep.store as store_mod
from particles.app.sweep import load_results, run_sweep

TINY = """\
name = "tiny"
batch = 2

[tokens]
n = 6
d = 3

[heads]
kind = "scalar"
count = 1

[dynamics]
rule = "softmax"
dt = 0.1
steps = 10

[axes]
"dynamics.beta" = [0.5, 2.0]
"tokens.seed" = {count = 2}

[record]
times = [0.0, 1.0]
observables = ["eps", "energy"]
"""


def full_disk(path=None):
    return OSError(errno.ENOSPC, "No space left on device", str(path) if path else None)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    path = folder / "tiny.toml"
    path.write_text(textwrap.dedent(TINY))
    return path, load_results(run_sweep(path, folder / "clean"))


def _fail_once(monkeypatch, owner, name, when=lambda *a, **k: True):
    real = getattr(owner, name)
    state = {"failed": False}

    def failing(*args, **kwargs):
        if not state["failed"] and when(*args, **kwargs):
            state["failed"] = True
            raise full_disk(args[0] if args else None)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, failing)


FAULTS = {
    "sweep.json": lambda mp: _fail_once(mp, store_mod, "write_json"),
    "results.csv header": lambda mp: _fail_once(
        mp, store_mod, "atomic_write_text", lambda path, *a: str(path).endswith("results.csv")),
    "first unit's rows": lambda mp: _fail_once(mp, store_mod.ResultStore, "_append_rows"),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_sweep_that_met_a_full_disk_continues_when_run_again(tiny, tmp_path, monkeypatch, fault):
    path, clean = tiny
    with monkeypatch.context() as mp:
        FAULTS[fault](mp)
        with pytest.raises(OSError, match="No space left"):
            run_sweep(path, tmp_path / "out")
    got = load_results(run_sweep(path, tmp_path / "out"))   # the disk has room again
    assert got.keys() == clean.keys()
    for key in clean:
        assert np.array_equal(got[key], clean[key]) if got[key].dtype.kind != "f" else \
            np.array_equal(got[key], clean[key], equal_nan=True), key


def test_the_layout_an_earlier_version_left_on_a_full_disk_is_continued(tiny, tmp_path):
    """results.csv (its header) and an empty ledger without sweep.json: no unit finished, so
    there is nothing to mix up; the rerun starts afresh instead of refusing for good."""
    path, clean = tiny
    out = tmp_path / "out"
    out.mkdir()
    header = (path.parent / "clean" / "results.csv").read_text().split("\n")[0]
    (out / "results.csv").write_text(header + "\n")
    (out / "units_done.txt").write_text("")
    assert len(load_results(run_sweep(path, out))["step"]) == len(clean["step"])


def test_finished_units_without_sweep_json_are_still_refused(tiny, tmp_path):
    path, _ = tiny
    out = tmp_path / "out"
    run_sweep(path, out)
    (out / "sweep.json").unlink()
    with pytest.raises(Exception, match="lists finished units but sweep.json is missing"):
        run_sweep(path, out)


# ----------------------------------------------------------------------------- Ray

SLOW_UNITS = TINY.replace("n = 6", "n = 512").replace("steps = 10", "steps = 50000") \
    .replace("times = [0.0, 1.0]", "times = [0.0, 500.0]").replace("batch = 2", "batch = 1")


def _sweep_process(args, tmp_path):
    from cli_runner import start_particles
    return start_particles("sweep", *args, cwd=tmp_path)


@pytest.mark.ray
@pytest.mark.slow
def test_ray_banners_stay_out_of_the_output_unless_verbose(tiny, tmp_path):
    pytest.importorskip("ray")
    path, _ = tiny
    # both at once, each with its own local cluster: a Ray start is mostly waiting (~20 s)
    quiet = _sweep_process([str(path), "--executor", "ray", "--workers", "1", "--out", "q"], tmp_path)
    loud = _sweep_process([str(path), "--executor", "ray", "--workers", "1", "--out", "v",
                           "--verbose"], tmp_path)
    try:
        out, err = quiet.communicate(timeout=300)
        assert quiet.returncode == 0, err[-2000:]
        assert "WARNING" not in out + err and "Token authentication" not in out + err, err[-2000:]
        assert "Started a local Ray instance" not in out + err
        out, err = loud.communicate(timeout=300)
    finally:
        for process in (quiet, loud):
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert loud.returncode == 0 and "Started a local Ray instance" in out + err, err[-2000:]


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self"), reason="the watchdog reads /proc")
def test_the_local_ray_cluster_does_not_outlive_a_sigkill_of_its_driver(tmp_path):
    """Ray's agents outlived a killed driver by about 60 s (and its GCS, raylet and workers
    die with it): within a few seconds none of the driver's processes is left."""
    import os
    import signal
    import time
    pytest.importorskip("ray")
    from particles.app.sweep.executors import _processes_below
    (tmp_path / "slow.toml").write_text(textwrap.dedent(SLOW_UNITS))
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
    import time
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
