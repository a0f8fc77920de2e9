"""A user rule that crashes or hangs is an exit-2 paragraph naming the rule (issue 27): the
probe evaluates it at its edge cases (i == j, i = 0, j = n - 1, z = 0, large |z|) in a
child process under a time limit. Each case runs `particles run` in a process of its own."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCENE = """
name = "probe"
[tokens]
n = 6
d = 3
[heads]
kind = "scalar"
[dynamics]
rule = "{rule}"
rule_file = "rule.py"
mask = "{mask}"
steps = 3
[render]
enabled = false
"""

RULES = {
    "divide_by_distance": ("causal", """
        import taichi as ti
        import particles

        def divide_by_distance(z, i, j, n):
            return ti.exp(z) * (1.0 + 1e-9 * (7 // (i - j)))     # i == j on the diagonal

        particles.register_rule("divide_by_distance", kernel=divide_by_distance, normalization="softmax")
    """, "SIGFPE"),
    "forever": ("none", """
        import taichi as ti
        import particles

        def forever(z):
            w = z
            while w > -1.0e30:
                w = w + 0.0
            return ti.exp(w)

        particles.register_rule("forever", kernel=forever, normalization="softmax")
    """, "did not return within"),
}


@pytest.mark.parametrize("name", [n if n != "forever" else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(RULES)])   # "forever" waits out the time limit
def test_a_rule_that_crashes_or_hangs_is_an_exit_2_paragraph(tmp_path, name):
    mask, code, says = RULES[name]
    (tmp_path / "rule.py").write_text(textwrap.dedent(code))
    (tmp_path / "scene.toml").write_text(SCENE.format(rule=name, mask=mask))
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg", PARTICLES_RULE_PROBE_SECONDS="6")
    proc = subprocess.run([sys.executable, "-m", "particles", "run", str(tmp_path / "scene.toml"),
                           "--out", str(tmp_path / "run"), "--quiet"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)
    err = " ".join(proc.stderr.split())
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert f"rule '{name}'" in err and says in err and "Traceback" not in err, err


POSITION_RULES = {   # issue 31.6: positions the first probe, (i, j, n) with n <= 3, never tried
    "off_by_five": (6, """
        import taichi as ti
        import particles

        def off_by_five(z, i, j, n):
            return ti.exp(z) * (1.0 + 1e-9 * (7 // (i - j - 5)))     # i - j = 5 needs n >= 6

        particles.register_rule("off_by_five", kernel=off_by_five, normalization="softmax")
    """, "SIGFPE", "with n = 6 tokens"),
    "at_its_own_n": (200, """
        import taichi as ti
        import particles

        def at_its_own_n(z, i, j, n):
            return ti.exp(z) * (1.0 + 1e-9 * (7 // (i - j - 150)))   # only where n > 150

        particles.register_rule("at_its_own_n", kernel=at_its_own_n, normalization="softmax")
    """, "SIGFPE", "with n = 200 tokens"),
    "hangs_above_five": (6, """
        import taichi as ti
        import particles

        def hangs_above_five(z, i, j, n):
            w = z
            while n > 5 and w > -1.0e30:
                w = w + 0.0
            return ti.exp(w)

        particles.register_rule("hangs_above_five", kernel=hangs_above_five, normalization="softmax")
    """, "did not return within", "with n = 6 tokens"),
}


@pytest.mark.parametrize("name", [n if n != "hangs_above_five" else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(POSITION_RULES)])   # the hang waits out the limit
def test_a_position_aware_rule_is_probed_beyond_three_tokens_and_at_the_scenes_n(tmp_path, name):
    n, code, says, where = POSITION_RULES[name]
    (tmp_path / "rule.py").write_text(textwrap.dedent(code))
    (tmp_path / "scene.toml").write_text(SCENE.format(rule=name, mask="none").replace("n = 6", f"n = {n}"))
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg", PARTICLES_RULE_PROBE_SECONDS="6")
    proc = subprocess.run([sys.executable, "-m", "particles", "run", str(tmp_path / "scene.toml"),
                           "--out", str(tmp_path / "run"), "--quiet"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)
    err = " ".join(proc.stderr.split())
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert f"rule '{name}'" in err and says in err and where in err and "Traceback" not in err, err


def test_advance_raises_where_a_rule_returns_nan():
    """Simulation.advance returned normally with NaN tokens (only run() raised): issue 31.6."""
    import numpy as np
    import taichi as ti
    import particles

    def nan_beyond_zero(z):
        return ti.exp(z) + ti.sqrt(z - 2.0)       # NaN for z < 2: every pair at beta = 1

    particles.register_rule("nan_beyond_zero", kernel=nan_beyond_zero, normalization="softmax")
    x = np.random.default_rng(0).standard_normal((8, 3))
    sim = particles.Simulation(x, [np.eye(3)], beta=1.0, dt=0.01, rule="nan_beyond_zero")
    with pytest.raises(particles.BlowUpError, match="blow-up at step 1: token"):
        sim.advance(1)
    assert sim.step_count == 1
    from particles.errors import ParticlesUserError
    with pytest.raises(ParticlesUserError, match="stopped with a BlowUpError"):
        sim.advance(1)                              # and it will not step on from there
    sim.set_state(x, step=0)
    sim.advance(2, check_finite=False)              # the caller's own cadence (the drive loop)
    assert not np.isfinite(sim.tokens).all()


NUMPY_RULE = """
import numpy as np
import particles


def numpy_sigmoid(z):
    return 1 / (1 + np.exp(-z))


particles.register_rule("numpy_sigmoid", kernel=numpy_sigmoid)
"""


def test_a_stale_kernel_cache_lock_leaves_the_rules_own_error_and_is_named(tmp_path):
    """A lock left in Taichi's kernel cache by a killed process (issue 31.12): the probe
    reported Taichi's "Lock ... failed" warning in place of the rule's own error."""
    cache = tmp_path / "ticache"
    cache.mkdir()
    lock = cache / "ticache.lock"
    lock.touch()
    os.utime(lock, (os.path.getmtime(lock) - 600,) * 2)   # ten minutes old: no save lasts that long
    (tmp_path / "rule.py").write_text(NUMPY_RULE)
    (tmp_path / "scene.toml").write_text(SCENE.format(rule="numpy_sigmoid", mask="none"))
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg", TI_OFFLINE_CACHE_FILE_PATH=str(cache))
    proc = subprocess.run([sys.executable, "-m", "particles", "run", str(tmp_path / "scene.toml"),
                           "--out", str(tmp_path / "run"), "--quiet"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = " ".join(proc.stderr.split())
    first = err[err.index("error:"):]
    assert "rule 'numpy_sigmoid'" in first and "kernel function 'numpy_sigmoid'" in first, err
    assert "failed when evaluated" not in first, err   # the rule's own error, not the lock warning
    assert "np.exp" in first and "Traceback" not in err, err
    assert f"kernel-cache lock '{lock}' is 10 min old and no process holds it" in first, err
    assert f"Remove it (rm '{lock}')" in first, err


def test_a_fresh_lock_is_not_called_stale(tmp_path):
    from particles.rule_check import stale_cache_lock, stale_cache_lock_note
    assert stale_cache_lock(tmp_path) is None and stale_cache_lock_note(tmp_path) == ""
    (tmp_path / "ticache.lock").touch()
    assert stale_cache_lock(tmp_path) is None           # a save in progress
    lock, age = stale_cache_lock(tmp_path, now=os.path.getmtime(tmp_path / "ticache.lock") + 61)
    assert lock == tmp_path / "ticache.lock" and 60 < age < 62


def test_the_test_run_compiles_into_a_private_kernel_cache():
    """The suite must not depend on the machine's kernel cache (~/.cache/taichi): its own."""
    import taichi as ti
    from conftest import KERNEL_CACHE
    from particles import backend
    backend.init("cpu")
    used = Path(ti.lang.impl.current_cfg().offline_cache_file_path)
    machines = Path.home() / ".cache" / "taichi"   # Taichi's default cache, the machine's
    assert used == KERNEL_CACHE and machines not in (used, *used.parents)
    child = subprocess.run([sys.executable, "-c", "from particles.rule_check import kernel_cache_dir; "
                            "print(kernel_cache_dir())"], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert child.stdout.strip().splitlines()[-1] == str(KERNEL_CACHE), child.stderr
