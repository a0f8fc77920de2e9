"""Sweep throughput: replicas per second for a reduced version of the bundled 1-head phase
diagram (scenes/sweeps/phase_diagram_1head.toml), run four ways:

  ensemble      run_sweep, local executor in this process, units of up to 256 replicas
                (one ensemble Simulation per unit) -- how sweeps run by default;
  singles       the same sweep with batch = 1: a loop of single-replica Simulations (each
                built, warmed up and run alone) -- what a sweep without ensembles does;
  pool x2       the ensemble sweep on a local process pool of 2 workers (units of 128);
  ray x2        the ensemble sweep as Ray tasks on a local 2-CPU Ray cluster (units of 128);
                the cluster's start-up is timed apart and not counted in the rate.

Reduced, so the script runs in about a minute: the bundled file's scene (n = 32 on S^2, one
scalar head, softmax, dt = 0.1) and record spec (clusters at 20 log-spaced times, eps,
clustering time) but t_end = 10 (100 steps instead of 1000) and 16 betas x 16 seeds = 256
replicas (instead of 90 x 32). The singles mode runs only its first --singles replicas (a
rate needs no more). Every mode writes a full results table, so the rates include
recording, cluster counting and the CSV/ledger writes.

    python benchmarks/sweep_speed.py                 # all four modes
    python benchmarks/sweep_speed.py --no-ray --steps 50
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from particles.app.sweep import SWEEP_LIBRARY, Sweep, load_results, run_sweep  # noqa: E402


def reduced_sweep(steps: int, betas: int, seeds: int, batch: int, limit: int | None = None) -> Sweep:
    path = SWEEP_LIBRARY / "phase_diagram_1head.toml"
    raw = tomllib.loads(path.read_text())
    raw = copy.deepcopy(raw)
    dt = raw["dynamics"]["dt"]
    raw["dynamics"].pop("t_end", None)
    raw["dynamics"]["steps"] = steps
    betas_all = np.linspace(0.1, 9.0, betas).tolist()
    if limit is not None:      # the first `limit` replicas (beta is the slow axis)
        betas_all = betas_all[:max(1, limit // seeds)]
    raw["axes"]["dynamics.beta"] = betas_all
    raw["axes"]["tokens.seed"] = {"count": seeds}
    raw["record"]["times"] = {"from": 0.5, "to": steps * dt, "num": 20, "log": True}
    raw["batch"] = batch
    raw["name"] = f"bench_b{batch}"
    return Sweep.from_dict(raw, source=str(path), base_dir=path.parent)


def _equal(a, b) -> bool:
    """Same values (NaN equals NaN: replicas that never clustered)."""
    if a.dtype.kind == "f":
        return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))
    return list(a) == list(b)


def timed(sweep: Sweep, out: Path, **kw) -> tuple[float, Path]:
    t0 = time.perf_counter()
    table = run_sweep(sweep, out, **kw)
    return time.perf_counter() - t0, table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100, help="steps per replica (default 100: t_end = 10)")
    ap.add_argument("--betas", type=int, default=16)
    ap.add_argument("--seeds", type=int, default=16)
    ap.add_argument("--singles", type=int, default=32, help="replicas timed in the singles mode")
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--no-pool", action="store_true")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args(argv)

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # warm the kernel cache (compile once) so no mode pays the JIT
        run_sweep(reduced_sweep(10, 2, 2, 256), tmp / "warm")

        ens = reduced_sweep(args.steps, args.betas, args.seeds, 256)
        wall, table = timed(ens, tmp / "ensemble")
        R = ens.n_replicas
        results["ensemble"] = {"replicas": R, "units": len(ens.units), "seconds": wall,
                               "replicas_per_s": R / wall}
        reference = load_results(table)

        singles = reduced_sweep(args.steps, args.betas, args.seeds, 1, limit=args.singles)
        wall_s, table_s = timed(singles, tmp / "singles")
        results["singles"] = {"replicas": singles.n_replicas, "units": len(singles.units),
                              "seconds": wall_s, "replicas_per_s": singles.n_replicas / wall_s}
        # the singles' rows must equal the ensemble's rows of the same replicas
        s_cols = load_results(table_s)
        n = s_cols["point"].size
        same = all(_equal(s_cols[k], reference[k][:n]) for k in s_cols if k not in ("unit", "point"))
        results["singles"]["matches_ensemble"] = bool(same)

        half = reduced_sweep(args.steps, args.betas, args.seeds, max(1, R // 2))
        if not args.no_pool:
            wall_p, _ = timed(half, tmp / "pool", workers=2)
            results["pool x2"] = {"replicas": R, "units": len(half.units), "seconds": wall_p,
                                  "replicas_per_s": R / wall_p}
        if not args.no_ray:
            try:
                import ray
            except ImportError:
                print("ray is not installed: skipping the ray mode (pip install 'ray>=2.9')")
            else:
                t0 = time.perf_counter()
                ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING",
                         log_to_driver=False)
                startup = time.perf_counter() - t0
                try:
                    # first Ray run pays worker start-up and Taichi init in the workers
                    wall_r1, _ = timed(half, tmp / "ray_cold", executor="ray", workers=2)
                    wall_r, table_r = timed(half, tmp / "ray", executor="ray", workers=2)
                finally:
                    ray.shutdown()
                r_cols = load_results(table_r)
                same = all(_equal(r_cols[k], reference[k]) for k in r_cols if k != "unit")
                results["ray x2"] = {"replicas": R, "units": len(half.units), "seconds": wall_r,
                                     "replicas_per_s": R / wall_r, "cluster_startup_s": startup,
                                     "first_run_s": wall_r1, "matches_ensemble": bool(same)}

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"reduced phase_diagram_1head: n = 32, d = 3, 1 head, {args.steps} steps per replica, "
          f"{args.betas} betas x {args.seeds} seeds; {os.cpu_count()} CPUs, load average "
          f"{load[0]:.1f}" if load else "")
    print(f"{'mode':<10} {'replicas':>8} {'units':>6} {'seconds':>8} {'replicas/s':>11}")
    for mode, r in results.items():
        print(f"{mode:<10} {r['replicas']:>8} {r['units']:>6} {r['seconds']:>8.2f} {r['replicas_per_s']:>11.1f}")
    speedup = results["ensemble"]["replicas_per_s"] / results["singles"]["replicas_per_s"]
    print(f"ensemble / singles: {speedup:.1f}x (target >= 10x); singles rows equal the "
          f"ensemble's: {results['singles']['matches_ensemble']}")
    if "ray x2" in results:
        r = results["ray x2"]
        print(f"ray: local cluster start-up {r['cluster_startup_s']:.1f} s, first (cold-worker) run "
              f"{r['first_run_s']:.1f} s; table equals the local one: {r['matches_ensemble']}")
    results["speedup_ensemble_vs_singles"] = speedup
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
