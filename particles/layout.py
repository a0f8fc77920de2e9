"""The engine's arrays by name, and where each per-token observable lives: Taichi-free, so
that the observables' host side and the application read the layout without starting Taichi.

Layout (b = replica, h = head, i/j = token, c = component):
    x      (R, n, d)        tokens
    q, k   (R, H, n, r)     score factors  q_i = Q_h x_i,  k_j = K_h x_j   (s_ij = <q_i, k_j>)
    u      (R, H, n, rv)    value inputs   u_j = W_h x_j
    g      (R, H, n, rv)    normalised pulls g_i = sum_j w_ij u_j  (f_i = O_h g_i)
    f      (R, H, n, d)     head outputs f^h_i
    row    (R, H, n, 4)     per-row statistics of the pair pass: running max m_i of z, weight
                            sum l_i, entropy H_i, row energy (log-sum for exponential rules)
    tok    (R, n, slots)    per-token observables (the SLOT_* below)
    red    (batch, R, slots, 4)   their reductions over tokens (RED_*), float64 where the
                            device has it
    sumx   (batch, R, d, 1)       sum over tokens of x_i / |x_i|
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Per-token observable slots (last axis of the `tok` buffer), per head h:
SLOT_TANGENT, SLOT_CROSS, SLOT_RADIAL_PAIR, SLOT_RADIAL_ABS_PAIR, SLOT_RADIAL, SLOT_ENTROPY, \
    SLOT_ROW_ENERGY, SLOT_ENTROPY_RATE = range(8)
SLOTS_PER_HEAD = 8
SLOT_KINETIC = 0  # then head h's slot s lives at 1 + h * SLOTS_PER_HEAD + s


def tok_slot(h: int, s: int) -> int:
    return 1 + h * SLOTS_PER_HEAD + s


def n_tok_slots(n_heads: int) -> int:
    return 1 + n_heads * SLOTS_PER_HEAD


# Reduction outputs per slot: sum, min, max, log-sum-exp.
RED_SUM, RED_MIN, RED_MAX, RED_LSE = range(4)


@dataclass
class Operands:
    """The arrays a pass or a whole-step kernel reads and writes, passed by name (one record
    per layer: its factors and per-head parameters, the simulation's shared arrays).
    Arrays an implementation does not use (``paths.Plan.operands``) are one-token stand-ins."""

    x: Any          # the state (a stage's point is passed to a pass separately)
    xdot: Any
    beta: Any       # (R,) one per replica
    Q: Any          # (H, r, d), K (H, r, d), W (H, rv, d), O (H, d, rv): the layer's factors
    K: Any
    W: Any
    O: Any
    hreal: Any      # (H, 2): ALiBi slope, the head's own beta (0: the replica's)
    q: Any
    k: Any
    u: Any
    g: Any
    f: Any
    row: Any
    tok: Any
    red: Any
    sumx: Any
