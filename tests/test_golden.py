"""Behaviour held bitwise: recorded runs (tests/golden/) are made again and compared exactly.

Logs and results tables as text (they hold no wall-clock column), trajectories with
np.array_equal. A difference here means the numbers changed: that needs a reason, and a new
recording (tests/golden_runs.py) in the same commit as the change that explains it.
"""
import numpy as np
import pytest

import golden_runs


@pytest.mark.parametrize("name", golden_runs.NAMES)
def test_golden_run_is_bitwise_unchanged(name, tmp_path):
    folder = golden_runs.produce(name, tmp_path / name)
    got = golden_runs.outputs(folder)
    want_dir = golden_runs.GOLDEN / name
    texts = [t for t in ("log.csv", "results.csv") if (want_dir / t).is_file()]
    assert texts, f"golden run {name} has no recorded table"
    for text in texts:
        assert got[text] == (want_dir / text).read_text(), f"{name}/{text} differs from the recording"
    if (want_dir / "trajectory.npz").is_file():
        with np.load(want_dir / "trajectory.npz") as want:
            for key in ("steps", "times", "tokens"):
                assert got["trajectory"][key].dtype == want[key].dtype
                assert np.array_equal(got["trajectory"][key], want[key]), f"{name} trajectory {key}"
    else:
        assert "trajectory" not in got
