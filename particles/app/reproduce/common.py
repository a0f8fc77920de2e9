"""Shared machinery of the reproduction experiments: running ensembles, checks, figures.

Every experiment measures with the engine (``particles.Simulation``); the closed forms
it compares against are written out in the experiment's module (copied from
``tests/reference.py`` where they exist there).
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from render.figures import new_figure

from particles.drive import AT_END, Every, Rows, drive
from particles.simulation import Simulation

# closed forms: one home, particles.theory (re-exported here for the experiments)
from particles.theory import beta_star, c_star, phi, rho_crossing_beta, rho_orthonormal  # noqa: E402,F401

# ----------------------------------------------------------------------------- running


@dataclass
class Trace:
    """Logged columns of an ensemble run as arrays of shape (R, T); ``time`` is (T,)."""

    time: np.ndarray
    cols: dict
    finite: np.ndarray  # (R,) whether every logged value of the replica stayed finite
    wall: float = 0.0

    def __getitem__(self, key):
        return self.cols[key]

    def head(self, name: str, H: int) -> np.ndarray:
        """(R, H, T) stack of a per-head column."""
        return np.stack([self.cols[f"{name}_h{h}"] for h in range(H)], axis=1)


def rows_to_trace(rows: list[dict], R: int) -> Trace:
    steps = sorted({r["step"] for r in rows})
    index = {s: k for k, s in enumerate(steps)}
    keys = [k for k in rows[0] if k not in ("step", "replica")]
    cols = {k: np.full((R, len(steps)), np.nan) for k in keys}
    for r in rows:
        b, k = r.get("replica", 0), index[r["step"]]
        for key in keys:
            cols[key][b, k] = r[key]
    time_ = cols.pop("time")[0]
    finite = np.ones(R, dtype=bool)
    for key, a in cols.items():
        finite &= np.all(np.isfinite(a) | np.isposinf(a) & key.startswith("radial_dominance"), axis=1)
    return Trace(time=time_, cols=cols, finite=finite)


def ensemble_tokens(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x if x.ndim == 3 else x[None]


def make_sim(tokens, heads, beta, *, rule="exp", geometry="sphere", dt=0.01,
             integrator="rk4", entropy_rate=False) -> Simulation:
    """A float64 CPU ensemble Simulation (tokens always (R, n, d), so rows carry ``replica``)."""
    sim = Simulation(ensemble_tokens(tokens), heads, beta=beta, rule=rule, geometry=geometry,
                     dt=dt, integrator=integrator, dtype="float64", arch="cpu",
                     entropy_rate=entropy_rate)
    sim._repro_kw = dict(rule=rule, geometry=geometry, dt=dt, integrator=integrator, entropy_rate=entropy_rate)
    return sim


def run(tokens, heads, beta, *, steps: int, observe_every: int = 1, **kw) -> Trace:
    """Run ``steps`` steps observing every ``observe_every``; the final state is observed too."""
    t0 = time.perf_counter()
    sim = make_sim(tokens, heads, beta, **kw)
    trace = rows_to_trace(_drive_rows(sim, steps, observe_every), sim.n_replicas)
    trace.wall = time.perf_counter() - t0
    trace.sim = sim
    return trace


def _drive_rows(sim: Simulation, steps: int, observe_every: int) -> list[dict]:
    """The rows of every observe_every-th state and of the final one, through the drive loop."""
    rows = Rows(Every(observe_every) | AT_END)
    drive(sim, [rows], sim.step_count + int(steps))
    return rows.rows


def reset(sim: Simulation, tokens, beta) -> Simulation:
    """A Simulation at a new start with new per-replica betas, reusing ``sim`` when it is safe.

    Rebuilding costs a warm-up pass over every kernel, so searches over beta reuse the built
    Simulation: new tokens through ``set_tokens`` and new betas written into its device array.
    That touches the engine's internals, so the first reuse of each Simulation is verified
    against a freshly built one (every observable of the new start, to 1e-12); if they differ,
    or the internals are not there, every call builds a fresh Simulation instead.
    Always use the returned object.
    """
    sim.take_rows()
    b = np.broadcast_to(np.asarray(beta, dtype=np.float64), (sim.n_replicas,)).copy()
    if not np.all(np.isfinite(b) & (b > 0)):
        raise ValueError(f"beta must be positive and finite, got {beta!r}")
    x = ensemble_tokens(tokens)

    def fresh():
        return make_sim(x, sim.heads, b, **sim._repro_kw)

    if getattr(sim, "_repro_reuse_ok", True) is False:
        return fresh()
    sim.set_state(x, step=0)
    sim.set_beta(b)
    if not getattr(sim, "_repro_checked", False):
        ref = fresh()
        sim.observe()
        ref.observe()
        ok = _rows_match(sim.take_rows(), ref.take_rows())
        sim._repro_checked, sim._repro_reuse_ok = True, ok
        if not ok:
            return ref
    return sim


def _rows_match(a: list[dict], b: list[dict], rtol: float = 1e-12) -> bool:
    if len(a) != len(b):
        return False
    for ra, rb in zip(a, b):
        if ra.keys() != rb.keys():
            return False
        for k in ra:
            u, v = float(ra[k]), float(rb[k])
            if not (u == v or (math.isnan(u) and math.isnan(v)) or abs(u - v) <= rtol * max(abs(u), abs(v))):
                return False
    return True


def run_on(sim: Simulation, steps: int, observe_every: int = 1) -> Trace:
    """Advance an existing (reset) Simulation and return its trace, final state included."""
    t0 = time.perf_counter()
    trace = rows_to_trace(_drive_rows(sim, steps, observe_every), sim.n_replicas)
    trace.wall = time.perf_counter() - t0
    return trace


def observe_once(tokens, heads, beta, **kw) -> Trace:
    """The observables of the initial state only (one velocity evaluation, no step)."""
    sim = make_sim(tokens, heads, beta, **kw)
    sim.observe()
    return rows_to_trace(sim.take_rows(), sim.n_replicas)


def first_crossing_time(t: np.ndarray, y: np.ndarray, level: float, above: bool = True) -> float:
    """First time y(t) reaches ``level`` (from below if ``above``), linearly interpolated; nan if never."""
    ok = (y >= level) if above else (y <= level)
    if not ok.any():
        return math.nan
    k = int(np.argmax(ok))
    if k == 0:
        return float(t[0])
    y0, y1 = y[k - 1], y[k]
    if not (np.isfinite(y0) and np.isfinite(y1)) or y1 == y0:
        return float(t[k])
    return float(t[k - 1] + (level - y0) / (y1 - y0) * (t[k] - t[k - 1]))


def multisection(predicate_batch, lo: float, hi: float, points: int, tol: float,
                 max_rounds: int = 40):
    """Smallest x in [lo, hi] where a monotone predicate turns True, by repeated grid refinement.

    ``predicate_batch(xs)`` evaluates the predicate on an array of points at once (one
    ensemble run). Returns (x_lo, x_hi, rounds): predicate False at x_lo, True at x_hi, or
    (hi, inf, rounds) when it is False on the whole interval, (-inf, lo, rounds) when True at lo.
    """
    rounds = 0
    while hi - lo > tol and rounds < max_rounds:
        xs = np.linspace(lo, hi, points)
        ok = np.asarray(predicate_batch(xs), dtype=bool)
        rounds += 1
        if not ok.any():
            return hi, math.inf, rounds
        k = int(np.argmax(ok))
        if k == 0:
            return -math.inf, lo, rounds
        lo, hi = float(xs[k - 1]), float(xs[k])
    return lo, hi, rounds


def last_transition(predicate_batch, lo: float, hi: float, points: int, tol: float,
                    max_rounds: int = 40):
    """Bracket the last False -> True transition of a predicate on [lo, hi] by grid refinement.

    Robust where the predicate is not monotone at the low end: it follows the largest x at
    which the predicate is False. Returns (x_lo, x_hi, rounds); (hi, inf) when False at hi,
    (-inf, lo) when True on the whole first grid.
    """
    rounds = 0
    while hi - lo > tol and rounds < max_rounds:
        xs = np.linspace(lo, hi, points)
        ok = np.asarray(predicate_batch(xs), dtype=bool)
        rounds += 1
        if not ok[-1]:
            return hi, math.inf, rounds
        if ok.all():
            if rounds == 1:
                return -math.inf, lo, rounds
            return lo, lo, rounds
        k = int(np.nonzero(~ok)[0][-1])
        lo, hi = float(xs[k]), float(xs[k + 1])
    return lo, hi, rounds


def bracket_mid(lo: float, hi: float) -> float:
    """Midpoint of a search bracket; -inf / inf pass through."""
    if math.isinf(lo) or math.isinf(hi):
        return -math.inf if lo == -math.inf else math.inf
    return 0.5 * (lo + hi)


def fit_line(x, y):
    """Least-squares y = a x + b; returns (a, b, standard error of a)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    A = np.vstack([x, np.ones_like(x)]).T
    coef, res, *_ = np.linalg.lstsq(A, y, rcond=None)
    a, b = coef
    dof = len(x) - 2
    if dof > 0:
        resid = y - (a * x + b)
        s2 = float(resid @ resid) / dof
        se = math.sqrt(s2 / float(((x - x.mean()) ** 2).sum()))
    else:
        se = math.nan
    return float(a), float(b), se


# ----------------------------------------------------------------------------- progress


def progress(key: str):
    """A printer of progress lines within one experiment: ``say = progress("e3"); say("H = 2, n = 8")``
    prints ``    e3: H = 2, n = 8 (12 s)`` (seconds since the experiment started), so that a long
    experiment is never silent for minutes."""
    t0 = time.perf_counter()

    def say(text: str) -> None:
        print(f"    {key}: {text} ({time.perf_counter() - t0:.0f} s)", flush=True)

    return say


# ----------------------------------------------------------------------------- checks


@dataclass
class Check:
    """One agreement between a measurement and a claim, with its tolerance and verdict."""

    name: str
    measured: float
    target: str          # what it is held against, in words/numbers
    tolerance: str       # the criterion, in words
    passed: bool
    note: str = ""
    verdict: str = ""    # agrees / disagrees / identity holds / information (outside ...) / cannot decide
    identity: bool = False   # an algebraic identity: "identity holds", counted apart from experiments

    def __post_init__(self):
        from .stats import AGREES, DISAGREES, IDENTITY
        if self.identity and self.verdict in ("", AGREES):
            self.verdict = IDENTITY if self.passed else DISAGREES
        elif not self.verdict:
            self.verdict = AGREES if self.passed else DISAGREES

    def as_dict(self):
        return asdict(self)


def cite(checks: list, check: "Check") -> str:
    """How prose states a row's verdict: '(row k: <verdict>)', k its 1-based place in the section's
    table. ``report.text_problems`` holds every verdict stated in a report's text to this form and to
    the row's own verdict."""
    k = next(i for i, c in enumerate(checks) if c is check)
    return f"(row {k + 1}: {check.verdict})"


@dataclass
class Result:
    """What one experiment hands to the report."""

    key: str
    title: str
    theorem: str
    what: str                 # one opening sentence for a reader who has not read the paper
    claim: str
    closed_form: str
    measurement: str
    agreement: str
    params: dict
    numbers: dict
    checks: list = field(default_factory=list)
    figures: list = field(default_factory=list)
    table: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        from .stats import OUTSIDE
        return all(c.passed for c in self.checks if c.verdict != OUTSIDE)   # information is no check


# ----------------------------------------------------------------------------- formatting


def fmt(x, digits: int = 4) -> str:
    """A number for the report: significant digits, nan/inf spelled out."""
    if x is None:
        return "n/a"
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    x = float(x)
    if math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    if x == 0:
        return "0"
    if abs(x) >= 1e5 or abs(x) < 1e-3:
        return f"{x:.{max(digits - 1, 1)}e}"
    return f"{x:.{digits}g}"


def md_cell(text: str) -> str:
    """Text safe inside a Markdown table cell (pipes escaped)."""
    return str(text).replace("|", "\\|")


def md_table(header: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(md_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        out.append("| " + " | ".join(md_cell(c) if isinstance(c, str) else fmt(c) for c in r) + " |")
    return "\n".join(out)


def jsonable(obj):
    """Plain JSON types; non-finite floats become the strings 'nan', 'inf', '-inf'."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        x = float(obj)
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return x
    if isinstance(obj, Path):
        return str(obj)
    return obj


# ----------------------------------------------------------------------------- figures


def figure(ncols: int = 1, nrows: int = 1, width: float = 5.0, height: float = 3.8):
    """A matplotlib Figure on an Agg canvas (no pyplot state) and its axes (always a flat list)."""
    fig = new_figure(width * ncols, height * nrows, dpi=110)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def save(fig: Figure, fig_dir: Path, name: str) -> str:
    fig_dir.mkdir(parents=True, exist_ok=True)
    path = fig_dir / name
    fig.savefig(path)
    return name


def plain_log_axis(ax, axis: str = "y", ticks=None):
    """Plain decimal tick labels on a log axis (instead of 2×10^1), optionally at given ticks."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

    target = ax.yaxis if axis == "y" else ax.xaxis
    if ticks is not None:
        target.set_major_locator(FixedLocator(list(ticks)))
    else:
        target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    target.set_minor_formatter(NullFormatter())


def panel_label(ax, text: str):
    ax.set_title(text, loc="left", fontsize=10)
