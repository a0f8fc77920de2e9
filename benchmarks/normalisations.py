"""Sinkhorn attention's cost and convergence, and the normalisation placements' contraction on
the equiangular start (docs/MODEL.md, "Sinkhorn attention" and "Normalisation placements";
the numbers in benchmarks/README.md).

    python benchmarks/normalisations.py sinkhorn      # time per evaluation, iterations to a tolerance
    python benchmarks/normalisations.py contraction   # late contraction of each placement
"""
import sys
import time

import numpy as np

import particles
from particles import Simulation, theory


def _tokens(n, d, seed=0):
    x = np.random.default_rng(seed).normal(size=(n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _per_evaluation(sim, repeats=5) -> float:
    sim.velocity()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sim.velocity()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def sinkhorn(n_values=(256, 1024), d=16, beta=2.0):
    rng = np.random.default_rng(1)
    M = rng.normal(size=(d, d)) / np.sqrt(d)
    heads = [(M, np.eye(d))]
    print("time per evaluation (median of 5, float32, one head, d = 16, beta = 2, random tokens)")
    print(f"{'n':>6} {'softmax fast':>13} {'softmax plain':>14} " +
          " ".join(f"{'sinkhorn ' + str(k):>12}" for k in (0, 5, 20)))
    for n in n_values:
        x = _tokens(n, d)
        row = [_per_evaluation(Simulation(x, heads, beta=beta, rule="softmax", path="tiled")),
               _per_evaluation(Simulation(x, heads, beta=beta, rule="softmax", path="plain"))]
        row += [_per_evaluation(Simulation(x, heads, beta=beta, rule=particles.sinkhorn_rule(k)))
                for k in (0, 5, 20)]
        print(f"{n:>6} " + " ".join(f"{t * 1e3:>11.2f}ms" for t in row))
    print("\niterations to max_j |column sum - 1| <= tol (float64, n = 256, d = 16, one head, "
          "random tokens; 'limit': not reached in 2000)")
    x = _tokens(256, d)
    print(f"{'beta':>6} " + " ".join(f"{'tol ' + f'{t:g}':>10}" for t in (1e-3, 1e-6, 1e-9)))
    for b in (0.5, 2.0, 8.0, 32.0):
        out = []
        for tol in (1e-3, 1e-6, 1e-9):
            sim = Simulation(x, heads, beta=b, rule=particles.sinkhorn_rule(2000, tol), dtype="float64")
            (_, sinkhorn_pass, _), = sim._layers[0].passes
            sim.velocity()
            out.append("limit" if sinkhorn_pass.iterations >= 2000 else str(sinkhorn_pass.iterations))
        print(f"{b:>6g} " + " ".join(f"{v:>10}" for v in out))


def contraction(n=16, lambdas=(1.0,), beta=1.0, alpha=0.5, dt=0.01, t_end=40.0):
    """Orthonormal tokens (gamma = 0, the equiangular start) under scalar softmax heads; the
    late slope of ln eps against t (post, ngpt) or against ln r and ln t (pre, peri)."""
    heads = [(lam * np.eye(n), lam * np.eye(n)) for lam in lambdas]
    Lambda = sum(lambdas)
    print(f"n = {n}, heads {lambdas}, beta = {beta}, softmax, RK4 dt = {dt}, float64, nGPT alpha = {alpha}")
    print(f"{'placement':>9} {'window':>14} {'measured':>28} {'closed form':>22} {'ODE':>12}")
    for placement in ("post", "ngpt", "pre", "peri"):
        sim = Simulation(np.eye(n), heads, beta=beta, rule="softmax", dtype="float64", dt=dt,
                         normalisation=placement, ngpt_alpha=alpha if placement == "ngpt" else 1.0)
        steps = int(round(t_end / dt))
        res = sim.run(steps, every=10)
        t, eps = res["time"], res["eps"]
        gamma_ode, r_ode = theory.equiangular_placement_curve(0.0, lambdas, beta, n, t, "softmax", placement,
                                                              alpha, max_step=dt / 4)
        if placement in ("post", "ngpt"):
            late = (eps < 1e-4) & (eps > 1e-11)
            slope = np.polyfit(t[late], np.log(eps[late]), 1)[0]
            ode = np.polyfit(t[late], np.log(1 - gamma_ode[late]), 1)[0]
            closed = -2 * Lambda if placement == "post" else -2 * alpha
            window = f"t {t[late][0]:.1f}-{t[late][-1]:.1f}"
            print(f"{placement:>9} {window:>14} {'d ln eps/dt = ' + f'{slope:.4f}':>28} "
                  f"{f'{closed:g}':>22} {ode:>12.4f}")
        else:
            late = t >= t_end / 2
            r = res["radius_mean"]
            slope_r = np.polyfit(np.log(r[late]), np.log(eps[late]), 1)[0]
            slope_t = np.polyfit(np.log(t[late]), np.log(eps[late]), 1)[0]
            ode = np.polyfit(np.log(r_ode[late]), np.log(1 - gamma_ode[late]), 1)[0]
            window = f"t {t[late][0]:.0f}-{t[late][-1]:.0f}"
            print(f"{placement:>9} {window:>14} {'d ln eps/d ln r = ' + f'{slope_r:.4f}':>28} "
                  f"{'-2 (r^-2)':>22} {ode:>12.4f}")
            print(f"{'':>9} {'':>14} {'d ln eps/d ln t = ' + f'{slope_t:.4f}':>28} "
                  f"{'-> -2 (t^-2)':>22} {'r(t_end) = ' + f'{r[-1]:.2f}':>12}")
        gap = np.max(np.abs(res["gamma_bar"] - gamma_ode))
        print(f"{'':>9} {'':>14} {'max |gamma - ODE| = ' + f'{gap:.1e}':>28}")


if __name__ == "__main__":
    which = sys.argv[1:] or ["sinkhorn", "contraction"]
    for name in which:
        {"sinkhorn": sinkhorn, "contraction": contraction}[name]()
        print()
