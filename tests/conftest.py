import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import reference`
os.environ.setdefault("MPLBACKEND", "Agg")

# Relative tolerances by dtype for one evaluation (velocity, observables, one step).
RTOL = {"float64": 1e-10, "float32": 1e-5}


def random_tokens(n, d, seed=0):
    x = np.random.default_rng(seed).standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def general_heads(H, d, seed=0, scale=1.0):
    """Non-symmetric M_h with V_h != M_h."""
    rng = np.random.default_rng(seed + 100)
    return [(scale * rng.standard_normal((d, d)) / np.sqrt(d), scale * rng.standard_normal((d, d)) / np.sqrt(d))
            for _ in range(H)]


def symmetric_heads(H, d, seed=0, scale=1.0):
    """Symmetric M_h with V_h = M_h (the energy-consistent case of Theorem 11)."""
    rng = np.random.default_rng(seed + 200)
    out = []
    for _ in range(H):
        a = rng.standard_normal((d, d))
        m = scale * (a + a.T) / (2 * np.sqrt(d))
        out.append((m, m))
    return out


def rel_err(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


@pytest.fixture
def tmp_run_dir(tmp_path):
    return tmp_path / "run"


def pytest_terminal_summary(terminalreporter):
    """Say which comparison the golden runs made (bitwise on the recording machine)."""
    module = sys.modules.get("test_golden")
    for line in getattr(module, "GOLDEN_MODES", []):
        terminalreporter.write_line(line)
