"""report.md: one section per result, every number taken from the experiments' results."""
from __future__ import annotations

from pathlib import Path

from .common import fmt, md_table


def _verdict(check) -> str:
    if check.note == "informational":
        return "INFO"
    return "PASS" if check.passed else "FAIL"


def _checks_table(checks) -> str:
    return md_table(["check", "measured", "held against", "criterion", "verdict"],
                    [[c.name, c.measured, c.target, c.tolerance, f"**{_verdict(c)}**"] for c in checks])


def write_markdown(path: Path, results, meta: dict) -> Path:
    lines = [
        "# Reproduction report: multi-head self-attention dynamics",
        "",
        (f"Written by `particles reproduce{' --quick' if meta['mode'] == 'quick' else ''}` on {meta['generated']} "
         f"({meta['mode']} mode, {fmt(meta['runtime_seconds'], 3)} s on {meta['arch']}, {meta['dtype']}, "
         f"particles {meta['particles_version']}). It re-derives the quantitative results of Pendharkar, "
         "\"Gradient Flow Structure and Quantitative Dynamics of Multi-Head Self-Attention\" (2026) with this "
         "project's simulation engine; the mathematics is restated in `shared/MODEL.md`. Every number below comes "
         "from runs made by this command; `report.json` holds all of them with each experiment's parameters."),
        "",
        "| # | result | paper | checks passed | time (s) |",
        "|---|---|---|---|---|",
    ]
    for i, r in enumerate(results, 1):
        graded = [c for c in r.checks if c.note != "informational"]
        lines.append(f"| {i} | [{r.title}](#{i}-{_anchor(r.title)}) | {r.theorem} | "
                     f"{sum(c.passed for c in graded)}/{len(graded)} | {fmt(r.seconds, 3)} |")
    for key, tb in meta.get("errors", {}).items():
        lines.append(f"| – | {key} | – | **ERROR** | – |")
    lines.append("")
    for i, r in enumerate(results, 1):
        lines += [
            f"## {i}. {r.title}",
            "",
            f"*{r.theorem}.* {r.what}",
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
