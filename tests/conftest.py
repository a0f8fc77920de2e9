import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import reference`
os.environ.setdefault("MPLBACKEND", "Agg")
# the built-in tiles unless a test asks for others (particles.tuning): nothing measured or cached
os.environ["PARTICLES_TUNING"] = "off"

# Taichi's compiled kernels for the test run (this process, xdist workers, every particles
# process a test starts: they inherit it) in a cache of their own, so that the machine's cache,
# e.g. a stale lock left in ~/.cache/taichi by a killed process, cannot change a message or a
# result. Kept between runs and checkouts (Taichi keys each kernel by its source and
# settings): a cold cache made the whole suite 1.6x slower (720 s against ~450 s on a
# 2-core EPYC; a fresh CI checkout is always cold inside the checkout). A lock in it older
# than any save (a test process killed while saving) is ours to remove.
KERNEL_CACHE = Path(os.environ.get("PARTICLES_TEST_KERNEL_CACHE")
                    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "particles" / "test-kernels")
os.environ["TI_OFFLINE_CACHE_FILE_PATH"] = str(KERNEL_CACHE)
KERNEL_CACHE.mkdir(parents=True, exist_ok=True)
try:
    from particles.rule_check import stale_cache_lock   # (imports taichi, does not start it)
    if stale_cache_lock(KERNEL_CACHE) is not None:
        (KERNEL_CACHE / "ticache.lock").unlink()
except OSError:
    pass

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


def engine_matrix(paths=("fused", "tiled"), rules=("exp", "softmax", "relu")):
    """(rule, H, geometry, dtype, path) for every combination; the default run (not the slow
    tier) keeps, on each path, each rule once, with dtype, geometry and H each taking both values
    among them (each combination compiles its own kernels, the suite's main cost)."""
    import itertools
    fast = set()
    rotations = [("float64", "sphere", 1), ("float32", "flat", 3), ("float32", "sphere", 3), ("float64", "flat", 1)]
    for p_i, path in enumerate(paths):
        for r_i, rule in enumerate(rules):
            dtype, geometry, H = rotations[(p_i + r_i) % len(rotations)]
            fast.add((rule, H, geometry, dtype, path))
    out = []
    for rule, H, geometry, dtype, path in itertools.product(rules, (1, 3), ("sphere", "flat"),
                                                             ("float64", "float32"), paths):
        key = (rule, H, geometry, dtype, path)
        out.append(pytest.param(*key, id="-".join(map(str, key)),
                                marks=() if key in fast else pytest.mark.slow))
    return out


def rel_err(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


@pytest.fixture(autouse=True)
def unwrapped_messages(monkeypatch):
    """Error paragraphs wrap at the terminal's width (COLUMNS): unwrapped, a message's words
    can be matched whatever the length of the temporary paths inside it. Set per test, so
    pytest's own output keeps the real width."""
    monkeypatch.setenv("COLUMNS", "100000")


@pytest.fixture
def tmp_run_dir(tmp_path):
    return tmp_path / "run"


_GOLDEN_MODES: list[str] = []


def pytest_collection_modifyitems(config, items):
    """The default run (README's command, CI) leaves out the exhaustive tier marked slow. Any
    -m expression chooses for itself (`-m slow`, `-m "slow or not slow"`), and a test named by
    its node id (file::name) runs whatever its tier, as a developer who names it expects."""
    if config.option.markexpr or any("::" in str(arg) for arg in config.args):
        return
    slow = [item for item in items if "slow" in item.keywords]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if "slow" not in item.keywords]


def pytest_sessionfinish(session):
    """Save this process's compiled kernels now, one process at a time. Left to Taichi's exit,
    two xdist workers ending together race for the cache's lock: one warned 'Lock ... failed'
    and saved nothing, the other was ended while saving and left the lock standing, so a run
    kept none of the kernels it compiled and the next run compiled them again."""
    taichi = sys.modules.get("taichi")
    if taichi is None:
        return
    import fcntl
    with open(KERNEL_CACHE / "particles-save.lock", "w") as turn:
        fcntl.flock(turn, fcntl.LOCK_EX)   # released when the file closes
        taichi.reset()


def pytest_runtest_logreport(report):
    """Collect which comparison each golden run made (reports reach the controlling process
    from xdist workers, module globals do not)."""
    for key, line in report.user_properties:
        if key == "golden_mode" and line not in _GOLDEN_MODES:
            _GOLDEN_MODES.append(line)


def pytest_terminal_summary(terminalreporter):
    """Say which comparison the golden runs made (bitwise on the recording machine)."""
    for line in _GOLDEN_MODES:
        terminalreporter.write_line(line)
