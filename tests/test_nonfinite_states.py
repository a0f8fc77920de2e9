"""A state whose tokens or velocity are not finite: every path logs NaN in every observable,
and the drive loop stops with BlowUpError instead of handing such a row to a writer."""
import math

import numpy as np
import pytest

import particles
from conftest import general_heads, random_tokens
from particles.observables import INDEX_COLUMNS


def _all_observables_nan(row):
    return all(math.isnan(v) for k, v in row.items() if k not in INDEX_COLUMNS)


@pytest.mark.parametrize("path", ["fused", "tiled", "plain"])
@pytest.mark.parametrize("rule", ["exp", "relu"])
def test_nan_tokens_log_nan_in_every_column_on_every_path(path, rule):
    x = random_tokens(9, 3, seed=1)
    sim = particles.Simulation(x, general_heads(2, 3), rule=rule, dtype="float32", path=path)
    bad = sim.native_tokens().copy()
    bad[0, 4, :] = np.nan
    sim._x.from_numpy(bad)  # past the API's door, which refuses NaN: as a blow-up leaves it
    sim.observe()
    (row,) = sim.take_rows()
    assert _all_observables_nan(row), {k: v for k, v in row.items() if not math.isnan(v)}


@pytest.mark.parametrize("path", ["fused", "tiled"])
def test_an_overflowing_velocity_with_finite_tokens_stops_the_run(path):
    """float64, flat space, tokens near 1e155: scores overflow, the tokens stay finite."""
    x = random_tokens(8, 3, seed=2) * 1e155
    sim = particles.Simulation(x, general_heads(1, 3), rule="softmax", geometry="flat",
                               dtype="float64", path=path)
    assert np.all(np.isfinite(sim.tokens))
    sim.observe()
    (row,) = sim.take_rows()
    assert _all_observables_nan(row)
    with pytest.raises(particles.BlowUpError, match="velocity is not finite"):
        sim.run(3, every=1)
