"""Adaptive steps against fixed RK4 and scipy's solve_ivp on a metastable flow (issue 35).

    python benchmarks/adaptive.py [--sizes 64,256] [--t-end 200] [--beta 9] [--repeat 3] [--json out.json]

The problem: n random tokens on S^2 (seed 0), one head Q = K = V = I, softmax at beta, float64,
to t_end. The reference is scipy's DOP853 at rtol = atol = 1e-12 on a NumPy right-hand side; the
error of a run is max |x(t_end) - reference| over every component. For each target final error
(1e-6 and 1e-8) and each method, the cheapest setting reaching it:

    rk4      the engine at a fixed dt (path 'auto': the fused path at small n), the largest dt of
             0.4, 0.2, 0.1, ..., halving, that reaches the target
    dopri5   the engine's adaptive Dormand-Prince 5(4) (path 'auto'; one grid step of t_end, so
             no row cuts a step), the loosest rtol = atol of 1e-5, 3e-6, 1e-6, ... that reaches it
    RK45, DOP853   scipy.integrate.solve_ivp on the NumPy right-hand side (dense n x n), the
             same tolerances

and reports velocity evaluations (scipy's nfev; the engine's count), wall time (the engine's
compile excluded: built, then timed; for dopri5 and scipy the best of --repeat runs, default 3)
and wall time per evaluation. Then the exact step on the sphere: |x| - 1 after the
run with retraction 'exp' (commutator-free Heun, no renormalisation) against 'normalise'.
The CPU model is printed and stored.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
from scipy.integrate import solve_ivp

from particles import Adaptive, backend
from particles.simulation import Simulation

TARGETS = (1e-6, 1e-8)
TOLERANCES = (1e-5, 3e-6, 1e-6, 3e-7, 1e-7, 3e-8, 1e-8, 3e-9, 1e-9, 3e-10, 1e-10)


def tokens(n: int, d: int = 3, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def numpy_rhs(beta: float, n: int, d: int):
    def f(_t, y):
        x = y.reshape(n, d)
        z = beta * (x @ x.T)
        w = np.exp(z - z.max(axis=1, keepdims=True))
        w /= w.sum(axis=1, keepdims=True)
        v = w @ x
        return (v - np.sum(v * x, axis=1, keepdims=True) * x).ravel()
    return f


def scipy_run(x0, beta, t_end, method, tol):
    n, d = x0.shape
    start = time.perf_counter()
    sol = solve_ivp(numpy_rhs(beta, n, d), (0.0, t_end), x0.ravel(), method=method, rtol=tol, atol=tol)
    wall = time.perf_counter() - start
    y = sol.y[:, -1].reshape(n, d)
    return y / np.linalg.norm(y, axis=1, keepdims=True), int(sol.nfev), wall


def engine(x0, beta, **kw) -> Simulation:
    return Simulation(x0, [np.eye(x0.shape[1])], beta=beta, rule="softmax", dtype="float64", **kw)


def timed(sim, steps):
    start = time.perf_counter()
    sim.advance(steps)
    return time.perf_counter() - start


def rk4_runs(x0, beta, t_end, ref, smallest):
    dt = 0.4
    while dt >= smallest:
        steps = int(round(t_end / dt))
        sim = engine(x0, beta, dt=t_end / steps, integrator="rk4")
        wall = timed(sim, steps)
        yield dict(setting=f"dt {t_end / steps:g}", error=float(np.max(np.abs(sim.tokens - ref))),
                   evaluations=4 * steps, wall=wall, path=sim.path)
        dt /= 2


def dopri5_runs(x0, beta, t_end, ref, repeat):
    for tol in TOLERANCES:
        walls = []
        for _ in range(repeat):   # the same run each time, from a new simulation
            sim = engine(x0, beta, dt=t_end, integrator=Adaptive("dopri5", rtol=tol, atol=tol))
            walls.append(timed(sim, 1))
        wall = min(walls)
        stats = sim.stepper.stats()
        yield dict(setting=f"tol {tol:g}", error=float(np.max(np.abs(sim.tokens - ref))),
                   evaluations=stats["evaluations"], wall=wall, path=sim.path,
                   accepted=stats["accepted"][0], rejected=stats["rejected"][0])


def scipy_runs(x0, beta, t_end, ref, method, repeat):
    for tol in TOLERANCES:
        y, nfev, wall = scipy_run(x0, beta, t_end, method, tol)
        for _ in range(repeat - 1):
            wall = min(wall, scipy_run(x0, beta, t_end, method, tol)[2])
        yield dict(setting=f"tol {tol:g}", error=float(np.max(np.abs(y - ref))), evaluations=nfev, wall=wall)


def cheapest(runs, target):
    """The first run (they come from cheap to dear) whose error reaches the target."""
    for run in runs:
        if run["error"] <= target:
            return run
    return None


def measure(n: int, t_end: float, beta: float, repeat: int) -> dict:
    x0 = tokens(n)
    start = time.perf_counter()
    ref, ref_nfev, _ = scipy_run(x0, beta, t_end, "DOP853", 1e-12)
    print(f"n = {n}: reference DOP853 at 1e-12, {ref_nfev} evaluations, {time.perf_counter() - start:.1f} s",
          flush=True)
    out = {"n": n, "reference_nfev": ref_nfev, "targets": {}}
    # every method's runs once, cheapest first, then the cheapest reaching each target
    runs = {"rk4": list(rk4_runs(x0, beta, t_end, ref, smallest=t_end / 2 ** 16 if n <= 64 else 0.0125)),
            "dopri5": list(dopri5_runs(x0, beta, t_end, ref, repeat)),
            "scipy RK45": list(scipy_runs(x0, beta, t_end, ref, "RK45", repeat)),
            "scipy DOP853": list(scipy_runs(x0, beta, t_end, ref, "DOP853", repeat))}
    for name, rs in runs.items():
        for r in rs:
            print(f"  {name:13s} {r['setting']:12s} error {r['error']:.2e}  evaluations {r['evaluations']:7d}  "
                  f"{r['wall']:8.3f} s  {r.get('path', '')}", flush=True)
    out["runs"] = runs
    for target in TARGETS:
        out["targets"][f"{target:g}"] = {name: cheapest(rs, target) for name, rs in runs.items()}
    # the exact step on the sphere: |x| - 1 after the run, with and without renormalising
    drift = {}
    for retraction in ("exp", "normalise"):
        sim = engine(x0, beta, dt=0.05, integrator="heun", retraction=retraction)
        sim.advance(int(round(t_end / 0.05)))
        drift[retraction] = float(np.max(np.abs(np.linalg.norm(sim.native_tokens(), axis=-1) - 1)))
    out["sphere_drift_heun_dt0.05"] = drift
    return out


def table(results: list[dict]) -> str:
    lines = ["| n | target | method | path | setting | final error | evaluations | wall (s) | per evaluation (us) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        for target, best in res["targets"].items():
            for name, r in best.items():
                if r is None:
                    lines.append(f"| {res['n']} | {target} | {name} | | none reached it | | | | |")
                    continue
                lines.append(f"| {res['n']} | {target} | {name} | {r.get('path', 'NumPy')} | {r['setting']} | "
                             f"{r['error']:.1e} | {r['evaluations']:,} | {r['wall']:.3f} | "
                             f"{r['wall'] / r['evaluations'] * 1e6:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="64,256")
    p.add_argument("--t-end", type=float, default=200.0)
    p.add_argument("--beta", type=float, default=9.0)
    p.add_argument("--repeat", type=int, default=3,
                   help="the adaptive and scipy runs' wall time: the best of this many (a shared machine's "
                        "load doubles single timings)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    cpu = backend.fingerprint()
    print(f"CPU: {cpu.get('model', cpu)}; taichi {cpu.get('taichi')}; d = 3, beta = {args.beta:g}, "
          f"t_end = {args.t_end:g}, float64; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} "
          "cores", flush=True)
    results = [measure(int(n), args.t_end, args.beta, args.repeat) for n in args.sizes.split(",")]
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    print(table(results))
    for res in results:
        d = res["sphere_drift_heun_dt0.05"]
        print(f"n = {res['n']}: max ||x| - 1| after t_end with heun, dt 0.05: exp {d['exp']:.1e}, "
              f"normalise {d['normalise']:.1e}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": cpu, "t_end": args.t_end, "beta": args.beta, "results": results}, fh,
                      indent=1, default=lambda o: None if isinstance(o, float) and math.isnan(o) else str(o))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
