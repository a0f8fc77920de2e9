"""Sizes whose one evaluation holds off Ctrl-C and SIGTERM for more than seconds (issue 31.7):
the guard is where the Simulation is built, so the API has it too, and it says the size, the
wait and how to accept it. Times are estimated from a pair's operations (2d + 24) at the rate
measured on a shared 2-core machine (0.2 ns per operation and core)."""
import numpy as np
import pytest

from particles import validation
from particles.errors import ParticlesUserError


def test_the_limit_is_seconds_of_one_evaluation_not_hours():
    # 2.6-3.1 ns per pair measured at d = 3 on 2 cores, 14.4 ns at d = 64
    assert validation.evaluation_seconds(1e9, 3, cores=2) == pytest.approx(3.0)
    assert validation.evaluation_seconds(1e9, 64, cores=2) == pytest.approx(15.2)
    assert validation.cpu_pair_limit(3, cores=2) == pytest.approx(5 / 3.0e-9)
    validation.pair_guard(28_000, 2, 1, "cpu", cores=2)                     # 1.6e9 pairs: ~5 s
    with pytest.raises(ParticlesUserError) as err:
        validation.pair_guard(2_000_000, 2, 1, "cpu", "[tokens] ", cores=2)   # the sweep unit
    text = str(err.value)
    assert "[tokens] n = 2000000 (2 heads, 1 replicas, d = 3) means 8e+12 token pairs" in text
    assert "(2 cores) one evaluation takes about 7 h" in text and "Ctrl-C and SIGTERM wait for" in text
    assert "PARTICLES_MAX_PAIRS=8e12" in text
    with pytest.raises(ParticlesUserError, match=r"d = 64\) means 6.7e\+08"):
        validation.pair_guard(8192, 10, 1, "cpu", d=64, cores=2)            # wide heads cost more per pair
    validation.pair_guard(2_000_000, 2, 1, "cuda")                          # a GPU's kernels are not timed here


def test_the_override_is_read_and_checked(monkeypatch):
    monkeypatch.setenv("PARTICLES_MAX_PAIRS", "1e13")
    validation.pair_guard(2_000_000, 2, 1, "cpu")
    for bad in ("lots", "0", "-1", "nan"):
        monkeypatch.setenv("PARTICLES_MAX_PAIRS", bad)
        with pytest.raises(ParticlesUserError, match=f"PARTICLES_MAX_PAIRS = '{bad}' must be a positive number"):
            validation.pair_guard(10, 1, 1, "cpu")


def test_the_simulation_itself_refuses_before_it_compiles(monkeypatch):
    """From the API there was no guard at all (it lived in the app layer)."""
    import particles
    monkeypatch.setenv("PARTICLES_MAX_PAIRS", "1e6")
    x = np.random.default_rng(0).standard_normal((3, 700, 2))      # 3 replicas x 2 heads x 700^2
    with pytest.raises(ParticlesUserError, match=r"n = 700 \(2 heads, 3 replicas, d = 2\) means 2.9e\+06 token pairs"):
        particles.Simulation(x, [np.eye(2), np.eye(2)], beta=1.0)


def test_a_run_looks_for_a_signal_within_two_seconds_of_work():
    step = validation.evaluation_seconds(64 * 64 * 2, 3, cores=2) * 4       # the quickstart, RK4
    assert validation.steps_between_signal_checks(step) == 16
    assert validation.steps_between_signal_checks(0.5) == 4
    assert validation.steps_between_signal_checks(20.0) == 1
