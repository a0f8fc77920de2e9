"""Sizes whose one evaluation holds off Ctrl-C and SIGTERM for more than seconds (issue 31.7):
the guard is where the Simulation is built, so the API has it too, and it says the size, the
wait and how to accept it."""
import numpy as np
import pytest

from particles import validation
from particles.errors import ParticlesUserError


def test_the_limit_is_seconds_of_one_evaluation_not_hours():
    assert validation.CPU_PAIR_LIMIT * validation.NS_PER_PAIR * 1e-9 <= 10
    validation.pair_guard(54_000, 1, 1, "cpu")                      # 2.9e9 pairs: about 9 s
    with pytest.raises(ParticlesUserError) as err:
        validation.pair_guard(2_000_000, 2, 1, "cpu", "[tokens] ")   # the sweep unit
    text = str(err.value)
    assert "[tokens] n = 2000000 (2 heads, 1 replicas) means 8e+12 token pairs" in text
    assert "about 7 h" in text and "Ctrl-C and SIGTERM wait for" in text
    assert "PARTICLES_MAX_PAIRS=8e12" in text
    validation.pair_guard(2_000_000, 2, 1, "cuda")                  # a GPU's kernels are not ours to time


def test_the_override_is_read_and_checked(monkeypatch):
    monkeypatch.setenv("PARTICLES_MAX_PAIRS", "1e13")
    validation.pair_guard(2_000_000, 2, 1, "cpu")
    monkeypatch.setenv("PARTICLES_MAX_PAIRS", "lots")
    with pytest.raises(ParticlesUserError, match="PARTICLES_MAX_PAIRS = 'lots' must be a positive number"):
        validation.pair_guard(10, 1, 1, "cpu")


def test_the_simulation_itself_refuses_before_it_compiles(monkeypatch):
    """From the API there was no guard at all (it lived in the app layer)."""
    import particles
    monkeypatch.setenv("PARTICLES_MAX_PAIRS", "1e6")
    x = np.random.default_rng(0).standard_normal((3, 700, 2))      # 3 replicas x 2 heads x 700^2
    with pytest.raises(ParticlesUserError, match=r"n = 700 \(2 heads, 3 replicas\) means 2.9e\+06 token pairs"):
        particles.Simulation(x, [np.eye(2), np.eye(2)], beta=1.0)


def test_a_run_looks_for_a_signal_within_a_billion_pairs_of_work():
    assert validation.steps_between_signal_checks(64 * 64 * 4) == 16      # the quickstart
    assert validation.steps_between_signal_checks(2e8) == 5
    assert validation.steps_between_signal_checks(3e9 * 4) == 1
