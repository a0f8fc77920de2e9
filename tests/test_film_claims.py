"""The film shows what its scene claims: panels chosen from what the run has, theory beside
measurement (c*(H), the equiangular ODE, Theorem 11's identity), layer switches, a colour per
head for any number of heads, the end of the motion passed over, a camera that faces the
tokens. Fabricated tokens and logs, except where the app's facts about a bundled scene are
checked (no simulation is run)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from render import Animation, RenderConfig, RunInfo
from render.panels import available_panels

SMALL = dict(width=480, height=270, fps=10)


def info(n_heads=2, geometry="sphere", d=3, n=12, **kw) -> RunInfo:
    return RunInfo("claims", 1.0, "exp", n_heads, n, d, geometry, **kw)


def log_of(times, n_heads=2, **extra):
    t = np.asarray(times, float)
    log = {"time": t, "energy": 1 + t ** 2, "kinetic": 2 * t, "gamma_bar": np.tanh(t)}
    for h in range(n_heads):
        log[f"energy_h{h}"] = (1 + t ** 2) / n_heads
        log[f"radial_dominance_h{h}"] = 0.5 * (1 + h) * np.exp(t)
        log[f"entropy_mean_h{h}"] = (1 - 0.5 * np.exp(-t)) * (1 + 0.01 * h)
    log.update(extra)
    return log


def sphere_tokens(n, seed=0):
    x = np.random.default_rng(seed).standard_normal((n, 3))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def film(path, cfg, inf, logs, xs, t_end=None, values=None):
    with Animation(path, cfg, inf, t_end=t_end) as anim:
        for k, (x, log) in enumerate(zip(xs, logs)):
            anim.add_frame(x, float(log["time"][-1]), log, None if values is None else values[k])
    return anim


# --------------------------------------------------------------------------- which panels
def test_panels_follow_from_what_the_run_has():
    log = log_of([0.0])
    wanted = ("energy", "energy_rate", "radial_dominance", "entropy", "gamma_bar")
    assert available_panels(wanted, log, info(1)) == ["energy", "entropy", "gamma_bar"]   # one head: no rho
    assert available_panels(wanted, log, info(2, geometry="flat")) == ["energy", "entropy", "gamma_bar"]
    assert available_panels(wanted, log, info(2)) == ["energy", "radial_dominance", "entropy", "gamma_bar"]
    assert available_panels(wanted, log, info(2, gradient_flow=True)) == \
        ["energy", "energy_rate", "radial_dominance", "entropy"]                           # at most four
    nan = {**log, "energy": np.array([np.nan])}
    assert available_panels(("energy", "gamma_bar"), nan, info(2)) == ["gamma_bar", "energy"]  # no potential: last


def test_one_heads_energy_panel_draws_the_total_once():
    from render.panels import panel_columns
    assert panel_columns("energy", log_of([0.0], 1), 1) == [("energy", "total")]
    assert [c for c, _ in panel_columns("energy", log_of([0.0], 3), 3)] == ["energy", "energy_h0", "energy_h1", "energy_h2"]


# --------------------------------------------------------------------------- theory beside measurement
def test_rho_panel_is_log_from_the_first_frame_with_c_star_beside_one(tmp_path):
    """The quickstart's rho axis switched from linear to log mid-film; critical_beta compared rho
    only with 1. Now log from frame one, with c*(2) = 0.618 drawn."""
    inf = info(2, c_star=(math.sqrt(5) - 1) / 2)
    times = np.linspace(0, 3, 4)
    full = log_of(times)
    logs = [{k: v[:i + 1] for k, v in full.items()} for i in range(4)]
    anim = film(tmp_path / "rho.gif", RenderConfig(panels=("radial_dominance",), **SMALL), inf, logs,
                [sphere_tokens(12, k) for k in range(4)], t_end=3.0)
    panel = anim._panels.panels[0]
    assert panel.ax.get_yscale() == "log"
    assert any(abs(line.get_ydata()[0] - 0.618034) < 1e-6 for line in panel.ax.get_lines()
               if len(line.get_ydata()) == 2)
    assert any("c^*(2)" in t.get_text() for t in panel.ax.texts)


def test_gamma_bar_panel_draws_the_theory_curve_whole_from_the_first_frame(tmp_path):
    t = np.linspace(0, 2, 50)
    ode = np.tanh(t)
    inf = info(2, theory={"gamma_bar": [(t, ode, "equiangular ODE")]})
    anim = film(tmp_path / "g.gif", RenderConfig(panels=("gamma_bar",), **SMALL), inf, [log_of([0.0])],
                [sphere_tokens(12)], t_end=2.0)
    panel = anim._panels.panels[0]
    (theory,) = panel.theory
    assert np.array_equal(theory.get_ydata(), ode) and theory.get_label() == "equiangular ODE"
    assert "equiangular ODE" in [x.get_text() for x in panel.legend.get_texts()]


def test_energy_rate_panel_overlays_the_energys_rate_and_the_kinetic_term(tmp_path):
    """Theorem 11 on one axis: the rate of the logged E (finite differences at the rows'
    midpoints) against the kinetic column; for E = 1 + t^2 and kinetic 2t they coincide."""
    times = np.linspace(0, 2, 21)
    full = log_of(times)
    inf = info(2, gradient_flow=True)
    anim = film(tmp_path / "e.gif", RenderConfig(panels=("energy", "energy_rate"), **SMALL), inf,
                [{k: v[:i + 1] for k, v in full.items()} for i in (0, 20)], [sphere_tokens(12, k) for k in (0, 1)],
                t_end=2.0)
    rate = anim._panels.panels[1]
    assert rate.name == "energy_rate" and rate.ax.get_yscale() == "log"
    kinetic, de = rate.lines
    tm, r = de.get_data()
    assert np.allclose(tm, 0.5 * (times[1:] + times[:-1])) and np.allclose(r, 2 * tm)
    assert np.allclose(kinetic.get_data()[1], 2 * times)


def test_huge_energies_are_drawn_on_a_log_axis_or_as_relative_change(tmp_path):
    """MiniLM's energies run from 0.007 to 5e14 at t = 0 (1e246 later): a linear axis drew one
    curve with a 1e15 offset, and a relative change made one head's 1e231 the whole axis. Positive
    energies go on a log axis from the first frame; huge ones of either sign as relative change."""
    times = np.linspace(0, 1, 3)
    full = log_of(times, 12)
    for h in range(12):
        full[f"energy_h{h}"] = 10.0 ** (h * 1.5 - 2) * (1 + times)
    full["energy"] = sum(full[f"energy_h{h}"] for h in range(12))
    steps = [{k: v[:i + 1] for k, v in full.items()} for i in range(3)]
    anim = film(tmp_path / "m.gif", RenderConfig(panels=("energy",), **SMALL), info(12), steps,
                [sphere_tokens(12, k) for k in range(3)], t_end=1.0)
    panel = anim._panels.panels[0]
    assert panel.ax.get_yscale() == "log" and panel.energy0 is None
    assert "log" in panel.ax.get_title(loc="left")
    signed = {**full, "energy_h0": -1e15 * (1 + 0.01 * times), "energy": 1e15 * (1 + 0.01 * times)}
    anim = film(tmp_path / "s.gif", RenderConfig(panels=("energy",), **SMALL), info(12),
                [{k: v[:i + 1] for k, v in signed.items()} for i in range(3)],
                [sphere_tokens(12, k) for k in range(3)], t_end=1.0)
    panel = anim._panels.panels[0]
    assert panel.ax.get_yscale() == "linear" and "E(0)" in panel.ax.get_title(loc="left")
    assert np.allclose(panel.lines[0].get_data()[1], 0.01 * times)


def test_twelve_heads_get_twelve_colours_and_a_legend(tmp_path):
    from render.colors import head_colors
    cols = head_colors(12)
    assert len({tuple(np.round(c, 3)) for c in cols}) == 12
    anim = film(tmp_path / "h.gif", RenderConfig(panels=("entropy",), **SMALL), info(12), [log_of([0.0], 12)],
                [sphere_tokens(12)], t_end=1.0)
    panel = anim._panels.panels[0]
    assert [t.get_text() for t in panel.legend.get_texts()] == [f"h{h}" for h in range(12)]
    assert len({tuple(np.round(line.get_color(), 3)) if not isinstance(line.get_color(), str) else line.get_color()
                for line in panel.lines}) == 12


def test_layer_switches_are_marked_in_the_panels(tmp_path):
    times = np.arange(0.0, 12.0, 1.0)
    full = log_of(times, layer=np.repeat([0, 1, 2], 4))
    anim = film(tmp_path / "l.gif", RenderConfig(panels=("gamma_bar",), **SMALL), info(2), [full],
                [sphere_tokens(12)], t_end=12.0)
    panel = anim._panels.panels[0]
    assert panel.layer_marks == [4.0, 8.0]
    assert [t.get_text().strip() for t in panel.ax.texts if "layer" in t.get_text()] == ["layer 1", "layer 2"]


def test_the_claim_and_the_alibi_slopes_are_in_the_frame(tmp_path):
    inf = info(4, claim="ALiBi slows the first merges", alibi_slopes=(0.25, 0.0625, 0.015625, 0.00390625))
    with Animation(tmp_path / "a.gif", RenderConfig(**SMALL), inf) as anim:
        anim.add_frame(sphere_tokens(12), 0.0, log_of([0.0], 4))
        assert "ALiBi slows the first merges" in [t.get_text() for t in anim._fig.texts]
        assert "ALiBi slopes m_h = 1/4, 1/16, 1/64, 1/256" in anim._info_text.get_text()


# --------------------------------------------------------------------------- the end of the motion
def test_a_film_passes_over_frames_in_which_nothing_moves_and_draws_the_last(tmp_path):
    """energy_monotone: 60% of the film was one dot. Frames whose tokens moved by less than
    STILL_MOVE are held back; the run's last state is still drawn, saying what was passed over."""
    import imageio.v3 as iio
    moving = [sphere_tokens(12, k) for k in range(3)]
    still = [moving[-1] + 1e-5 * k for k in range(1, 7)]
    xs = moving + still
    times = np.linspace(0, 1, len(xs))
    full = log_of(times)
    logs = [{k: v[:i + 1] for k, v in full.items()} for i in range(len(xs))]
    cfg = RenderConfig(panels=("energy",), rotate=True, **SMALL)    # a spinning camera: no turn to face the tokens
    anim = film(tmp_path / "s.gif", cfg, info(2), logs, xs, t_end=None)
    assert anim.frames_written == 4 and anim.frames_skipped == 5
    assert "passed over" in anim._info_text.get_text()
    assert "t = 0.375 to 0.875" in anim._info_text.get_text()
    assert iio.imread(tmp_path / "s.gif", index=None).shape[0] == 4
    # the same with t_end known: the last frame is drawn as it comes, nothing is held at close
    anim = film(tmp_path / "t.gif", cfg, info(2), logs, xs, t_end=1.0)
    assert anim.frames_written == 4


def test_the_sphere_camera_turns_to_face_where_the_tokens_gather(tmp_path):
    """The quickstart's final cluster ended on the back of the sphere."""
    target = np.array([-0.3, -0.8, -0.5])
    target /= np.linalg.norm(target)
    xs = []
    for k in range(30):
        s = min(1.0, k / 10)
        x = (1 - s) * sphere_tokens(12) + s * target
        xs.append(x / np.linalg.norm(x, axis=1, keepdims=True))
    times = np.arange(30.0)
    full = log_of(times)
    anim = film(tmp_path / "c.gif", RenderConfig(panels=(), **SMALL), info(2), [{k: v[:i + 1] for k, v in full.items()}
                                                                               for i in range(30)], xs)
    view = anim._views[0]
    toward = view.camera.matrix()[2]
    assert toward @ target > 0.8                  # in front, 30 degrees below the view's centre
    assert view.camera.project(target[None])[0, 1] < 0


# --------------------------------------------------------------------------- the app's facts about bundled scenes
def test_the_app_hands_the_film_the_theory_of_each_scene():
    from particles import theory
    from particles.app.rerender import run_info
    from scenes import load_scene

    def facts(name):
        scene = load_scene(name)
        return run_info(scene, scene.build_heads(), scene.dynamics.beta)

    het = facts("heterogeneous_heads")
    (t, ode, label), (_, equal, label2) = het.theory["gamma_bar"]
    assert "3, 7" in label and "5, 5" in label2
    k = np.searchsorted(t, 0.5)
    assert ode[k] == pytest.approx(theory.equiangular_curve(0.0, [3.0, 7.0], 1.0, 16, [t[k]])[0], abs=1e-6)
    assert ode[k] > equal[k]                                 # the unequal pair is ahead early
    assert het.c_star == pytest.approx(0.618034, abs=1e-6) and not het.gradient_flow
    assert len(facts("homogeneous_heads").theory["gamma_bar"]) == 1
    assert facts("critical_beta_h3").c_star == pytest.approx(math.sqrt(2) - 1)
    assert facts("energy_monotone").gradient_flow and facts("radial_shadow_sphere").gradient_flow
    assert not facts("quickstart").gradient_flow                # softmax: no identity claimed
    assert facts("alibi_vs_none_alibi").alibi_slopes == (0.25, 0.0625, 0.015625, 0.00390625)
    assert facts("alibi_vs_none_none").alibi_slopes is None
    assert facts("relu_vs_softmax_relu").theory == {}          # a random start: no equiangular ODE
    assert facts("quickstart").claim.startswith("Tokens gather")


def test_every_bundled_scene_names_its_claim():
    from scenes import bundled_scenes
    import tomllib
    for name, (path, *_rest) in bundled_scenes().items():
        raw = tomllib.loads(path.read_text())
        claim = raw.get("render", {}).get("claim", "")
        assert 20 <= len(claim) <= 120, (name, claim)


def test_every_bundled_scene_films_the_panels_its_claim_needs():
    """From each bundled scene's own [render] and heads (no simulation): the panels its film
    draws, with the theory each claim is judged against."""
    from particles.app.rerender import run_info
    from scenes import bundled_scenes, load_scene
    from minilm import model_missing
    expected = {
        "energy_monotone": ["energy", "energy_rate", "radial_dominance"],
        "radial_shadow_sphere": ["energy", "radial_dominance", "energy_rate"],
        "radial_shadow_flat": ["energy", "energy_rate"],                   # flat: no rho panel
        "heterogeneous_heads": ["gamma_bar", "energy", "radial_dominance"],
        "homogeneous_heads": ["gamma_bar", "energy", "radial_dominance"],
        "critical_beta_h2_below": ["radial_dominance", "energy", "gamma_bar"],
        "relu_vs_softmax_relu": ["gamma_bar", "energy", "entropy"],        # one head: no rho panel
        "causal_kpr": ["gamma_bar", "entropy"],
        "three_layers": ["gamma_bar", "radial_dominance", "entropy"],
        "quickstart": ["gamma_bar", "energy", "radial_dominance", "entropy"],
        "entropy_rise": ["entropy", "gamma_bar", "energy"],
    }
    for name in sorted(bundled_scenes()):
        if model_missing(name):
            continue
        scene = load_scene(name)
        heads = scene.build_heads()
        inf = run_info(scene, heads, scene.dynamics.beta)
        keys = ["time", "energy", "kinetic", "gamma_bar"] + [f"{base}{h}" for h in range(len(heads))
                                                             for base in ("energy_h", "radial_dominance_h",
                                                                          "entropy_mean_h")]
        panels = available_panels(scene.render.panels, {k: np.ones(1) for k in keys}, inf)
        assert panels, name
        if name in expected:
            assert panels == expected[name], name
        if inf.n_heads < 2 or inf.geometry == "flat":
            assert "radial_dominance" not in panels, name
    assert run_info(load_scene("entropy_rise"), load_scene("entropy_rise").build_heads(), 2.0).theory["gamma_bar"]
    assert load_scene("radial_shadow_flat").render.color_by == "norm"
