"""Experiment 1 (Theorems 11-12): the multi-head energy rises, at the rate of the kinetic term."""
from __future__ import annotations

import math
import time

import numpy as np

from scenes import head_builders, load_scene

from .common import Check, Result, figure, fit_line, fmt, md_table, panel_label, run, save


def _rates(trace):
    """Central and forward differences of the energy, against the logged kinetic term."""
    E, K, t = trace["energy"], trace["kinetic"], trace.time
    dt = float(t[1] - t[0])
    central = (E[:, 2:] - E[:, :-2]) / (2 * dt)
    forward = (E[:, 1:] - E[:, :-1]) / dt
    scale = np.max(K, axis=1)
    mis_c = np.max(np.abs(central - K[:, 1:-1]), axis=1) / scale
    mis_f = np.max(np.abs(forward - K[:, :-1]), axis=1) / scale
    step_drop = np.min((E[:, 1:] - E[:, :-1]) / np.abs(E[:, :-1]), axis=1)
    return dict(central=central, forward=forward, mis_central=mis_c, mis_forward=mis_f,
                min_rel_increment=step_drop, min_rate_rel=np.min(central, axis=1) / scale,
                min_kinetic=np.min(K, axis=1))


def run_experiment(quick: bool, fig_dir) -> Result:
    t_start = time.perf_counter()
    scene = load_scene("energy_monotone")
    dyn = scene.data["dynamics"]
    R = 3 if quick else 12
    n, d = scene.data["tokens"]["n"], scene.data["tokens"]["d"]
    base = load_scene("energy_monotone", overrides=[f"tokens.replicas={R}"])
    x0 = base.tokens()
    heads = base.heads()
    H = len(heads)
    beta, dt = float(dyn["beta"]), float(dyn["dt"])
    t_sphere = 2.0 if quick else 10.0
    dt_flat, t_flat = 0.002, 0.3
    eps_list = [0.0, 0.01, 0.03, 0.1, 0.3, 1.0]
    t_eps = 2.0 if quick else 5.0
    params = dict(scene="energy_monotone", n=n, d=d, H=H, heads="random_symmetric (seeds 0..H-1), V_h = M_h",
                  rule="exp", beta=beta, integrator="rk4", dtype="float64", replicas=R,
                  token_seeds=list(range(R)), sphere=dict(dt=[dt, dt / 2], t_end=t_sphere),
                  flat=dict(dt=[dt_flat, dt_flat / 2], t_end=t_flat),
                  perturbation=dict(eps=eps_list, t_end=t_eps, dt=dt,
                                    value="V_h = M_h + eps E_h, E_h Gaussian d x d / sqrt(d) (seeded per head)"))

    out = {}
    traces = {}
    for geom, step, t_end in (("sphere", dt, t_sphere), ("flat", dt_flat, t_flat)):
        res = {}
        for k, h in enumerate((step, step / 2)):
            steps = int(round(t_end / h))
            tr = run(x0, heads, beta, rule="exp", geometry=geom, dt=h, steps=steps)
            r = _rates(tr)
            res[k] = r
            if k == 0:
                traces[geom] = (tr, r)
            out[f"{geom}_dt{k}"] = dict(
                dt=h, steps=steps, all_finite=bool(tr.finite.all()),
                max_mismatch_central=float(np.max(r["mis_central"])),
                max_mismatch_forward=float(np.max(r["mis_forward"])),
                min_relative_energy_increment=float(np.min(r["min_rel_increment"])),
                min_rate_over_max_kinetic=float(np.min(r["min_rate_rel"])),
                energy_start=float(np.mean(tr["energy"][:, 0])),
                energy_end=float(np.mean(tr["energy"][:, -1])))
        out[f"{geom}_order_central"] = math.log2(out[f"{geom}_dt0"]["max_mismatch_central"]
                                                 / out[f"{geom}_dt1"]["max_mismatch_central"])
        out[f"{geom}_order_forward"] = math.log2(out[f"{geom}_dt0"]["max_mismatch_forward"]
                                                 / out[f"{geom}_dt1"]["max_mismatch_forward"])

    # Theorem 12: V_h = M_h + eps E_h
    pert = []
    for eps in eps_list:
        hs = [head_builders.with_value(h, "aligned", eps, seed=100 + i) for i, h in enumerate(heads)]
        tr = run(x0, hs, beta, rule="exp", geometry="sphere", dt=dt, steps=int(round(t_eps / dt)))
        r = _rates(tr)
        pert.append(dict(eps=eps, max_mismatch=float(np.max(r["mis_central"])),
                         min_rate_over_max_kinetic=float(np.min(r["min_rate_rel"])),
                         min_relative_energy_increment=float(np.min(r["min_rel_increment"])),
                         energy_decreases=bool(np.min(r["min_rel_increment"]) < 0),
                         all_finite=bool(tr.finite.all())))
    out["perturbation"] = pert
    e_pos = np.array([p["eps"] for p in pert if p["eps"] > 0])
    m_pos = np.array([p["max_mismatch"] for p in pert if p["eps"] > 0])
    floor = pert[0]["max_mismatch"]
    # local log-log slopes between consecutive eps, and m(eps) ~ c1 eps + c2 eps^2 on eps <= 0.3
    local = np.diff(np.log(m_pos)) / np.diff(np.log(e_pos))
    small = e_pos <= 0.3
    c2, c1, _ = fit_line(e_pos[small], m_pos[small] / e_pos[small])
    out["perturbation_local_slopes"] = local.tolist()
    out["perturbation_linear_coeff_c1"] = c1
    out["perturbation_quadratic_coeff_c2"] = c2
    out["perturbation_crossover_eps"] = c1 / c2 if c2 > 0 else math.inf
    grows = bool(np.all(np.diff(m_pos) > 0))
    out["perturbation_mismatch_increasing"] = grows
    out["perturbation_mismatch_over_floor_at_smallest_eps"] = float(m_pos[0] / floor)
    decreasing_eps = [p["eps"] for p in pert if p["energy_decreases"]]
    out["smallest_eps_with_energy_decrease"] = min(decreasing_eps) if decreasing_eps else math.nan

    # --- checks
    tol_id = 1e-3
    checks = []
    for geom in ("sphere", "flat"):
        o0 = out[f"{geom}_dt0"]
        checks.append(Check(f"{geom}: E never decreases (min relative step increment)",
                            o0["min_relative_energy_increment"], ">= 0", "min_k (E_{k+1}-E_k)/|E_k| >= -1e-12",
                            o0["min_relative_energy_increment"] >= -1e-12 and o0["all_finite"]))
        checks.append(Check(f"{geom}: dE/dt (central difference) = kinetic",
                            o0["max_mismatch_central"], "0", f"max|dE/dt - kinetic| / max kinetic <= {tol_id:g}",
                            o0["max_mismatch_central"] <= tol_id))
        checks.append(Check(f"{geom}: mismatch shrinks with dt (observed order, central difference)",
                            out[f"{geom}_order_central"], "2 (finite-difference error O(dt^2))",
                            ">= 1.5", out[f"{geom}_order_central"] >= 1.5))
    checks.append(Check("V = M + eps E: mismatch grows with eps", float(m_pos[-1]),
                        "increasing in eps, above the eps = 0 discretisation floor",
                        "strictly increasing over eps > 0, and >= 3x the floor at the smallest eps",
                        grows and m_pos[0] >= 3 * floor and c1 > 0))

    # --- figure
    fig, axes = figure(3, 1, width=4.6, height=3.6)
    for ax, geom in zip(axes[:2], ("sphere", "flat")):
        tr, r = traces[geom]
        t = tr.time
        ax.plot(t, tr["kinetic"][0], lw=2.2, color="0.7", label="kinetic (1/n) Σ|ẋ|²")
        ax.plot(t[1:-1], r["central"][0], "--", color="C0", lw=1.3, label="dE/dt (finite difference)")
        ax.set_xlabel("t")
        ax.set_ylabel("rate")
        ax.legend(fontsize=8)
        panel_label(ax, f"({'ab'[geom == 'flat']}) {geom}: dE/dt vs kinetic, replica 0")
    ax = axes[2]
    ax.loglog(e_pos, m_pos, "o-", label="max |dE/dt − kinetic| / max kinetic")
    viol = np.array([max(0.0, -p["min_rate_over_max_kinetic"]) for p in pert if p["eps"] > 0])
    if np.any(viol > 0):
        ax.loglog(e_pos[viol > 0], viol[viol > 0], "s-", color="C3", label="max decrease rate / max kinetic")
    ax.axhline(pert[0]["max_mismatch"], color="0.5", ls=":", label="eps = 0 (discretisation floor)")
    ax.set_xlabel("value perturbation eps")
    ax.legend(fontsize=8)
    ee = np.geomspace(e_pos[0], e_pos[-1], 50)
    ax.loglog(ee, c1 * ee + c2 * ee ** 2, color="0.4", lw=0.8, label=f"fit {c1:.3g} eps + {c2:.3g} eps²")
    ax.legend(fontsize=7)
    panel_label(ax, "(c) Theorem 12: V = M + eps E")
    fig_name = save(fig, fig_dir, "e1_energy.png")

    rows = [[fmt(p["eps"]), p["max_mismatch"], p["min_rate_over_max_kinetic"],
             "yes" if p["energy_decreases"] else "no"] for p in pert]
    table = md_table(["eps", "max mismatch / max kinetic", "min dE/dt / max kinetic", "E decreases"], rows)
    s0, f0 = out["sphere_dt0"], out["flat_dt0"]
    measurement = (
        f"{R} random starts (n = {n}, d = {d}, H = {H} random symmetric heads with V = M, beta = {fmt(beta)}), "
        f"RK4 in float64. Sphere to t = {fmt(t_sphere)} with dt = {fmt(dt)} and {fmt(dt / 2)}; flat space "
        f"(exp blows up in finite time) to t = {fmt(t_flat)} with dt = {fmt(dt_flat)} and {fmt(dt_flat / 2)}. "
        f"dE/dt is the central difference of the logged `energy`, compared with the logged `kinetic`. "
        f"Sphere: E goes {fmt(s0['energy_start'])} -> {fmt(s0['energy_end'])}, smallest relative step increment "
        f"{fmt(s0['min_relative_energy_increment'])}, max mismatch {fmt(s0['max_mismatch_central'])} "
        f"(forward difference: {fmt(s0['max_mismatch_forward'])}); flat: {fmt(f0['min_relative_energy_increment'])}, "
        f"{fmt(f0['max_mismatch_central'])} (forward {fmt(f0['max_mismatch_forward'])}). Halving dt shrinks the "
        f"mismatch with observed order {fmt(out['sphere_order_central'], 3)} (sphere) / "
        f"{fmt(out['flat_order_central'], 3)} (flat) for the central difference and "
        f"{fmt(out['sphere_order_forward'], 3)} / {fmt(out['flat_order_forward'], 3)} for the forward one: the "
        f"mismatch is the finite difference's own error, so the identity holds exactly in the limit. "
        f"With V = M + eps E (t = {fmt(t_eps)}, the same E for every eps) the mismatch grows with local log-log "
        f"slopes {', '.join(fmt(v, 3) for v in local)}; a fit m = c1 eps + c2 eps^2 over eps <= 0.3 gives "
        f"c1 = {fmt(c1)}, c2 = {fmt(c2)}: first order in eps below eps ~ {fmt(out['perturbation_crossover_eps'], 2)}, "
        f"where the quadratic term takes over (the first-order term ⟨E x, P v⟩ partly cancels).")
    agreement = (
        f"The energy never decreased in either geometry, and dE/dt matches the kinetic term to "
        f"{fmt(max(s0['max_mismatch_central'], f0['max_mismatch_central']))} of its peak, shrinking as dt^2 "
        f"(central difference). Breaking V = M breaks the identity by an amount that grows with eps "
        f"(from {fmt(m_pos[0])} at eps = {fmt(e_pos[0])} to {fmt(m_pos[-1])} at eps = {fmt(e_pos[-1])}); "
        + (f"the energy itself first decreased at eps = {fmt(out['smallest_eps_with_energy_decrease'])}."
           if decreasing_eps else
           f"the energy still rose at every step up to eps = {fmt(max(eps_list))} for these starts "
           "(Theorem 12's approximate monotonicity, with room to spare)."))
    return Result(
        key="e1_energy", title="Energy monotonicity", theorem="Theorems 11-12",
        what=("Tests whether the attention dynamics is a gradient flow: with symmetric score matrices and "
              "values equal to scores, a single energy (summed over heads) should only ever increase, at a rate "
              "equal to the tokens' mean squared speed."),
        claim=("If every M_h is symmetric and V_h = M_h (rule exp), E_multi = Σ_h 1/(2βn²) Σ_ij e^{β⟨x_i, M_h x_j⟩} "
               "satisfies dE/dt = (1/n) Σ_i |ẋ_i|² ≥ 0 on the sphere and in flat space (Theorem 11); for "
               "V_h = M_h + small perturbation the monotonicity holds approximately (Theorem 12)."),
        closed_form="dE_multi/dt = kinetic = (1/n) Σ_i ||ẋ_i||²  (an identity, no free constant).",
        measurement=measurement, agreement=agreement, params=params, numbers=out, checks=checks,
        figures=[fig_name], table=table, seconds=time.perf_counter() - t_start)
