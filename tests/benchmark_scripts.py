"""The benchmark scripts (benchmarks/*.py are scripts, not a package) as modules for tests."""
import importlib.util
import os
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str):
    """benchmarks/<name>.py as a fresh module; the folder is on sys.path while it loads, since
    the scripts import each other by name (step.py imports peers). Loading one must leave the
    environment alone: step.py once set PARTICLES_MAX_PAIRS at import, which lifted the pair
    guard for every later test in the same worker."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    environment = dict(os.environ)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    changed = sorted(k for k in set(environment) | set(os.environ) if environment.get(k) != os.environ.get(k))
    assert not changed, f"benchmarks/{name}.py changed the environment at import: {changed}"
    return module
