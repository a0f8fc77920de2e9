"""A run's headline figures, updated row by row so a long run keeps no rows in memory."""
from __future__ import annotations

import math

from particles.drive import Every, Writer


class Summary(Writer):
    """Energy first/last, final eps, max radial dominance and per-head monotonicity.

    A drive writer: it observes the log's rows (``observe = Every(log_every)``).
    """

    def __init__(self, n_heads: int, tolerance: float, log_every: int = 1,
                 energy_note: str | None = None):
        self.n_heads, self.tol = n_heads, tolerance
        self.energy_note = energy_note
        self.observe = Every(log_every)
        self.first_energy = self.last_energy = None
        self.final_eps = math.nan
        self.max_dominance = [0.0] * n_heads
        self.monotone = [True] * n_heads
        self._prev = {}

    def on_rows(self, rows: list[dict]) -> None:
        for row in rows:
            self.add(row)

    def add(self, row: dict) -> None:
        if row.get("replica", 0) == 0:
            if self.first_energy is None:
                self.first_energy = row["energy"]
            self.last_energy = row["energy"]
            self.final_eps = row["eps"]
        for h in range(self.n_heads):
            key = (row.get("replica", 0), h)
            e = row[f"energy_h{h}"]
            if math.isnan(e):
                self.monotone[h] = None  # the rule has no potential: no energy to judge
            prev = self._prev.get(key)
            if self.monotone[h] and prev is not None and e < prev - self.tol * max(abs(prev), 1e-300):
                self.monotone[h] = False
            self._prev[key] = e
            self.max_dominance[h] = max(self.max_dominance[h], row[f"radial_dominance_h{h}"])

    def state(self) -> dict:
        """Everything needed to continue exactly (JSON: floats round-trip by repr)."""
        return {"first_energy": self.first_energy, "last_energy": self.last_energy,
                "final_eps": self.final_eps, "max_dominance": list(self.max_dominance),
                "monotone": list(self.monotone),
                "previous": [[b, h, e] for (b, h), e in sorted(self._prev.items())]}

    def restore(self, saved: dict) -> None:
        """Continue the headline figures of a checkpointed run (``state()`` of that run)."""
        self.first_energy = saved["first_energy"]
        self.last_energy = saved["last_energy"]
        self.final_eps = saved["final_eps"]
        self.max_dominance = [float(v) for v in saved["max_dominance"]]
        self.monotone = list(saved["monotone"])
        self._prev = {(int(b), int(h)): e for b, h, e in saved["previous"]}

    def as_dict(self) -> dict:
        return {
            "final_eps": self.final_eps,
            "energy_first": self.first_energy,
            "energy_last": self.last_energy,
            "energy_change": (self.last_energy - self.first_energy)
            if self.first_energy is not None else math.nan,
            "max_radial_dominance": self.max_dominance,
            "condition8_held": all(d <= 1.0 for d in self.max_dominance),
            "per_head_energy_monotone": self.monotone,
            **({"energy_note": self.energy_note} if self.energy_note else {}),
        }


def energy_note(sim) -> str | None:
    """Why the energy columns are NaN, in one sentence (None when every head has an energy)."""
    if sim.scheduled:
        return ("energy columns are NaN: a layer schedule changes the heads in time, so no single "
                "potential exists (docs/LOG.md); radial shadows, entropies, clusters and T/C/R are logged")
    reasons = []
    for h, a in enumerate(sim.attention):
        if a.has_potential:
            continue
        why = [w for w, on in (("a " + a.mask + " mask", a.masked), ("an ALiBi bias", a.alibi > 0),
                               ("a position-aware rule", a.rule.positional)) if on]
        reasons.append(f"head {h}: " + (", ".join(why) if why else f"rule {a.rule.name!r} has no potential"))
    if not reasons:
        return None
    return ("energy is NaN where no potential exists (" + "; ".join(reasons) + "; docs/LOG.md); "
            "radial shadows, entropies, clusters and T/C/R are logged")
