"""The layering rule of ARCHITECTURE.md, checked on every import of every module.

    particles/app/  (run, sweep, reproduce, cli)  may import everything below
    scenes/         may import the core only (and never starts Taichi)
    render/         imports neither the core nor scenes: it draws arrays and metadata
    particles/      (the engine core) imports neither scenes, render nor the app layer

Module-level and function-local imports alike (the whole syntax tree is walked), relative
imports resolved against the importing module.
"""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("particles", "scenes", "render")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def layer(module: str) -> str | None:
    if module == "particles.__main__" or module == "particles.app" or module.startswith("particles.app."):
        return "app"
    top = module.split(".")[0]
    return {"particles": "core", "scenes": "scenes", "render": "render"}.get(top)


# what each layer may import (among the project's own layers)
ALLOWED = {"core": {"core"}, "scenes": {"scenes", "core"}, "render": {"render"},
           "app": {"app", "core", "scenes", "render"}}


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file, at any depth."""
    tree = ast.parse(path.read_text(), filename=str(path))
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            # `from . import kernels`, `from particles import app`: the names may be modules
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names
                      if (ROOT / Path(*f"{target}.{alias.name}".split("."))).with_suffix(".py").is_file()
                      or (ROOT / Path(*f"{target}.{alias.name}".split("."))).is_dir()]
    return found


def all_modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def violations() -> list[str]:
    out = []
    for path in all_modules():
        here = layer(module_name(path))
        for line, target in imports_of(path):
            there = layer(target)
            if there is not None and there not in ALLOWED[here]:
                out.append(f"{path.relative_to(ROOT)}:{line}: {here} imports {target} ({there})")
    return out


def test_every_module_is_in_a_layer():
    assert len(all_modules()) > 30
    assert {layer(module_name(p)) for p in all_modules()} == {"core", "scenes", "render", "app"}


def test_no_import_breaks_the_layering_rule():
    assert violations() == []


def test_the_checker_sees_module_level_and_function_local_imports(tmp_path, monkeypatch):
    """The rule catches both kinds of import (a fake render module importing the core)."""
    fake = ROOT / "render" / "_layering_probe.py"
    fake.write_text("import numpy\nfrom particles.heads import Head\n\ndef f():\n"
                    "    from scenes import load_scene\n    from .. import particles\n")
    try:
        found = violations()
    finally:
        fake.unlink()
    probe = [v for v in found if "_layering_probe" in v]
    assert len(probe) == 2, found
    assert any("particles.heads" in v for v in probe) and any("scenes" in v for v in probe)


@pytest.mark.parametrize("statement", [
    "import scenes; s = scenes.load_scene('quickstart'); s.build_tokens(); s.build_heads()",
    "import render",
    "import particles, particles.heads, particles.output",
])
def test_importing_scenes_or_render_does_not_start_taichi(statement):
    code = f"{statement}\nimport sys\nassert 'taichi' not in sys.modules, 'taichi was imported'"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
