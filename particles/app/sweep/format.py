"""Parameter sweeps: a scene plus axes, expanded to replicas, batched into ensembles, streamed
to a results table that survives a kill.

    from particles.app.sweep import load_sweep, run_sweep
    table = run_sweep("phase_diagram_1head", "sweeps/pd1")       # -> sweeps/pd1/results.csv

A sweep file (TOML) is a scene plus two tables::

    scene = "quickstart"              # a bundled scene name, or a path relative to this file;
                                      # or no `scene` and the scene's own sections inline
    batch = 256                       # optional: at most this many replicas per work unit

    [dynamics]                        # optional: scene sections, merged onto `scene` key by key
    rule = "softmax"                  # ([heads] replaces the scene's heads whole)

    [axes]                            # the grid: the product of every axis, in file order
    "dynamics.beta" = {from = 0.1, to = 9.0, num = 90}      # linspace (log = true: geomspace)
    "tokens.seed"   = {count = 64}                          # 0..63 (start = s: s..s+63)
    "heads.count"   = [1, 2, 4, 8]                          # any list of values
    "heads.0.strength" = {from = 0.5, to = 2.0, step = 0.5} # an entry of [[heads]]

    [record]
    times = [0.0, 5.0, 20.0]          # or {from, to, num[, log]}; default: the end only
    observables = ["eps", "energy"]   # log columns (docs/LOG.md); default ["eps"]
    clusters = true                   # cluster count at each recorded time ...
    threshold = 0.99                  # ... cos > threshold (default: the scene's [log] one)
    clustering_time = {threshold = 1e-3, every = 1}   # first t with eps < threshold, or nan

Rules: axis keys are ``section.key`` of [tokens], [heads] (``heads.<i>.key`` for the i-th
[[heads]] table) or [dynamics]; ``tokens.replicas``, ``dynamics.betas``, ``dynamics.arch`` and
``dynamics.rule_file`` cannot be swept. An axis (or a sweep-file section) setting
``dynamics.t_end`` drops the scene's ``steps`` and vice versa; ``heads.strength`` and
``heads.strengths`` likewise. Integer-valued ranges (``from``/``to``/``step`` integers) give
integers. Record times are rounded to the nearest step (the ``time`` column is step * dt).
Every grid point is validated as a scene; a problem names the grid point (``at heads.count =
8: ...``). The output folder must hold this sweep or nothing: another sweep's folder is
refused (its ``sweep.json`` hash differs).

Every grid point is one replica. Replicas that share a compiled kernel and its arguments --
same n, d, heads, rule, geometry, dtype, dt, integrator, steps; differing only in their
initial tokens (seed, init, ...) and beta -- are batched into ONE ensemble ``Simulation``
(tokens (R, n, d), betas (R,)): a *work unit*, at most ``batch`` replicas. Any other
difference makes separate units. Replicas of an ensemble are independent (one thread per
replica, head and row; no atomics), so a replica's results do not depend on its batch.

The table's columns: ``unit``, ``point`` (grid index), each swept key that is not already a
fixed column (e.g. ``heads.count``; lists as JSON), ``tokens.n``, ``tokens.d``, ``H``,
``tokens.seed``, ``dynamics.beta``, ``step``, ``time``, the recorded observables (``nan`` where
a unit has no such column, e.g. ``energy_h3`` with H = 2, or where a replica blew up),
``min_cosine`` and ``clusters`` (if asked), ``clustering_time`` (if asked; the same on every
row of a replica), and with stop rules ``stop_time`` and ``stop_reason``. ``load_results``
returns them sorted by (point, step).

Stop rules: a scene whose [dynamics] has ``stop_*`` keys (``particles.stop``) ends each unit
where its own flow stops (on the scene's [log] every grid, when every replica of the unit meets
the rule, as `particles run` ends a run); ``stop_time`` and ``stop_reason`` say where and why
(``nan`` and empty where the unit ran to its end). Record times after the stop hold the values
of the state where the unit stopped. ``batch = 1`` gives each grid point its own stop.

The output folder holds ``results.csv`` (one row per replica and recorded time),
``units_done.txt`` (the ledger), ``sweep.json`` (what the sweep is, for plots and resume) and
``sweep.toml`` (a copy of the file). The table is CSV, appended and fsync'ed as each unit
finishes: it streams, needs no extra dependency and opens anywhere (``load_results``,
pandas, numpy); Parquet was left out because a Parquet file is unreadable until its writer
closes it, which a killed sweep never does. A unit's rows are written first, then its
ledger line; on a rerun the rows of units missing from the ledger are dropped (they are
recomputed), so a kill at any point never loses a finished unit and never duplicates a row.
"""
from __future__ import annotations

from pathlib import Path


import scenes as _scenes_pkg
from scenes import SceneError
from scenes import schema as _schema
from scenes.specs import integer, number

SWEEP_LIBRARY = Path(_scenes_pkg.__file__).resolve().parent / "sweeps"   # the bundled sweeps
RESULTS = "results.csv"
LEDGER = "units_done.txt"
META = "sweep.json"
COPY = "sweep.toml"
DEFAULT_BATCH = 256
MAX_POINTS = 2_000_000
MAX_PROBLEMS = 25

TOP_KEYS = ("name", "description", "scene", "batch", "axes", "record")
SCENE_SECTIONS = _schema.SECTIONS            # tokens, heads, dynamics, log, render, output
RECORD_KEYS = ("times", "observables", "clusters", "threshold", "clustering_time")
RANGE_KEYS = ("from", "to", "num", "step", "log", "count", "start")
AXIS_SECTIONS = ("tokens", "heads", "dynamics")
# keys a sweep owns (it makes its own replicas) or that cannot differ within one process
FORBIDDEN_AXES = {
    "tokens.replicas": "a sweep makes its own replicas: sweep \"tokens.seed\" = {count = R}",
    "dynamics.betas": "sweep \"dynamics.beta\" instead (one beta per grid point)",
    "dynamics.arch": "every unit of a sweep runs on one arch; set [dynamics] arch",
    "dynamics.rule_file": "set [dynamics] rule_file once and sweep \"dynamics.rule\"",
}
# setting one key removes the alternative one of the base scene
EXCLUSIVE = {"dynamics.t_end": "steps", "dynamics.steps": "t_end",
             "heads.strength": "strengths", "heads.strengths": "strength"}
# axes whose values vary within one ensemble (validated here; all other axes via the scene)
REPLICA_AXES = {"tokens.seed": integer(0),
                "dynamics.beta": number(0, lo_open=True)}
# columns every results table has (swept or not)
FIXED_COLUMNS = ("tokens.n", "tokens.d", "H", "tokens.seed", "dynamics.beta")
PATH_KEYS = {"tokens": ("path",), "dynamics": ("rule_file",),
             "heads": ("basis", "score", "value_matrix")}


class SweepError(SceneError):
    """A sweep that cannot run; ``problems`` lists each problem. Message style of SceneError::

        sweep file 'pd.toml': 2 problems:
          - [axes] "dynamics.beeta": unknown key 'beeta' in [dynamics]; did you mean 'beta'?
          - [record] times: 30 is after the end of the run (t = 20.0 = steps * dt)
    """

    def __init__(self, source: str, problems, is_file: bool = True, what: str | None = None):
        super().__init__(source, problems, is_file)
        label = what or ("sweep file" if is_file else "sweep")
        count = len(self.problems)
        head = f"{label} '{self.source}': {count} problem{'s' if count != 1 else ''}:"
        ValueError.__init__(self, "\n  - ".join([head] + self.problems))
