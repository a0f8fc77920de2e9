"""Every whole scene written in README.md and scenes/README.md runs as written (issue 32: the
README's first scene was refused): each TOML block with a [tokens] table, saved as a file, run
by the command line for a few steps (the one change: --steps), video included, then plotted."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from cli_runner import particles_cli

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "scenes/README.md")


def whole_scenes():
    found = []
    for page in PAGES:
        text = (ROOT / page).read_text(encoding="utf-8")
        for block in re.findall(r"```toml\n(.*?)```", text, flags=re.S):
            if re.search(r"^\[tokens\]", block, flags=re.M):
                name = re.search(r'^name = "(.*?)"', block, flags=re.M)[1]
                slow = () if name == "two_heads" else (pytest.mark.slow,)   # the first in the fast tier
                found.append(pytest.param(block, id=f"{page}:{name}", marks=slow))
    return found


def test_the_pages_write_the_scenes_this_test_runs():
    assert [p.id for p in whole_scenes()] == ["README.md:two_heads", "scenes/README.md:two_blocks"]


@pytest.mark.parametrize("block", whole_scenes())
def test_a_scene_written_in_the_docs_runs_as_written(block, tmp_path):
    path = tmp_path / "scene.toml"
    path.write_text(block, encoding="utf-8")
    out = tmp_path / "run"
    proc = particles_cli("run", path, "--steps", 10, "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "run completed: 10/10 steps" in proc.stdout
    video = re.search(r'^file = "(.*?)"', block, flags=re.M)
    assert (out / (video[1] if video else "animation.mp4")).stat().st_size > 0
    proc = particles_cli("plot", out)
    assert proc.returncode == 0, proc.stderr
    assert (out / "summary.png").stat().st_size > 0
