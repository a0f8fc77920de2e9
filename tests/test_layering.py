"""The layering rule of ARCHITECTURE.md, checked on every import of every module.

    particles/app/  (run, sweep, reproduce, cli)  may import everything below
    scenes/         may import the core only (and never starts Taichi)
    render/         imports neither the core nor scenes: it draws arrays and metadata
    particles/      (the engine core) imports neither scenes, render nor the app layer

Module-level and function-local imports alike (the whole syntax tree is walked), relative
imports resolved against the importing module, and imports by string
(``importlib.import_module("particles.app.run")``, or a string naming a module in a file
that calls import_module). Read from the same imports: import cycles, private names
(``_name``) of one module used in another, and the modules that promise not to start Taichi
are imported in a fresh interpreter to see that they do not.

What exists today and the rule forbids is listed below by name (DOORS, KNOWN_*): a new one
fails, and so does one that is gone (take it off the list).
"""
import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("particles", "scenes", "render")
MODULE_STRING = re.compile(r"^(particles|scenes|render)(\.\w+)*$")

# the core's doors to the application layer, imported by string on first use: the
# notebook's entry points on the package (particles.run_scene, ...) and Result's drawing and
# conversions. They stay: the package is lazy so that `import particles` never starts Taichi,
# and a core class cannot name the app layer otherwise without breaking the documented API
DOORS = {
    ("particles", "particles.app.run"),
    ("particles", "particles.app.build"),
    ("particles.result", "particles.app.notebook"),
}
# forbidden: none is left (a new one fails)
KNOWN_CYCLES = set()
KNOWN_PRIVATE = set()
# function-local imports in the core and scenes, per module: none is left
KNOWN_LOCAL_IMPORTS = {}
# modules that promise never to start Taichi (the scene schema, the renderer, the file formats
# and the engine's Taichi-free tables)
TAICHI_FREE = ("scenes", "render", "particles", "particles.heads", "particles.attention", "particles.rules",
               "particles.pretrained", "particles.output",
               "particles.observables", "particles.layout", "particles.paths", "particles.integrators",
               "particles.errors", "particles.vocabulary", "particles.clock", "particles.machine")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
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


def _is_module(dotted: str, root: Path) -> bool:
    base = root / Path(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports_of(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file, at any depth, and of every
    module named by string where the file imports by string."""
    tree = ast.parse(path.read_text(), filename=str(path))
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    by_string = False
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
            # `from . import kernels`, `from particles import app`: a name that is a module
            # imports that module (its package is loaded first, as for any submodule, but none
            # of the package's own names is read); any other name is read from the target
            submodules = [f"{target}.{alias.name}" for alias in node.names
                          if _is_module(f"{target}.{alias.name}", root)]
            if len(submodules) < len(node.names):
                found.append((node.lineno, target))
            found += [(node.lineno, module) for module in submodules]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) \
                in ("import_module", "__import__"):
            by_string = True
    if by_string:  # a module named in a string of this file may be imported by it
        found += [(node.lineno, node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and MODULE_STRING.match(node.value) and _is_module(node.value, root)]
    return found


def all_modules(root: Path = ROOT) -> list[Path]:
    return sorted(p for pkg in PACKAGES if (root / pkg).is_dir() for p in (root / pkg).rglob("*.py"))


def violations(root: Path = ROOT) -> list[tuple[str, str, str]]:
    """(importer, imported, 'file:line: what') of every import across the layering rule."""
    out = []
    for path in all_modules(root):
        name = module_name(path, root)
        here = layer(name)
        for line, target in imports_of(path, root):
            there = layer(target)
            if there is not None and there not in ALLOWED[here]:
                out.append((name, target, f"{path.relative_to(root)}:{line}: {here} imports {target} ({there})"))
    return out


def import_graph(root: Path = ROOT) -> dict[str, set]:
    """module -> the project modules it imports (a name resolved to its longest module), the
    core's DOORS left out (they are taken at first use, after both sides are loaded)."""
    modules = {module_name(p, root): p for p in all_modules(root)}

    def resolve(target):
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target
    return {name: {resolve(t) for _, t in imports_of(path, root)
                   if resolve(t) not in ("", name) and (name, t) not in DOORS}
            for name, path in modules.items()}


def cycles(graph: dict[str, set]) -> set:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), set()

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(frozenset(component))
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def private_uses(root: Path = ROOT) -> set:
    """(user, 'module._name') for every private name of one project module used in another:
    ``from m import _name`` or ``m._name`` on an imported module."""
    modules = {module_name(p, root): p for p in all_modules(root)}
    out = set()
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in modules:
                        aliases[a.asname or a.name] = a.name
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    target = ".".join(base[:len(base) - (node.level - 1)] + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for a in node.names:
                    if f"{target}.{a.name}" in modules:
                        aliases[a.asname or a.name] = f"{target}.{a.name}"
                    elif a.name.startswith("_") and not a.name.startswith("__") and target != name:
                        out.add((name, f"{target}.{a.name}"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in aliases and aliases[node.value.id] != name \
                    and node.attr.startswith("_") and not node.attr.startswith("__"):
                out.add((name, f"{aliases[node.value.id]}.{node.attr}"))
    return out


def test_every_module_is_in_a_layer():
    assert len(all_modules()) > 30
    assert {layer(module_name(p)) for p in all_modules()} == {"core", "scenes", "render", "app"}


def test_no_import_breaks_the_layering_rule_but_the_core_s_doors():
    found = violations()
    assert [what for importer, target, what in found if (importer, target) not in DOORS] == []
    assert {(importer, target) for importer, target, _ in found} == DOORS


def test_no_new_import_cycle():
    assert cycles(import_graph()) == KNOWN_CYCLES


def test_no_new_private_name_used_across_modules():
    assert private_uses() == KNOWN_PRIVATE


def local_imports(root: Path = ROOT) -> dict[str, int]:
    """module -> how many import statements sit inside its functions (core and scenes)."""
    out = {}
    for path in all_modules(root):
        name = module_name(path, root)
        if layer(name) not in ("core", "scenes"):
            continue
        tree = ast.parse(path.read_text())
        inside = {id(node) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom))}
        if inside:
            out[name] = len(inside)
    return out


def test_no_new_function_local_import_in_the_core_or_scenes():
    assert local_imports() == KNOWN_LOCAL_IMPORTS


def _fake_tree(root: Path) -> None:
    """A small project: render importing the core (at module level, in a function and by
    string), a core cycle, a package cycle, a private name used across modules, a function-local
    import."""
    for pkg in PACKAGES:
        (root / pkg).mkdir()
        (root / pkg / "__init__.py").write_text("")
    (root / "particles" / "heads.py").write_text("from . import engine\n_SECRET = 1\n")
    (root / "particles" / "engine.py").write_text("from .heads import _SECRET\nfrom . import heads\n\n"
                                                   "def f():\n    return heads._SECRET\n\n"
                                                   "def g():\n    from . import heads as h\n    return h\n")
    (root / "render" / "probe.py").write_text(
        "import numpy\nfrom particles.heads import Head\n\ndef f():\n    from scenes import load_scene\n"
        "\ndef g():\n    import importlib\n    return importlib.import_module('particles.engine')\n")
    # a package that imports its modules: `from . import b` imports b alone (no cycle), while
    # `from . import A` reads a name of the package that is still being imported (a cycle)
    (root / "scenes" / "__init__.py").write_text("from .a import A\nfrom .c import C\n")
    (root / "scenes" / "a.py").write_text("from . import b\nA = b\n")
    (root / "scenes" / "b.py").write_text("")
    (root / "scenes" / "c.py").write_text("from . import A\nC = A\n")


def test_the_checker_sees_every_kind_of_import_cycles_and_private_names(tmp_path):
    """The checkers catch both kinds of import and an import by string, a cycle and a private
    name, in a fake project written under tmp_path (nothing is written into the package)."""
    _fake_tree(tmp_path)
    found = [what for _, _, what in violations(tmp_path)]
    probe = [v for v in found if v.startswith("render/probe.py")]
    assert len(probe) == 3, found
    assert any("particles.heads" in v for v in probe) and any("scenes" in v for v in probe)
    assert any(":9: render imports particles.engine" in v for v in probe)
    assert cycles(import_graph(tmp_path)) == {frozenset({"particles.heads", "particles.engine"}),
                                              frozenset({"scenes", "scenes.c"})}
    assert private_uses(tmp_path) == {("particles.engine", "particles.heads._SECRET")}
    assert local_imports(tmp_path) == {"particles.engine": 1}


def test_the_modules_that_promise_it_never_start_taichi():
    """Each imported in turn in one fresh interpreter: Taichi is not imported by any (the first
    that imports it is named)."""
    code = ("import importlib, sys\n"
            f"for name in {TAICHI_FREE!r}:\n"
            "    importlib.import_module(name)\n"
            "    assert 'taichi' not in sys.modules, name + ' imported taichi'\n"
            "import scenes\n"
            "s = scenes.load_scene('quickstart'); s.build_tokens(); s.build_heads()\n"
            "assert 'taichi' not in sys.modules, 'building a scene imported taichi'\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("name", ["particles.kernels", "particles.simulation"])
def test_the_taichi_check_can_fail(name):
    """The same check on a module that does start Taichi fails (so the check above is real)."""
    code = f"import importlib, sys\nimportlib.import_module({name!r})\nassert 'taichi' not in sys.modules\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode != 0
