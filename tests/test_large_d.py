"""Above kernel_math.UNROLL_MAX_D the loops over components run at runtime (unrolled at d = 384
they took minutes to compile): the velocity, one RK4 step (axpy, accumulate, the retraction),
every observable and the token sum of the reduction against the float64 NumPy reference."""
import numpy as np
import pytest

import particles
import reference as ref
from conftest import RTOL, general_heads, random_tokens, rel_err
from particles import kernel_math
from row_checks import assert_row_matches


@pytest.mark.parametrize("geometry", ["sphere", "flat"])
def test_above_the_unrolled_size_every_quantity_matches_reference(geometry):
    n, d, H, beta, dt = 9, kernel_math.UNROLL_MAX_D + 16, 2, 1.3, 0.05
    x = random_tokens(n, d, seed=4)
    if geometry == "flat":
        x = x * np.linspace(0.5, 1.5, n)[:, None]
    heads = general_heads(H, d, seed=5)
    sim = particles.Simulation(x, heads, beta=beta, rule="softmax", geometry=geometry, dt=dt,
                               integrator="rk4", dtype="float64", path="tiled")
    assert rel_err(sim.velocity(), ref.velocity(x, heads, beta, "softmax", geometry)) < RTOL["float64"]
    sim.observe()
    (row,) = sim.take_rows()
    want = ref.observables(x, heads, beta, "softmax", geometry)
    if geometry == "flat":  # gamma_bar and eps: the reference formula on unit tokens
        unit = x / np.linalg.norm(x, axis=1, keepdims=True)
        want.update({k: ref.observables(unit, heads, beta, "softmax", geometry)[k] for k in ("gamma_bar", "eps")})
    assert_row_matches(row, want, H, 1e-9, False)
    sim.advance(1)
    assert rel_err(sim.tokens, ref.step_rk4(x, heads, beta, "softmax", geometry, dt)) < RTOL["float64"]
