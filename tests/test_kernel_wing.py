"""The kernel wing's shared mathematics (particles.kernel_math) and the plan that picks its code:
the column reduction in both of its schedules against NumPy, the reduction named by the plan,
a toy observable and a toy normalisation reaching every implementation, and no tuning for a
pass that never runs."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import particles
from conftest import random_tokens
from particles import kernels, kernels_gpu, layout, paths

ROOT = Path(__file__).resolve().parents[1]


def _needs(arch: str) -> paths.Needs:
    return paths.Needs(rules=frozenset({"exponential"}), positions=False, layers=False,
                       entropy_rate=False, arch=arch, n=600, d=3, H=2, r=3, rv=3, dtype="float32")


def test_the_plan_names_the_column_reduction_by_arch():
    assert paths.choose("tiled", _needs("cpu")).reduction == "serial"
    assert paths.choose("tiled", _needs("cuda")).reduction == "chunked"
    assert paths.choose("plain", _needs("vulkan")).reduction == "chunked"
    assert paths.choose("auto", _needs("cpu")).reduction == "serial"   # fused: it reduces inside
    # what runs is what the plan names: a CPU simulation takes the serial kernel
    sim = particles.Simulation(random_tokens(9, 3), [np.eye(3)], path="tiled")
    assert sim.plan.reduction == "serial" and sim._reduce == sim._kern.reduce


@pytest.mark.parametrize("reduction", ["serial", "chunked"])
def test_both_schedules_of_the_column_reduction_match_numpy(reduction):
    """kernel_math.column_reduction over all n tokens at once (the CPU's) and over chunks of
    kernels_gpu.CHUNK tokens and then the chunks (a GPU's), both run here on the CPU, against
    float64 NumPy: sum, min, max, the row energies' log-sum-exp and sum x_i / |x_i|, over
    600 tokens (three chunks, the last partial) of two replicas."""
    import taichi as ti
    particles.backend.init("cpu")
    R, n, d, H = 2, 600, 3, 2
    assert n > 2 * kernels_gpu.CHUNK
    slots = layout.n_tok_slots(H)
    rng = np.random.default_rng(4)
    tok_np = (rng.standard_normal((R, n, slots)) * 3).astype(np.float32)
    x_np = rng.standard_normal((R, n, d)).astype(np.float32)
    tok, x = ti.ndarray(ti.f32, (R, n, slots)), ti.ndarray(ti.f32, (R, n, d))
    tok.from_numpy(tok_np)
    x.from_numpy(x_np)
    red, sumx = ti.ndarray(ti.f64, (2, R, slots, 4)), ti.ndarray(ti.f64, (2, R, d, 1))
    kern = kernels.build(particles.get_rule("softmax"), "sphere", "float32", d, H, 3, 3)
    reduce = paths.factory(reduction)(kern)
    reduce(tok, x, red, sumx, 1)
    got, got_x = red.to_numpy()[1], sumx.to_numpy()[1, :, :, 0]
    t = tok_np.astype(np.float64)
    np.testing.assert_allclose(got[..., layout.RED_SUM], t.sum(axis=1), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(got[..., layout.RED_MIN], t.min(axis=1))
    np.testing.assert_array_equal(got[..., layout.RED_MAX], t.max(axis=1))
    energy = [layout.tok_slot(h, layout.SLOT_ROW_ENERGY) for h in range(H)]
    lse = np.log(np.exp(t[:, :, energy]).sum(axis=1))
    np.testing.assert_allclose(got[:, energy, layout.RED_LSE], lse, rtol=1e-12)
    xx = x_np.astype(np.float64)
    want_x = (xx / np.linalg.norm(xx, axis=-1, keepdims=True)).sum(axis=1)
    np.testing.assert_allclose(got_x, want_x, rtol=1e-12, atol=1e-12)
