"""Stop rules: end a run where the flow has stopped, not at a fixed time.

A rule is a drive writer (``particles.drive``) that sees the logged rows (and, for the cluster
rule, the tokens) on the log's grid; the drive loop asks it at each of its grid states, after
handing out every row observed before, whether the run should end there (``end_reason``). The
state it ends at is then the run's end: every writer's end trigger fires there (the log's last
row, the film's last frame, the final checkpoint). Each rule holds over a time window:

    kinetic        the kinetic energy (the log's ``kinetic``) at most this, over ``window``
    energy_rate    |dE/dt| (the sum of the per-head ``energy_rate_h*``) at most this, over ``window``
    clusters       the cluster count (cos > ``cluster_threshold``) unchanged for this long

For an ensemble every replica must satisfy the rule. The decision at a state uses the rows
before it only, so it is the same whatever else the loop does, and ``state``/``restore`` carry
it through a checkpoint: an interrupted run stops where the uninterrupted one did.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .clusters import cluster_stats
from .drive import Every, Writer
from .errors import ParticlesUserError


@dataclass(frozen=True)
class StopRules:
    """Thresholds (None: that rule is off) and the window the row rules must hold over."""

    kinetic: float | None = None
    energy_rate: float | None = None
    clusters: float | None = None        # the time the count must stay unchanged
    window: float = 1.0
    cluster_threshold: float = 0.999

    def __post_init__(self):
        for key in ("kinetic", "energy_rate", "clusters"):
            value = getattr(self, key)
            if value is not None and not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
                raise ParticlesUserError(f"stop rule {key} must be a finite number > 0, got {value!r}")
        if not (isinstance(self.window, (int, float)) and self.window >= 0 and math.isfinite(self.window)):
            raise ParticlesUserError(f"stop rule window must be a finite number >= 0, got {self.window!r}")

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.kinetic, self.energy_rate, self.clusters))


class StopWriter(Writer):
    """The rules as a drive writer on the grid Every(``every``) (the log's)."""

    ends_run = True

    def __init__(self, rules: StopRules, every: int, n_heads: int):
        self.rules, self.n_heads = rules, n_heads
        self.trigger = self.observe = Every(int(every))
        self.needs = frozenset({"tokens"}) if rules.clusters is not None else frozenset()
        self.dt = 1.0
        # per rule: the time since which it has held at every logged state (None: not now)
        self.since = {"kinetic": None, "energy_rate": None}
        self.last_time = None          # of the last row seen
        self.counts = None             # cluster counts per replica at the last check
        self.counts_since = None       # the time they were first seen unchanged
        self.counts_time = None
        self._pending_step = None      # the rows of one step arrive per replica
        self._pending_ok = {}

    def start(self, sim, step, end):
        self.dt = sim.dt

    # -- rows ----------------------------------------------------------------------------------
    def on_rows(self, rows):
        for row in rows:
            if row["step"] != self._pending_step:
                self._close_step()
                self._pending_step, self._pending_time = row["step"], row["time"]
                self._pending_ok = {"kinetic": True, "energy_rate": True}
            ok = self._pending_ok
            if self.rules.kinetic is not None:
                ok["kinetic"] &= bool(row["kinetic"] <= self.rules.kinetic)
            if self.rules.energy_rate is not None:
                rate = sum(row.get(f"energy_rate_h{h}", math.nan) for h in range(self.n_heads))
                ok["energy_rate"] &= bool(abs(rate) <= self.rules.energy_rate)
        self._close_step()

    def _close_step(self):
        if self._pending_step is None:
            return
        t = self._pending_time
        for key, ok in self._pending_ok.items():
            if not ok:
                self.since[key] = None
            elif self.since[key] is None:
                self.since[key] = t
        self.last_time = t
        self._pending_step = None

    # -- tokens (the cluster rule) -------------------------------------------------------------
    def on_state(self, state):
        if self.rules.clusters is None or state.tokens is None:
            return
        x = np.asarray(state.tokens, dtype=np.float64)
        _, counts = cluster_stats(x, self.rules.cluster_threshold)
        counts = [int(c) for c in counts]
        if counts != self.counts:
            self.counts, self.counts_since = counts, state.time
        self.counts_time = state.time

    # -- the decision --------------------------------------------------------------------------
    def end_reason(self, step: int) -> str | None:
        """Why the run ends at state ``step`` (the rows and tokens before it decide), or None."""
        r = self.rules
        for key, limit, what in (("kinetic", r.kinetic, "kinetic energy"),
                                 ("energy_rate", r.energy_rate, "|dE/dt|")):
            since = self.since[key]
            if limit is not None and since is not None and self.last_time - since >= r.window:
                return (f"stop rule: {what} <= {limit:g} at every logged state from t = {since:g} "
                        f"to t = {self.last_time:g} (window {r.window:g})")
        if r.clusters is not None and self.counts is not None \
                and self.counts_time - self.counts_since >= r.clusters:
            shown = self.counts[0] if len(self.counts) == 1 else self.counts
            return (f"stop rule: cluster count {shown} (cos > {r.cluster_threshold:g}) unchanged from "
                    f"t = {self.counts_since:g} to t = {self.counts_time:g} (at least {r.clusters:g})")
        return None

    # -- checkpoints ---------------------------------------------------------------------------
    def state(self) -> dict:
        return {"since": dict(self.since), "last_time": self.last_time, "counts": self.counts,
                "counts_since": self.counts_since, "counts_time": self.counts_time}

    def restore(self, saved: dict) -> None:
        try:
            since = saved["since"]
            self.since = {k: (None if since[k] is None else float(since[k])) for k in self.since}
            self.last_time = None if saved["last_time"] is None else float(saved["last_time"])
            self.counts = None if saved["counts"] is None else [int(c) for c in saved["counts"]]
            self.counts_since = None if saved["counts_since"] is None else float(saved["counts_since"])
            self.counts_time = None if saved["counts_time"] is None else float(saved["counts_time"])
        except (KeyError, TypeError, ValueError) as err:
            raise ParticlesUserError(f"stop rule state is malformed ({type(err).__name__}: {err})") from None


__all__ = ["StopRules", "StopWriter"]
