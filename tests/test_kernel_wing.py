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
import reference as ref
from conftest import general_heads, random_tokens
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


_TOY = r"""
import numpy as np
from particles import kernel_math, layout
import test_path_capabilities as t
import reference as ref
from conftest import general_heads, random_tokens

ti = kernel_math.ti
TOY_SLOT = layout.tok_slot(0, layout.SLOT_ENTROPY_RATE)   # free while the entropy rate is off
shared_norm, shared_observables = kernel_math.normalisation, kernel_math.token_observables

def halved(real, softmax, exponential, guarded=True):
    row_norm = shared_norm(real, softmax, exponential, guarded)

    @ti.func
    def toy(wsum, m, count):
        return row_norm(wsum, m, count) * 0.5
    return toy

def with_toy(H, d, sphere, zero, absolute, head_output, point, radial_shadow, row_stat, store):
    observe = shared_observables(H, d, sphere, zero, absolute, head_output, point, radial_shadow,
                                 row_stat, store)

    @ti.func
    def toy(f: ti.template(), y: ti.template(), radial: ti.template(), row: ti.template(),
            tok: ti.template(), b, i, n, v_radial, kinetic):
        observe(f, y, radial, row, tok, b, i, n, v_radial, kinetic)
        store(tok, b, i, n, TOY_SLOT, kinetic + 2 * point(y, b, i, 0))   # |xdot_i|^2 + 2 x_i0
    return toy

kernel_math.normalisation = halved          # before any pass is compiled
kernel_math.token_observables = with_toy
import particles
seen = []
for path, implementation, (rule, attention, n) in t.IMPLEMENTATION_TABLE:
    x, heads = random_tokens(n, t.D, seed=21), general_heads(t.H, t.D, seed=22)
    sim = particles.Simulation(x, heads, beta=t.BETA, rule=rule, dtype="float64", path=path,
                               attention=attention)
    atts = attention or [particles.Attention()] * t.H
    specs = [ref.HeadSpec(a.rule.name if a.rule is not None else rule, beta=a.beta, mask=a.mask,
                          window=a.window, alibi=a.alibi) for a in atts]
    # Sinkhorn's rows are scaled by its own potentials, not by the shared row normalisation
    want = (1.0 if implementation == "sinkhorn" else 0.5) * ref.spec_velocity(x, heads, t.BETA, specs)
    err = np.max(np.abs(sim.velocity() - want)) / np.max(np.abs(want))
    assert err < 1e-10, ("normalisation", path, implementation, err)
    sim.observe()
    toy = sim._tok.to_numpy()[0, :, TOY_SLOT]
    want_toy = (want ** 2).sum(axis=1) + 2 * x[:, 0]
    err = np.max(np.abs(toy - want_toy)) / np.max(np.abs(want_toy))
    assert err < 1e-10, ("observable", path, implementation, err)
    seen.append(f"{path}-{sim.implementation}")
print(" ".join(seen))
"""


def test_a_toy_observable_and_normalisation_in_the_shared_library_reach_every_implementation(tmp_path):
    """kernel_math.token_observables and kernel_math.normalisation are each the one home of
    their mathematics: replaced in a fresh interpreter before anything compiles (an extra
    per-token observable |xdot_i|^2 + 2 x_i0 in a free slot; half of every row's pull),
    every (path, implementation) of the capability table (test_path_capabilities) writes the
    observable and returns half the float64 reference's velocity, to 1e-10."""
    import test_path_capabilities as table
    script = tmp_path / "toy.py"   # a file: Taichi reads a ti.func's source
    script.write_text(_TOY)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
           "PARTICLES_TUNING": "off"}
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = proc.stdout.split()
    assert sorted(seen) == sorted(f"{p}-{i}" for p, i, _ in table.IMPLEMENTATION_TABLE), seen


def test_a_fused_simulation_measures_and_caches_no_tuning(tmp_path, monkeypatch):
    """With tuning on and an empty cache, a simulation on the fused path builds no wide pass:
    nothing is measured, no cache entry is written and sim.tuning is '-'; the same system on
    the tiled path (the wide pass from n = 512) measures once and writes its entry (the
    measurement itself replaced by fixed times: what is tested is who asks for it)."""
    from particles import tuning
    cache = tmp_path / "tuning.json"
    monkeypatch.setenv(tuning.ENV, "measure")
    monkeypatch.setenv(tuning.CACHE_ENV, str(cache))
    asked = []

    def fixed_times(candidates, prepare):
        asked.append(len(candidates))
        return {t.label: 1.0 for t in candidates}
    monkeypatch.setattr(tuning, "best_times", fixed_times)
    x = random_tokens(paths.WIDE_MIN_N + 88, 3, seed=2)
    heads = [np.eye(3), 0.5 * np.eye(3)]
    fused = particles.Simulation(x, heads, rule="softmax")
    assert (fused.path, fused.implementation, fused.tuning) == ("fused", "fused", "-")
    assert asked == [] and not cache.exists()
    tiled = particles.Simulation(x, heads, rule="softmax", path="tiled")
    assert tiled.implementation == "wide" and tiled.tuning.endswith("(measured)")
    assert asked == [3] and len(json.loads(cache.read_text())) == 1


def test_run_json_records_the_implementation_beside_the_path(tmp_path):
    """run.json names the code that ran (sim.implementation), not only the path: 512 tokens in
    float64 take the tiled path's wide pass."""
    from particles.app.run import run_scene
    from scenes import load_scene
    scene = load_scene("quickstart", overrides=["tokens.n=512", "dynamics.dtype=float64", "dynamics.steps=1"])
    run_scene(scene, tmp_path / "run", render=False, progress=False, echo=lambda *a: None)
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert (info["path"], info["implementation"]) == ("tiled", "wide")


@pytest.mark.parametrize("rule", ["softmax", "relu"])
def test_key_by_key_streams_a_row_to_numpys_sums(rule):
    """kernel_math.key_by_key, one key at a time as the plain and GPU passes call it, over a row
    whose maximum rises at keys 0, 3, 7 and 12 (each rise an online_rebase, the value sum scaled
    then), against float64 NumPy: softmax's weights e^(z - max z), their sum, the entropy sum
    and the weighted sum of u; ReLU's weights, the entropy terms relative to the largest weight
    (add_weight), the positive weights' sum and the potential's sum."""
    import taichi as ti
    from particles import kernel_math
    particles.backend.init("cpu")
    rng = np.random.default_rng(7)
    z = rng.uniform(-2.0, 0.5, 16)
    z[[0, 3, 7, 12]] = [0.6, 1.1, 2.5, 4.0]   # the running maximum rises four times
    u = rng.standard_normal(16)
    add_key = kernel_math.key_by_key(particles.get_rule(rule), ti.f64)
    f64 = ti.types.ndarray(dtype=ti.f64, ndim=1)

    @ti.kernel
    def stream(z: f64, u: f64, out: f64):
        m, wsum, ent, wpos, top, pot, acc = -1.0e300, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
        for _ in range(1):  # one thread, keys in order
            for j in range(z.shape[0]):
                w, rebased, scale, m, wsum, ent, wpos, top, pot = add_key(z[j], 0, j, z.shape[0], m, wsum, ent,
                                                                          wpos, top, pot, True)
                if rebased:
                    acc *= scale
                acc += w * u[j]
        out[0], out[1], out[2], out[3], out[4], out[5], out[6] = m, wsum, ent, wpos, top, pot, acc

    out = np.zeros(7)
    stream(z, u, out)
    m, wsum, ent, wpos, top, pot, acc = out
    if rule == "softmax":
        w = np.exp(z - z.max())
        assert m == z.max()
        want = (w.sum(), (w * (z - z.max())).sum(), (w * u).sum())
        np.testing.assert_allclose((wsum, ent, acc), want, rtol=1e-13)
    else:
        w = np.maximum(z, 0)
        pos = w[w > 0]
        want = (w.sum(), (pos * np.log(pos / pos.max())).sum(), pos.sum(), pos.max(), (w * w / 2).sum(), (w * u).sum())
        np.testing.assert_allclose((wsum, ent, wpos, top, pot, acc), want, rtol=1e-13)


@pytest.mark.parametrize("vector_bits", [256, 512])
def test_the_fused_register_tiles_of_either_vector_width_step_as_the_reference(monkeypatch, vector_bits):
    """The fused pass's row tiles follow the CPU's vector width (kernels_fused.tile_shape: 2
    row vectors below 512 bits, 4 at n = 100 with 512): each family is compiled and checked
    here whatever this machine is, an RK4 step and the observables against float64 NumPy."""
    from particles import kernels_fused
    monkeypatch.setattr(kernels_fused, "VECTOR_BITS", vector_bits)
    n, d = 60, 5
    nbl = -(-n // 8)   # float64: 8 lanes
    assert kernels_fused.tile_shape(nbl, d, vector_bits)[0] == (2 if vector_bits < 512 else 4)
    x = random_tokens(n, d, 3)
    heads = general_heads(2, d, 3)
    sim = particles.Simulation(x, heads, beta=1.3, rule="softmax", dtype="float64", integrator="rk4",
                               dt=0.02, path="fused")
    sim.observe()
    row = sim.take_rows()[0]
    want = ref.observables(x, heads, 1.3, "softmax", "sphere")
    assert abs(row["energy"] / want["energy"] - 1) < 1e-12
    assert abs(row["entropy_mean_h1"] / want["entropy_mean_h1"] - 1) < 1e-12
    sim.advance(2)
    expect = ref.step_rk4(ref.step_rk4(x, heads, 1.3, "softmax", "sphere", 0.02), heads, 1.3, "softmax",
                          "sphere", 0.02)
    assert np.max(np.abs(sim.tokens - expect)) < 1e-12
