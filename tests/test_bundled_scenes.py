"""Every bundled scene loads, validates, runs a few steps headless and plots (issue 32: `particles
plot` on every bundled scene's run; the twin pairs in tests/test_plot_runs.py)."""
import numpy as np
import pytest

from particles.output import load_log
from particles.app.run import run_scene
from scenes import bundled_scenes, load_scene
from minilm import skip_without_minilm
from cli_runner import particles_cli


# the fast tier runs these; the others (each compiling its own kernels) only in the full suite
FAST = {"quickstart", "three_layers", "causal_kpr", "relu_vs_softmax_relu", "radial_shadow_flat"}


@pytest.fixture
def png_only(monkeypatch):
    """`particles plot` without its SVG: the same figure drawn a second time (its 16 panels'
    constrained layout again), half of the plot's ~4 s a scene here. The PNG's drawing meets
    what a scene can break (titles, log axes, references); the SVG is test_cli's and
    test_plot_runs'."""
    import render.figures as figures
    real = figures.save_png_svg

    def png(fig, stem):
        savefig = fig.savefig
        fig.savefig = lambda path, **kw: None if str(path).endswith(".svg") else savefig(path, **kw)
        return real(fig, stem)

    monkeypatch.setattr(figures, "save_png_svg", png)


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(bundled_scenes())])
def test_bundled_scene_runs_a_few_steps(name, tmp_path, png_only):
    skip_without_minilm(name)
    scene = load_scene(name).replace(dynamics={"steps": 4}, log={"every": 1})
    result = run_scene(scene, tmp_path / name, render=False, progress=False, echo=lambda *a: None)
    assert result.status == "completed", result.message
    log = load_log(result.log)
    assert list(log["step"]) == [0, 1, 2, 3, 4]
    assert np.all(np.isfinite(log["gamma_bar"]))
    assert (tmp_path / name / "scene.toml").is_file()
    proc = particles_cli("plot", tmp_path / name)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / name / "summary.png").stat().st_size > 10_000
