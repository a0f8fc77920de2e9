"""The notebook-first API (issue 26): rich display, load_log as a Result, to_xarray, plot, progress."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest

from particles.result import Result, Trajectory


def _result(ensemble=False):
    rows = []
    for step in (0, 10, 20):
        for b in ((0, 1) if ensemble else (0,)):
            row = {"step": step, "time": step * 0.01}
            if ensemble:
                row["replica"] = b
            row.update({"eps": 1.0 / (1 + step + b), "energy_h0": 1.0 + step, "energy_h1": 2.0 + step,
                        "clusters": 3})
            rows.append(row)
    return Result.from_rows(rows, final_tokens=np.zeros((4, 3)))


def test_result_displays_rows_steps_and_columns():
    res = _result()
    text = repr(res)
    assert text.startswith("Result(rows=3, columns=6, steps=0 .. 20 (3 observed), time=0 .. 0.2, "
                           "final tokens=4x3)")
    assert "columns: step, time, eps, energy_h0, energy_h1, clusters" in text
    html = res._repr_html_()
    assert "<th style='text-align:left;padding-right:1em'>rows</th><td style='text-align:left'>3</td>" in html
    assert "columns: step, time, eps" in html


def test_result_is_a_mapping_with_completable_columns():
    res = _result()
    assert "eps" in res and dict(res).keys() == set(res.columns) and list(res) == res.columns
    assert {"eps", "energy_h0", "clusters"} <= set(dir(res))


def test_trajectory_displays_frames_and_meta():
    traj = Trajectory(np.array([0, 5]), np.array([0.0, 0.05]), np.zeros((2, 6, 3)),
                      {"scene": "quickstart", "n": 6, "d": 3, "n_heads": 2, "beta": [1.0], "rule": "exp"})
    assert repr(traj) == ("Trajectory(frames=2, tokens=2x6x3, steps=0 .. 5, time=0 .. 0.05, "
                          "scene=quickstart, n=6, d=3, heads=2, rule=exp, beta=1)")
    assert "<strong>Trajectory</strong>" in traj._repr_html_()
    steps, times, tokens, meta = traj            # still unpacks as the 4-tuple


def test_simulation_displays_what_it_is():
    import particles
    from particles import Head
    rng = np.random.default_rng(0)
    sim = particles.Simulation(rng.standard_normal((8, 3)), [Head.scalar(1.0, 3), Head.scalar(0.5, 3)],
                               beta=2.0, rule="softmax", dt=0.05, arch="cpu")
    sim.advance(2)
    text = repr(sim)
    assert text.startswith("Simulation(n=8, d=3, heads=2, rule=softmax, beta=2, geometry=sphere, dt=0.05, "
                           "integrator=rk4, dtype=float32, arch=cpu, path=")
    assert text.endswith("step=2, time=0.1)")
    html = sim._repr_html_()
    assert "<strong>Simulation</strong>" in html and ">softmax</td>" in html


def test_load_log_returns_a_result(tmp_path):
    from particles.output import load_log
    (tmp_path / "log.csv").write_text("step,time,eps\n0,0,1\n10,0.1,0.5\n")
    log = load_log(tmp_path)
    assert isinstance(log, Result) and log.step.dtype == np.int64 and log["eps"][-1] == 0.5
    assert repr(log).startswith("Result(rows=2, columns=3, steps=0 .. 10")


def test_result_to_xarray_has_step_replica_head_dims():
    xr = pytest.importorskip("xarray")
    ds = _result(ensemble=True).to_xarray()
    assert isinstance(ds, xr.Dataset)
    assert ds["energy"].dims == ("step", "replica", "head") and ds["energy"].shape == (3, 2, 2)
    assert ds["eps"].dims == ("step", "replica")
    assert float(ds["energy"].sel(step=10, replica=1, head=1)) == 12.0
    assert list(ds["time"].values) == [0.0, 0.1, 0.2]
    assert _result().to_xarray()["energy"].dims == ("step", "head")


def test_result_to_xarray_names_the_install_without_xarray(monkeypatch):
    monkeypatch.setitem(sys.modules, "xarray", None)
    with pytest.raises(ImportError, match=r"pip install xarray"):
        _result().to_xarray()


def test_result_plot_draws_default_and_per_head_panels():
    import matplotlib
    matplotlib.use("Agg")
    res = _result()
    fig = res.plot()
    assert [a.get_ylabel() for a in fig.axes] == ["eps", "energy", "clusters"] or \
        [a.get_ylabel() for a in fig.axes] == ["eps", "clusters"]
    fig = res.plot("energy")
    assert [ln.get_label() for ln in fig.axes[0].lines] == ["energy_h0", "energy_h1"]
    with pytest.raises(ValueError, match="no column 'nope'; columns: step, time"):
        res.plot("nope")


def test_result_plot_is_not_left_open_in_pyplot_so_a_notebook_shows_it_once():
    import io
    import matplotlib.pyplot as plt
    before = plt.get_fignums()
    fig = _result().plot("energy")
    assert plt.get_fignums() == before            # the inline backend has nothing of it to show again
    png = io.BytesIO()
    fig.savefig(png, format="png")
    assert png.getvalue().startswith(b"\x89PNG") and fig.axes[0].get_ylabel() == "energy"


def test_progress_uses_the_notebook_bar_in_jupyter(monkeypatch):
    from particles.app import progress
    made = {}

    class FakeBar:
        def __init__(self, **kw):
            made.update(kw)

        def update(self, n):
            made["n"] = n

        def close(self):
            pass

    monkeypatch.setattr(progress, "in_notebook", lambda: True)
    monkeypatch.setitem(sys.modules, "tqdm.auto", SimpleNamespace(tqdm=FakeBar))
    bar = progress.Progress(100)
    bar.update(5)
    assert made["total"] == 100 and made["n"] == 5


def test_not_a_notebook_outside_jupyter():
    from particles.app.progress import in_notebook
    assert in_notebook() is False


def test_run_keeps_the_tokens_when_asked():
    import particles
    from particles import Head
    rng = np.random.default_rng(1)
    sim = particles.Simulation(rng.standard_normal((6, 3)), [Head.scalar(1.0, 3)], beta=1.0, dt=0.1, arch="cpu")
    res = sim.run(10, every=5, trajectory_every=4)
    traj = res.trajectory
    assert list(traj.steps) == [0, 4, 8, 10] and traj.tokens.shape == (4, 6, 3)
    assert np.allclose(traj.tokens[-1], res.final_tokens) and traj.meta["n"] == 6
    assert "trajectory=4 frames" in repr(res)
    assert sim.run(2).trajectory is None
    with pytest.raises(Exception, match="trajectory_every"):
        sim.run(2, trajectory_every=-1)


@pytest.mark.parametrize("d", [2, 3])
def test_trajectory_animates_inline(d):
    rng = np.random.default_rng(2)
    tokens = rng.standard_normal((5, 7, d))
    traj = Trajectory(np.arange(5) * 10, np.arange(5) * 0.1, tokens, {})
    html = traj.animate(max_frames=3, width=320, height=180)._repr_html_()   # the film's renderer, inline
    assert html.startswith("<video") and "data:video/mp4;base64," in html
    import base64
    import imageio.v3 as iio
    video = base64.b64decode(html.split("base64,")[1].split('"')[0])
    assert iio.imread(video, index=None, extension=".mp4").shape[:3] == (3, 180, 320)


NOTEBOOK_STDOUT = """
import io, sys
class KernelStream(io.TextIOBase):   # stands in for ipykernel's OutStream: not a real file
    def write(self, text):
        sys.__stdout__.write(text)
        return len(text)
sys.stdout = KernelStream()
import numpy as np, particles
particles.Simulation(np.eye(3)[:2], [(np.eye(3), np.eye(3))]).advance(1)
"""


def test_a_notebook_cell_gets_no_taichi_info_lines():
    """Taichi's "Graphical python shell detected" info line (and any warning about our own
    log settings) stays out of the first notebook cell."""
    import subprocess
    proc = subprocess.run([sys.executable, "-c", NOTEBOOK_STDOUT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout + proc.stderr
    assert "Graphical python shell" not in said and "overridden" not in said, said
