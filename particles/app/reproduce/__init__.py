"""`particles reproduce`: run every quantitative result of the paper with the engine, write a report.

    from particles.app.reproduce import main
    report = main(quick=True, out_dir=Path("repro"))   # -> repro/report.md (+ report.json, PNGs)

One module per experiment (``e1_energy`` ... ``e8_causal``); each exposes
``run_experiment(quick, fig_dir) -> common.Result``, whose checks each carry a verdict
(agrees / disagrees / outside the theorem's assumptions / cannot decide; ``stats``).
Helpers: ``stats`` (fits with confidence intervals, bootstrap, verdicts), ``equiangular``
(the 1-D gamma ODE), ``head_outputs`` (per-token head outputs on the host, for the paper's
form of Theorem 19's condition). The results themselves are stated in docs/MODEL.md. Every number in the report comes
from the runs made here (closed forms are evaluated here too, never typed in).
``quick`` took 207 s of CPU time (22 min on the project's 2-core machine at load average ~11);
the full run uses larger ensembles and grids.
"""
from __future__ import annotations

import datetime as _dt
import json
import platform
import time
import traceback
from pathlib import Path

from particles.errors import ParticlesUserError

from . import (e1_energy, e2_radial, e3_critical, e4_heterogeneous, e5_relu, e6_entropy,
               e7_near_orthogonal, e8_causal)
from .common import jsonable
from .report import compare_verdicts, text_problems, verdict_counts, write_markdown

EXPERIMENTS = [
    ("e1_energy", e1_energy),
    ("e2_radial", e2_radial),
    ("e3_critical", e3_critical),
    ("e4_heterogeneous", e4_heterogeneous),
    ("e5_relu", e5_relu),
    ("e6_entropy", e6_entropy),
    ("e7_near_orthogonal", e7_near_orthogonal),
    ("e8_causal", e8_causal),
]

__all__ = ["main", "EXPERIMENTS"]


def main(quick: bool, out_dir: Path, only=None, compare=None) -> Path:
    """Run the experiments (all, or the keys in ``only``), write report.md, report.json and the
    figures into ``out_dir``, print progress lines (each experiment's start and end, and its own lines
    within); return report.md's path. Text that states a verdict other than its row's, or a median
    without saying which (``report.text_problems``), is printed and listed at the top of the report.

    ``compare``: the report.json of another run (e.g. the other mode); the report then lists every
    check whose verdict differs from it (the quick and full modes must reach the same verdicts).
    """
    other = None
    if compare is not None:
        try:
            other = json.loads(Path(compare).read_text(encoding="utf-8"))
            other["experiments"], other["meta"]["mode"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ParticlesUserError(f"--compare {compare}: not a readable report.json of `particles reproduce` ({exc})")
    from particles import __version__
    from particles.backend import init

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    arch = init("cpu")
    selected = [(k, m) for k, m in EXPERIMENTS if only is None or k in only]
    if only is not None:
        unknown = set(only) - {k for k, _ in EXPERIMENTS}
        if unknown:
            raise ParticlesUserError(f"unknown experiment(s) {sorted(unknown)}; known: {[k for k, _ in EXPERIMENTS]}")
    t0 = time.perf_counter()
    results, errors, problems = [], {}, []
    for i, (key, mod) in enumerate(selected, 1):
        t1 = time.perf_counter()
        print(f"[{i}/{len(selected)}] {key} ...", flush=True)
        try:
            res = mod.run_experiment(quick, out_dir)
            results.append(res)
            counts = verdict_counts(res.checks)
            status = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
            for p in text_problems(res):
                problems.append(p)
                print(f"    TEXT ERROR (a bug of particles reproduce): {p}", flush=True)
        except Exception as exc:  # keep going: one broken experiment must not lose the others' report
            errors[key] = "".join(traceback.format_exception(exc))
            status = f"ERROR: {type(exc).__name__}: {exc}"
        print(f"[{i}/{len(selected)}] {key}: {status} in {time.perf_counter() - t1:.1f} s", flush=True)
    total = time.perf_counter() - t0
    meta = dict(mode="quick" if quick else "full", generated=_dt.datetime.now().isoformat(timespec="seconds"),
                runtime_seconds=total, particles_version=__version__, arch=arch, dtype="float64",
                python=platform.python_version(), machine=platform.machine(),
                experiments=[k for k, _ in selected], errors=errors, text_problems=problems)
    try:
        import taichi
        meta["taichi_version"] = ".".join(str(v) for v in taichi.__version__)
    except Exception:  # pragma: no cover - version is informative only
        pass
    doc = dict(meta=meta, experiments={
        r.key: dict(title=r.title, theorem=r.theorem, passed=r.passed, seconds=r.seconds, params=r.params,
                    numbers=r.numbers, checks=[c.as_dict() for c in r.checks], figures=r.figures,
                    what=r.what, claim=r.claim, closed_form=r.closed_form, measurement=r.measurement,
                    agreement=r.agreement) for r in results})
    if other is not None:
        meta["compared_with"] = dict(path=str(compare), mode=other["meta"]["mode"],
                                     differences=compare_verdicts(jsonable(doc), other))
    (out_dir / "report.json").write_text(json.dumps(jsonable(doc), indent=1, ensure_ascii=False))
    path = write_markdown(out_dir / "report.md", results, meta)
    print(f"report: {path} ({total:.0f} s)", flush=True)
    return path
