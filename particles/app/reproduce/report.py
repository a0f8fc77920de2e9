"""report.md: one section per result, every number taken from the experiments' results."""
from __future__ import annotations

import re
from pathlib import Path

from .common import fmt, md_cell, md_table
from .stats import AGREES, DISAGREES, IDENTITY, OUTSIDE, UNDECIDED, VERDICTS

MODEL_DOC = "docs/MODEL.md"   # the project's own statement of every result the report checks


def _checks_table(checks) -> str:
    return md_table(["check", "measured", "held against", "criterion", "verdict", "note"],
                    [[c.name, c.measured, c.target, c.tolerance, f"**{c.verdict}**", c.note] for c in checks])


_VERDICT = "|".join(re.escape(v) for v in sorted(VERDICTS, key=len, reverse=True))
_CITED = re.compile(rf"\(row (\d+): ({_VERDICT})\)")
_BARE_VERDICT = re.compile(rf"\b({_VERDICT})(?!\w)")
# a median is always said to be the lower one (of an even count, the smaller middle value) or the
# usual one (the mean of the two middle values): they differ, e.g. 57 against 81 for 20, 57, 105, 249
_BARE_MEDIAN = re.compile(r"(?<!lower )(?<!usual )(?<!upper )\bmedians?\b", re.IGNORECASE)


def bare_medians(text: str) -> list[str]:
    """Every 'median' in ``text`` not said to be the lower, usual or upper one (with 30 characters around)."""
    return [text[max(m.start() - 30, 0):m.end() + 30] for m in _BARE_MEDIAN.finditer(text)]


def text_problems(result) -> list[str]:
    """Sentences of one experiment's report text that state a verdict other than the row's own, or a
    median without saying which: [] when there are none.

    Prose may state a verdict only as '(row k: <verdict>)' (``common.cite``), k the row of the
    section's checks table, and the verdict must be that row's; any other verdict word in the text
    (what, claim, closed form, measurement, agreement, tables, every check's name, target, criterion
    and note) is a problem, since nothing ties it to a row.
    """
    checks = result.checks
    texts = [("what", result.what), ("claim", result.claim), ("closed form", result.closed_form),
             ("measurement", result.measurement), ("agreement", result.agreement), ("table", result.table)]
    for i, c in enumerate(checks, 1):
        texts += [(f"row {i} {field}", str(getattr(c, field))) for field in ("name", "target", "tolerance", "note")]
    problems = []
    for where, text in texts:
        for m in _CITED.finditer(text):
            k, said = int(m.group(1)), m.group(2)
            if not 1 <= k <= len(checks):
                problems.append(f"{result.key} {where}: '{m.group(0)}' names no row (there are {len(checks)})")
            elif checks[k - 1].verdict != said:
                problems.append(f"{result.key} {where}: '{m.group(0)}' but row {k} "
                                f"({checks[k - 1].name}) says '{checks[k - 1].verdict}'")
        rest = _CITED.sub("", text)
        for m in _BARE_VERDICT.finditer(rest):
            problems.append(f"{result.key} {where}: verdict '{m.group(1)}' stated without its row: "
                            f"'...{rest[max(m.start() - 40, 0):m.end() + 20]}...'")
        for snippet in bare_medians(text):
            problems.append(f"{result.key} {where}: a median without saying which (lower or usual): "
                            f"'...{snippet}...'")
    return problems


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
    if meta.get("text_problems"):
        lines += [f"**The report's own text is inconsistent ({len(meta['text_problems'])} sentences; a bug of "
                  "`particles reproduce`, the numbers and verdicts in the tables stand):**", ""]
        lines += [f"- {md_cell(p)}" for p in meta["text_problems"]] + [""]
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
