"""report.md: one section per result, every number taken from the experiments' results."""
from __future__ import annotations

from pathlib import Path

from .common import fmt, md_table
from .stats import AGREES, DISAGREES, IDENTITY, OUTSIDE, UNDECIDED

MODEL_DOC = "docs/MODEL.md"   # the project's own statement of every result the report checks


def _checks_table(checks) -> str:
    return md_table(["check", "measured", "held against", "criterion", "verdict", "note"],
                    [[c.name, c.measured, c.target, c.tolerance, f"**{c.verdict}**", c.note] for c in checks])


def verdict_counts(checks) -> dict:
    return {v: sum(c.verdict == v for c in checks) for v in (AGREES, DISAGREES, IDENTITY, OUTSIDE, UNDECIDED)}


def compare_verdicts(doc: dict, other: dict) -> list[dict]:
    """Checks whose verdict differs between two report.json documents (e.g. quick and full mode).

    Checks are matched by experiment and position (names may carry mode-dependent sizes); a check
    present in one report only is a difference too.
    """
    diffs = []
    for key in sorted(set(doc["experiments"]) | set(other["experiments"])):
        a = doc["experiments"].get(key, {}).get("checks", [])
        b = other["experiments"].get(key, {}).get("checks", [])
        for i in range(max(len(a), len(b))):
            va = a[i]["verdict"] if i < len(a) else "absent"
            vb = b[i]["verdict"] if i < len(b) else "absent"
            if va != vb:
                diffs.append(dict(experiment=key, index=i, name=(a[i] if i < len(a) else b[i])["name"],
                                  this=va, other=vb))
    return diffs


def write_markdown(path: Path, results, meta: dict) -> Path:
    lines = [
        "# Reproduction report: multi-head self-attention dynamics",
        "",
        (f"Written by `particles reproduce{' --quick' if meta['mode'] == 'quick' else ''}` on {meta['generated']} "
         f"({meta['mode']} mode, {fmt(meta['runtime_seconds'], 3)} s on {meta['arch']}, {meta['dtype']}, "
         f"particles {meta['particles_version']}). It re-derives the quantitative results of Pendharkar, "
         "\"Gradient Flow Structure and Quantitative Dynamics of Multi-Head Self-Attention\" (2026, "
         "arXiv:2605.04279) with this "
         f"project's simulation engine. Each result is stated in the project's own words in `{MODEL_DOC}` "
         "(in the repository that produced this report). Every number below comes from runs made by this "
         "command; `report.json` holds all of them with each experiment's parameters."),
        "",
        ("Every check states the measured quantity, what it is held against, and a criterion fixed before the "
         f"run. An experiment whose outcome was open ends **{AGREES}**, **{DISAGREES}** or **{UNDECIDED}** "
         f"(the experiment is too weak to tell). **{IDENTITY}** marks a check of an algebraic identity (only an "
         "arithmetic bug could fail it; a failure says **disagrees**), counted apart from the experiments. "
         f"**{OUTSIDE}** rows report a measurement where the theorem makes no claim: information, never a "
         "passed check nor a finding about the paper."),
        "",
        f"| # | result | paper | {AGREES} | {DISAGREES} | {UNDECIDED} | identities | information | time (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(results, 1):
        c = verdict_counts(r.checks)
        lines.append(f"| {i} | [{r.title}](#{i}-{_anchor(r.title)}) | {r.theorem} | {c[AGREES]} | "
                     f"{'**' + str(c[DISAGREES]) + '**' if c[DISAGREES] else 0} | {c[UNDECIDED]} | {c[IDENTITY]} | "
                     f"{c[OUTSIDE]} | "
                     f"{fmt(r.seconds, 3)} |")
    for key in meta.get("errors", {}):
        lines.append(f"| – | {key} | – | **ERROR** | – | – | – | – | – |")
    lines.append("")
    if "compared_with" in meta:
        cw = meta["compared_with"]
        diffs = cw["differences"]
        lines += [f"**Verdicts against `{cw['path']}` ({cw['mode']} mode):** "
                  + ("identical for every check." if not diffs else f"{len(diffs)} differ:"), ""]
        if diffs:
            lines += [md_table(["experiment", "check", f"this ({meta['mode']})", f"other ({cw['mode']})"],
                               [[d["experiment"], d["name"], d["this"], d["other"]] for d in diffs]), ""]
    for i, r in enumerate(results, 1):
        lines += [
            f"## {i}. {r.title}",
            "",
            f"*{r.theorem}* (statement: `{MODEL_DOC}`). {r.what}",
            "",
            f"**Claim.** {r.claim}",
            "",
            f"**Closed form.** {r.closed_form}",
            "",
            f"**Measurement.** {r.measurement}",
            "",
            f"**Agreement.** {r.agreement}",
            "",
            _checks_table(r.checks),
            "",
        ]
        if r.table:
            lines += [r.table, ""]
        for fig in r.figures:
            lines += [f"![{r.title}]({fig})", ""]
    for key, tb in meta.get("errors", {}).items():
        lines += [f"## {key}: error", "", "```", tb.rstrip(), "```", ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _anchor(title: str) -> str:
    return "-".join("".join(ch for ch in title.lower() if ch.isalnum() or ch in " -").split())
