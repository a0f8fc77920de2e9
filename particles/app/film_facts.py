"""What the film of a scene can set beside its measurements: the theory that applies to the
run (c*(H), the equiangular ODE, Theorem 11's identity), its ALiBi slopes and its claim.

The renderer imports neither the core nor the scenes, so the app computes these here, from
the scene and its built heads, and hands them over as plain numbers in ``RunInfo``.
"""
from __future__ import annotations

import numpy as np

from particles import theory

from .build import head_attention
from .summary import TANGENT_FLOOR

ODE_POINTS = 400


def scalar_strengths(heads) -> list[float] | None:
    """lambda_h of heads that are all scalar, M_h = V_h = lambda_h I; else None."""
    out = []
    for head in heads:
        m, v = head.score, head.value
        lam = float(m[0, 0])
        eye = np.eye(m.shape[0])
        if not (np.allclose(m, lam * eye, atol=1e-6 * max(abs(lam), 1.0)) and np.allclose(v, m, atol=1e-6 * max(abs(lam), 1.0))):
            return None
        out.append(lam)
    return out


def _plain(scene) -> bool:
    """No positions, masks, own rules or layers: the heads alone drive the flow."""
    data, dyn = scene.data, scene.data["dynamics"]
    if data.get("layers") or dyn.get("mask", "none") != "none" or dyn.get("alibi"):
        return False
    entries = data["heads"] if isinstance(data["heads"], (list, tuple)) else [data["heads"]]
    return not any(k in e for e in entries for k in ("mask", "alibi_slope", "rule", "beta"))


def t_end(scene) -> float:
    dyn = scene.dynamics
    return float(dyn.steps * dyn.dt) if dyn.steps else float(dyn.t_end)


def film_facts(scene, heads, beta: float) -> dict:
    """RunInfo's keyword arguments for what a film can show beside the log:

    claim          the scene's [render] claim ('' when it names none)
    c_star         c*(H) of Theorem 19, for H >= 2 scalar heads on the sphere
    theory         {"gamma_bar": [(times, values, label), ...]}: the equiangular ODE of
                   Theorem 22 from an equiangular start under scalar heads (softmax or exp),
                   and, for unequal heads, the ODE of equal heads of the same total strength
    gradient_flow  Theorem 11's identity dE/dt = (1/n) sum |xdot_i|^2 holds: the exp rule,
                   every V_h = M_h symmetric, no masks, positions or layers
    alibi_slopes   the heads' ALiBi slopes m_h, when any is non-zero
    tangent_floor  the summary's floor on T_h below which rho_h is not judged, nor drawn
    """
    data, dyn = scene.data, scene.dynamics
    placement = data["dynamics"].get("normalisation", "post")   # the LayerNorm's place
    sphere = dyn.geometry == "sphere"
    plain = _plain(scene)
    lambdas = scalar_strengths(heads) if plain else None
    facts: dict = {"claim": getattr(scene.render, "claim", "") or None, "tangent_floor": TANGENT_FLOOR}
    if lambdas is not None and len(lambdas) >= 2 and sphere:
        facts["c_star"] = float(theory.c_star(len(lambdas)))
    tokens = data["tokens"]
    if (lambdas is not None and sphere and placement == "post" and tokens.get("init") == "equiangular"
            and not tokens.get("noise") and dyn.rule in ("softmax", "exp")):
        n, gamma0 = int(tokens["n"]), float(tokens.get("gamma", 0.0))
        times = np.linspace(0.0, t_end(scene), ODE_POINTS)
        label = "equiangular ODE, heads (" + ", ".join(f"{v:g}" for v in lambdas) + ")"
        curves = [(times, theory.equiangular_curve(gamma0, lambdas, float(beta), n, times, dyn.rule,
                                                   max_step=2e-3), label)]
        equal = [sum(lambdas) / len(lambdas)] * len(lambdas)
        if len(lambdas) > 1 and not np.allclose(lambdas, equal):
            curves.append((times, theory.equiangular_curve(gamma0, equal, float(beta), n, times, dyn.rule,
                                                           max_step=2e-3),
                           "ODE, equal heads (" + ", ".join(f"{v:g}" for v in equal) + ")"))
        facts["theory"] = {"gamma_bar": curves}
    facts["gradient_flow"] = bool(
        plain and dyn.rule == "exp" and placement == "post"
        and all(np.allclose(h.score, h.score.T, atol=1e-9) and np.allclose(h.value, h.score, atol=1e-9)
                for h in heads))
    if not data.get("layers"):
        slopes = [a.alibi for a in head_attention(data["heads"], {}, data["dynamics"], len(heads))]
        if any(s != 0.0 for s in slopes):
            facts["alibi_slopes"] = tuple(float(s) for s in slopes)
    return facts
