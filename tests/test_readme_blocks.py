"""Literal README blocks (issue 26): the sweep example runs as written; no page speaks of one
machine's session (issue targets, stops, a workplace's environment variables)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_sweep_example_loads_as_written(tmp_path):
    from particles.app.sweep import load_sweep
    block = next(b for b in re.findall(r"```toml\n(.*?)```", README, flags=re.S) if "[axes]" in b)
    path = tmp_path / "my_sweep.toml"
    path.write_text(block)
    sweep = load_sweep(path)                   # record times within the quickstart's t = 25
    assert sweep.name == "my_sweep"
    assert "particles plot sweeps/my_sweep" in README


def test_no_page_speaks_of_one_session_or_machine():
    pages = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "benchmarks" / "README.md",
             *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for phrase in ("issue's target", "this stop", "this workplace", "this VM", "stop's run"):
            assert phrase not in text, f"{page.name}: {phrase!r}"
    perf = README[README.index("## Performance"):README.index("## GPU")]
    assert "AMD EPYC" in perf and "benchmarks/README.md" in perf and "OPENBLAS" not in perf
