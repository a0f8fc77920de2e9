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


# Ray (banners, a SIGKILL of the driver): tests/test_ray.py
