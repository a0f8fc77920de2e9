"""Bitwise resume does not depend on the tuning cache (issue 31.11): the wide pass's tiles sum
in different orders, so a run records the tiles it started with (run.json "tiles") and a
resume builds with those, whatever the cache or PARTICLES_TUNING says now; a sweep keeps one
set of tiles for all its units and attempts (sweep.json "tiles")."""
import json

import numpy as np
import pytest

from particles import tuning
from particles.app.run import resume_run, run_scene
from particles.errors import ParticlesUserError
from particles.output import load_trajectory
from scenes import load_scene

QUIET = dict(render=False, progress=False, echo=lambda *a: None)


def wide_scene(steps):
    """float64 at n = 512: the tiled path's wide pass (the fused one stops at n = 256)."""
    return load_scene("quickstart", overrides=["tokens.n=512", "dynamics.dtype=float64", "log.every=1",
                                               "log.trajectory_every=1", f"dynamics.steps={steps}"])


def test_a_resume_keeps_the_tiles_the_run_started_with(tmp_path, monkeypatch):
    # another column block than the default 8x3x6: the online softmax rebases at other columns,
    # so the bits differ on every CPU (4x3x6 summed as 8x3x6 does on an AVX2 Zen 3)
    monkeypatch.setenv("PARTICLES_TUNING", "wide=8x2x4")
    run_scene(wide_scene(4), tmp_path / "whole", **QUIET)
    run_scene(wide_scene(2), tmp_path / "resumed", **QUIET)
    info = json.loads((tmp_path / "resumed" / "run.json").read_text())
    assert info["tiles"] == {"wide float64 d=3 r=3 rv=3 softmax n~512": "8x2x4"}
    monkeypatch.setenv("PARTICLES_TUNING", "off")          # the cache emptied: the default tiles
    run_scene(wide_scene(4), tmp_path / "other_tiles", **QUIET)
    result = resume_run(tmp_path / "resumed", steps=4, **QUIET)
    assert result.status == "completed"
    info = json.loads((tmp_path / "resumed" / "run.json").read_text())
    assert info["tuning"] == "wide 8x2x4 (kept from run.json)", info["tuning"]
    _, _, whole, _ = load_trajectory(tmp_path / "whole")
    _, _, resumed, _ = load_trajectory(tmp_path / "resumed")
    _, _, other, _ = load_trajectory(tmp_path / "other_tiles")
    assert not np.array_equal(other[-1], whole[-1])     # the tiles matter: the test can fail
    assert np.array_equal(resumed, whole)
    assert (tmp_path / "resumed" / "log.csv").read_bytes() == (tmp_path / "whole" / "log.csv").read_bytes()


def test_recorded_tiles_are_checked_and_named():
    assert tuning.check_pins({"wide float32 d=3 r=3 rv=3 exp n~512": "16x3x6"}, "x") == \
        {"wide float32 d=3 r=3 rv=3 exp n~512": "16x3x6"}
    with pytest.raises(ParticlesUserError, match="run.json key 'tiles' holds tiles '3x3x3'"):
        tuning.check_pins({"a": "3x3x3"}, "run.json key 'tiles'")
    with pytest.raises(ParticlesUserError, match="run.json key 'tiles' must map pass classes"):
        tuning.check_pins(["16x3x6"], "run.json key 'tiles'")


def test_pins_win_over_the_environment_and_measure_false_takes_the_default(monkeypatch):
    monkeypatch.setenv("PARTICLES_TUNING", "wide=8x2x4")
    never = lambda tiles: pytest.fail("nothing is measured")   # noqa: E731
    with tuning.pinned({"wide float64 d=3 r=3 rv=3 exp n~512": "4x3x6"}, why="kept") as chosen:
        got = tuning.wide_tiles("float64", "cpu | wide float64 d=3 r=3 rv=3 exp n~512", never)
    assert (got.tiles.label, got.how) == ("4x3x6", "kept") and chosen == {"wide float64 d=3 r=3 rv=3 exp n~512": "4x3x6"}
    monkeypatch.setenv("PARTICLES_TUNING", "measure")
    with tuning.pinned({}, measure=False) as chosen:
        got = tuning.wide_tiles("float32", "cpu | wide float32 d=8 r=8 rv=8 exp n~4096", never)
    assert got.tiles == tuning.WIDE_CANDIDATES["float32"][0] and chosen == {"wide float32 d=8 r=8 rv=8 exp n~4096": "16x3x6"}


SWEEP = """
name = "wide"
[tokens]
n = 512
d = 3
[heads]
kind = "scalar"
[dynamics]
rule = "softmax"
dtype = "float64"
dt = 0.05
steps = 2
[axes]
"dynamics.beta" = [1.0, 2.0]
[record]
times = [0.0, 0.1]
observables = ["eps"]
"""


def test_a_sweep_keeps_one_set_of_tiles_for_every_unit_and_attempt(tmp_path, monkeypatch):
    from particles import backend, machine
    from particles.app.sweep import run_sweep
    from particles.app.sweep.executors import run_unit
    from particles.app.sweep.spec import load_sweep
    from particles.app.sweep.store import read_meta
    cache = tmp_path / "tuning.json"
    key = "wide float64 d=3 r=3 rv=3 softmax n~512"
    mine = machine.describe(backend.fingerprint())
    cache.write_text(json.dumps({f"{mine} | {key}": {"choice": "4x3x6"}}))
    monkeypatch.setenv("PARTICLES_TUNING_CACHE", str(cache))
    monkeypatch.setenv("PARTICLES_TUNING", "measure")
    (tmp_path / "sweep.toml").write_text(SWEEP)
    run_sweep(tmp_path / "sweep.toml", tmp_path / "out")
    assert read_meta(tmp_path / "out")["tiles"] == {key: "4x3x6"}
    cache.write_text(json.dumps({f"{mine} | {key}": {"choice": "8x2x4"}}))   # measured again since
    unit = load_sweep(tmp_path / "sweep.toml").units[0]
    assert run_unit(unit)["tuning"] == "wide 8x2x4 (cached)"      # a worker on its own: the cache's
    kept = run_unit(dict(unit, tiles=read_meta(tmp_path / "out")["tiles"]))
    assert kept["tuning"] == "wide 4x3x6 (kept by the sweep)"
    run_sweep(tmp_path / "sweep.toml", tmp_path / "out")           # another attempt keeps them
    assert read_meta(tmp_path / "out")["tiles"] == {key: "4x3x6"}
