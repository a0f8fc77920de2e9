"""`particles plot` on runs of every bundled scene, alone and twin pairs overlaid (issue 32)."""
from __future__ import annotations

import pytest

from cli_runner import particles_cli


def _run(name, out, steps=10):
    proc = particles_cli("run", name, "--out", out, "--steps", steps, "--no-render", "--quiet")
    assert proc.returncode == 0, proc.stderr
    return out


def test_plot_a_run_whose_scene_writes_an_array_of_heads(tmp_path):
    """radial_shadow_sphere writes [[heads]]: its scene.toml's heads are a list (an AttributeError
    in the title, exit 1, before)."""
    run = _run("radial_shadow_sphere", tmp_path / "r")
    proc = particles_cli("plot", run)
    assert proc.returncode == 0, proc.stderr
    assert (run / "summary.png").is_file() and (run / "summary.svg").is_file()
    from particles.app.figures import run_title as _run_title
    assert _run_title(run) == "radial_shadow_sphere    n = 32, d = 4, H = 2, rule = exp, \u03b2 = 1"


def test_the_title_names_every_layers_rule_and_heads_own_rules():
    import tomllib
    from scenes import load_scene
    from particles.app.summary import scene_title
    data = tomllib.loads(load_scene("three_layers").to_toml())
    assert scene_title(data) == ("three_layers    n = 48, d = 3, H = 2, layer 0: softmax, layer 1 from t = 4: "
                                 "relu, layer 2 from t = 8: softmax causal, \u03b2 = 4")
    data = tomllib.loads(load_scene("quickstart", overrides=['heads.rule="relu"']).to_toml())
    assert "rule = softmax (h0-1 relu)" in scene_title(data)
    assert scene_title({"tokens": {}}) is None


# --------------------------------------------------------------------------- the summary figure
def _fake_log(n_heads=2, rows=41, one_head_zeros=False):
    import numpy as np
    t = np.linspace(0.0, 4.0, rows)
    log = {"step": np.arange(rows), "time": t, "energy": 1 + t, "kinetic": np.exp(-t), "eps": np.exp(-t)}
    for h in range(n_heads):
        log[f"energy_h{h}"] = (1 + t) * (h + 1) / n_heads
        log[f"radial_dominance_h{h}"] = np.zeros(rows) if one_head_zeros else 0.3 + 0.1 * h + t
        log[f"entropy_mean_h{h}"] = 2.0 - 0.01 * h * t
    return log


def _axes_by_title(fig):
    return {ax.get_title(loc="left").split(":")[0]: ax for ax in fig.axes if ax.get_visible()}


def test_the_summary_leaves_out_quantities_zero_throughout_and_says_so():
    from render.figures import ZERO_NOTE, summary_figure
    fig = summary_figure(_fake_log(n_heads=1, one_head_zeros=True))
    axes = _axes_by_title(fig)
    assert "radial_dominance" not in axes and {"energy", "kinetic", "eps", "entropy_mean"} <= set(axes)
    assert fig._supxlabel.get_text() == f"{ZERO_NOTE}: radial_dominance"


def test_twelve_heads_get_twelve_colours_and_one_legend_naming_each():
    import numpy as np
    from matplotlib.colors import to_hex
    from render.figures import summary_figure
    fig = summary_figure(_fake_log(n_heads=12))
    lines = [ln for ln in _axes_by_title(fig)["radial_dominance"].lines if ln.get_label().startswith("head")]
    assert len(lines) == 12 and len({to_hex(ln.get_color()) for ln in lines}) == 12
    legend, = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [f"head {h}" for h in range(12)]
    assert len({to_hex(h.get_color()) for h in legend.legend_handles}) == 12
    assert np.all([ax.get_legend() is None for ax in fig.axes if ax.get_title(loc="left").startswith("radial")])


def test_theory_values_are_drawn_in_their_subplots():
    import numpy as np
    from render.figures import Reference, summary_figure
    log = _fake_log()
    refs = [Reference("radial_dominance", "c*(2) = 0.618", 0.618),
            Reference("kinetic", "dE/dt from E", times=log["time"], values=np.exp(-log["time"]))]
    axes = _axes_by_title(summary_figure(log, references=refs))
    assert "c*(2) = 0.618" in [ln.get_label() for ln in axes["radial_dominance"].lines]
    kinetic = {ln.get_label(): ln for ln in axes["kinetic"].lines}
    assert set(kinetic) == {"kinetic", "dE/dt from E"}           # the identity on one axis
    assert axes["kinetic"].get_title(loc="left").endswith("and $dE/dt$")


def test_references_of_a_run_come_from_its_scene():
    """c*(H) for several heads on the sphere; the equiangular ODE of theory.py at the run's
    times for heterogeneous_heads; dE/dt from E only where Theorem 11 holds (rule exp)."""
    import tomllib
    import numpy as np
    from particles import theory
    from particles.app.figures import references
    from scenes import load_scene

    def refs_of(name, **changes):
        data = tomllib.loads(load_scene(name).replace(**changes).to_toml() if changes else load_scene(name).to_toml())
        t = np.linspace(0.0, 2.0, 201)
        return {r.label: r for r in references(data, {"time": t, "energy": 1 + t - np.exp(-3 * t)})}, t

    refs, t = refs_of("heterogeneous_heads")
    assert refs["c*(2) = 0.618 (Theorem 19)"].value == theory.c_star(2)
    ode = refs["equiangular ODE"]
    np.testing.assert_allclose(ode.values, theory.equiangular_curve(0.0, [3.0, 7.0], 1.0, 16, ode.times), rtol=0)
    assert not any(label.startswith("$dE/dt$") for label in refs)            # softmax: no identity
    refs, t = refs_of("energy_monotone")
    rate = next(r for label, r in refs.items() if label.startswith("$dE/dt$"))
    np.testing.assert_allclose(rate.values, np.gradient(1 + t - np.exp(-3 * t), t)[np.isin(t, rate.times)])
    assert "equiangular ODE" not in refs
    refs, _ = refs_of("relu_vs_softmax_relu")
    assert not any(r.quantity == "radial_dominance" for r in refs.values())   # one head: no rho lines
    refs, _ = refs_of("radial_shadow_flat")
    assert not any(r.quantity == "radial_dominance" for r in refs.values())   # flat: no radial shadow


# ------------------------------------------------ twin pairs (every bundled scene alone: test_bundled_scenes.py)
TWINS = [("heterogeneous_heads", "homogeneous_heads"), ("critical_beta_h2_below", "critical_beta_h2_above"),
         ("relu_vs_softmax_relu", "relu_vs_softmax_softmax"), ("alibi_vs_none_alibi", "alibi_vs_none_none")]


@pytest.fixture(scope="module")
def twin_runs(tmp_path_factory):
    """heterogeneous_heads and homogeneous_heads, 30 steps each (t = 0.3)."""
    folder = tmp_path_factory.mktemp("twins")
    return [_run(name, folder / name, steps=30) for name in TWINS[0]]


@pytest.mark.parametrize("pair", [pytest.param(p, marks=pytest.mark.slow, id=p[0]) for p in TWINS[1:]])
def test_each_twin_pair_plots_on_one_axis(pair, tmp_path):
    _plot_pair([_run(name, tmp_path / name, steps=20) for name in pair], tmp_path)


def test_the_heterogeneous_pair_plots_on_one_axis(twin_runs, tmp_path):
    _plot_pair(twin_runs, tmp_path)


def _plot_pair(runs, tmp_path):
    import matplotlib.image as mpimg
    proc = particles_cli("plot", *runs, "--out", tmp_path / "both")
    assert proc.returncode == 0, proc.stderr
    assert "wrote " + str(tmp_path / "both.png") in proc.stdout
    assert mpimg.imread(tmp_path / "both.png").shape[1] > 1000


def test_the_comparison_overlays_both_runs_and_the_ode(twin_runs):
    """heterogeneous vs homogeneous: both gamma_bar curves and each one's ODE on one axis, the
    measured curve on theory.equiangular_curve (float32 run: 6e-7 apart over the whole run, t = 2)."""
    import numpy as np
    from render.figures import comparison_figure
    from particles.app.figures import read_log, references, scene_data
    runs = []
    for name, run in zip(TWINS[0], twin_runs):
        run_dir, cols, _ = read_log(run)
        runs.append((name, cols, references(scene_data(run_dir), cols)))
    axes = _axes_by_title(comparison_figure(runs))
    labels = [ln.get_label() for ln in axes["gamma_bar"].lines]
    assert labels[:2] == ["heterogeneous_heads", "equiangular ODE"] and "homogeneous_heads" in labels
    het, ode = axes["gamma_bar"].lines[:2]
    t = het.get_xdata()
    assert np.abs(np.interp(t, ode.get_xdata(), ode.get_ydata()) - het.get_ydata()).max() < 2e-5   # 6e-7 measured to t = 2


def test_a_sweep_folder_is_plotted_alone(tmp_path, twin_runs):
    (tmp_path / "sweep.json").write_text('{"kind": "sweep"}')
    proc = particles_cli("plot", twin_runs[0], tmp_path)
    assert proc.returncode == 2 and "plot it alone" in proc.stderr


def test_each_twin_documents_its_comparison_command():
    """The one line that runs a pair and plots it on one axis, in both scenes' header comments
    and in scenes/README.md, naming the pair's own scenes."""
    import re
    from pathlib import Path
    from scenes import bundled_scenes
    readme = (Path(__file__).resolve().parents[1] / "scenes" / "README.md").read_text(encoding="utf-8")
    for a, b in TWINS:
        lines = set()
        for name in (a, b):
            header = bundled_scenes()[name][0].read_text(encoding="utf-8").split("\nname = ")[0]
            lines |= {m.strip() for m in re.findall(r"^#\s+(particles run .*)$", header, flags=re.M)}
        line, = lines
        assert re.fullmatch(rf"particles run {a} --out (\S+) && particles run {b} --out (\S+) && "
                            r"particles plot \1 \2", line), line
        assert line in readme.splitlines()


def test_the_comparison_names_equal_heads_and_runs_without_a_quantity():
    import numpy as np
    from render.figures import comparison_figure
    equal, masked = _fake_log(n_heads=4), _fake_log(n_heads=4)
    for h in range(4):
        equal[f"radial_dominance_h{h}"] = equal["radial_dominance_h0"]
        masked[f"radial_dominance_h{h}"] = masked["radial_dominance_h0"] * (1 + h)
    masked["energy"] = np.full_like(masked["energy"], np.nan)
    axes = _axes_by_title(comparison_figure([("none", equal, []), ("alibi", masked, [])]))
    assert [t.get_text() for t in axes["radial_dominance"].get_legend().get_texts()] == [
        "none (all 4 heads equal)", "alibi"]
    assert [t.get_text() for t in axes["energy"].get_legend().get_texts()] == [
        "none", "alibi (NaN throughout: no potential)"]
