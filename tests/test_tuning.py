"""Speed choices measured per machine (particles.tuning): every candidate gives the reference's
numbers, the fastest measured one is kept and cached under the CPU, overrides work, and a
damaged cache or a bad override is handled."""
import json

import numpy as np
import pytest

import particles
import reference as ref
from conftest import RTOL, general_heads, random_tokens, rel_err
from particles import backend, kernels_wide, machine, tuning
from particles.errors import ParticlesUserError

# the defaults run in the fast tier (tests/test_engine.py); 256-bit float32 lanes here too
CANDIDATES = [pytest.param(dtype, t.label, id=f"{dtype}-{t.label}",
                           marks=() if (dtype, t.label) == ("float32", "8x3x6") else pytest.mark.slow)
              for dtype, tiles in tuning.WIDE_CANDIDATES.items() for t in tiles[1:]]


@pytest.mark.parametrize("dtype, label", CANDIDATES)
def test_every_candidate_matches_the_reference(dtype, label, monkeypatch):
    monkeypatch.setenv(tuning.ENV, f"wide={label}")
    n, d, beta = kernels_wide.WIDE_MIN_N + 9, 6, 1.3
    x = random_tokens(n, d, seed=6)
    heads = general_heads(2, d, seed=6)
    sim = particles.Simulation(x, heads, beta=beta, rule="softmax", dtype=dtype, path="tiled")
    assert sim.tuning == f"wide {label} (set by {tuning.ENV})"
    assert rel_err(sim.velocity(), ref.velocity(x, heads, beta, "softmax", "sphere")) < RTOL[dtype]
    sim.observe()
    row = sim.take_rows()[0]
    want = ref.observables(x, heads, beta, "softmax", "sphere")
    tol = 1e-9 if dtype == "float64" else 1e-4
    for key in ("energy_h1", "entropy_mean_h0", "radial_mean_h1", "kinetic"):
        assert abs(row[key] - want[key]) <= tol * max(abs(want[key]), 1e-3), key


@pytest.fixture
def measuring(tmp_path, monkeypatch):
    monkeypatch.setenv(tuning.ENV, "measure")
    monkeypatch.setenv(tuning.CACHE_ENV, str(tmp_path / "tuning.json"))
    return tmp_path / "tuning.json"


@pytest.fixture
def fake_clock(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(tuning.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(tuning.time, "sleep", lambda s: None)
    return clock


def timed_by(fake_clock, seconds, prepared=None):
    def prepare(tiles):
        if prepared is not None:
            prepared.append(tiles.label)

        def one_pass():
            fake_clock[0] += seconds[tiles.label]
        return one_pass
    return prepare


def test_the_fastest_candidate_is_kept_and_cached_under_this_cpu(measuring, fake_clock):
    fake = {"16x3x6": 3.0, "8x3x6": 1.0, "16x2x4": 2.0}
    timed = []
    measure = timed_by(fake_clock, fake, timed)

    key = tuning.shape_class("float32", 64, 64, 64, True, 3000)
    assert key.startswith(machine.describe(backend.fingerprint())) and "n~4096" in key
    choice = tuning.wide_tiles("float32", key, measure)
    assert (choice.tiles.label, choice.how) == ("8x3x6", "measured") and sorted(timed) == sorted(fake)
    stored = json.loads(measuring.read_text())[key]
    assert stored["choice"] == "8x3x6" and stored["seconds_per_pass"] == fake
    again = tuning.wide_tiles("float32", key, lambda t: pytest.fail("measured twice"))
    assert (again.tiles.label, again.how) == ("8x3x6", "cached")
    # another CPU (or another shape class) is measured on its own
    other = key.replace(machine.describe(backend.fingerprint()), "Some Other CPU")
    assert tuning.wide_tiles("float32", other, measure).how == "measured"


def test_the_default_stays_unless_another_is_clearly_faster(measuring, fake_clock):
    close = {"16x3x6": 1.0, "8x3x6": 0.95, "16x2x4": 1.2}
    assert tuning.wide_tiles("float32", "a", timed_by(fake_clock, close)).tiles.label == "16x3x6"
    clear = {"16x3x6": 1.0, "8x3x6": 0.8, "16x2x4": 1.2}
    assert tuning.wide_tiles("float32", "b", timed_by(fake_clock, clear)).tiles.label == "8x3x6"


def test_candidates_are_timed_in_interleaved_rounds_best_of_each(fake_clock):
    """A burst of load during one round slows every candidate, not only the one timed then."""
    order = []
    base = {"16x3x6": 1.0, "8x3x6": 2.0}

    def prepare(tiles):
        def one_pass():
            order.append(tiles.label)
            loaded = 2 <= len(order) - 1 <= 3          # calls 0, 1 compile; 2, 3: a loaded round
            fake_clock[0] += base[tiles.label] + (10.0 if loaded else 0.0)
        return one_pass
    seconds = tuning.best_times([tuning.WideTiles(16, 3, 6), tuning.WideTiles(8, 3, 6)], prepare)
    assert order == ["16x3x6", "8x3x6"] * (1 + tuning.ROUNDS)   # compiled, then round by round
    assert seconds == base


def test_a_damaged_cache_is_measured_again(measuring, fake_clock):
    measuring.write_text("{not json")
    choice = tuning.wide_tiles("float64", "k", timed_by(fake_clock, {"8x3x6": 2.0, "4x3x6": 1.0, "8x2x4": 1.5}))
    assert choice.how == "measured" and choice.tiles.label != "8x3x6"
    assert json.loads(measuring.read_text())["k"]["choice"] == choice.tiles.label


def test_off_uses_the_defaults_without_measuring(monkeypatch):
    monkeypatch.setenv(tuning.ENV, "off")
    choice = tuning.wide_tiles("float32", "k", lambda t: pytest.fail("measured"))
    assert choice.describe() == "wide 16x3x6 (default)"


@pytest.mark.parametrize("value, says", [("fast", "'measure' (the default), 'off'"),
                                         ("wide=16x3", "LANESxROWSxCOLS"),
                                         ("wide=16x3x5", "dividing rows x lanes"),
                                         ("wide=32x1x1", "lanes 4, 8 or 16")])
def test_a_bad_override_names_the_variable(monkeypatch, value, says):
    monkeypatch.setenv(tuning.ENV, value)
    with pytest.raises(ParticlesUserError, match=tuning.ENV) as err:
        tuning.wide_tiles("float32", "k", lambda t: lambda: None)
    assert says in str(err.value)


def test_measuring_times_real_passes_and_the_pick_is_used(measuring):
    """The real measurement (compiled candidates, timed passes) picks a candidate the
    simulation then runs; small n, so the timings are short."""
    n, d = kernels_wide.WIDE_MIN_N, 4
    sim = particles.Simulation(random_tokens(n, d, 1), general_heads(1, d, 1), rule="exp", path="tiled")
    stored = next(iter(json.loads(measuring.read_text()).values()))
    assert set(stored["seconds_per_pass"]) == {t.label for t in tuning.WIDE_CANDIDATES["float32"]}
    assert all(0 < s < 5 for s in stored["seconds_per_pass"].values())
    assert sim.tuning == f"wide {stored['choice']} (measured)"


def test_small_simulations_have_no_tuned_choice():
    sim = particles.Simulation(random_tokens(8, 3), general_heads(1, 3))
    assert sim.tuning == "-"


@pytest.mark.parametrize("entry", ["x", {"choice": 5}, {"choice": [1]}, {"choice": "99x9x9"}, None])
def test_a_cache_entry_of_the_wrong_kind_is_measured_again(measuring, fake_clock, entry):
    measuring.write_text(json.dumps({"k": entry}))
    choice = tuning.wide_tiles("float32", "k", timed_by(fake_clock, {"16x3x6": 1.0, "8x3x6": 2.0, "16x2x4": 2.0}))
    assert (choice.tiles.label, choice.how) == ("16x3x6", "measured")


def test_an_empty_override_is_the_default_mode(measuring, fake_clock, monkeypatch):
    monkeypatch.setenv(tuning.ENV, " ")
    assert tuning.wide_tiles("float32", "k", timed_by(fake_clock, {"16x3x6": 1.0, "8x3x6": 2.0,
                                                                   "16x2x4": 2.0})).how == "measured"


def test_the_cache_is_never_written_through_a_link(measuring, fake_clock, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    measuring.symlink_to(outside)
    choice = tuning.wide_tiles("float32", "k", timed_by(fake_clock, {"16x3x6": 1.0, "8x3x6": 2.0, "16x2x4": 2.0}))
    assert choice.how == "measured" and outside.read_text() == "keep me" and measuring.is_symlink()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


# ----------------------------------------------------------------------------- hostile cache paths

FAKE = {"16x3x6": 1.0, "8x3x6": 2.0, "16x2x4": 2.0}


@pytest.mark.parametrize("kind", ["fifo", "char device", "folder"])
def test_a_cache_path_that_is_not_a_regular_file_is_neither_read_nor_replaced(
        measuring, fake_clock, monkeypatch, tmp_path, kind):
    """PARTICLES_TUNING_CACHE naming a FIFO (reading it waited forever), a device (/dev/zero
    was read to a MemoryError; a device node in its place was replaced by a JSON file) or a
    folder: measured, nothing read from it or written in its place."""
    import os
    import stat
    import threading
    path = tmp_path / "cache-node"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path = tmp_path / "zero"
        path.symlink_to("/dev/zero")   # a link to a device: as the device itself to the reader
    monkeypatch.setenv(tuning.CACHE_ENV, str(path))
    result = []
    worker = threading.Thread(target=lambda: result.append(
        tuning.wide_tiles("float32", "k", timed_by(fake_clock, FAKE))), daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "the tuning cache was waited on"
    assert result[0].how == "measured"
    mode = os.lstat(path).st_mode
    assert {"fifo": stat.S_ISFIFO, "folder": stat.S_ISDIR, "char device": stat.S_ISLNK}[kind](mode)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_device_node_as_the_cache_is_left_in_place(measuring, fake_clock, monkeypatch, tmp_path):
    """mknod ./nulldev c 1 3 as the cache (as root; else /dev/null itself, which is never
    written either): the device stays a device."""
    import os
    import stat
    node = tmp_path / "nulldev"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs root")
    monkeypatch.setenv(tuning.CACHE_ENV, str(node))
    assert tuning.wide_tiles("float32", "k", timed_by(fake_clock, FAKE)).how == "measured"
    assert stat.S_ISCHR(os.lstat(node).st_mode)
    assert tuning._read(node) == {}


def test_dev_zero_as_the_cache_is_not_read(fake_clock, monkeypatch):
    monkeypatch.setenv(tuning.ENV, "measure")
    monkeypatch.setenv(tuning.CACHE_ENV, "/dev/zero")
    assert tuning.wide_tiles("float32", "k", timed_by(fake_clock, FAKE)).how == "measured"


@pytest.mark.parametrize("content", ["[" * 200_000, "{\"k\": " * 200_000, " " * 4_000_001],
                         ids=["200000 brackets", "200000 objects", "over 4 MB"])
def test_a_deeply_nested_or_oversized_cache_is_measured_again(measuring, fake_clock, content):
    """A cache of 200,000 '[' (a RecursionError ended every large run) or one larger than any
    cache: damaged, measured again, and replaced by a good one."""
    measuring.write_text(content)
    choice = tuning.wide_tiles("float32", "k", timed_by(fake_clock, FAKE))
    assert (choice.tiles.label, choice.how) == ("16x3x6", "measured")
    assert json.loads(measuring.read_text())["k"]["choice"] == "16x3x6"


def test_the_cache_is_never_written_with_nan_or_infinity(measuring, fake_clock):
    """Another entry holding NaN or Infinity (Python's json reads them) is dropped when the
    cache is written back: the file stays standard JSON, the good entries stay."""
    good = {"choice": "8x3x6", "seconds_per_pass": {"8x3x6": 1.0}, "measured": "then"}
    measuring.write_text('{"nan": {"choice": "8x3x6", "seconds_per_pass": {"8x3x6": NaN}}, '
                         '"inf": {"choice": "8x3x6", "seconds_per_pass": {"8x3x6": -Infinity}}, '
                         f'"good": {json.dumps(good)}}}')
    tuning.wide_tiles("float32", "k", timed_by(fake_clock, FAKE))
    text = measuring.read_text()
    stored = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} written to the cache"))
    assert set(stored) == {"good", "k"} and stored["good"] == good
