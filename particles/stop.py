"""Stop rules: end a run where the flow has stopped, not at a fixed time.

A rule is a drive writer (``particles.drive``) that sees the logged rows (and, for the cluster
rule, the tokens) on the log's grid; the drive loop asks it at each of its grid states, after
handing out every row observed before, whether the run should end there (``end_reason``). The
state it ends at is then the run's end: every writer's end trigger fires there (the log's last
row, the film's last frame, the final checkpoint). Each rule holds over a time window:

    kinetic        the kinetic energy (the log's ``kinetic``) at most this, over ``window``
    energy_rate    |dE/dt| (the sum of the per-head ``energy_rate_h*``) at most this, over ``window``
    clusters       the cluster count (cos > ``cluster_threshold``) unchanged for this long
    attention      the attention map's change rate (``attention_change``: the largest
                   total-variation change of an attention row between consecutive logged
                   states over the time between them) at most this, over ``window``

For an ensemble every replica must satisfy the rule. The decision at a state uses the rows
before it only, so it is the same whatever else the loop does, and ``state``/``restore`` carry
it through a checkpoint (the attention rule's the previous logged tokens too): an interrupted
run stops where the uninterrupted one did.

The attention rows are computed here in float64 NumPy at the logged states only (not the hot
path), a chunk of rows at a time: memory O(n x chunk), never the n x n map.
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
    attention: float | None = None       # the attention map's change per unit time

    def __post_init__(self):
        for key in ("kinetic", "energy_rate", "clusters", "attention"):
            value = getattr(self, key)
            if value is not None and not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
                raise ParticlesUserError(f"stop rule {key} must be a finite number > 0, got {value!r}")
        if not (isinstance(self.window, (int, float)) and self.window >= 0 and math.isfinite(self.window)):
            raise ParticlesUserError(f"stop rule window must be a finite number >= 0, got {self.window!r}")

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.kinetic, self.energy_rate, self.clusters, self.attention))

    @classmethod
    def from_dynamics(cls, dynamics: dict, cluster_threshold: float) -> "StopRules":
        """The rules a scene's [dynamics] table names (``stop_kinetic``, ``stop_energy_rate``,
        ``stop_clusters``, ``stop_attention``, ``stop_window``)."""
        return cls(kinetic=dynamics.get("stop_kinetic"), energy_rate=dynamics.get("stop_energy_rate"),
                   clusters=dynamics.get("stop_clusters"), attention=dynamics.get("stop_attention"),
                   window=dynamics.get("stop_window", 1.0), cluster_threshold=float(cluster_threshold))


# ------------------------------------------------------------------ the attention map's change

ATTENTION_RULES = ("exp", "softmax", "relu")   # the rules whose rows are computed here
CHUNK_ENTRIES = 1 << 20                         # rows x keys of one chunk (8 MiB of float64)


def attention_refusal(sim) -> str | None:
    """Why the attention rule cannot watch ``sim`` (a rule whose rows are not computed here),
    or None."""
    for layer, attention in enumerate(sim.layer_attention):
        for h, a in enumerate(attention):
            rule = a.rule
            if rule.name not in ATTENTION_RULES or rule.source != "built-in" or rule.positional:
                where = f"layer {layer} " if len(sim.layer_attention) > 1 else ""
                return (f"the attention rows are computed for the built-in rules "
                        f"{', '.join(ATTENTION_RULES)}; {where}head {h} has rule {rule.name!r}")
    return None


def _projections(y: np.ndarray, head, attention):
    """(q, k) of every token of one replica's directions y (n, d), with the head's biases and
    rotary positions: n x rank each."""
    q = y @ head.query.T + (0.0 if head.query_bias is None else head.query_bias)
    k = y @ head.key.T + (0.0 if head.key_bias is None else head.key_bias)
    if attention.rotary is not None:
        q, k = attention.rotary.apply(q), attention.rotary.apply(k)
    return q, k


def _rows(q, k, rows: slice, beta: float, attention) -> np.ndarray:
    """w_ij for i in ``rows`` and every key j (docs/MODEL.md; masks, ALiBi, the rule's
    normalisation over the visible keys): (rows, n) float64."""
    n = k.shape[0]
    z = beta * (q[rows] @ k.T)
    if attention.masked or attention.alibi:
        offset = np.arange(n)[None, :] - np.arange(rows.start, rows.stop)[:, None]   # j - i
        below, above = attention.band
        visible = (offset >= -below) & (offset <= above)
        count = visible.sum(axis=1, keepdims=True)
        if attention.alibi:
            z = z - attention.alibi * np.abs(offset)
        z = np.where(visible, z, -np.inf)                  # weight 0 where hidden
    else:
        count = n
    name = attention.rule.name
    if name == "relu":
        return np.maximum(z, 0.0) / count
    top = z.max(axis=1, keepdims=True)
    e = np.exp(z - top)
    if name == "softmax":
        return e / e.sum(axis=1, keepdims=True)
    return e * np.exp(top - np.log(count))                 # exp: e^z / count


def attention_change(before: np.ndarray, after: np.ndarray, layer_before, layer_after, betas,
                     normalised: bool, chunk: int | None = None) -> float:
    """max over replicas r, heads h and rows i of (1/2) sum_j |w^h_ij(after) - w^h_ij(before)|:
    the largest total-variation change of an attention row between two states (R, n, d),
    each under its own layer ((heads, attentions) in force there). ``betas`` (R,): each
    replica's beta (a head's own beta replaces it); ``normalised``: the weights are those of
    the directions x_i / |x_i| (every placement but 'post'). Rows go ``chunk`` at a time."""
    before = np.asarray(before, dtype=np.float64)
    after = np.asarray(after, dtype=np.float64)
    if normalised:
        before = before / np.linalg.norm(before, axis=-1, keepdims=True)
        after = after / np.linalg.norm(after, axis=-1, keepdims=True)
    n = after.shape[-2]
    chunk = max(1, CHUNK_ENTRIES // n) if chunk is None else int(chunk)
    worst = 0.0
    for r in range(after.shape[0]):
        for (hb, ab), (ha, aa) in zip(zip(*layer_before), zip(*layer_after)):
            qb, kb = _projections(before[r], hb, ab)
            qa, ka = _projections(after[r], ha, aa)
            beta_b = float(betas[r]) if ab.beta is None else ab.beta
            beta_a = float(betas[r]) if aa.beta is None else aa.beta
            for lo in range(0, n, chunk):
                rows = slice(lo, min(n, lo + chunk))
                change = np.abs(_rows(qa, ka, rows, beta_a, aa) - _rows(qb, kb, rows, beta_b, ab))
                tv = 0.5 * change.sum(axis=1).max()
                if math.isnan(tv):     # an overflowing weight: never "still"
                    return math.nan
                worst = max(worst, float(tv))
    return worst


class StopWriter(Writer):
    """The rules as a drive writer on the grid Every(``every``) (the log's)."""

    ends_run = True

    def __init__(self, rules: StopRules, every: int, n_heads: int):
        self.rules, self.n_heads = rules, n_heads
        self.trigger = self.observe = Every(int(every))
        self.needs = frozenset({"tokens"}) if (rules.clusters is not None or rules.attention is not None) \
            else frozenset()
        self.dt = 1.0
        self.sim = None
        # the attention rule: the time since which it has held, the last rate and its time,
        # and the previous logged state (step, time, tokens float64 (R, n, d))
        self.attention_since = self.attention_time = self.attention_rate = None
        self.previous = None
        # per rule: the time since which it has held at every logged state (None: not now)
        self.since = {"kinetic": None, "energy_rate": None}
        self.last_time = None          # of the last row seen
        self.counts = None             # cluster counts per replica at the last check
        self.counts_since = None       # the time they were first seen unchanged
        self.counts_time = None
        self._pending_step = None      # the rows of one step arrive per replica
        self._pending_ok = {}

    def start(self, sim, step, end):
        self.dt, self.sim = sim.dt, sim
        if self.rules.attention is not None:
            why = attention_refusal(sim)
            if why:
                raise ParticlesUserError(f"stop rule attention: {why}")

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
        if state.tokens is None:
            return
        if self.rules.attention is not None:
            self._attention(state)
        if self.rules.clusters is None:
            return
        x = np.asarray(state.tokens, dtype=np.float64)
        _, counts = cluster_stats(x, self.rules.cluster_threshold)
        counts = [int(c) for c in counts]
        if counts != self.counts:
            self.counts, self.counts_since = counts, state.time
        self.counts_time = state.time

    def _attention(self, state):
        """The attention map's change from the previous logged state to this one, per unit time."""
        sim = self.sim
        x = np.array(state.tokens, dtype=np.float64)
        if self.previous is not None:
            step0, time0, x0 = self.previous
            layer = sim.schedule.layer_at
            rate = attention_change(
                x0, x, (sim.layer_heads[layer(step0)], sim.layer_attention[layer(step0)]),
                (sim.layer_heads[layer(state.step)], sim.layer_attention[layer(state.step)]),
                sim.betas, sim.normalisation != "post") / (state.time - time0)
            if rate <= self.rules.attention:
                if self.attention_since is None:
                    self.attention_since = state.time
            else:
                self.attention_since = None
            self.attention_time, self.attention_rate = state.time, rate
        self.previous = (state.step, state.time, x)

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
        since = self.attention_since
        if r.attention is not None and since is not None and self.attention_time - since >= r.window:
            return (f"stop rule: attention change <= {r.attention:g} per unit time at every logged "
                    f"state from t = {since:g} to t = {self.attention_time:g} (window {r.window:g})")
        if r.clusters is not None and self.counts is not None \
                and self.counts_time - self.counts_since >= r.clusters:
            shown = self.counts[0] if len(self.counts) == 1 else self.counts
            return (f"stop rule: cluster count {shown} (cos > {r.cluster_threshold:g}) unchanged from "
                    f"t = {self.counts_since:g} to t = {self.counts_time:g} (at least {r.clusters:g})")
        return None

    # -- checkpoints ---------------------------------------------------------------------------
    def state(self) -> dict:
        saved = {"since": dict(self.since), "last_time": self.last_time, "counts": self.counts,
                 "counts_since": self.counts_since, "counts_time": self.counts_time}
        if self.rules.attention is not None:   # the previous tokens exactly (float64 repr)
            step0, time0, x0 = self.previous if self.previous is not None else (None, None, None)
            saved["attention"] = {"since": self.attention_since, "time": self.attention_time,
                                  "rate": self.attention_rate, "step": step0, "t": time0,
                                  "tokens": None if x0 is None else x0.tolist()}
        return saved

    def restore(self, saved: dict) -> None:
        try:
            since = saved["since"]
            self.since = {k: (None if since[k] is None else float(since[k])) for k in self.since}
            self.last_time = None if saved["last_time"] is None else float(saved["last_time"])
            self.counts = None if saved["counts"] is None else [int(c) for c in saved["counts"]]
            self.counts_since = None if saved["counts_since"] is None else float(saved["counts_since"])
            self.counts_time = None if saved["counts_time"] is None else float(saved["counts_time"])
            if self.rules.attention is not None:
                att = saved["attention"]
                opt = lambda v: None if v is None else float(v)   # noqa: E731
                self.attention_since, self.attention_time = opt(att["since"]), opt(att["time"])
                self.attention_rate = opt(att["rate"])
                self.previous = None if att["tokens"] is None else (
                    int(att["step"]), float(att["t"]), np.array(att["tokens"], dtype=np.float64))
                if self.previous is not None and self.previous[2].ndim != 3:
                    raise ValueError(f"attention tokens of shape {self.previous[2].shape}, not (R, n, d)")
        except (KeyError, TypeError, ValueError) as err:
            raise ParticlesUserError(f"stop rule state is malformed ({type(err).__name__}: {err})") from None


__all__ = ["StopRules", "StopWriter", "attention_change", "attention_refusal"]
