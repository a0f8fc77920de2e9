"""Two commits' engines timed against each other on this machine, in one window.

    python benchmarks/compare_commits.py BEFORE [AFTER] [--configs fused16 wide_low ...] [--rounds 3]

Each commit is checked out into a temporary git worktree (AFTER defaults to the working tree
itself) and every configuration runs in a fresh process of that commit's code, alternating
B A, A B, B A, ... so that drift in the machine's state falls on both sides. Each process
builds the simulation as `benchmarks/step.py` does, warms up (compile time is left out),
and takes the median and minimum of `--samples` timed calls, each after a 0.2 s pause. The
table gives, per configuration, the least minimum of each side and their ratio: two threads
sharing a launch on a small VM run at one of two speeds, so the medians of single processes
scatter more than the minima. It needs only the public `Simulation` API, so any commit since
the fused path can be measured.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# name: (n, d, H, rank, integrator, observe_every (0: bare), calls per sample)
CONFIGS = {
    "fused3": (256, 3, 4, 3, "rk4", 10, 1),
    "fused16": (128, 16, 4, 16, "rk4", 10, 1),
    "small_d3": (1024, 3, 4, 3, "euler", 0, 50),
    "mid_full": (1024, 64, 8, 64, "euler", 0, 5),
    "mid_low": (1024, 64, 8, 8, "euler", 0, 20),
    "mid_obs": (1024, 64, 8, 8, "euler", 1, 20),
    "wide_low": (4096, 64, 8, 8, "euler", 0, 2),
    "wide_full": (4096, 64, 8, 64, "euler", 0, 1),
    "large_d16": (16384, 16, 4, 16, "euler", 0, 1),   # not in the default set: ~2 s a step
}
DEFAULT_CONFIGS = [name for name in CONFIGS if name != "large_d16"]
STEPS_PER_RUN = 200  # RK4 configurations: 200 steps per call, observables every 10 as step.py's small n


def child(repo: str, config: str, samples: int) -> None:
    """Time one configuration on `repo`'s code; print 'median min' in ms per step."""
    os.environ.setdefault("PARTICLES_MAX_PAIRS", "1e12")   # n = 16384 passes the pair guard's 5 s
    sys.path[:0] = [repo, str(Path(repo) / "benchmarks")]
    import numpy as np
    import peers
    import step
    import taichi as ti
    n, d, H, rank, integrator, observe, calls = CONFIGS[config]
    Q, K, O, W = peers.make_factors(H, d, rank, rank, seed=step.SEED)
    sim = step.engine(step.tokens(n, d), Q, K, O, W, integrator)
    steps = STEPS_PER_RUN if observe > 1 else 1

    def call():
        if observe:
            sim.advance(steps, observe_every=observe)
            sim.take_rows()
        else:
            sim.advance(1)
    call()
    call()
    ti.sync()
    per_step = []
    for _ in range(samples):
        time.sleep(0.2)
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        ti.sync()
        per_step.append((time.perf_counter() - t0) / calls / steps * 1e3)
    print(f"{np.median(per_step)} {min(per_step)} {sim.path}")


def measure(repo: Path, config: str, samples: int) -> tuple[float, float, str]:
    proc = subprocess.run([sys.executable, __file__, "--child", str(repo), config, str(samples)],
                          capture_output=True, text=True, cwd=repo)
    if proc.returncode:
        sys.exit(f"{config} on {repo} failed:\n{proc.stderr[-3000:]}")
    out = proc.stdout.split()
    return float(out[-3]), float(out[-2]), out[-1]


def worktree(rev: str, into: Path) -> Path:
    proc = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(into), rev],
                          capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"compare_commits: cannot check out {rev!r}: {proc.stderr.strip()}")
    return into


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child(argv[1], argv[2], int(argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", help="a git revision (the baseline)")
    ap.add_argument("after", nargs="?", help="a git revision (default: this working tree)")
    ap.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=DEFAULT_CONFIGS)
    ap.add_argument("--rounds", type=int, default=3, help="B A / A B pairs of processes per config")
    ap.add_argument("--samples", type=int, default=9, help="timed calls per process")
    args = ap.parse_args(argv)
    from step import cpu_model
    with tempfile.TemporaryDirectory() as tmp:
        sides = {}
        try:
            sides["B"] = worktree(args.before, Path(tmp) / "before")
            sides["A"] = worktree(args.after, Path(tmp) / "after") if args.after else ROOT
            print(f"# {cpu_model()}, {os.cpu_count()} cores; before {args.before}, after "
                  f"{args.after or 'the working tree'}; load {os.getloadavg()[0]:.1f}", flush=True)
            got = {cfg: {"B": [], "A": []} for cfg in args.configs}
            for round_ in range(args.rounds):
                for side in ("BA" if round_ % 2 == 0 else "AB"):
                    for cfg in args.configs:
                        median, best, path = measure(sides[side], cfg, args.samples)
                        got[cfg][side].append((median, best))
                        print(f"  {side} {cfg:<9} {path:<6} median {median:9.3f}  min {best:9.3f} ms/step",
                              flush=True)
            print(f"# load {os.getloadavg()[0]:.1f} at the end\n")
            print(f"{'config':<10} {'n, d, H, rank, integrator, observe':<36} {'before min':>10} "
                  f"{'after min':>10} {'after/before':>12} {'medians before / after':>24}")
            for cfg, sides_got in got.items():
                before = min(b for _, b in sides_got["B"])
                after = min(b for _, b in sides_got["A"])
                medians = (f"{statistics.median(m for m, _ in sides_got['B']):.3g} / "
                           f"{statistics.median(m for m, _ in sides_got['A']):.3g}")
                print(f"{cfg:<10} {str(CONFIGS[cfg][:6]):<36} {before:10.3f} {after:10.3f} "
                      f"{after / before:12.2f} {medians:>24}")
        finally:
            for side, path in sides.items():
                if path != ROOT:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                                   capture_output=True)


if __name__ == "__main__":
    main()
