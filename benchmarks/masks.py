"""Cost of masks: one Euler step (softmax, float32) with causal and windowed heads against
the same heads seeing every key, in one process, compile time excluded.

    python benchmarks/masks.py [--sizes 2048,16,4 ...] [--arch cpu|gpu] [--min-time 1.0]

Causal attention visits (n + 1) / 2 keys per row on average, so its pair pass should cost
about half; a window of w keys per side about (2w + 1) / n. Two families, each against
its own unmasked baseline (ratio = time / baseline):

    banded   the default path for masked or ALiBi exp/softmax heads (on the CPU the tiled
             path, walking only the key blocks a row tile can see); baseline: mask
             'window' with window = n (hides nothing, same kernel)
    plain    the plain kernels (path 'plain'), which heads with different rules, ReLU
             and user rules take on the CPU; baseline: no mask

and, for scale, the unmasked step on the default path (the tiled or wide pass).
"""
from __future__ import annotations

import argparse
import platform
import time

import numpy as np


def time_per_step(sim, min_time: float) -> float:
    import taichi as ti
    sim.advance(1)
    ti.sync()
    best, spent = float("inf"), 0.0
    while spent < min_time:
        t0 = time.perf_counter()
        sim.advance(1)
        ti.sync()
        dt = time.perf_counter() - t0
        best, spent = min(best, dt), spent + dt
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="*", default=["2048,16,4"])
    parser.add_argument("--arch", default="cpu")
    parser.add_argument("--min-time", type=float, default=1.0)
    args = parser.parse_args()
    import particles
    from particles import Attention
    print(f"arch {args.arch}, {platform.processor() or platform.machine()}")
    print(f"{'n':>6} {'d':>3} {'H':>2}  {'attention':<22} {'ms/step':>9} {'ratio':>6}")
    for size in args.sizes:
        n, d, H = map(int, size.split(","))
        rng = np.random.default_rng(0)
        x = rng.standard_normal((n, d))
        heads = [rng.standard_normal((d, d)) / np.sqrt(d) for _ in range(H)]
        families = {
            "banded": ("auto", {"window n": Attention(mask="window", window=n),
                                "causal": Attention(mask="causal"),
                                "window 64": Attention(mask="window", window=64),
                                "alibi": [Attention(alibi=m) for m in particles.alibi_slopes(H)]}),
            "plain": ("plain", {"none": None, "causal": Attention(mask="causal"),
                                "window 64": Attention(mask="window", window=64),
                                "alibi": [Attention(alibi=m) for m in particles.alibi_slopes(H)]}),
        }
        for family, (path, cases) in families.items():
            base = None
            for name, attention in cases.items():
                sim = particles.Simulation(x, heads, beta=1.0, rule="softmax", integrator="euler",
                                           dtype="float32", arch=args.arch, path=path, attention=attention)
                t = time_per_step(sim, args.min_time) * 1e3
                base = t if base is None else base
                label = f"{family}: {name}"
                print(f"{n:>6} {d:>3} {H:>2}  {label:<22} {t:>9.2f} {t / base:>6.2f}")
        fast = particles.Simulation(x, heads, beta=1.0, rule="softmax", integrator="euler",
                                    dtype="float32", arch=args.arch)
        t = time_per_step(fast, args.min_time) * 1e3
        label = f"default: none ({type(fast._heads).__name__})"
        print(f"{n:>6} {d:>3} {H:>2}  {label:<22} {t:>9.2f}")

if __name__ == "__main__":
    main()
