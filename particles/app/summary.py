"""A run's headline figures, updated row by row so a long run keeps no rows in memory."""
from __future__ import annotations

import math

from particles.drive import Every, Writer
from particles.theory import c_star


# Condition 8 is judged while a head's tangent power T_h is at least this fraction of its value at
# the first logged state: once tokens merge, T_h -> 0 and rho_h = R_h / T_h grows without meaning.
TANGENT_FLOOR = 1e-6


class Summary(Writer):
    """Energy first/last, final eps, Condition 8 per head and per-head monotonicity.

    Condition 8 (rho_h <= 1) is reported as the theory speaks of it: rho_h at the first logged
    state, the first time it exceeds 1 and the fraction of logged states in which it held, counted
    while T_h >= ``TANGENT_FLOOR`` x T_h(first state); "n/a" with one head or in flat space.
    A drive writer: it observes the log's rows (``observe = Every(log_every)``).
    """

    def __init__(self, n_heads: int, tolerance: float, log_every: int = 1,
                 energy_note: str | None = None, geometry: str = "sphere"):
        self.n_heads, self.tol = n_heads, tolerance
        self.energy_note = energy_note
        self.geometry = geometry
        self.observe = Every(log_every)
        self.first_energy = self.last_energy = None
        self.final_eps = math.nan
        self.max_dominance = [0.0] * n_heads
        self.monotone = [True] * n_heads
        self._prev = {}
        self._c8 = _fresh_condition8(n_heads)

    def on_rows(self, rows: list[dict]) -> None:
        for row in rows:
            self.add(row)

    def add(self, row: dict) -> None:
        if row.get("replica", 0) == 0:
            if self.first_energy is None:
                self.first_energy = row["energy"]
            self.last_energy = row["energy"]
            self.final_eps = row["eps"]
        c8 = self._c8
        if c8["first_step"] is None:
            c8["first_step"] = int(row["step"])
        for h in range(self.n_heads):
            key = (row.get("replica", 0), h)
            e = row[f"energy_h{h}"]
            if math.isnan(e):
                self.monotone[h] = None  # the rule has no potential: no energy to judge
            prev = self._prev.get(key)
            if self.monotone[h] and prev is not None and e < prev - self.tol * max(abs(prev), 1e-300):
                self.monotone[h] = False
            self._prev[key] = e
            rho = row.get(f"radial_dominance_h{h}", math.nan)
            self.max_dominance[h] = max(self.max_dominance[h], rho)
            self._condition8_row(c8, row, h, key, rho)

    def _condition8_row(self, c8: dict, row: dict, h: int, key, rho: float) -> None:
        power = row.get(f"tangent_power_h{h}", math.nan)
        tag = f"{key[0]}/{h}"
        if int(row["step"]) == c8["first_step"]:
            c8["rho_t0"][h] = max(c8["rho_t0"][h], rho) if not math.isnan(c8["rho_t0"][h]) else rho
            c8["power_t0"][tag] = power
        if tag in c8["spent"]:
            return
        p0 = c8["power_t0"].get(tag, math.nan)
        if not (math.isnan(power) or math.isnan(p0)) and power < TANGENT_FLOOR * p0:
            c8["spent"][tag] = float(row["time"])   # below the floor: rho_h says nothing from here
            return
        if math.isnan(rho):
            return
        c8["counted"][h] += 1
        if rho <= 1.0:
            c8["held"][h] += 1
        elif c8["first_exceed"][h] is None:
            c8["first_exceed"][h] = float(row["time"])

    def condition8(self) -> dict:
        """Condition 8 per head: ``applies`` (False with one head or in flat space, ``why_not``
        says which), ``rho_t0``, ``first_exceed_time`` (None where it never exceeded 1),
        ``held_fraction`` and ``floor_time`` (when T_h fell below the floor, None if never)."""
        c8 = self._c8
        why = "one head" if self.n_heads == 1 else "flat space" if self.geometry == "flat" else None
        floor_time = []
        for h in range(self.n_heads):
            times = [t for tag, t in c8["spent"].items() if tag.endswith(f"/{h}")]
            floor_time.append(min(times) if times else None)
        return {"applies": why is None, "why_not": why, "tangent_floor": TANGENT_FLOOR,
                "rho_t0": list(c8["rho_t0"]), "first_exceed_time": list(c8["first_exceed"]),
                "held_fraction": [held / counted if counted else math.nan
                                  for held, counted in zip(c8["held"], c8["counted"])],
                "floor_time": floor_time}

    def state(self) -> dict:
        """Everything needed to continue exactly (JSON: floats round-trip by repr)."""
        return {"first_energy": self.first_energy, "last_energy": self.last_energy,
                "final_eps": self.final_eps, "max_dominance": list(self.max_dominance),
                "monotone": list(self.monotone),
                "previous": [[b, h, e] for (b, h), e in sorted(self._prev.items())],
                "condition8": {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
                               for k, v in self._c8.items()}}

    def restore(self, saved: dict) -> None:
        """Continue the headline figures of a checkpointed run (``state()`` of that run)."""
        self.first_energy = saved["first_energy"]
        self.last_energy = saved["last_energy"]
        self.final_eps = saved["final_eps"]
        self.max_dominance = [float(v) for v in saved["max_dominance"]]
        self.monotone = list(saved["monotone"])
        self._prev = {(int(b), int(h)): e for b, h, e in saved["previous"]}
        c8 = saved.get("condition8")
        fresh = _fresh_condition8(self.n_heads)
        if isinstance(c8, dict) and set(c8) == set(fresh) \
                and all(len(c8[k]) == self.n_heads for k in ("rho_t0", "first_exceed", "counted", "held")):
            self._c8 = {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
                        for k, v in c8.items()}
        else:   # a checkpoint from before these figures: judged from the resumed rows on
            self._c8 = fresh

    def as_dict(self) -> dict:
        c8 = self.condition8()
        held = None if not c8["applies"] else all(
            f is None for f in c8["first_exceed_time"])
        return {
            "final_eps": self.final_eps,
            "energy_first": self.first_energy,
            "energy_last": self.last_energy,
            "energy_change": (self.last_energy - self.first_energy)
            if self.first_energy is not None else math.nan,
            "max_radial_dominance": self.max_dominance,
            "condition8_held": held,
            "condition8": c8,
            "per_head_energy_monotone": self.monotone,
            **({"energy_note": self.energy_note} if self.energy_note else {}),
        }


def _fresh_condition8(n_heads: int) -> dict:
    return {"first_step": None, "rho_t0": [math.nan] * n_heads, "first_exceed": [None] * n_heads,
            "counted": [0] * n_heads, "held": [0] * n_heads, "power_t0": {}, "spent": {}}


def condition8_lines(s: dict) -> list[str]:
    """The summary's Condition 8 lines (``s``: ``Summary.as_dict()``, as run.json records it)."""
    c8 = s.get("condition8")
    if not c8:
        return []
    head = "Condition 8 (radial dominance rho_h <= 1):"
    if not c8["applies"]:
        return [f"{head} n/a ({c8['why_not']})"]
    n_heads = len(c8["rho_t0"])
    cstar = c_star(n_heads)
    # rho_h(0) = c*(H) exactly at beta* from orthonormal tokens with identical scalar heads
    # ((H-1) c*^2 / (1 - c*^2) = c*): the side of c*(H) is the side of Theorem 19's threshold
    lines = [f"{head} per head, judged while T_h >= {c8['tangent_floor']:g} x T_h(t=0); "
             f"c*({n_heads}) = {cstar:.3f} is rho's value at beta* from orthonormal tokens (Theorem 19)"]
    for h, (r0, first, frac, floor) in enumerate(zip(c8["rho_t0"], c8["first_exceed_time"],
                                                    c8["held_fraction"], c8["floor_time"])):
        side = "" if math.isnan(r0) else f", {'below' if r0 < cstar else 'above'} c*"
        text = f"  h{h}: rho at t = 0 {r0:.3g} ({'holds' if r0 <= 1 else 'fails'}{side}); "
        text += "never exceeds 1" if first is None else f"first exceeds 1 at t = {first:g}"
        text += "; held in " + ("no judged state" if math.isnan(frac) else f"{100 * frac:.0f}% of judged states")
        if floor is not None:
            text += f" (T_h below the floor from t = {floor:g})"
        lines.append(text)
    return lines


def energy_note(sim) -> str | None:
    """Why the energy columns are NaN, in one sentence (None when every head has an energy)."""
    if sim.scheduled:
        return ("energy columns are NaN: a layer schedule changes the heads in time, so no single "
                "potential exists (docs/LOG.md); radial shadows, entropies, clusters and T/C/R are logged")
    by_reason: dict[str, list[int]] = {}
    for h, a in enumerate(sim.attention):
        biased = sim.heads[h].has_biases
        if a.has_potential and not biased:
            continue
        why = [w for w, on in (("a " + a.mask + " mask", a.masked), ("an ALiBi bias", a.alibi > 0),
                               ("rotary positions", a.rotary is not None),
                               ("query/key/value biases", biased),
                               ("a position-aware rule", a.rule.positional)) if on]
        by_reason.setdefault(", ".join(why) if why else f"rule {a.rule.name!r} has no potential", []).append(h)
    if not by_reason:
        return None
    everyone = len(by_reason) == 1 and len(next(iter(by_reason.values()))) == sim.n_heads > 1
    reasons = [("every head" if everyone else _heads(hs)) + ": " + why for why, hs in by_reason.items()]
    return ("energy is NaN where no potential exists (" + "; ".join(reasons) + "; docs/LOG.md); "
            "radial shadows, entropies, clusters and T/C/R are logged")


def _heads(hs: list[int]) -> str:
    return f"head {hs[0]}" if len(hs) == 1 else "heads " + ", ".join(str(h) for h in hs)


def frames_of(steps: int, frame_every: int) -> int:
    """Frames of a video drawn every ``frame_every`` steps and at the end, from step 0."""
    return steps // frame_every + 1 + (1 if steps % frame_every else 0)


def frame_note(frames: int, steps: int, frame_every: int, log_every: int) -> str:
    """What ``[render] frames`` became: frames fall on logged steps (the panels draw log rows)."""
    got = frames_of(steps, frame_every)
    return (f"note: [render] frames = {frames} gives {got} frames here (the initial state, then one every "
            f"{frame_every} steps of {steps}: a frame falls on a logged step, a multiple of [log] every = "
            f"{log_every}); set frames to a divisor of {steps // log_every} for an exact count")


def scene_title(scene: dict, fallback_name: str = "run") -> str | None:
    """A figure's title from a scene's data (a run's scene.toml as a dict): 'quickstart    n = 64,
    d = 3, H = 2, rule = softmax, β = 4'; heads with their own rule, mask or beta are named
    ('h1 relu'), and a layer schedule names every layer's rule and start ('layer 1 from t = 4:
    relu'). None where the data is not a scene's (a figure then goes without a title)."""
    try:
        tok, dyn = scene.get("tokens", {}), scene.get("dynamics", {})
        parts = [f"n = {tok['n']}", f"d = {tok['d']}", f"H = {_head_count(scene.get('heads'))}"]
        layers = scene.get("layers") or []
        base = _layer_rule(scene.get("heads"), dyn.get("rule", "exp"), dyn.get("mask", "none"), dyn)
        parts.append(("layer 0: " if layers else "rule = ") + base)
        for number, layer in enumerate(layers, start=1):
            start = layer.get("start", number * dyn.get("layer_every", math.nan))
            rule = _layer_rule(layer.get("heads", scene.get("heads")), layer.get("rule", dyn.get("rule", "exp")),
                               layer.get("mask", dyn.get("mask", "none")), layer)
            parts.append(f"layer {number} from t = {start:g}: {rule}")
        betas = dyn.get("betas")
        parts.append("\u03b2 = " + (", ".join(f"{b:g}" for b in betas) if betas else f"{dyn.get('beta', 1.0):g}"))
        if dyn.get("geometry") == "flat":
            parts.append("flat")
        return f"{scene.get('name', fallback_name)}    " + ", ".join(parts)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def _head_entries(heads) -> list[dict]:
    """A [heads] table or a [[heads]] array as a list of tables (none: the default scalar head)."""
    if isinstance(heads, dict):
        return [heads]
    return list(heads) if isinstance(heads, list) else [{}]


def _head_count(heads) -> int:
    return sum(int(e.get("count", len(e.get("strengths", ())) or 1)) for e in _head_entries(heads))


def _layer_rule(heads, rule: str, mask: str, options: dict) -> str:
    """'softmax', 'softmax causal, ALiBi', 'exp (h1 relu)': a layer's rule and mask, and the heads'
    own where they differ."""
    text = rule + ("" if mask in (None, "none") else f" {mask}") + (", ALiBi" if options.get("alibi") else "")
    own, h = [], 0
    for entry in _head_entries(heads):
        count = int(entry.get("count", len(entry.get("strengths", ())) or 1))
        bits = [str(entry[k]) for k in ("rule", "mask") if entry.get(k) not in (None, rule, mask)]
        if entry.get("beta") is not None:
            bits.append(f"\u03b2 = {entry['beta']:g}")
        if bits:
            own.append(("h" + (str(h) if count == 1 else f"{h}-{h + count - 1}")) + " " + " ".join(bits))
        h += count
    return text + (f" ({'; '.join(own)})" if own else "")
