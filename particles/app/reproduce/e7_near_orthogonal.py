"""Experiment 7 (Theorem 39): per-head energy rates of nearly orthogonal heads."""
from __future__ import annotations

import math
import time

import numpy as np

from scenes import configurations, head_builders, load_scene

from .common import Check, Result, figure, fit_line, fmt, md_table, panel_label, run, save


def _op_overlap(heads) -> float:
    """max_{h != h'} ||M_h'^T M_h||_op = max_{h != h'} ||M_h' M_h||_op for the symmetric projector heads."""
    Ms = [h.score for h in heads]
    return max(float(np.linalg.norm(Ms[a] @ Ms[b], 2)) for a in range(len(Ms)) for b in range(len(Ms)) if a != b)


def run_experiment(quick: bool, fig_dir) -> Result:
    t_start = time.perf_counter()
    scene = load_scene("near_orthogonal")
    tok, hd, dyn = scene.data["tokens"], scene.data["heads"], scene.data["dynamics"]
    n, d = tok["n"], tok["d"]
    H, rank, strength, hseed = hd["count"], hd["rank"], float(hd["strength"]), hd.get("seed", 0)
    beta, rule = float(dyn["beta"]), dyn["rule"]
    angles = [90.0, 80.0, 70.0, 60.0] if quick else [90.0, 85.0, 80.0, 75.0, 70.0, 65.0, 60.0]
    R = 4 if quick else 16
    dt = 0.025 if quick else float(dyn["dt"])
    t_end = 5.0 if quick else 10.0
    t_early = 1.0
    params = dict(scene="near_orthogonal", n=n, d=d, H=H, rank=rank, strength=strength, head_seed=hseed,
                  rule=rule, beta=beta, angles_deg=angles, token_seeds=list(range(R)), dt=dt, t_end=t_end,
                  relative_rate="energy_rate_h(t) / max_t kinetic(t), per run",
                  early_window=t_early)
    X = np.stack([configurations.random(n, d, s) for s in range(R)])

    per = []
    example = None
    for ang in angles:
        heads = head_builders.near_orthogonal(H, d, rank, ang, hseed, strength)
        overlap = _op_overlap(heads)
        tr = run(X, heads, beta, rule=rule, dt=dt, steps=int(round(t_end / dt)), observe_every=1)
        rates = tr.head("energy_rate", H)                      # (R, H, T)
        K = tr["kinetic"]
        scale = np.max(K, axis=1)[:, None, None]
        rel = rates / scale
        worst_per_run = np.min(rel, axis=(1, 2))
        early = tr.time <= t_early + 1e-12
        cross = tr.head("cross_coupling", H)
        T = tr.head("tangent_power", H)
        Rsh = tr.head("radial_shadow", H)
        per.append(dict(
            angle=ang, overlap_op=overlap, cos_angle=math.cos(math.radians(ang)),
            worst_rel_rate=float(np.min(worst_per_run)), median_worst_rel_rate=float(np.median(worst_per_run)),
            q25=float(np.percentile(worst_per_run, 25)), q75=float(np.percentile(worst_per_run, 75)),
            fraction_runs_with_decrease=float(np.mean(worst_per_run < -1e-12)),
            worst_rel_rate_early=float(np.min(rel[:, :, early])),
            worst_rel_tangent_minus_radial=float(np.min((T - Rsh) / scale)),
            max_rel_abs_cross=float(np.max(np.abs(cross) / scale)),
            min_rel_cross=float(np.min(cross / scale)),
            total_energy_min_rel_increment=float(np.min(np.diff(tr["energy"], axis=1) / tr["energy"][:, :-1])),
            all_finite=bool(tr.finite.all())))
        if example is None or abs(ang - float(hd["angle"])) < abs(example[0] - float(hd["angle"])):
            example = (ang, tr)

    ov = np.array([p["overlap_op"] for p in per])
    worst = np.array([p["worst_rel_rate"] for p in per])
    med = np.array([p["median_worst_rel_rate"] for p in per])
    # the part of the worst decrease beyond the exactly orthogonal (radial-shadow-only) case
    excess = med - med[0]
    slope, icpt, se = fit_line(ov, med)
    out = dict(per_angle=per, median_worst_vs_overlap_slope=slope, slope_se=se,
               monotone_in_overlap=bool(np.all(np.diff(med) <= 1e-12)), excess_over_orthogonal=excess.tolist())
    max_overlap_err = max(abs(p["overlap_op"] - strength ** 2 * p["cos_angle"]) for p in per)
    checks = [
        Check("||M_h' M_h||_op = strength² cos(angle)", max_overlap_err, "closed form", "max |diff| <= 1e-12",
              max_overlap_err <= 1e-12),
        Check("exactly orthogonal (90°): no ambient cross-coupling", per[0]["max_rel_abs_cross"], "0",
              "max |C_h| / max kinetic <= 1e-12", per[0]["max_rel_abs_cross"] <= 1e-12),
        Check("the total energy still rises at every angle (Theorem 11)",
              min(p["total_energy_min_rel_increment"] for p in per), ">= 0", "min relative step increment >= -1e-12",
              min(p["total_energy_min_rel_increment"] for p in per) >= -1e-12),
        Check("slope of the median worst per-head rate against ||M'M||_op", slope, "Theorem 39: decrease O(δ)",
              "reported as measured (informational)", True, note="informational"),
    ]

    # --- figure
    fig, axes = figure(3, 1, width=4.6, height=3.7)
    ax = axes[0]
    ax.errorbar(ov, med, yerr=[med - np.array([p["q25"] for p in per]), np.array([p["q75"] for p in per]) - med],
                fmt="o-", capsize=3, label=f"median over {R} starts (25–75%)")
    ax.plot(ov, worst, "v--", color="C3", label="worst start")
    ax.plot(ov, [p["worst_rel_rate_early"] for p in per], "s:", color="C2", mfc="none", label=f"worst, t ≤ {fmt(t_early)}")
    for p in per:
        ax.annotate(f"{p['angle']:.0f}°", (p["overlap_op"], p["median_worst_rel_rate"]), textcoords="offset points",
                    xytext=(4, 4), fontsize=7)
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xlabel("||M_h' M_h||_op (= cos of the principal angle)")
    ax.set_ylabel("min_t,h energy_rate_h / max kinetic")
    ax.legend(fontsize=7)
    panel_label(ax, "(a) largest per-head energy decrease")
    ax = axes[1]
    ax.plot(ov, [p["worst_rel_tangent_minus_radial"] for p in per], "o-", label="min (T_h − R_h) / max kinetic")
    ax.plot(ov, [p["max_rel_abs_cross"] for p in per], "s-", label="max |C_h| / max kinetic")
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xlabel("||M_h' M_h||_op")
    ax.legend(fontsize=7)
    panel_label(ax, "(b) radial shadow vs ambient cross-coupling")
    ax = axes[2]
    ang, tr = example
    for h in range(H):
        ax.plot(tr.time, tr[f"energy_rate_h{h}"][0], color=f"C{h}", label=f"dE_{h}/dt")
        ax.plot(tr.time, tr[f"cross_coupling_h{h}"][0], color=f"C{h}", ls=":", lw=1, label=f"C_{h}")
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xlabel("t")
    ax.legend(fontsize=7, ncol=2)
    panel_label(ax, f"(c) {ang:.0f}°, start 0: per-head rates")
    fig_name = save(fig, fig_dir, "e7_near_orthogonal.png")

    table = md_table(["angle", "||M'M||_op", "worst rate (all starts)", "median worst", "fraction of starts with a decrease",
                      f"worst for t ≤ {fmt(t_early)}", "min (T−R)", "max |C|"],
                     [[f"{p['angle']:.0f}°", p["overlap_op"], p["worst_rel_rate"], p["median_worst_rel_rate"],
                       p["fraction_runs_with_decrease"], p["worst_rel_rate_early"],
                       p["worst_rel_tangent_minus_radial"], p["max_rel_abs_cross"]] for p in per])
    table += "\n\nRates are relative to the run's peak kinetic term (the total energy's peak rate)."
    measurement = (
        f"{H} rank-{rank} projector heads in R^{d} with every pairwise principal angle equal (scenes.head_builders."
        f"near_orthogonal, strength {fmt(strength)}), n = {n} random tokens ({R} starts), rule {rule}, β = {fmt(beta)}, "
        f"RK4 float64, dt = {fmt(dt)} to t = {fmt(t_end)}, angles {', '.join(f'{a:.0f}°' for a in angles)}. "
        f"The largest per-head decrease is min over time and heads of `energy_rate_h` divided by the run's peak "
        f"`kinetic`: median over starts {', '.join(fmt(v, 3) for v in med)} at ||M'M||_op = "
        f"{', '.join(fmt(v, 3) for v in ov)}; fitted slope {fmt(slope, 3)} ± {fmt(se, 2)} per unit of overlap.")
    shallower = med[-1] > med[0]
    cross_pos = all(p["min_rel_cross"] >= -1e-12 for p in per)
    early_ok = [p["angle"] for p in per if p["worst_rel_rate_early"] >= 0]
    agreement = (
        f"Per-head energies fall at every angle, including exactly orthogonal heads (90°: worst "
        f"{fmt(per[0]['worst_rel_rate'], 3)}, median {fmt(med[0], 3)}; all of it radial shadow, since C_h = 0 there). "
        f"As the overlap grows the median worst decrease becomes "
        + ("shallower" if shallower else "deeper")
        + ("" if np.all(np.diff(med) >= 0) or np.all(np.diff(med) <= 0) else ", though not monotonically,")
        + f" ({fmt(med[0], 3)} at 90° → {fmt(med[-1], 3)} at {angles[-1]:.0f}°; slope {fmt(slope, 3)} per unit of "
        f"||M'M||_op): the ambient cross-coupling C_h "
        + ("is non-negative throughout and " if cross_pos else "")
        + f"grows to {fmt(per[-1]['max_rel_abs_cross'], 3)} of the peak rate, while min(T_h − R_h) goes "
        f"{fmt(per[0]['worst_rel_tangent_minus_radial'], 3)} → {fmt(per[-1]['worst_rel_tangent_minus_radial'], 3)}"
        + (": overlapping heads pull their tokens the same way and the coupling offsets the radial shadow. "
           if shallower else ". ")
        + "So the measured decrease is not an O(δ) perturbation of a monotone orthogonal case: at δ = 0 it is "
        "already the radial-shadow decrease of Experiment 2, and overlap "
        + ("reduces" if shallower else "adds to")
        + " it. "
        + (f"Early on (t ≤ {fmt(t_early)}) no head lost energy at " + ", ".join(f"{a:.0f}°" for a in early_ok) + "."
           if early_ok else f"Even early on (t ≤ {fmt(t_early)}) some head lost energy at every angle, by at most "
           f"{fmt(max(abs(p['worst_rel_rate_early']) for p in per), 3)} of the peak rate."))
    return Result(
        key="e7_near_orthogonal", title="Near-orthogonal heads", theorem="Theorem 39",
        what=("Tests how the per-head energy guarantees degrade when heads look at subspaces that are almost, but not "
              "exactly, orthogonal, as the heads of trained transformers do (principal angles of 70–85°)."),
        claim=("The per-head statements survive approximate orthogonality: with ||M_h' M_h||_op ≤ δ small against the "
               "head's own energy, a head's energy decreases by at most O(δ)."),
        closed_form="||M_h' M_h||_op = λ_h λ_h' cos(principal angle); the bound is O(δ), no explicit constant.",
        measurement=measurement, agreement=agreement, params=params, numbers=out, checks=checks,
        figures=[fig_name], table=table, seconds=time.perf_counter() - t_start)
