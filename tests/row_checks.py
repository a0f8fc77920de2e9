"""One observed log row against the float64 reference, with the tolerances every engine path
and arch is held to (used by test_observables.py and the GPU checks)."""
import math

PER_HEAD_RATES = ("tangent_power", "cross_coupling", "radial_shadow", "energy_rate")


def assert_row_matches(row: dict, want: dict, H: int, rtol: float, entropy_rate: bool) -> None:
    for h in range(H):  # scale for quantities that may cancel to ~0
        scale = max(abs(want[f"tangent_power_h{h}"]), abs(want[f"cross_coupling_h{h}"]), 1e-30)
        for q in PER_HEAD_RATES:
            key = f"{q}_h{h}"
            assert abs(row[key] - want[key]) <= rtol * 10 * scale, (key, row[key], want[key])
        if entropy_rate:
            key = f"entropy_rate_h{h}"
            assert abs(row[key] - want[key]) <= rtol * 100 * max(abs(want[key]), 1e-3), (key, row[key], want[key])
    for key, value in want.items():
        if key.startswith(PER_HEAD_RATES + ("entropy_rate",)):
            continue
        got = row[key]
        if math.isinf(value):
            assert math.isinf(got), key
        else:
            floor = 1.0 if key in ("gamma_bar", "eps") else 1e-30
            assert abs(got - value) <= rtol * 10 * max(abs(value), floor), (key, got, value)
