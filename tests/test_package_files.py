"""The package and its documents (issue 26): LICENSE, py.typed, CITATION.cff, the paper's arXiv id,
extras, `particles docs`, `particles scenes` listing sweeps, a sweep given to `particles run`."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from particles.app.cli import main

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_license_file_matches_pyproject():
    assert PYPROJECT["project"]["license"] == {"text": "MIT"}
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


def test_py_typed_is_shipped():
    assert (ROOT / "particles" / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["particles"]


def test_citation_and_model_name_the_arxiv_id():
    cff = (ROOT / "CITATION.cff").read_text()
    assert "cff-version: 1.2.0" in cff and "arXiv:2605.04279" in cff and "Pendharkar" in cff
    assert "arXiv:2605.04279" in (ROOT / "docs" / "MODEL.md").read_text()


def test_pandas_is_in_a_user_extra():
    assert "pandas" in PYPROJECT["project"]["optional-dependencies"]["analysis"]


def test_docs_pages_are_shipped_links_to_the_docs(capsys):
    shipped = ROOT / "particles" / "app" / "docs"
    for page in ("MODEL.md", "LOG.md"):
        assert (shipped / page).resolve() == (ROOT / "docs" / page).resolve()
    assert "docs/*.md" in PYPROJECT["tool"]["setuptools"]["package-data"]["particles.app"]
    assert main(["docs", "model"]) == 0
    assert capsys.readouterr().out == (ROOT / "docs" / "MODEL.md").read_text(encoding="utf-8")
    assert main(["docs", "log"]) == 0
    assert capsys.readouterr().out.startswith("# The log: `log.csv`")


def test_docs_refuses_an_unknown_page(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["docs", "nope"])
    assert exc.value.code == 2 and "choose from 'log', 'model'" in capsys.readouterr().err


def test_scenes_lists_the_bundled_sweeps(capsys):
    assert main(["scenes"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("scenes (particles run NAME):\n  alibi_vs_none_alibi")
    assert "sweeps (particles sweep NAME):\n  phase_diagram_1head" in out and "phase_diagram_multihead" in out


def test_run_of_a_sweep_says_to_use_sweep(capsys):
    assert main(["run", "phase_diagram_1head"]) == 2
    err = capsys.readouterr().err
    assert "'phase_diagram_1head' is a bundled sweep, not a scene: run it with `particles sweep" in err
    assert "Traceback" not in err
