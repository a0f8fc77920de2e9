"""One drive loop: advance a Simulation in one call up to the next trigger, serve the writers there.

A *writer* declares when it is served and what it needs (in the manner of HOOMD's writers
with triggers, diffrax's ``SaveAt``):

    trigger   the states it sees: ``Every(k)``, ``At(steps)``, ``AT_END``, or ``a | b``
    observe   the states whose observable rows (log columns) it receives, in ``on_rows``
    needs     {"tokens", "per_token"}: what ``on_state`` reads from the ``State``

``drive(sim, writers, end)`` runs the simulation from its current step to ``end``:

    at each stop s (a step where some writer fires, or a finiteness check is due):
        writers with ``flush_first`` (checkpoints): every pending row is handed out and every
            writer flushed first, so what they save is everything up to state s
        tokens of state s are read if a writer needs them
        observables of state s: fused into the first stage of the step from s when the
            observation cadence (the gcd of the writers' ``Every`` observe triggers) hits s,
            otherwise (``At`` steps, the final state) one extra evaluation, ``sim.observe()``
        the writers firing at s get ``on_state(State)``
    then one ``sim.advance(k, observe_every)`` up to the next stop.

Row k of every log is the state after k steps. The arithmetic does not depend on where the
loop stops: a step is the same kernels whether advanced alone or in a block, so any set of
writers gives the same numbers bitwise. With adaptive steps (``particles.adaptive``) the
stops, and the observed steps, are where steps are clipped: the numbers are then those of
the same stops (a resumed run stops where the uninterrupted one did: every stop is a
function of the step alone), equal to the tolerance otherwise.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from .clock import step_time

NEVER_STEP = 1 << 62


class Trigger:
    """A set of steps; ``end`` is the run's final step."""

    def hits(self, step: int, end: int) -> bool:
        raise NotImplementedError

    def next_after(self, step: int, end: int) -> int:
        """The smallest step > ``step`` (and <= end) this trigger hits, or NEVER_STEP."""
        raise NotImplementedError

    def every_periods(self) -> list[int]:
        return []

    def unfused(self) -> "Trigger":
        """The part of this trigger an observation cannot be fused into a step for."""
        return self

    def __or__(self, other: "Trigger") -> "Trigger":
        return AnyOf((self, other))


@dataclass(frozen=True)
class Every(Trigger):
    """Steps 0, k, 2k, ... (none when k <= 0)."""

    k: int

    def hits(self, step, end):
        return self.k > 0 and step % self.k == 0

    def next_after(self, step, end):
        if self.k <= 0:
            return NEVER_STEP
        s = (step // self.k + 1) * self.k
        return s if s <= end else NEVER_STEP

    def every_periods(self):
        return [self.k] if self.k > 0 else []

    def unfused(self):
        return NEVER


@dataclass(frozen=True)
class At(Trigger):
    """The given steps."""

    steps: frozenset

    def __init__(self, steps):
        object.__setattr__(self, "steps", frozenset(int(s) for s in steps))

    def hits(self, step, end):
        return step in self.steps

    def next_after(self, step, end):
        later = [s for s in self.steps if step < s <= end]
        return min(later) if later else NEVER_STEP


@dataclass(frozen=True)
class _AtEnd(Trigger):
    def hits(self, step, end):
        return step == end

    def next_after(self, step, end):
        return end if step < end else NEVER_STEP


@dataclass(frozen=True)
class _Never(Trigger):
    def hits(self, step, end):
        return False

    def next_after(self, step, end):
        return NEVER_STEP


@dataclass(frozen=True)
class AnyOf(Trigger):
    parts: tuple

    def hits(self, step, end):
        return any(p.hits(step, end) for p in self.parts)

    def next_after(self, step, end):
        return min(p.next_after(step, end) for p in self.parts)

    def every_periods(self):
        return [k for p in self.parts for k in p.every_periods()]

    def unfused(self):
        return AnyOf(tuple(p.unfused() for p in self.parts))


AT_END = _AtEnd()
NEVER = _Never()


@dataclass
class State:
    """What a writer sees at state ``step``: tokens in the simulation's dtype, (R, n, d)."""

    step: int
    time: float
    end: int
    tokens: object = None
    per_token: dict | None = None


class Writer:
    """Base of every writer: override what you need; the defaults do nothing."""

    trigger: Trigger = NEVER
    observe: Trigger = NEVER
    needs: frozenset = frozenset()
    current_rows: bool = False   # every row up to this state is handed out before on_state
    flush_first: bool = False    # served first, after all rows are out and all writers flushed
    ends_run: bool = False       # asked ``end_reason`` at its trigger's states (particles.stop)

    def start(self, sim, step: int, end: int) -> None:
        pass

    def on_state(self, state: State) -> None:
        pass

    def on_rows(self, rows: list[dict]) -> None:
        pass

    def flush(self) -> None:
        pass

    def end_reason(self, step: int) -> str | None:
        """(``ends_run`` writers) Why the run should end at state ``step``, every row before
        it handed out; None to go on."""
        return None


class Stopped(Exception):
    """``should_stop`` said so at state ``step``: every writer has seen every state before it
    and none has seen it, so a checkpoint now continues exactly (``resume`` serves it)."""

    def __init__(self, step: int):
        super().__init__(f"stopped at step {step}")
        self.step = step


@dataclass
class Driver:
    """The loop, with its pending rows; ``drive`` is the one-call form."""

    sim: object
    writers: list
    end: int
    check_every: int = 0              # finiteness check at multiples (0: only at the end)
    max_chunk: int = 0                # at most this many steps per advance call (0: no limit)
    flush_seconds: float = math.inf   # hand out rows at least this often (wall clock)
    on_advance: object = None         # callable(steps_advanced, rows_handed_out_now)
    should_stop: object = None        # callable() -> bool, asked only at fully served states
    end_reason: str | None = field(default=None, init=False)   # why a writer ended the run early
    _last_flush: float = field(default=0.0, init=False)

    def __post_init__(self):
        self.writers = list(self.writers)
        periods = [k for w in self.writers for k in w.observe.every_periods()]
        self.observe_every = math.gcd(*periods) if periods else 0

    def drain(self) -> list[dict]:
        """Hand every observed row so far to the writers that observe its step."""
        rows = self.sim.take_rows()
        # a row whose kinetic is not finite is of a state whose tokens or velocity are not
        # (particles.observables makes its every column NaN)
        bad = next((k for k, r in enumerate(rows) if not math.isfinite(r["kinetic"])), None)
        if bad is not None:  # serve what came before, then stop: a NaN row is no result
            self._hand_out(rows[:bad])
            raise self.sim.velocity_blow_up(rows[bad])
        self._hand_out(rows)
        return rows

    def _check_finite(self) -> None:
        try:
            self.sim.check_finite()
        except FloatingPointError:  # BlowUpError: an earlier state's velocity may be the first
            self.drain()            # to fail (then that is raised), and valid rows are kept
            raise

    def _hand_out(self, rows: list[dict]) -> None:
        if rows:
            for w in self.writers:
                if w.observe is NEVER:
                    continue
                mine = [r for r in rows if w.observe.hits(r["step"], self.end)]
                if mine:
                    w.on_rows(mine)

    def run(self) -> None:
        sim, end = self.sim, int(self.end)
        start = sim.step_count
        for w in self.writers:
            w.start(sim, start, end)
        self._last_flush = time.perf_counter()
        while True:
            s = sim.step_count
            if s < end and self.should_stop is not None and self.should_stop():
                raise Stopped(s)   # every state before s is served; state s is not yet
            if s < end and self._ends_here(s):
                end = self.end = s   # the run's end now: every end trigger fires at s
            if s == end:
                self._check_finite()
            stepped = self._serve(s)
            if s >= end:
                break
            if not stepped:
                self._advance(self._next_stop(s) - s)
        self.drain()

    # -- internals ----------------------------------------------------------------------------
    def _ends_here(self, s: int) -> bool:
        """A writer that may end the run (a stop rule) says so at state s, from the rows
        before s (all handed out first, so the answer never depends on when rows drain)."""
        asked = [w for w in self.writers if w.ends_run and w.trigger.hits(s, self.end)]
        if not asked:
            return False
        self.drain()
        for w in asked:
            reason = w.end_reason(s)
            if reason:
                self.end_reason = reason
                return True
        return False

    def _next_stop(self, s: int) -> int:
        end = self.end
        nxt = min([w.trigger.next_after(s, end) for w in self.writers]
                  + [w.observe.unfused().next_after(s, end) for w in self.writers]
                  + [Every(self.check_every).next_after(s, end), AT_END.next_after(s, end)])
        if self.max_chunk > 0:   # on a fixed grid, so a resumed run stops where the first did
            nxt = min(nxt, (s // self.max_chunk + 1) * self.max_chunk)
        return min(nxt, end)

    def _advance(self, steps: int, drain: bool = True) -> None:
        sim = self.sim
        sim.advance(steps, observe_every=self.observe_every, check_finite=False)
        if self.check_every and sim.step_count % self.check_every == 0:
            self._check_finite()
        rows = []
        now = time.perf_counter()
        if drain and now - self._last_flush > self.flush_seconds:
            rows = self.drain()
            self._last_flush = now
        if self.on_advance is not None:
            self.on_advance(steps, rows)

    def _serve(self, s: int) -> bool:
        """Serve the writers at state s; True if serving it took the step from s."""
        sim, end = self.sim, self.end
        firing = [w for w in self.writers if w.trigger.hits(s, end)]
        first = [w for w in firing if w.flush_first]
        if first:
            self.drain()
            for w in self.writers:
                w.flush()
            for w in first:
                w.on_state(State(s, step_time(s, sim.dt), end))
        others = [w for w in firing if not w.flush_first]
        # an adaptive step (particles.adaptive) reuses an observation made before it instead
        fused = (self.observe_every > 0 and s % self.observe_every == 0 and s < end
                 and getattr(sim, "stepper", None) is None)
        wanted = any(w.observe.hits(s, end) for w in self.writers)
        if not others:
            if wanted and not fused:
                sim.observe()
            return False
        needs = set().union(*(w.needs for w in others))
        tokens = sim.native_tokens() if "tokens" in needs else None
        stepped = False
        if fused:          # observe state s inside the step from it, as a lone step would
            self._advance(1, drain=False)
            stepped = True
        elif wanted or "per_token" in needs:
            sim.observe()
        per_token = sim.per_token() if "per_token" in needs else None
        state = State(s, step_time(s, sim.dt), end, tokens, per_token)
        # Row s must not reach a writer before that writer has seen state s (the log pairs
        # row s with the cluster count it computes from state s): writers that want current
        # rows are served after the others and after the drain.
        current = [w for w in others if w.current_rows]
        for w in others:
            if not w.current_rows:
                w.on_state(state)
        if current:
            self.drain()
            for w in current:
                w.on_state(state)
        if stepped:
            # the step from s was taken without the timed drain (row s had to wait for the
            # writers of state s); every writer has now seen state s, so hand rows out here:
            # at a stop on every step this is the only place the loop drains while it runs
            self._timed_drain()
        return stepped

    def _timed_drain(self) -> None:
        now = time.perf_counter()
        if now - self._last_flush > self.flush_seconds:
            self.drain()
            self._last_flush = now


def drive(sim, writers, end: int, **options) -> Driver:
    """Run ``sim`` from its current step to step ``end``, serving ``writers``; see the module."""
    driver = Driver(sim, writers, end, **options)
    driver.run()
    return driver


class Rows(Writer):
    """Collects observable rows in memory (notebooks, experiments)."""

    def __init__(self, observe: Trigger):
        self.observe = observe
        self.rows: list[dict] = []

    def on_rows(self, rows):
        self.rows.extend(rows)


__all__ = ["drive", "Driver", "Stopped", "Writer", "State", "Trigger", "Every", "At", "AT_END", "NEVER",
           "Rows"]
