"""Time one Euler step of the engine against the NumPy (and PyTorch) peers.

    python benchmarks/step.py [--quick] [--sizes 1024,3,4 4096,64,8] [--json out.json]
    python benchmarks/step.py --table a.json b.json     # one table from saved runs

The step: rule softmax, sphere geometry, float32, explicit Euler, H heads given as
factors (``particles.Head.from_factors(Q[h], K[h], O[h], W[h])``; the peers get the same
factors). Each size runs with two head structures: full (r = rv = d) and low rank
(r = rv = max(1, d // H)). Timings are per step, after a warm-up (compile time excluded:
the Simulation compiles when built), ``ti.sync()`` around every timed region, in one
process (see ``time_per_call``: the best of about five blocks lasting >= --min-time s in
all, or a single call when one lasts that long):

    engine       sim.advance(1)
    engine+obs   sim.advance(1, observe_every=1); sim.take_rows()   (every per-step
                 observable the NumPy peer computes; entropy_rate stays off, as there)
    numpy        peers.numpy_step / peers.numpy_step_with_observables
    torch        peers.torch_step on CPU tensors, when torch imports

|dx| is the largest difference between one engine step and one numpy_step from the same
tokens (both float32).

Peak memory (max RSS) is measured per (implementation, size, structure) in a fresh
subprocess, since a process's peak only grows: the engine child builds the Simulation and
takes a bare and an observed step; the NumPy child takes one numpy_step (and, separately,
one numpy_step_with_observables). The engine child imports Taichi, the NumPy child does not.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import peers  # noqa: E402

SIZES = [(1024, 3, 4), (1024, 64, 8), (4096, 64, 8), (16384, 16, 4), (16384, 64, 8)]
BETA, DT, SEED = 1.0, 0.01, 0


def structures(d, H):
    """(name, r, rv): full d x d heads and low-rank heads of rank max(1, d // H)."""
    low = max(1, d // H)
    return [("full", d, d), ("low", low, low)]


def tokens(n, d, seed=SEED):
    x = np.random.default_rng(seed + 1).standard_normal((n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def time_per_call(fn, min_time, min_reps, sync=lambda: None):
    """(best, mean) seconds per call of fn, and the number of timed calls.

    A timed probe call; if it lasted min_time, it is the timing (the slowest points take
    tens of seconds a call). Otherwise it was the warm-up, and blocks of calls follow, each
    block one timed region (sync() around it), until the blocks last >= min_time in all and
    hold >= min_reps calls: about five blocks, as on a shared machine the best block is the
    steadier figure."""
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    probe = time.perf_counter() - t0
    if probe >= min_time:
        return probe, probe, 1
    per_block = max(1, math.ceil(min_time / 5 / max(probe, 1e-9)))
    blocks, calls, spent = [], 0, 0.0
    while spent < min_time or calls < min_reps:
        sync()
        t0 = time.perf_counter()
        for _ in range(per_block):
            fn()
        sync()
        dt = time.perf_counter() - t0
        blocks.append(dt / per_block)
        calls += per_block
        spent += dt
    return min(blocks), spent / calls, calls


# -- the implementations ------------------------------------------------------------------

def engine(x, Q, K, O, W):
    import particles
    heads = [particles.Head.from_factors(Q[h], K[h], O[h], W[h]) for h in range(Q.shape[0])]
    return particles.Simulation(x, heads, beta=BETA, rule="softmax", geometry="sphere", dt=DT,
                                integrator="euler", dtype="float32")


def engine_observed(sim):
    sim.advance(1, observe_every=1)
    return sim.take_rows()


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def vm_hwm_mib():
    """Peak RSS of this address space alone (Linux /proc), None elsewhere. ru_maxrss also
    counts the parent's pages at exec time; the parent measures memory first, while small."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def child(impl, n, d, H, r, rv):
    """Run one implementation once in this (fresh) process; print its peak RSS in MiB."""
    x = tokens(n, d)
    Q, K, O, W = peers.make_factors(H, d, r, rv, seed=SEED)
    if impl == "engine":
        sim = engine(x, Q, K, O, W)
        sim.advance(1)
        engine_observed(sim)
    elif impl == "numpy":
        peers.numpy_step(x, Q, K, O, W, BETA, DT)
    elif impl == "numpy_obs":
        peers.numpy_step_with_observables(x, Q, K, O, W, BETA, DT)
    else:
        raise ValueError(impl)
    print(json.dumps({"peak_rss_mib": peak_rss_mib(), "vm_hwm_mib": vm_hwm_mib()}))


def measure_memory(impl, n, d, H, r, rv):
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", impl, str(n), str(d), str(H),
           str(r), str(rv)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return None
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return None


def memory_one(n, d, H, name, r, rv, args):
    """Peak RSS (MiB) of each implementation for one configuration, in fresh processes."""
    rec = {}
    impls = ["engine"] + ([] if args.no_numpy else ["numpy", "numpy_obs"])
    for impl in impls:
        m = measure_memory(impl, n, d, H, r, rv)
        rec[f"rss_{impl}_mib"] = None if m is None else m["peak_rss_mib"]
        rec[f"hwm_{impl}_mib"] = None if m is None else m.get("vm_hwm_mib")
    return rec


def bench_one(n, d, H, name, r, rv, args):
    import taichi as ti
    x = tokens(n, d)
    Q, K, O, W = peers.make_factors(H, d, r, rv, seed=SEED)
    rec = {"n": n, "d": d, "H": H, "structure": name, "r": r, "rv": rv}
    mt, mr = args.min_time, args.min_reps

    t0 = time.perf_counter()
    sim = engine(x, Q, K, O, W)
    rec["engine_build_s"] = time.perf_counter() - t0
    # one step from the same state as the peers: how far apart are they?
    sim.advance(1)
    x_np = peers.numpy_step(x, Q, K, O, W, BETA, DT)
    rec["max_abs_diff_vs_numpy"] = float(np.max(np.abs(sim.tokens - x_np)))
    timed = {"engine": (lambda: sim.advance(1), ti.sync),
             "engine_obs": (lambda: engine_observed(sim), ti.sync)}
    if not args.no_numpy:
        timed["numpy"] = (lambda: peers.numpy_step(x, Q, K, O, W, BETA, DT), lambda: None)
        timed["numpy_obs"] = (lambda: peers.numpy_step_with_observables(x, Q, K, O, W, BETA, DT),
                              lambda: None)
    if peers.torch_available() and not args.no_torch:
        import torch
        tx, tQ, tK, tO, tW = (torch.as_tensor(a) for a in (x, Q, K, O, W))
        timed["torch"] = (lambda: peers.torch_step(tx, tQ, tK, tO, tW, BETA, DT), lambda: None)
    for key, (fn, sync) in timed.items():
        best, mean, calls = time_per_call(fn, mt, mr, sync)
        rec[f"{key}_ms"], rec[f"{key}_mean_ms"], rec[f"{key}_calls"] = 1e3 * best, 1e3 * mean, calls
    rec["obs_overhead_pct"] = 100.0 * (rec["engine_obs_ms"] / rec["engine_ms"] - 1.0)
    if "numpy_ms" in rec:
        rec["numpy_over_engine"] = rec["numpy_ms"] / rec["engine_ms"]
        rec["numpy_obs_over_engine_obs"] = rec["numpy_obs_ms"] / rec["engine_obs_ms"]
    return rec


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def print_table(records):
    head = (f"{'n':>6} {'d':>3} {'H':>2} {'heads':<9} {'engine':>9} {'eng+obs':>9} {'obs %':>6} "
            f"{'numpy':>9} {'np/eng':>7} {'torch':>8} {'RSS eng':>8} {'RSS np':>8} {'|dx|':>8}")
    print(head)
    print(f"{'':>6} {'':>3} {'':>2} {'':<9} {'ms':>9} {'ms':>9} {'':>6} {'ms':>9} {'':>7} {'ms':>8} "
          f"{'MiB':>8} {'MiB':>8}")
    for r in records:
        heads = f"{r['structure']} r={r['r']}"
        print(f"{r['n']:>6} {r['d']:>3} {r['H']:>2} {heads:<9} {fmt(r.get('engine_ms'), '9.1f')} "
              f"{fmt(r.get('engine_obs_ms'), '9.1f')} {fmt(r.get('obs_overhead_pct'), '6.1f')} "
              f"{fmt(r.get('numpy_ms'), '9.1f')} {fmt(r.get('numpy_over_engine'), '7.2f')} "
              f"{fmt(r.get('torch_ms'), '8.1f')} {fmt(r.get('rss_engine_mib'), '8.0f')} "
              f"{fmt(r.get('rss_numpy_mib'), '8.0f')} {fmt(r.get('max_abs_diff_vs_numpy'), '8.1e')}",
              flush=True)


def parse_size(text):
    parts = tuple(int(p) for p in text.replace("x", ",").split(","))
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"a size is n,d,H, got {text!r}")
    return parts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="skip n = 16384 and time for 0.2 s per point")
    ap.add_argument("--sizes", nargs="+", type=parse_size, metavar="N,D,H", help="sizes to run")
    ap.add_argument("--structures", nargs="+", choices=("full", "low"), default=("full", "low"))
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--min-time", type=float, default=None, help="seconds per timing (default 1, quick 0.2)")
    ap.add_argument("--min-reps", type=int, default=3)
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-RSS subprocesses")
    ap.add_argument("--no-numpy", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--table", nargs="+", metavar="JSON", help="print one table from saved runs")
    ap.add_argument("--child", nargs=6, metavar=("IMPL", "N", "D", "H", "R", "RV"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.table:
        print_table([rec for path in args.table for rec in json.loads(Path(path).read_text())["results"]])
        return
    if args.child:
        impl, *nums = args.child
        child(impl, *map(int, nums))
        return
    if args.min_time is None:
        args.min_time = 0.2 if args.quick else 1.0
    sizes = args.sizes or [s for s in SIZES if not (args.quick and s[0] >= 16384)]
    configs = [(n, d, H, name, r, rv) for (n, d, H) in sizes for name, r, rv in structures(d, H)
               if name in args.structures]
    # memory first, while this process is small: a child's ru_maxrss starts from the
    # parent's RSS at fork time
    memory = [{} if args.no_memory else memory_one(*cfg, args) for cfg in configs]
    import taichi as ti
    meta = {"python": platform.python_version(), "numpy": np.__version__,
            "taichi": ".".join(map(str, ti.__version__)), "cpus": os.cpu_count(),
            "machine": platform.machine(), "torch": peers.torch_available(),
            "min_time_s": args.min_time, "min_reps": args.min_reps,
            "load_average_start": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    print(f"one Euler step, softmax, sphere, float32; {os.cpu_count()} CPUs; "
          f"best per-step times (ms) of ~5 timed blocks", flush=True)
    records = []
    for cfg, mem in zip(configs, memory):
        rec = bench_one(*cfg, args)
        rec.update(mem)
        records.append(rec)
        print(f"  done n={cfg[0]} d={cfg[1]} H={cfg[2]} {cfg[3]}", file=sys.stderr, flush=True)
    print_table(records)
    meta["load_average_end"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": records}, indent=2))


if __name__ == "__main__":
    main()
