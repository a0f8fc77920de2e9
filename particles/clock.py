"""The time of a step: step * dt, written as the decimal the user meant.

In binary floating point 7 * 0.025 is 0.17500000000000002, so a log's `time == 0.175` finds
nothing. Times are rounded to the precision of dt's shortest decimal form plus the digits of
the step count, which removes the noise of the product and nothing else.
"""
from __future__ import annotations

import math
from decimal import Decimal


def step_time(step: int, dt: float) -> float:
    """step * dt, rounded to the decimals dt was given in (dt = 0.025: three decimals)."""
    t = step * dt
    if not math.isfinite(t) or step == 0:
        return float(t)
    exponent = Decimal(repr(float(dt))).normalize().as_tuple().exponent
    decimals = max(0, -int(exponent))
    if decimals > 15:  # dt not a short decimal (e.g. 1/3): the product is as meant as it gets
        return t
    return round(t, decimals)
