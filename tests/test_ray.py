"""`--executor ray` under an address-space limit (issue 39.4): Ray's default object store (30%
of the memory) cannot be mapped under `prlimit --as=6G`, and the sweep ended in "internal
error" after 32 s. The local cluster's store is sized to what the process may map, and where
the limit leaves no room the sweep says so in one paragraph, naming what fixes it."""
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from particles.app.sweep.executors import (RAY_PROCESS_BYTES, RAY_STORE_MIN, LocalClusterError,
                                           object_store_bytes)

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


def _sweep_on_ray_under(limit, tmp_path, timeout):
    """`particles sweep --executor ray` of SWEEP in a process whose address space is ``limit`` bytes."""
    (tmp_path / "s.toml").write_text(SWEEP)
    return subprocess.run([sys.executable, "-m", "particles", "sweep", str(tmp_path / "s.toml"), "--out",
                           str(tmp_path / "out"), "--executor", "ray", "--workers", "2"],
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                          timeout=timeout, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))


def test_a_limit_too_small_for_ray_is_one_paragraph_not_a_crash(tmp_path):
    pytest.importorskip("ray")
    proc = _sweep_on_ray_under(2 * 10**9, tmp_path, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = " ".join(proc.stderr.split())
    assert "Ray's local cluster cannot start here" in err and "Traceback" not in err, err
    assert "StackTrace" not in proc.stderr and "internal error" not in err, err


@pytest.mark.slow
@pytest.mark.ray
def test_a_sweep_runs_on_ray_under_a_six_gigabyte_limit(tmp_path):
    pytest.importorskip("ray")
    proc = _sweep_on_ray_under(6 * 10**9, tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "out" / "results.csv").read_text().count("\n") == 5
