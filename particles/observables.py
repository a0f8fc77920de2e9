"""Observable rows: column names and the host-side finish of the device reductions.

The kernels reduce every per-token quantity over tokens on the device (sum, min, max,
log-sum-exp, in float64, fixed order); this module turns those few numbers per head
into the log's columns. Energies of exponential rules arrive as log-sums, so they stay
finite in float64 even where e^(beta s) overflows float32.
"""
from __future__ import annotations

import math

import numpy as np

from . import layout as K
from .clock import step_time

RUN_COLUMNS = ("step", "time", "energy", "kinetic", "gamma_bar", "eps")
# Observable groups a scene can switch off ([log] energy / radial / entropy); they all come
# from the same fused pass, so switching one off only shortens the log.
GROUPS = {
    "energy": ("energy", "tangent_power", "cross_coupling", "radial_shadow", "energy_rate"),
    "radial": ("radial_mean", "radial_absmax", "radial_dominance"),
    "entropy": ("entropy_mean", "entropy_min", "entropy_max"),
}
HEAD_QUANTITIES = GROUPS["energy"] + GROUPS["radial"] + GROUPS["entropy"]
# pre/peri-LN (particles.normalisation): each token's radius |x_i| is state, logged after the rest
RADIUS_COLUMNS = ("radius_mean", "radius_min", "radius_max")


def columns(n_heads: int, entropy_rate: bool = False, clusters: bool = False,
            ensemble: bool = False, groups=("energy", "radial", "entropy"),
            layer: bool = False) -> list[str]:
    """The log's column names, in order (``layer``: the schedule's layer index, after time)."""
    cols = [c for c in RUN_COLUMNS if c not in ("energy", "kinetic") or "energy" in groups]
    if layer:
        cols.insert(2, "layer")
    if ensemble:
        cols.insert(2, "replica")
    quantities = tuple(q for g in ("energy", "radial", "entropy") if g in groups for q in GROUPS[g])
    quantities += ("entropy_rate",) if entropy_rate else ()
    for h in range(n_heads):
        cols += [f"{q}_h{h}" for q in quantities]
    if clusters:
        cols += ["min_cosine", "clusters"]
    return cols


def assemble_rows(sim, step: int, red: np.ndarray, sumx: np.ndarray) -> list[dict]:
    """One dict per replica for the state at ``step``; red is (R, slots, 4), sumx (R, d)."""
    n, H = sim.n, sim.n_heads
    layer = sim.schedule.layer_at(step)
    attention = sim.layer_attention[layer]
    out = []
    for b in range(sim.n_replicas):
        r = red[b]
        row = {"step": step, "time": step_time(step, sim.dt)}
        if sim.ensemble:
            row["replica"] = b
        if sim.scheduled:
            row["layer"] = layer
        head_cols = {}
        energy_total = 0.0
        for h in range(H):
            def col(slot, kind=K.RED_SUM):
                return float(r[K.tok_slot(h, slot), kind])
            att = attention[h]
            beta = float(att.beta if att.beta is not None else sim.betas[b])
            if sim.scheduled or not att.has_potential or sim.heads[h].has_biases:
                # no potential: masks, biases and positions break the symmetry it needs, and a
                # schedule changes the field in time (docs/LOG.md)
                energy = math.nan
            elif att.rule.exponential:
                log_e = col(K.SLOT_ROW_ENERGY, K.RED_LSE) - math.log(2 * beta * n * n)
                energy = math.exp(log_e) if log_e < 709 else math.inf
            else:
                energy = col(K.SLOT_ROW_ENERGY) / (2 * beta * n * n)
            energy_total += energy
            tangent = col(K.SLOT_TANGENT) / n
            cross = col(K.SLOT_CROSS) / n
            radial_pair = col(K.SLOT_RADIAL_PAIR) / n
            radial_abs_pair = col(K.SLOT_RADIAL_ABS_PAIR) / n
            absmax = max(abs(col(K.SLOT_RADIAL, K.RED_MIN)), abs(col(K.SLOT_RADIAL, K.RED_MAX)))
            dominance = radial_abs_pair / tangent if tangent > 0 else (0.0 if radial_abs_pair == 0 else math.inf)
            head_cols.update({
                f"energy_h{h}": energy,
                f"tangent_power_h{h}": tangent,
                f"cross_coupling_h{h}": cross,
                f"radial_shadow_h{h}": radial_pair,
                f"energy_rate_h{h}": tangent + cross - radial_pair,
                f"radial_mean_h{h}": col(K.SLOT_RADIAL) / n,
                f"radial_absmax_h{h}": absmax,
                f"radial_dominance_h{h}": dominance,
                f"entropy_mean_h{h}": col(K.SLOT_ENTROPY) / n,
                f"entropy_min_h{h}": col(K.SLOT_ENTROPY, K.RED_MIN),
                f"entropy_max_h{h}": col(K.SLOT_ENTROPY, K.RED_MAX),
            })
            if sim.entropy_rate_enabled:
                head_cols[f"entropy_rate_h{h}"] = col(K.SLOT_ENTROPY_RATE) / n
        gamma_bar = (float(sumx[b] @ sumx[b]) - n) / (n * (n - 1)) if n > 1 else 1.0
        row.update(energy=energy_total, kinetic=float(r[K.SLOT_KINETIC, K.RED_SUM]) / n,
                   gamma_bar=gamma_bar, eps=1.0 - gamma_bar)
        row.update(head_cols)
        if not math.isfinite(row["kinetic"]):
            # tokens or velocity not finite: no observable of this state means anything, and
            # the paths' reductions treat NaN differently (max ignores it, sums do not)
            row.update({k: math.nan for k in row if k not in INDEX_COLUMNS})
        out.append(row)
    return out


INDEX_COLUMNS = ("step", "time", "replica", "layer")


# the cluster measures have one home, particles.clusters (re-exported for existing callers)
from .clusters import cluster_stats, pairwise_extremes  # noqa: E402,F401
