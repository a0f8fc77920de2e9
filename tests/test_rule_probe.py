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
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg", PARTICLES_RULE_PROBE_SECONDS="15")
    proc = subprocess.run([sys.executable, "-m", "particles", "run", str(tmp_path / "scene.toml"),
                           "--out", str(tmp_path / "run"), "--quiet"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)
    err = " ".join(proc.stderr.split())
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert f"rule '{name}'" in err and says in err and "Traceback" not in err, err
