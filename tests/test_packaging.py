"""What users install is what we test: package discovery must find every package and data file.
(.ci/run also builds the wheel, installs it into a fresh environment and runs .ci/smoke.)"""
import tomllib
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[1]


def test_every_folder_of_python_modules_is_a_found_package():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "packages" in config and "find" in config["packages"], "list packages by discovery"
    found = set(find_packages(str(ROOT), include=config["packages"]["find"]["include"]))
    folders = {".".join(p.parent.relative_to(ROOT).parts)
               for top in ("particles", "scenes", "render") for p in (ROOT / top).rglob("*.py")
               if "__pycache__" not in p.parts}
    assert folders <= found, f"not shipped: {sorted(folders - found)}"
    assert {"particles.app", "particles.app.sweep", "particles.app.reproduce"} <= found


def test_bundled_data_files_are_declared():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    declared = {p for pattern in data["scenes"] for p in (ROOT / "scenes").glob(pattern)}
    shipped_kinds = {p for p in (ROOT / "scenes").rglob("*") if p.suffix in (".toml", ".md")}
    assert shipped_kinds <= declared, f"not shipped: {sorted(map(str, shipped_kinds - declared))}"
