"""The engine on a GPU: steps/s with every observable, achieved TFLOP/s, device memory,
and PyTorch's scaled_dot_product_attention on the same GPU when torch is installed.

    python benchmarks/gpu.py [--small] [--arch gpu] [--peak-tflops X] [--min-time S]

One table. The step: rule softmax, sphere, float32, explicit Euler (as benchmarks/step.py
and its torch peer, ``peers.torch_step``), H heads given as factors, observables every step
(``sim.advance(1, observe_every=1)``; rows taken every 64 steps, as a run does). Cases
(n, d, H): (16384, 64, 8) full heads (r = rv = 64), (65536, 64, 8) and (100000, 64, 8) with
rank-8 heads; --small runs (512, 16, 2) full and (1000, 16, 2) rank 4, for the software
Vulkan device (tests/test_gpu.py runs it so it cannot rot).

Timing: the Simulation compiles and warms up when built (compile time excluded), then
``time_per_call`` of step.py (best of about five blocks, ``ti.sync()`` around each block).
FLOPs per step, counted as multiply-adds x 2 (exp and the observables not counted):
    pair  2 H n^2 (r + rv),  project 2 H n d (2 r + rv),  head_out 2 H n rv d.
The FP32 peak is looked up by device name (Vulkan: as Taichi reports it; CUDA: nvidia-smi)
in PEAK_FP32_TFLOPS, or given with --peak-tflops. Device memory: the bytes of every array the
Simulation allocated ("arrays"), and on CUDA the process's memory as nvidia-smi reports it.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import peers  # noqa: E402
from step import time_per_call, tokens  # noqa: E402

BETA, DT, SEED = 1.0, 0.01, 0
CASES = [(16384, 64, 8, 64), (65536, 64, 8, 8), (100000, 64, 8, 8)]   # (n, d, H, rank)
SMALL_CASES = [(512, 16, 2, 16), (1000, 16, 2, 4)]
# Dense FP32 (non-tensor-core) peaks, TFLOP/s, by a substring of the device name.
PEAK_FP32_TFLOPS = {
    "H200": 67.0, "H100 SXM": 67.0, "H100 PCIe": 51.0, "H100": 51.0, "A100": 19.5,
    "L40S": 91.6, "L4": 30.3, "A10G": 31.2, "A10": 31.2, "RTX 4090": 82.6, "RTX 3090": 35.6,
    "V100": 15.7, "T4": 8.1,
}


def step_flops(n, d, H, r, rv):
    return 2 * H * n * n * (r + rv) + 2 * H * n * d * (2 * r + rv) + 2 * H * n * rv * d


def device_name(arch: str) -> str | None:
    from particles import backend
    if backend.device_name():  # Vulkan: as Taichi reported it
        return backend.device_name()
    if arch == "cuda" and shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    return None


def peak_tflops(name: str | None, given: float | None) -> float | None:
    if given:
        return given
    for key, value in PEAK_FP32_TFLOPS.items():
        if name and key in name:
            return value
    return None


def cuda_process_mib() -> float | None:
    """This process's GPU memory per nvidia-smi (CUDA only), or None."""
    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        pid, _, used = line.partition(",")
        if pid.strip() == str(os.getpid()):
            return float(used)
    return None


def array_bytes(sim) -> int:
    """Bytes of every Taichi ndarray the Simulation holds (its heads' and reductions' too)."""
    import taichi as ti
    seen, total = set(), 0
    owners = [sim, sim._heads, sim._kern.reduce]
    for owner in owners:
        values = list(vars(owner).values()) if hasattr(owner, "__dict__") else []
        for value in values:
            arrays = value.values() if isinstance(value, dict) else [value]
            for a in arrays:
                if isinstance(a, ti.Ndarray) and id(a) not in seen:
                    seen.add(id(a))
                    elems = int(np.prod(a.shape))
                    try:
                        lanes = int(np.prod(a.element_type.shape() or [1]))  # vector elements
                    except (AttributeError, TypeError):
                        lanes = 1
                    item = 8 if "64" in str(a.dtype) else 4
                    total += elems * lanes * item
    return total


def engine_case(n, d, H, rank, arch, min_time):
    import particles
    import taichi as ti
    x = tokens(n, d)
    Q, K, O, W = peers.make_factors(H, d, rank, rank, seed=SEED)
    heads = [particles.Head.from_factors(Q[h], K[h], O[h], W[h]) for h in range(H)]
    t0 = time.perf_counter()
    sim = particles.Simulation(x, heads, beta=BETA, rule="softmax", geometry="sphere", dt=DT,
                               integrator="euler", dtype="float32", arch=arch)
    build = time.perf_counter() - t0
    calls = [0]

    def observed_step():
        sim.advance(1, observe_every=1)
        calls[0] += 1
        if calls[0] % 64 == 0:
            sim.take_rows()

    best, _mean, _n = time_per_call(observed_step, min_time, 3, sync=ti.sync)
    rows = sim.take_rows()
    assert all(np.isfinite(r["energy"]) for r in rows), "non-finite observables"
    return sim, best, build, (Q, K, O, W, x)


def torch_case(factors, arch, min_time):
    """Seconds per torch_step on the same GPU, or a reason it was not run."""
    if not peers.TORCH_AVAILABLE:
        return "torch not installed"
    import torch
    device = "cuda" if arch == "cuda" and torch.cuda.is_available() else \
        "mps" if arch == "metal" and torch.backends.mps.is_available() else None
    if device is None:
        return f"torch has no device for {arch}"
    Q, K, O, W, x = (torch.as_tensor(a, device=device) for a in factors)
    sync = torch.cuda.synchronize if device == "cuda" else torch.mps.synchronize
    try:
        best, _mean, _n = time_per_call(lambda: peers.torch_step(x, Q, K, O, W, BETA, DT), min_time, 3,
                                        sync=sync)
    except RuntimeError as err:  # out of memory, say
        return f"torch failed: {str(err).splitlines()[0][:60]}"
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="small sizes, for a software device")
    ap.add_argument("--arch", default="gpu", choices=("gpu", "cpu", "auto"))
    ap.add_argument("--peak-tflops", type=float, help="the device's FP32 peak, if not in the table")
    ap.add_argument("--min-time", type=float, default=None, help="seconds of timed steps per case")
    args = ap.parse_args(argv)
    os.environ.setdefault("PARTICLES_MAX_PAIRS", "1e13")   # --arch cpu at these sizes: the benchmark accepts the wait
    cases = SMALL_CASES if args.small else CASES
    min_time = args.min_time if args.min_time is not None else (0.5 if args.small else 3.0)
    from particles import backend
    arch = backend.init(args.arch)
    name = device_name(arch)
    peak = peak_tflops(name, args.peak_tflops)
    print(f"arch {arch}, device {name or 'unknown'}, FP32 peak "
          f"{f'{peak:g} TFLOP/s' if peak else 'unknown (--peak-tflops)'}; softmax, sphere, float32, "
          "Euler, every observable every step")
    header = (f"{'n':>7} {'d':>3} {'H':>2} {'heads':>9} {'steps/s':>9} {'TFLOP/s':>8} {'% peak':>7} "
              f"{'arrays MiB':>10} {'proc MiB':>9} {'build s':>8} {'torch steps/s':>14}")
    print(header)
    for n, d, H, rank in cases:
        sim, sec, build, factors = engine_case(n, d, H, rank, args.arch, min_time)
        flops = step_flops(n, d, H, rank, rank) / sec / 1e12
        torch_sec = torch_case(factors, arch, min_time)
        torch_col = f"{1 / torch_sec:.2f}" if isinstance(torch_sec, float) else torch_sec
        proc = cuda_process_mib() if arch == "cuda" else None
        heads = "full" if rank == d else f"rank {rank}"
        pct = f"{100 * flops / peak:.1f}" if peak else "-"
        print(f"{n:>7} {d:>3} {H:>2} {heads:>9} {1 / sec:>9.3g} {flops:>8.3g} {pct:>7} "
              f"{array_bytes(sim) / 2**20:>10.1f} {f'{proc:.0f}' if proc else '-':>9} {build:>8.1f} "
              f"{torch_col:>14}", flush=True)
        del sim
    return 0


if __name__ == "__main__":
    sys.exit(main())
