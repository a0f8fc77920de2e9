"""The engine against its peers and the machine's bound, ratios measured in one process.

    python benchmarks/step.py [--quick] [--sizes 1024,3,4 ...] [--small 64,3,2 ...] [--json out.json]
    python benchmarks/step.py --table a.json b.json     # one table from saved runs

Two regimes, each timed with the peers interleaved (sample 1 of every implementation, then
sample 2, ...; the median of 5 samples, 3 where one call takes over a second, or of --samples N; a 0.2 s pause
before each, so no thread pool of the one before still spins), after a warm-up (compile time
excluded: the Simulation compiles when built), ``ti.sync()`` around every timed region:

small n (``--small``): RK4, softmax, sphere, float32, observables every 10 steps, a run of
    steps per sample. engine = ``Simulation(path="auto")`` (the fused path while the pair
    work n^2 H (r + rv + 24) is under 2.5e9, float32), tiled = the per-kernel path,
    numpy = ``peers.numpy_rk4_run`` (a plain NumPy RK4 loop).
large n (``--sizes``): one Euler step, softmax, sphere, float32, H heads given as factors
    (full r = rv = d, and low rank r = rv = max(1, d // H)):
        engine       sim.advance(1)
        engine+obs   sim.advance(1, observe_every=1); sim.take_rows()
        numpy        peers.numpy_step (dense n x n per head, BLAS)
        torch        peers.torch_step: torch's fused scaled_dot_product_attention, when torch
                     imports (never a dependency of the project), on as many threads as
                     the machine has cores (torch.set_num_threads), as the engine runs
        torch+obs    peers.torch_step_with_observables: the same step and every observable
                     of engine+obs (energy and entropy from the flash kernel's row
                     log-sum-exp, the rest from the per-head outputs), the fastest of its
                     layouts measured once per shape before the timing
    |dx| = max |x_new - numpy's x_new| of the engine's step and of torch's (float32 agreement);
    |dobs| = max over the observables of |torch+obs - engine+obs| / (|engine+obs| + 1e-6), the
    state before one step (the two compute the same numbers);
    spread = max / min of the interleaved samples of engine, engine+obs, torch, torch+obs;
    sdpa = the kernel torch's attention takes (``peers.torch_sdpa_backend``: flash on the CPU);
    tuning = the engine's measured speed choice (``Simulation.tuning``), "-" where none applies.
    bound = the pair pass's work at the machine's measured rates, max(2 H n^2 (r + rv) flops /
    SGEMM rate, H n^2 exps / exp rate), both measured in this run with every core (NumPy
    float32 matmul at 2048^2; np.exp on float32 in one thread per core). A step cannot beat it.

Memory (``--no-memory`` skips it): peak RSS growth of one (implementation, size) in a fresh
subprocess, compile excluded: the child first builds and steps the same kernels at a small n
(engine) or makes one tiny call (torch), then resets the peak (Linux /proc/self/clear_refs)
and measures the growth of create, load and one step from there.

The CPU model and its vector width are printed and stored: Taichi 1.7's JIT generates code
for the host CPU (AVX-512 where present), but its LLVM loop vectoriser costs with a generic
128-bit target, so the full width comes from explicit vectors only (see
particles/kernels_fused.py).
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import peers  # noqa: E402
from particles import machine  # noqa: E402

SIZES = [(1024, 3, 4), (1024, 64, 8), (4096, 64, 8), (16384, 16, 4), (16384, 64, 8)]
SMALL = [(16, 3, 1), (32, 8, 3), (64, 3, 2), (128, 16, 4), (256, 3, 1), (256, 16, 4)]
BETA, DT, SEED = 1.0, 0.01, 0
OBSERVE_EVERY = 10  # small-n runs log every 10th state
# OpenBLAS's worker threads spin ~0.1 s after a NumPy matmul before they sleep: whatever is
# timed next shares the cores with them (torch right after numpy_step read ~2x slower)
SETTLE_S = 0.2


def structures(d, H):
    """(name, r, rv): full d x d heads and low-rank heads of rank max(1, d // H)."""
    low = max(1, d // H)
    return [("full", d, d), ("low", low, low)]


def tokens(n, d, seed=SEED):
    x = np.random.default_rng(seed + 1).standard_normal((n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def time_per_call(fn, min_time, min_reps, sync=lambda: None):
    """(best, mean) seconds per call of fn, and the number of timed calls (for benchmarks/gpu.py).

    A timed probe call; if it lasted min_time, it is the timing. Otherwise it was the warm-up,
    and blocks of calls follow, each block one timed region (sync() around it), until the
    blocks last >= min_time in all and hold >= min_reps calls."""
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


def interleaved(timed, min_time, samples=None):
    """{name: (median, min, max) seconds per call}: each sample times every implementation in
    turn (calls per sample sized from a probe so a sample lasts ~min_time / samples), each
    after a SETTLE_S pause that lets the previous one's thread pools go idle. ``samples``
    None: 5, or 3 where a call takes over a second; a number given is always taken."""
    probes = {}
    for name, (fn, sync) in timed.items():
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        probes[name] = time.perf_counter() - t0
    if samples is None:
        samples = 3 if max(probes.values()) > 1.0 else 5
    per = {name: max(1, math.ceil(min_time / samples / max(probe, 1e-9))) for name, probe in probes.items()}
    times = {name: [] for name in timed}
    for _ in range(samples):
        for name, (fn, sync) in timed.items():
            sync()
            time.sleep(SETTLE_S)
            t0 = time.perf_counter()
            for _ in range(per[name]):
                fn()
            sync()
            times[name].append((time.perf_counter() - t0) / per[name])
    return {name: (float(np.median(t)), float(np.min(t)), float(np.max(t))) for name, t in times.items()}


# -- the machine ----------------------------------------------------------------------------

def cpu_model():
    """'AMD EPYC (AuthenticAMD family 25 model 1)': the name alone does not tell a Zen 3 from a Zen 4."""
    cpu = machine.cpu_identity()
    numbers = f"{cpu['vendor']} family {cpu['family']} model {cpu['model_number']}".strip()
    return f"{cpu['model']} ({numbers})" if cpu["family"] else cpu["model"]


def machine_rates(seconds=0.5):
    """(SGEMM flop/s, exp/s): NumPy float32 matmul at 2048^2 (its BLAS threads), np.exp on
    float32 arrays in one thread per core (ufuncs release the GIL)."""
    from concurrent.futures import ThreadPoolExecutor
    a = np.random.default_rng(0).standard_normal((2048, 2048)).astype(np.float32)
    a @ a
    best = math.inf
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end or best == math.inf:
        t0 = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t0)
    sgemm = 2.0 * 2048 ** 3 / best
    cores = os.cpu_count() or 1
    chunks = [-np.random.default_rng(i).uniform(0, 20, 1 << 20).astype(np.float32) for i in range(cores)]
    outs = [np.empty_like(c) for c in chunks]
    reps = 8
    with ThreadPoolExecutor(cores) as pool:
        def run(i):
            for _ in range(reps):
                np.exp(chunks[i], out=outs[i])
        list(pool.map(run, range(cores)))
        best = math.inf
        t_end = time.perf_counter() + seconds
        while time.perf_counter() < t_end or best == math.inf:
            t0 = time.perf_counter()
            list(pool.map(run, range(cores)))
            best = min(best, time.perf_counter() - t0)
    return sgemm, cores * reps * chunks[0].size / best


def import_torch():
    """torch on every core (its default can be the physical cores only), or None."""
    if not peers.torch_available():
        return None
    import torch
    torch.set_num_threads(os.cpu_count() or 1)
    return torch


def bound_seconds(n, H, r, rv, rates):
    flops, exps = peers.pair_work(n, H, r, rv)
    return max(flops / rates[0], exps / rates[1])


# -- the implementations ------------------------------------------------------------------

def engine(x, Q, K, O, W, integrator="euler", path="auto"):
    import particles
    heads = [particles.Head.from_factors(Q[h], K[h], O[h], W[h]) for h in range(Q.shape[0])]
    return particles.Simulation(x, heads, beta=BETA, rule="softmax", geometry="sphere", dt=DT,
                                integrator=integrator, dtype="float32", path=path)


def engine_observed(sim):
    sim.advance(1, observe_every=1)
    return sim.take_rows()


def rss_mib():
    """(current, peak) RSS of this process in MiB (Linux /proc), or (None, None)."""
    out = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line[:5]] = int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return out.get("VmRSS"), out.get("VmHWM")


def reset_peak():
    """Start the peak RSS afresh (Linux >= 4.0); False where it cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def child(impl, n, d, H, r, rv):
    """Peak RSS growth (MiB) of create + load + one step of ``impl``, compile excluded."""
    Q, K, O, W = peers.make_factors(H, d, r, rv, seed=SEED)
    if impl == "engine":
        import particles
        from particles import kernels
        warm = engine(tokens(min(n, kernels.LARGE_N), d), Q, K, O, W)  # compiles the same kernels
        warm.advance(1)
        engine_observed(warm)
        del warm
    elif impl == "torch":
        torch = import_torch()
        peers.torch_step(*(torch.as_tensor(a) for a in (tokens(64, d), Q, K, O, W)), BETA, DT)
    gc.collect()
    base, _ = rss_mib()
    exact = reset_peak()
    x = tokens(n, d)
    if impl == "engine":
        sim = engine(x, Q, K, O, W)
        sim.advance(1)
        engine_observed(sim)
    elif impl == "numpy":
        peers.numpy_step(x, Q, K, O, W, BETA, DT)
    elif impl == "torch":
        torch = import_torch()
        peers.torch_step(*(torch.as_tensor(a) for a in (x, Q, K, O, W)), BETA, DT)
    else:
        raise ValueError(impl)
    _, peak = rss_mib()
    print(json.dumps({"growth_mib": None if base is None else peak - base, "exact_peak": exact}))


def measure_memory(impl, n, d, H, r, rv):
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", impl, str(n), str(d), str(H),
           str(r), str(rv)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return None
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)["growth_mib"]
    return None


def memory_one(n, d, H, name, r, rv, args):
    impls = ["engine"] + ([] if args.no_numpy else ["numpy"]) + \
        (["torch"] if peers.torch_available() and not args.no_torch else [])
    return {f"mem_{impl}_mib": measure_memory(impl, n, d, H, r, rv) for impl in impls}


def bench_large(n, d, H, name, r, rv, args, rates):
    import taichi as ti
    x = tokens(n, d)
    Q, K, O, W = peers.make_factors(H, d, r, rv, seed=SEED)
    rec = {"n": n, "d": d, "H": H, "structure": name, "r": r, "rv": rv}
    t0 = time.perf_counter()
    sim = engine(x, Q, K, O, W)
    rec["engine_build_s"] = time.perf_counter() - t0
    rec["path"] = sim.path
    rec["tuning"] = getattr(sim, "tuning", None)
    expect = peers.numpy_step(x, Q, K, O, W, BETA, DT)
    sim.advance(1)  # one step from the peers' state: how far apart are they?
    rec["max_abs_diff_vs_numpy"] = float(np.max(np.abs(sim.tokens - expect)))
    timed = {"engine": (lambda: sim.advance(1), ti.sync),
             "engine_obs": (lambda: engine_observed(sim), ti.sync)}
    if not args.no_numpy:
        timed["numpy"] = (lambda: peers.numpy_step(x, Q, K, O, W, BETA, DT), lambda: None)
    if peers.torch_available() and not args.no_torch:
        torch = import_torch()
        tx, tQ, tK, tO, tW = (torch.as_tensor(a) for a in (x, Q, K, O, W))
        rec["torch_max_abs_diff_vs_numpy"] = float(np.max(np.abs(
            peers.torch_step(tx, tQ, tK, tO, tW, BETA, DT).numpy() - expect)))
        rec["torch_sdpa"] = peers.torch_sdpa_backend(tx, tQ, tK, tW, BETA)
        timed["torch"] = (lambda: peers.torch_step(tx, tQ, tK, tO, tW, BETA, DT), lambda: None)
        # the layout is measured here, before the timing (NumPy's BLAS threads idle first);
        # the engine's row of the same state
        time.sleep(SETTLE_S)
        ty, torch_row = peers.torch_step_with_observables(tx, tQ, tK, tO, tW, BETA, DT)
        rec["torch_obs_kernel"] = peers.torch_observables_kernel(tx)
        rec["torch_obs_layout"] = "{}/{}".format(*peers.torch_observables_layout(tx, tQ, tK, tO, tW, BETA))
        rec["torch_obs_max_abs_diff_vs_numpy"] = float(np.max(np.abs(ty.numpy() - expect)))
        sim.set_state(x)
        engine_row = engine_observed(sim)[0]
        rec["torch_obs_max_rel_diff_vs_engine"] = max(
            abs(val - engine_row[key]) / (abs(engine_row[key]) + 1e-6) for key, val in torch_row.items())
        timed["torch_obs"] = (lambda: peers.torch_step_with_observables(tx, tQ, tK, tO, tW, BETA, DT),
                              lambda: None)
    for key, (med, best, worst) in interleaved(timed, args.min_time, args.samples).items():
        rec[f"{key}_ms"], rec[f"{key}_best_ms"] = 1e3 * med, 1e3 * best
        rec[f"{key}_spread"] = worst / best   # max / min of the samples
    rec["obs_over_bare"] = rec["engine_obs_ms"] / rec["engine_ms"]
    if "torch_obs_ms" in rec:
        rec["torch_obs_over_bare"] = rec["torch_obs_ms"] / rec["torch_ms"]
        rec["engine_obs_over_torch_obs"] = rec["engine_obs_ms"] / rec["torch_obs_ms"]
    rec["bound_ms"] = 1e3 * bound_seconds(n, H, r, rv, rates)
    for peer in ("numpy", "torch", "bound"):
        if f"{peer}_ms" in rec:
            rec[f"engine_over_{peer}"] = rec["engine_ms"] / rec[f"{peer}_ms"]
    return rec


def bench_small(n, d, H, args):
    import taichi as ti
    x = tokens(n, d)
    Q, K, O, W = peers.make_factors(H, d, d, d, seed=SEED)
    rec = {"n": n, "d": d, "H": H, "structure": "full", "r": d, "rv": d}
    sims = {"engine": engine(x, Q, K, O, W, "rk4"), "tiled": engine(x, Q, K, O, W, "rk4", "tiled")}
    rec["path"] = sims["engine"].path
    run = 20 * OBSERVE_EVERY  # steps per call: a whole number of logging periods

    def advance(sim):
        sim.advance(run, observe_every=OBSERVE_EVERY)
        sim.take_rows()
    timed = {key: (lambda s=sim: advance(s), ti.sync) for key, sim in sims.items()}
    if not args.no_numpy:
        timed["numpy"] = (lambda: peers.numpy_rk4_run(x, Q, K, O, W, BETA, DT, run, OBSERVE_EVERY),
                          lambda: None)
    for key, (med, best, _) in interleaved(timed, args.min_time, args.samples).items():
        rec[f"{key}_us_per_step"] = 1e6 * med / run
    rec["engine_steps_per_s"] = 1e6 / rec["engine_us_per_step"]
    rec["tiled_over_engine"] = rec["tiled_us_per_step"] / rec["engine_us_per_step"]
    if "numpy_us_per_step" in rec:
        rec["numpy_over_engine"] = rec["numpy_us_per_step"] / rec["engine_us_per_step"]
    return rec


def fmt(v, spec):
    """v formatted, or "-" in the same width."""
    if v is None:
        width = spec.split(".")[0]
        return format("-", f">{width}") if width.isdigit() else "-"
    return format(v, spec)


def print_meta(meta):
    print(f"CPU {meta['cpu_model']}, {meta['cpus']} cores, {meta['vector_width_bits']}-bit vectors; "
          f"SGEMM {meta['sgemm_gflops']:.0f} GFLOP/s, exp {meta['exp_g_per_s']:.2f} G/s; "
          f"taichi {meta['taichi']}, torch {torch_text(meta)}; {load_text(meta)}", flush=True)


def load_text(meta):
    """"load average 3.2 at the start, 4.1 at the end" (1-minute load averages)."""
    start, end = meta.get("load_average_start"), meta.get("load_average_end")
    return (f"load average {start[0]:.1f} at the start" if start else "load average -") + \
        (f", {end[0]:.1f} at the end" if end else "")


def torch_text(meta):
    """"2.13.0+cpu on 2 threads", or "absent"."""
    if not meta.get("torch_version"):
        return "absent"
    threads = meta.get("torch_threads")
    return meta["torch_version"] + (f" on {threads} threads" if threads else "")


def print_small(records):
    if not records:
        return
    print("\nsmall n: RK4 steps, observables every 10 (us/step; ratios = peer / engine)")
    print(f"{'n':>5} {'d':>3} {'H':>2} {'path':>6} {'engine':>9} {'steps/s':>9} {'tiled':>9} "
          f"{'tiled/eng':>9} {'numpy':>9} {'np/eng':>7}")
    for r in records:
        print(f"{r['n']:>5} {r['d']:>3} {r['H']:>2} {r['path']:>6} {r['engine_us_per_step']:>9.1f} "
              f"{r['engine_steps_per_s']:>9.0f} {r['tiled_us_per_step']:>9.1f} {r['tiled_over_engine']:>9.1f} "
              f"{fmt(r.get('numpy_us_per_step'), '9.1f')} {fmt(r.get('numpy_over_engine'), '7.1f')}", flush=True)


def print_table(records):
    if not records:
        return
    print("\nlarge n: one Euler step (ms, medians; ratios = engine / peer, < 1 means the engine is faster)")
    print(f"{'n':>6} {'d':>3} {'H':>2} {'heads':<9} {'engine':>9} {'eng+obs':>9} {'obs/e':>6} {'numpy':>9} {'torch':>8} "
          f"{'torch+obs':>9} {'bound':>8} {'e/np':>6} {'e/torch':>7} {'e+o/t+o':>7} {'e/bound':>7} {'MiB eng':>7} "
          f"{'np':>6} {'torch':>6} {'|dx|':>8} {'|dx|torch':>9} {'|dobs|':>7} {'spread e/obs/torch/t+o':>23} "
          f"{'sdpa':>5}  tuning")
    for r in records:
        heads = f"{r['structure']} r={r['r']}"
        print(f"{r['n']:>6} {r['d']:>3} {r['H']:>2} {heads:<9} {fmt(r.get('engine_ms'), '9.1f')} "
              f"{fmt(r.get('engine_obs_ms'), '9.1f')} {fmt(r.get('obs_over_bare'), '6.2f')} {fmt(r.get('numpy_ms'), '9.1f')} "
              f"{fmt(r.get('torch_ms'), '8.1f')} {fmt(r.get('torch_obs_ms'), '9.1f')} {fmt(r.get('bound_ms'), '8.1f')} "
              f"{fmt(r.get('engine_over_numpy'), '6.2f')} {fmt(r.get('engine_over_torch'), '7.2f')} "
              f"{fmt(r.get('engine_obs_over_torch_obs'), '7.2f')} "
              f"{fmt(r.get('engine_over_bound'), '7.2f')} {fmt(r.get('mem_engine_mib'), '7.0f')} "
              f"{fmt(r.get('mem_numpy_mib'), '6.0f')} {fmt(r.get('mem_torch_mib'), '6.0f')} "
              f"{fmt(r.get('max_abs_diff_vs_numpy'), '8.1e')} {fmt(r.get('torch_max_abs_diff_vs_numpy'), '9.1e')} "
              f"{fmt(r.get('torch_obs_max_rel_diff_vs_engine'), '7.0e')} "
              f"{spreads(r):>23} {r.get('torch_sdpa') or '-':>5}  "
              f"{r.get('tuning') or '-'}", flush=True)
    for (n, d, H, r), ratio in low_rank_speedups(records).items():
        print(f"  ({n}, {d}, {H}): rank-{r} heads {ratio:.1f}x faster than full heads")


def spreads(r):
    """"1.10/1.25/1.05/1.08": max / min of the samples of the engine, the engine with
    observables, torch and torch with observables ("-" where not timed)."""
    return "/".join(fmt(r.get(f"{key}_spread"), ".2f") for key in ("engine", "engine_obs", "torch", "torch_obs"))


def markdown(run):
    """The README's tables (markdown) from one saved run."""
    meta = run["meta"]
    out = [f"Measured {meta['date']} on {meta['cpu_model']} ({meta['cpus']} cores, "
           f"{meta['vector_width_bits']}-bit vectors; SGEMM {meta['sgemm_gflops']:.0f} GFLOP/s, "
           f"exp {meta['exp_g_per_s']:.1f} G/s in this run), torch {torch_text(meta)}; {load_text(meta)}.",
           "", "| n | d | H | path | engine us/step | steps/s | tiled path | NumPy RK4 loop | NumPy / engine |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in run.get("small", []):
        out.append(f"| {r['n']} | {r['d']} | {r['H']} | {r['path']} | {r['engine_us_per_step']:.0f} | "
                   f"{r['engine_steps_per_s']:.0f} | {r['tiled_us_per_step']:.0f} | "
                   f"{fmt(r.get('numpy_us_per_step'), '.0f')} | {fmt(r.get('numpy_over_engine'), '.1f')}x |")
    out += ["", "| n | d | H | heads | engine ms | with observables | observed / bare | NumPy ms "
            "| torch SDPA ms | torch with observables ms | bound ms | engine / torch | observed engine / torch "
            "| engine / bound | spread engine / observed / torch / torch observed "
            "| RSS growth engine / NumPy / torch MiB |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in run["results"]:
        heads = "full" if r["structure"] == "full" else f"rank {r['r']}"
        out.append(f"| {r['n']} | {r['d']} | {r['H']} | {heads} | {fmt(r.get('engine_ms'), '.1f')} | "
                   f"{fmt(r.get('engine_obs_ms'), '.1f')} | {fmt(r.get('obs_over_bare'), '.2f')} | "
                   f"{fmt(r.get('numpy_ms'), '.1f')} | "
                   f"{fmt(r.get('torch_ms'), '.1f')} | {fmt(r.get('torch_obs_ms'), '.1f')} | "
                   f"{fmt(r.get('bound_ms'), '.1f')} | {fmt(r.get('engine_over_torch'), '.2f')} | "
                   f"{fmt(r.get('engine_obs_over_torch_obs'), '.2f')} | {fmt(r.get('engine_over_bound'), '.2f')} | "
                   f"{spreads(r).replace('/', ' / ')} | "
                   f"{fmt(r.get('mem_engine_mib'), '.0f')} / {fmt(r.get('mem_numpy_mib'), '.0f')} / "
                   f"{fmt(r.get('mem_torch_mib'), '.0f')} |")
    speedups = low_rank_speedups(run["results"])
    if speedups:
        out += ["", "Low-rank heads against full heads, engine time full / low: " + ", ".join(
            f"({n}, {d}, {H}) rank {r} {ratio:.1f}x" for (n, d, H, r), ratio in speedups.items()) + "."]
    return "\n".join(out)


def low_rank_speedups(records):
    """{(n, d, H, r): full engine time / low-rank engine time} where a run timed both."""
    full = {(r["n"], r["d"], r["H"]): r["engine_ms"] for r in records
            if r["structure"] == "full" and "engine_ms" in r}
    return {(r["n"], r["d"], r["H"], r["r"]): full[(r["n"], r["d"], r["H"])] / r["engine_ms"]
            for r in records if r["structure"] == "low" and "engine_ms" in r
            and (r["n"], r["d"], r["H"]) in full}


def parse_size(text):
    parts = tuple(int(p) for p in text.replace("x", ",").split(","))
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"a size is n,d,H, got {text!r}")
    return parts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="skip n = 16384 and time for 0.5 s per point")
    ap.add_argument("--sizes", nargs="*", type=parse_size, metavar="N,D,H", help="large-n sizes")
    ap.add_argument("--small", nargs="*", type=parse_size, metavar="N,D,H", help="small-n sizes")
    ap.add_argument("--structures", nargs="+", choices=("full", "low"), default=("full", "low"))
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--min-time", type=float, default=None, help="seconds per implementation and point (default 2, quick 0.5)")
    ap.add_argument("--samples", type=int, default=None,
                    help="interleaved samples per point (default 5, 3 where a call takes over 1 s)")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-RSS subprocesses")
    ap.add_argument("--no-numpy", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--table", nargs="+", metavar="JSON", help="print the tables of saved runs")
    ap.add_argument("--markdown", metavar="JSON", help="print a saved run as the README's markdown tables")
    ap.add_argument("--child", nargs=6, metavar=("IMPL", "N", "D", "H", "R", "RV"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    # n = 16384 exceeds the engine's CPU pair guard (one evaluation over ~5 s): a benchmark
    # accepts the wait. Set here, not at import, so that a test loading this module keeps the guard
    os.environ.setdefault("PARTICLES_MAX_PAIRS", "1e12")
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return
    if args.table:
        runs = [json.loads(Path(path).read_text()) for path in args.table]
        for run in runs:
            print_meta(run["meta"])
        print_small([rec for run in runs for rec in run.get("small", [])])
        print_table([rec for run in runs for rec in run["results"]])
        return
    if args.child:
        impl, *nums = args.child
        child(impl, *map(int, nums))
        return
    if args.min_time is None:
        args.min_time = 0.5 if args.quick else 2.0
    sizes = args.sizes if args.sizes is not None else [s for s in SIZES if not (args.quick and s[0] >= 16384)]
    small = args.small if args.small is not None else SMALL
    configs = [(n, d, H, name, r, rv) for (n, d, H) in sizes for name, r, rv in structures(d, H)
               if name in args.structures]
    # memory first, while this process is small
    memory = [{} if args.no_memory else memory_one(*cfg, args) for cfg in configs]
    import taichi as ti
    sgemm, exp_rate = machine_rates()
    torch_version = torch_threads = None
    if peers.torch_available() and not args.no_torch:
        torch = import_torch()
        torch_version, torch_threads = torch.__version__, torch.get_num_threads()
    meta = {"cpu_model": cpu_model(), "vector_width_bits": machine.cpu_identity()["vector_width_bits"],
            "cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
            "taichi": ".".join(map(str, ti.__version__)), "torch_version": torch_version,
            "torch_threads": torch_threads,
            "sgemm_gflops": sgemm / 1e9, "exp_g_per_s": exp_rate / 1e9,
            "min_time_s": args.min_time, "load_average_start": os.getloadavg(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    print_meta(meta)
    small_records = []
    for n, d, H in small:
        small_records.append(bench_small(n, d, H, args))
        print(f"  done small n={n} d={d} H={H}", file=sys.stderr, flush=True)
    print_small(small_records)
    records = []
    for cfg, mem in zip(configs, memory):
        rec = bench_large(*cfg, args, (sgemm, exp_rate))
        rec.update(mem)
        records.append(rec)
        print(f"  done n={cfg[0]} d={cfg[1]} H={cfg[2]} {cfg[3]}", file=sys.stderr, flush=True)
    print_table(records)
    meta["load_average_end"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "small": small_records, "results": records},
                                              indent=2))


if __name__ == "__main__":
    main()
