"""Times are the decimals the user meant: step * dt without binary float noise."""
import numpy as np

import particles
from conftest import general_heads, random_tokens
from particles.clock import step_time


def test_step_time_is_the_meant_decimal():
    assert 7 * 0.025 != 0.175 and step_time(7, 0.025) == 0.175
    assert step_time(3, 0.1) == 0.3 and step_time(10**6, 1e-5) == 10.0
    assert step_time(0, 0.05) == 0.0 and step_time(60, 0.05) == 3.0
    assert step_time(5, 1 / 3) == 5 * (1 / 3)     # no short decimal: left as computed


def test_logged_times_compare_equal_to_the_decimal():
    sim = particles.Simulation(random_tokens(6, 3), general_heads(1, 3), dt=0.025, path="tiled")
    res = sim.run(8, every=1)
    assert 0.175 in list(res.time) and res.time[-1] == 0.2
    assert sim.time == 0.2
    assert np.all(np.diff(res.time) > 0)
