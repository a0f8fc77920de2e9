"""What a notebook draws from memory (issue 32): Result.plot one line per replica labelled by
its beta, beta a coordinate of to_xarray, the summary figure and the film of `particles run`
from a Result, the turnable view from a Trajectory, a progress bar."""
from __future__ import annotations

import base64
import re
import sys
import types

import numpy as np
import pytest

import particles


@pytest.fixture(scope="module")
def ensemble():
    """Two replicas at beta 1 and 3, 16 tokens on S^2, two heads; tokens kept every 10 steps."""
    x = np.random.default_rng(0).standard_normal((2, 16, 3))
    sim = particles.Simulation(x, [particles.Head.scalar(1.0, 3), particles.Head.scalar(1.5, 3)],
                               beta=[1.0, 3.0], rule="softmax", dt=0.05)
    return sim.run(60, every=5, trajectory_every=10)


def test_an_ensemble_plots_one_line_per_replica_labelled_by_its_beta(ensemble):
    fig = ensemble.plot("eps", "radial_dominance")
    eps, heads = fig.axes
    assert [ln.get_label() for ln in eps.lines] == ["\u03b2 = 1", "\u03b2 = 3"]
    for line, r in zip(eps.lines, (0, 1)):
        np.testing.assert_array_equal(line.get_ydata(), ensemble["eps"][ensemble["replica"] == r])
    assert [ln.get_label() for ln in heads.lines] == ["radial_dominance_h0, \u03b2 = 1", "radial_dominance_h0, \u03b2 = 3",
                                                      "radial_dominance_h1, \u03b2 = 1", "radial_dominance_h1, \u03b2 = 3"]
    from matplotlib.colors import to_hex
    assert to_hex(heads.lines[0].get_color()) != to_hex(heads.lines[1].get_color())
    assert heads.lines[0].get_linestyle() != heads.lines[2].get_linestyle()


def test_to_xarray_keeps_each_replicas_beta(ensemble, monkeypatch):
    """beta a coordinate along replica (xarray itself optional: a stand-in records the call)."""
    seen = {}
    fake = types.ModuleType("xarray")
    fake.Dataset = lambda variables, coords: seen.update(variables=variables, coords=coords)
    monkeypatch.setitem(sys.modules, "xarray", fake)
    ensemble.to_xarray()
    dims, values = seen["coords"]["beta"]
    assert dims == "replica" and list(values) == [1.0, 3.0]
    assert seen["variables"]["energy"][0] == ("step", "replica", "head")


def test_the_summary_figure_from_memory_is_the_commands(ensemble):
    fig = ensemble.summary(replica=1)
    assert fig._suptitle.get_text().startswith("simulation    n = 16, d = 3, H = 2, rule = softmax, \u03b2 = 3")
    titles = {ax.get_title(loc="left").split(":")[0] for ax in fig.axes if ax.get_visible()}
    assert {"energy", "kinetic", "radial_dominance", "entropy_mean"} <= titles
    rho = next(ax for ax in fig.axes if ax.get_title(loc="left").startswith("radial_dominance"))
    assert "c*(2) = 0.618 (Theorem 19)" in [ln.get_label() for ln in rho.lines]


def test_the_film_from_memory_is_an_inline_video_of_the_projects_renderer(ensemble):
    import imageio.v3 as iio
    page = str(ensemble.animate(max_frames=5, width=480, height=270))
    assert page.startswith("<video") and 'src="data:video/mp4;base64,' in page
    frames = iio.imread(base64.b64decode(re.search(r"base64,([^\"]+)", page)[1]), index=None, extension=".mp4")
    assert frames.shape == (5, 270, 480, 3)
    assert frames[-1].std() > 10                                    # a drawn frame, not a blank one
    with pytest.raises(ValueError, match="needs the heads"):
        ensemble.trajectory.animate(color_by="radial")


def test_to_html_writes_one_offline_page(ensemble, tmp_path):
    path = ensemble.trajectory.to_html(tmp_path / "view.html", replica=1, max_frames=4)
    page = path.read_text(encoding="utf-8")
    assert page.count('"name":"') >= 4 and "<script src=" not in page
    with pytest.raises(ValueError, match="must end in .html"):
        ensemble.trajectory.to_html(tmp_path / "view.png")


def test_run_shows_a_progress_bar(capsys):
    x = np.random.default_rng(1).standard_normal((8, 3))
    sim = particles.Simulation(x, [particles.Head.scalar(1.0, 3)], beta=1.0, rule="softmax")
    res = sim.run(50, every=10, progress=True)
    err = capsys.readouterr().err
    assert "50/50" in err and "100%" in err
    assert list(res["step"]) == [0, 10, 20, 30, 40, 50]


def test_run_scene_hands_back_a_table_carrying_its_result_and_trajectory(tmp_path):
    from scenes import load_scene
    scene = load_scene("quickstart").replace(dynamics={"steps": 10})
    rr = particles.run_scene(scene, tmp_path / "run", render=False, progress=False, echo=lambda *a: None)
    assert repr(rr) == f"RunResult(status=completed, steps=10/10, arch=cpu, run_dir={tmp_path / 'run'})"
    page = rr._repr_html_()
    assert "<table" in page and "final eps" in page and "Condition 8" in page and len(page) < 3000
    res = rr.result
    assert list(res["step"]) == [0, 5, 10] and res.trajectory.tokens.shape == (3, 64, 3)   # every 5 steps
    np.testing.assert_array_equal(res.final_tokens, res.trajectory.tokens[-1])
    assert res.meta["scene"] == "quickstart" and rr.result is res
