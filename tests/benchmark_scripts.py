"""The benchmark scripts (benchmarks/*.py are scripts, not a package) as modules for tests."""
import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str):
    """benchmarks/<name>.py as a fresh module; the folder is on sys.path while it loads, since
    the scripts import each other by name (step.py imports peers)."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module
