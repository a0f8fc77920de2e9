"""What a Simulation, a Result and a Trajectory show in a notebook (HTML) and elsewhere (text).

NumPy only: each object hands over a title and (name, value) fields; this module lays them out.
"""
from __future__ import annotations

import html

import numpy as np


def _value(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, np.ndarray):
        return _numbers(v)
    return str(v)


def _numbers(values) -> str:
    """One number, or 'lo .. hi (k values)' for several."""
    a = np.asarray(values, dtype=np.float64).ravel()
    if a.size == 0:
        return "none"
    if np.all(a == a[0]):
        return f"{a[0]:.6g}"
    return f"{a.min():.6g} .. {a.max():.6g} ({a.size} values)"


def text(title: str, fields: list[tuple[str, object]]) -> str:
    """``Title(name=value, ...)`` on one line."""
    return f"{title}(" + ", ".join(f"{k}={_value(v)}" for k, v in fields) + ")"


def html_table(title: str, fields: list[tuple[str, object]], note: str = "") -> str:
    """A small two-column table for Jupyter's ``_repr_html_``."""
    rows = "".join(f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(k)}</th>"
                   f"<td style='text-align:left'>{html.escape(_value(v))}</td></tr>" for k, v in fields)
    extra = f"<div style='font-size:smaller'>{html.escape(note)}</div>" if note else ""
    return f"<div><strong>{html.escape(title)}</strong><table>{rows}</table>{extra}</div>"


def simulation_fields(sim) -> list[tuple[str, object]]:
    rules = sorted({sim.rule.name} | {a.rule.name for layer in getattr(sim, "layer_attention", [])
                                      for a in layer if getattr(a, "rule", None) is not None})
    fields = [("n", sim.n), ("d", sim.d), ("heads", sim.n_heads)]
    if sim.ensemble:
        fields.append(("replicas", sim.n_replicas))
    fields += [("rule", ", ".join(rules)), ("beta", np.asarray(sim.betas)), ("geometry", sim.geometry),
               ("dt", sim.dt), ("integrator", getattr(sim.integrator, "name", sim.integrator)),
               ("dtype", sim.dtype), ("arch", sim.arch), ("path", sim.path)]
    if sim.scheduled:
        fields.append(("layers", len(sim.schedule.layers)))
    placement = getattr(sim, "normalisation", "post")
    if placement != "post":   # where the LayerNorm sits (the default, the sphere, goes unsaid)
        fields.append(("normalisation", placement + (f" (alpha {sim.ngpt_alpha:g})" if placement == "ngpt" else "")))
    fields += [("step", sim.step_count), ("time", sim.time)]
    return fields


def result_fields(res) -> list[tuple[str, object]]:
    fields = [("rows", len(res)), ("columns", len(res.columns))]
    if "step" in res.data and len(res):
        steps = res.data["step"]
        fields.append(("steps", f"{int(steps[0])} .. {int(steps[-1])} ({len(np.unique(steps))} observed)"))
    if "time" in res.data and len(res):
        fields.append(("time", f"{res.data['time'][0]:g} .. {res.data['time'][-1]:g}"))
    if "replica" in res.data and len(res):
        fields.append(("replicas", len(np.unique(res.data["replica"]))))
    if res.final_tokens is not None:
        fields.append(("final tokens", "x".join(str(s) for s in res.final_tokens.shape)))
    if getattr(res, "trajectory", None) is not None:
        fields.append(("trajectory", f"{len(res.trajectory.steps)} frames"))
    return fields


def trajectory_fields(traj) -> list[tuple[str, object]]:
    meta = traj.meta or {}
    fields = [("frames", len(traj.steps)), ("tokens", "x".join(str(s) for s in np.shape(traj.tokens)))]
    if len(traj.steps):
        fields.append(("steps", f"{int(traj.steps[0])} .. {int(traj.steps[-1])}"))
        fields.append(("time", f"{float(traj.times[0]):g} .. {float(traj.times[-1]):g}"))
    for key in ("scene", "n", "d", "n_heads", "rule", "beta", "geometry", "dt"):
        if key in meta:
            value = meta[key]
            fields.append(("heads" if key == "n_heads" else key,
                           np.asarray(value) if isinstance(value, list) else value))
    return fields
