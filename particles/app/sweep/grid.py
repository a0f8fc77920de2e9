"""The grid of a sweep: axis values expanded, grid points applied to the base scene, replicas
batched into ensemble work units (one Simulation each), the results table's columns."""
from __future__ import annotations

import copy
import difflib
import itertools
import json
import math

import numpy as np

from scenes import SceneError
from scenes.specs import is_int, is_number, show

from .format import EXCLUSIVE, FIXED_COLUMNS, RANGE_KEYS, REPLICA_AXES


def _label(assign: dict) -> str:
    return ", ".join(f"{k} = {show(v)}" for k, v in assign.items())


def _integral(values: list) -> list:
    """Floats that are whole numbers (to 1e-9) become ints, so integer keys can take ranges."""
    out = []
    for v in values:
        r = round(v)
        if abs(v - r) > 1e-9 * max(1.0, abs(v)):
            return values
        out.append(int(r))
    return out


def expand_values(spec, where: str, problems: list) -> list | None:
    """An axis' (or record.times') list of values from a list or a range table."""
    if isinstance(spec, list):
        if not spec:
            problems.append(f"{where}: the list of values is empty")
            return None
        seen = set()
        for v in spec:
            k = json.dumps(v, sort_keys=True, default=str)
            if k in seen:
                problems.append(f"{where}: the value {show(v)} appears twice")
                return None
            seen.add(k)
        return list(spec)
    if not isinstance(spec, dict):
        problems.append(f"{where}: expected a list of values or a range table "
                        f"({{from, to, num}}, {{from, to, step}} or {{count}}), got {show(spec)}")
        return None
    unknown = [k for k in spec if k not in RANGE_KEYS]
    if unknown:
        problems.append(f"{where}: unknown key '{unknown[0]}' in the range table; allowed: "
                        "{from, to, num[, log]}, {from, to, step} or {count[, start]}")
        return None
    ints_given = all(is_int(spec[k]) for k in ("from", "to", "step", "start") if k in spec)
    if "count" in spec:
        if set(spec) - {"count", "start"}:
            problems.append(f"{where}: {{count}} takes only 'start' besides it (values start.."
                            "start+count-1)")
            return None
        count, start = spec["count"], spec.get("start", 0)
        if not is_int(count) or count < 1 or not is_int(start):
            problems.append(f"{where}: count must be an integer >= 1 and start an integer, got "
                            f"count = {show(count)}, start = {show(start)}")
            return None
        return list(range(start, start + count))
    if "from" not in spec or "to" not in spec or ("num" in spec) == ("step" in spec):
        problems.append(f"{where}: a range table needs from, to and exactly one of num or step, "
                        f"got {{{', '.join(spec)}}}")
        return None
    lo, hi = spec["from"], spec["to"]
    if not (is_number(lo) and is_number(hi) and math.isfinite(lo) and math.isfinite(hi)):
        problems.append(f"{where}: from and to must be finite numbers, got {show(lo)}, {show(hi)}")
        return None
    log = spec.get("log", False)
    if not isinstance(log, bool):
        problems.append(f"{where}: log must be true or false, got {show(log)}")
        return None
    if log and (lo <= 0 or hi <= 0):
        problems.append(f"{where}: log = true needs from > 0 and to > 0, got {lo:g}, {hi:g}")
        return None
    if "num" in spec:
        num = spec["num"]
        if not is_int(num) or num < 1:
            problems.append(f"{where}: num must be an integer >= 1, got {show(num)}")
            return None
        if num > 1 and lo == hi:
            problems.append(f"{where}: from = to = {lo:g} with num = {num} repeats one value")
            return None
        values = (np.geomspace(lo, hi, num) if log else np.linspace(lo, hi, num)).tolist()
        values[0] = float(lo)
        values[-1] = float(hi) if num > 1 else values[-1]
    else:
        step = spec["step"]
        if log:
            problems.append(f"{where}: log = true goes with num, not step")
            return None
        if not is_number(step) or not step > 0 or hi < lo:
            problems.append(f"{where}: step must be a number > 0 and to >= from, got step = "
                            f"{show(step)}, from = {lo:g}, to = {hi:g}")
            return None
        count = int(math.floor((hi - lo) / step + 1e-9)) + 1
        values = [lo + k * step for k in range(count)]
    if ints_given:
        values = _integral(values)
    return values


def _apply(raw: dict, assign: dict) -> dict:
    """``raw`` with each axis value set (creating [heads] / sections as needed)."""
    out = copy.deepcopy(raw)
    for key, value in assign.items():
        parts = key.split(".")
        section = parts[0]
        if section == "heads" and not isinstance(out.get("heads"), (dict, list)):
            out["heads"] = {"kind": "scalar"}        # the scene's default: one scalar head
        node = out.setdefault(section, {})
        for part in parts[1:-1]:
            node = node[int(part)] if isinstance(node, list) else node[part]
        last = parts[-1]
        alias = EXCLUSIVE.get(f"{section}.{last}")
        if alias and isinstance(node, dict):
            node.pop(alias, None)
        node[last] = copy.deepcopy(value)
    return out


def expand_grid(axes, base_raw, base_dir, record, batch, problems):
    """Grid points -> resolved replicas -> work units; problems appended, never raised."""
    from scenes import Scene

    keys = [k for k, _ in axes]
    slow_keys = [k for k in keys if k not in REPLICA_AXES]
    cache: dict[str, tuple[dict | None, str]] = {}     # slow assignment -> (resolved, group)
    groups: dict[str, dict] = {}                        # group key -> info + its points
    points = []
    for index, combo in enumerate(itertools.product(*[v for _, v in axes])):
        assign = dict(zip(keys, combo))
        slow = {k: assign[k] for k in slow_keys}
        ck = json.dumps(slow, sort_keys=True, default=str)
        if ck not in cache:
            raw = _apply(base_raw, slow)
            where = f"at {_label(slow)}: " if slow else ""
            try:
                scene = Scene.from_dict(raw, source="sweep", base_dir=base_dir)
            except SceneError as exc:
                problems.extend(where + p for p in exc.problems)
                cache[ck] = (None, "")
                continue
            data = scene.data
            dyn = {k: v for k, v in data["dynamics"].items() if k not in ("beta", "betas")}
            gkey = json.dumps({"n": data["tokens"]["n"], "d": data["tokens"]["d"],
                               "heads": data["heads"], "dynamics": dyn}, sort_keys=True, default=str)
            cache[ck] = (data, gkey)
            if gkey not in groups:
                groups[gkey] = {"data": data, "slow": slow, "points": [], "where": where}
        data, gkey = cache[ck]
        if data is None:
            continue
        tokens = dict(data["tokens"])
        tokens.pop("replicas", None)
        if "tokens.seed" in assign:
            tokens["seed"] = int(assign["tokens.seed"])
        beta = float(assign.get("dynamics.beta", data["dynamics"]["beta"]))
        point = {"index": index, "axes": assign, "seed": int(tokens.get("seed", 0)), "beta": beta,
                 "tokens": tokens, "unit": None}
        points.append(point)
        groups[gkey]["points"].append(point)
    if problems:
        return [], [], [], {}

    # record steps per group, observables per group
    all_valid: set[str] = set()
    H_values = set()
    units, unit_meta = [], {}
    for g in groups.values():
        data = g["data"]
        dyn = data["dynamics"]
        H = _n_heads(data)
        H_values.add(H)
        all_valid.update(_valid_observables(H, dyn.get("normalisation", "post") in ("pre", "peri")))
        steps, dt = int(dyn["steps"]), float(dyn["dt"])
        t_end = steps * dt
        times = record["times"] if record["times"] is not None else [t_end]
        late = [t for t in times if t > t_end * (1 + 1e-9) + 1e-12]
        if late:
            problems.append(f"{g['where']}[record] times: {late[0]:g} is after the end of the run "
                            f"(t = {t_end:g} = steps * dt = {steps} * {dt:g})")
            continue
        rec_steps = sorted({min(steps, int(round(t / dt))) for t in times})
        threshold = record["threshold"]
        if threshold is None:
            threshold = float(data["log"].get("cluster_threshold", 0.99))
        unit_record = {"steps": rec_steps, "observables": list(record["observables"]),
                       "clusters": record["clusters"], "min_cosine": record["min_cosine"],
                       "threshold": threshold, "clustering_time": record["clustering_time"],
                       "clustering_every": record["clustering_every"]}
        if any(k.startswith("stop_") and k != "stop_window" for k in dyn):
            # the scene's stop rules (particles.stop) end each unit where its flow stops, on
            # the scene's log grid, as `particles run` does
            log = data.get("log", {})
            unit_record["stop"] = {"every": int(log.get("every", 1)),
                                   "cluster_threshold": float(log.get("cluster_threshold", 0.99))}
        scene_part = {"tokens": {"n": data["tokens"]["n"], "d": data["tokens"]["d"]},
                      "heads": data["heads"], "dynamics": data["dynamics"]}
        pts = g["points"]
        k = -(-len(pts) // batch)                      # units of near-equal size <= batch
        bounds = [round(i * len(pts) / k) for i in range(k + 1)]
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            chunk = pts[lo:hi]
            uid = f"u{len(units):05d}"
            for p in chunk:
                p["unit"] = uid
            units.append({"id": uid, "scene": scene_part,
                          "tokens": [p["tokens"] for p in chunk],
                          "betas": [p["beta"] for p in chunk],
                          "points": [p["index"] for p in chunk],
                          "record": unit_record})
            unit_meta[uid] = _unit_meta(data, H, unit_record, len(chunk))
    bad = [o for o in record["observables"] if o not in all_valid]
    if bad:
        hs = sorted(H_values)
        allowed = _valid_observables(1)
        close = difflib.get_close_matches(bad[0], sorted(all_valid), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        problems.append(
            f"[record] observables: '{bad[0]}' is not a log column of any unit; {hint}(heads per unit: "
            f"{', '.join(map(str, hs))}); allowed: {', '.join(c for c in allowed if not c.endswith('_h0'))}, "
            "the per-head columns <name>_h<h> with h < H (" +
            ", ".join(c[:-3] for c in allowed if c.endswith('_h0')) + "), clusters, min_cosine "
            "(see docs/LOG.md)")
    if problems:
        return [], [], [], {}
    columns = _columns(axes, record, stops=any("stop" in u["record"] for u in units))
    for p in points:
        del p["tokens"]
    return points, units, columns, unit_meta


def _n_heads(data: dict) -> int:
    heads = data["heads"]
    entries = heads if isinstance(heads, list) else [heads]
    return sum(e.get("count", 1) for e in entries)


def _unit_meta(data: dict, H: int, record: dict, size: int) -> dict:
    """What plots need about a unit (the scalar-head strengths for the equiangular curve)."""
    heads = data["heads"]
    entries = heads if isinstance(heads, list) else [heads]
    strengths = []
    scalar = True
    for e in entries:
        count = e.get("count", 1)
        strengths += list(e.get("strengths") or [e.get("strength", 1.0)] * count)
        if e["kind"] != "scalar" or e.get("value", "aligned") != "aligned" or e.get("value_noise", 0.0):
            scalar = False
    tok, dyn = data["tokens"], data["dynamics"]
    return {"n": tok["n"], "d": tok["d"], "H": H, "init": tok.get("init", "random"),
            "gamma": tok.get("gamma"), "rule": dyn["rule"], "geometry": dyn["geometry"],
            "dt": dyn["dt"], "steps": dyn["steps"], "head_kinds": [e["kind"] for e in entries],
            "scalar_strengths": strengths if scalar else None, "replicas": size,
            "threshold": record["threshold"], "clustering_threshold": record["clustering_time"]}


def _columns(axes, record, stops: bool = False) -> list[str]:
    cols = ["unit", "point"]
    cols += [k for k, _ in axes if k not in FIXED_COLUMNS]
    cols += list(FIXED_COLUMNS) + ["step", "time"] + list(record["observables"])
    if record["min_cosine"]:
        cols.append("min_cosine")
    if record["clusters"]:
        cols.append("clusters")
    if record["clustering_time"] is not None:
        cols.append("clustering_time")
    if stops:   # where and why a stop rule ended the replica's unit (nan and "" where none did)
        cols += ["stop_time", "stop_reason"]
    return cols


def _valid_observables(H: int, radius: bool = False) -> list[str]:
    """``radius``: the placement keeps each token's radius as state (pre/peri-LN)."""
    from particles.observables import RADIUS_COLUMNS, columns
    cols = columns(H, entropy_rate=True, clusters=False, ensemble=False) + list(RADIUS_COLUMNS) * radius
    return [c for c in cols if c not in ("step", "time")]
