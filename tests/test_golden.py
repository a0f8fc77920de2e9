"""Behaviour held fixed: recorded runs (tests/golden/) are made again and compared.

On the machine that recorded them (same CPU model and vector width, same Taichi and LLVM:
tests/golden/machine.json) the logs, results tables and trajectories must be identical bit
for bit. On any other machine Taichi's JIT vectorises the observables' reductions
differently, so each number is held to its dtype's tolerance instead
(`golden_runs.RTOL`); the session's summary says which comparison ran. A difference means
the numbers changed: that needs a reason, and a new recording (tests/golden_runs.py) in the
same commit as the change that explains it.
"""
import pytest

import golden_runs
from particles import backend, machine

def _bitwise_here() -> bool:
    return golden_runs.same_machine(golden_runs.recorded_machine(), backend.fingerprint())


def _mode_line(bitwise: bool) -> str:
    recorded = golden_runs.recorded_machine()
    if bitwise:
        return f"golden runs compared bitwise (recorded on this machine: {machine.describe(recorded)})"
    tol = ", ".join(f"{k} rtol {v:g}" for k, v in golden_runs.RTOL.items())
    return (f"golden runs compared to the dtype's tolerance ({tol}): recorded on "
            f"{machine.describe(recorded) if recorded else 'an unrecorded machine'}, this is "
            f"{machine.describe(backend.fingerprint())}")


@pytest.mark.parametrize("name", golden_runs.NAMES)
def test_golden_run_is_unchanged(name, tmp_path, record_property):
    bitwise = _bitwise_here()
    line = _mode_line(bitwise)
    record_property("golden_mode", line)   # conftest's terminal summary prints it (xdist workers too)
    print(line)
    folder = golden_runs.produce(name, tmp_path / name)
    golden_runs.compare(name, golden_runs.outputs(folder), golden_runs.GOLDEN / name, bitwise)


def test_another_machine_is_held_to_the_tolerance_and_a_real_change_still_fails(tmp_path, monkeypatch):
    """As on a machine of another CPU model (the recorded CPU string edited): the run made
    here passes at the tolerance, and the same run with dt changed by 0.1% fails."""
    recorded = dict(golden_runs.recorded_machine(), model="Some Other CPU", vector_width_bits=256)
    monkeypatch.setattr(golden_runs, "recorded_machine", lambda: recorded)
    assert not _bitwise_here()
    folder = golden_runs.produce("quickstart", tmp_path / "same")
    golden_runs.compare("quickstart", golden_runs.outputs(folder), golden_runs.GOLDEN / "quickstart",
                        bitwise=False)

    scene_name, overrides, steps = golden_runs.RUNS["quickstart"]
    monkeypatch.setitem(golden_runs.RUNS, "quickstart", (scene_name, overrides + ["dynamics.dt=0.05005"], steps))
    changed = golden_runs.produce("quickstart", tmp_path / "changed")
    with pytest.raises(AssertionError, match="rtol"):
        golden_runs.compare("quickstart", golden_runs.outputs(changed), golden_runs.GOLDEN / "quickstart",
                            bitwise=False)


def test_tolerance_comparison_of_tables():
    want = "step,energy,clusters\n0,1.0,3\n1,0.5,2\n2,nan,2\n"
    golden_runs.compare_tables(want, want, 1e-12, "t")
    golden_runs.compare_tables("step,energy,clusters\n0,1.0000000000001,3\n1,0.5,2\n2,nan,2\n", want, 1e-12, "t")
    bad = ["step,energy,clusters\n0,1.000000001,3\n1,0.5,2\n2,nan,2\n",     # float64: 1e-9 off
           "step,energy,clusters\n0,1.0,4\n1,0.5,2\n2,nan,2\n",             # a count differs
           "step,energy,clusters\n0,1.0,3\n1,0.5,2\n2,0.1,2\n",             # NaN became a number
           "step,energy,clusters\n0,1.0,3\n1,0.5,2\n",                      # a row lost
           "step,energy,cluster\n0,1.0,3\n1,0.5,2\n2,nan,2\n"]              # a column renamed
    for got in bad:
        with pytest.raises(AssertionError):
            golden_runs.compare_tables(got, want, 1e-12, "t")
