"""Figures and videos labelled (issue 26): colour-bar limits, legends, cluster count, summary figure."""
from __future__ import annotations

import numpy as np
import pytest

from render import Animation, RenderConfig, RunInfo
from render.colors import CLUSTER_LEGEND, TokenColorizer, cluster_count
from render.figures import plot_summary

SMALL = dict(width=320, height=180, fps=10, dpi=50)


def _info(n=8, d=3, heads=2):
    return RunInfo("scene", 0.65, "exp", heads, n, d)


@pytest.mark.parametrize("value", [0.2390000001, 0.239])
def test_radial_colour_bar_has_a_minimum_span_when_tokens_agree(value):
    c = TokenColorizer(RenderConfig(color_by="radial"), _info())
    v = np.full(8, value)
    v[3] += 1e-8                                      # float noise across tokens
    c.prepare(np.zeros((8, 3)), {"radial_h0": v})
    lo, hi = c.limits
    assert hi - lo >= 0.2 * value and lo < value < hi


def test_entropy_colour_bar_keeps_the_theory_ceiling_and_a_legible_span():
    info = _info(n=8)
    c = TokenColorizer(RenderConfig(color_by="entropy"), info)
    c.prepare(np.zeros((8, 3)), {"entropy_h0": np.full(8, np.log(8) - 1e-9)})
    lo, hi = c.limits
    assert hi == pytest.approx(np.log(8)) and hi - lo >= 0.25 * np.log(8) - 1e-12


def test_index_colouring_has_a_colour_bar_of_positions():
    c = TokenColorizer(RenderConfig(color_by="index"), _info(n=64))
    assert c.mappable is not None and c.label == "token index i"
    assert tuple(c.mappable.get_clim()) == (-0.5, 63.5)


def test_cluster_count_means_groups_of_two_or_more():
    """A singleton, drawn grey, is no cluster (the quickstart's caption said '53 clusters')."""
    from render.colors import singleton_count
    assert cluster_count(np.array([0, 0, 1, 2, 2, 2])) == 2
    assert singleton_count(np.array([0, 0, 1, 2, 2, 2])) == 1


def _frame_texts(tmp_path, color_by, token_values):
    info = _info(n=8, d=3)
    path = tmp_path / "v.mp4"
    anim = Animation(path, RenderConfig(color_by=color_by, **SMALL), info, t_end=1.0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    anim.add_frame(x, 0.0, {"time": np.array([0.0])}, token_values)
    texts = [t.get_text() for t in anim._fig.texts]
    anim.close()
    return texts, anim


def test_cluster_frames_say_the_count_and_what_grey_means(tmp_path):
    labels = np.array([0, 0, 0, 1, 1, 2, 3, 4])
    texts, _ = _frame_texts(tmp_path, "cluster", {"cluster": labels})
    assert "grey: a singleton" in CLUSTER_LEGEND
    assert "2 clusters, 3 singletons   \u00b7   " + CLUSTER_LEGEND in texts and "t = 0.000" in texts
    texts, _ = _frame_texts(tmp_path, "cluster", {"cluster": np.zeros(8, int)})
    assert any(t.startswith("1 cluster, 0 singletons   \u00b7") for t in texts)


def test_a_layer_schedule_names_the_layer_in_force(tmp_path):
    from scenes import load_scene
    from particles.app.rerender import layer_labels
    labels = layer_labels(load_scene("three_layers"))
    assert labels == ("rule = softmax", "rule = relu", "rule = softmax, causal")
    info = RunInfo("three_layers", 4.0, "softmax", 2, 8, 3, layer_labels=labels)
    assert "rule = by layer" in info.title()
    anim = Animation(tmp_path / "v.mp4", RenderConfig(**SMALL), info, t_end=1.0)
    x = np.eye(3)[[0, 1, 2, 0, 1, 2, 0, 1]] + 0.01
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    anim.add_frame(x, 0.5, {"time": np.array([0.0, 0.5]), "layer": np.array([0, 1])})
    texts = [t.get_text() for t in anim._fig.texts]
    anim.close()
    assert "layer 1: rule = relu" in texts and "layer 1   t = 0.500" in texts


def test_radial_colour_bar_has_no_offset_label(tmp_path):
    _, anim = _frame_texts(tmp_path, "radial", {"radial_h0": np.full(8, 0.239)})
    fmt = anim._colorbar.formatter
    assert fmt.get_useOffset() is False and fmt.get_offset() == ""


def _log():
    t = np.linspace(0, 10, 21)
    e = 1 + t
    return {"step": np.arange(21), "time": t, "energy": 2 * e, "energy_h0": e, "energy_h1": e.copy(),
            "clusters": np.maximum(64 // (1 + np.arange(21) ** 2), 1).astype(float)}


def test_summary_figure_has_a_title_a_log_cluster_axis_and_visible_twin_heads(tmp_path, monkeypatch):
    import render.figures as figures
    seen = {}
    real = figures.save_png_svg

    def keep(fig, stem):
        seen["fig"] = fig
        return real(fig, stem)

    monkeypatch.setattr(figures, "save_png_svg", keep)
    plot_summary(_log(), tmp_path / "s", title="scene    n = 8, d = 3, H = 2, rule = exp, \u03b2 = 0.65")
    fig = seen["fig"]
    assert fig._suptitle.get_text() == "scene    n = 8, d = 3, H = 2, rule = exp, \u03b2 = 0.65"
    axes = {ax.get_title(loc="left").split(":")[0]: ax for ax in fig.axes if ax.get_visible()}
    assert axes["clusters"].get_yscale() == "log"
    labels = [ln.get_label() for ln in axes["energy"].lines]
    assert "head 1 (= head 0)" in labels
    twin = axes["energy"].lines[labels.index("head 1 (= head 0)")]
    assert twin.get_linestyle() == "--"


def test_particles_plot_titles_the_figure_from_the_run(tmp_path):
    from particles.app.figures import run_title as _run_title
    (tmp_path / "scene.toml").write_text('name = "quickstart"\n[tokens]\nn = 64\nd = 3\n[heads]\ncount = 2\n'
                                         '[dynamics]\nrule = "softmax"\nbeta = 4.0\ngeometry = "sphere"\n')
    assert _run_title(tmp_path) == "quickstart    n = 64, d = 3, H = 2, rule = softmax, \u03b2 = 4"
    assert _run_title(tmp_path / "missing") is None


def _gradient(h=180, w=320):
    """A shaded sphere's colours (light blue-grey to slate) with saturated token dots."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    r = np.clip(np.hypot(x - 0.35 * w, y - 0.35 * h) / (0.8 * w), 0, 1)[..., None]
    img = (1 - r) * np.array([235, 240, 250]) + r * np.array([95, 105, 125])
    rng = np.random.default_rng(0)
    for cx, cy in rng.integers(0, [w, h], size=(40, 2)):
        img[max(cy - 3, 0):cy + 3, max(cx - 3, 0):cx + 3] = rng.integers(0, 256, 3)
    return img.astype(np.uint8)


def _band_error(path, frame):
    import imageio.v3 as iio
    got = iio.imread(path, index=0)[..., :3].astype(np.float64)
    k = 4                                             # local means over 4x4 blocks: what the eye sees
    h, w = (frame.shape[0] // k) * k, (frame.shape[1] // k) * k

    def blocks(a):
        return a[:h, :w].reshape(h // k, k, w // k, k, 3).mean(axis=(1, 3))
    return float(np.abs(blocks(got) - blocks(frame.astype(np.float64))).mean())


def test_gif_frames_are_dithered_against_banding(tmp_path, monkeypatch):
    from render import writers
    frame = _gradient()
    dithered = tmp_path / "d.gif"
    w = writers.GifStreamWriter(dithered, 10)
    w.append(frame)
    w.close()
    monkeypatch.setattr(writers, "ordered_dither", lambda rgb: np.ascontiguousarray(rgb))
    banded = tmp_path / "b.gif"
    w = writers.GifStreamWriter(banded, 10)
    w.append(frame)
    w.close()
    assert _band_error(dithered, frame) < 0.6 * _band_error(banded, frame)


def test_gif_default_size_is_smaller(tmp_path):
    info = _info()
    assert Animation(tmp_path / "a.gif", RenderConfig(), info).frame_size == (800, 450)
    assert Animation(tmp_path / "a.mp4", RenderConfig(), info).frame_size == (1280, 720)
    assert Animation(tmp_path / "b.gif", RenderConfig(width=640, height=360), info).frame_size == (640, 360)


def _panel_frames(tmp_path, head1):
    """Two frames of a two-head run whose head 1 curves are ``head1(head 0 curve)``; the panels."""
    info = _info(n=8, d=3)
    t = np.array([0.0, 0.5, 1.0])
    e0 = 1 + t
    log = {"time": t, "energy": 2 * e0, "energy_h0": e0, "energy_h1": head1(e0),
           "radial_dominance_h0": 0.1 + t, "radial_dominance_h1": 0.3 + t}
    x = np.eye(3)[[0, 1, 2, 0, 1, 2, 0, 1]] + 0.01
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    anim = Animation(tmp_path / "v.mp4", RenderConfig(panels=("energy", "radial_dominance"), **SMALL), info,
                     t_end=1.0)
    for k in (2, 3):
        anim.add_frame(x, t[k - 1], {c: v[:k] for c, v in log.items()})
    panels = {p.name: p for p in anim._panels.panels}
    anim.close()
    return panels


def test_video_panels_dash_a_head_that_coincides_with_an_earlier_one(tmp_path):
    panels = _panel_frames(tmp_path, lambda e0: e0.copy())          # the quickstart's two equal heads
    energy = panels["energy"]
    styles = [line.get_linestyle() for line in energy.lines]        # total, head 0, head 1
    assert styles == ["-", "-", "--"]
    assert [t.get_text() for t in energy.legend.get_texts()] == ["total", "h0", "h1=h0"]
    assert energy.legend.get_lines()[2].get_linestyle() == "--"
    assert [line.get_linestyle() for line in panels["radial_dominance"].lines] == ["-", "-"]   # unequal


def test_video_panels_keep_distinct_heads_solid(tmp_path):
    panels = _panel_frames(tmp_path, lambda e0: 1.5 * e0)
    assert [line.get_linestyle() for line in panels["energy"].lines] == ["-", "-", "-"]
    assert [t.get_text() for t in panels["energy"].legend.get_texts()] == ["total", "h0", "h1"]


def _first_frame_view(tmp_path, info, layer=None, d=2):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((info.n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    log = {"time": np.array([0.0])} if layer is None else {"time": np.array([0.0]), "layer": np.array([layer])}
    anim = Animation(tmp_path / "v.mp4", RenderConfig(**SMALL), info, t_end=1.0)
    anim.add_frame(x, 0.0, log)
    view = anim._views[0]
    anim.close()
    return view, x


@pytest.mark.parametrize("d", [2, 3])
def test_causal_frames_ring_token_0_with_a_legend_entry(tmp_path, d):
    from render.views import FIRST_TOKEN_LABEL
    view, x = _first_frame_view(tmp_path, RunInfo("causal_kpr", 64.0, "softmax", 1, 8, d, mask="causal"), d=d)
    ring = view.first_token.ring
    assert ring.get_visible() and ring.get_label() == FIRST_TOKEN_LABEL
    assert [t.get_text() for t in view.ax.get_legend().get_texts()] == [FIRST_TOKEN_LABEL]
    if d == 2:
        np.testing.assert_allclose(np.ravel(ring.get_xydata()), x[0])
    assert ring in view.dynamic_artists()


def test_frames_without_a_causal_mask_have_no_token_0_marker(tmp_path):
    for mask in ("none", "window", "mixed"):
        view, _ = _first_frame_view(tmp_path, RunInfo("s", 1.0, "softmax", 1, 8, 2, mask=mask))
        assert view.first_token is None and view.ax.get_legend() is None


def test_token_0_is_ringed_only_while_a_causal_layer_is_in_force(tmp_path):
    labels = ("rule = softmax", "rule = softmax, causal")
    info = RunInfo("layers", 4.0, "softmax", 1, 8, 2, layer_labels=labels, mask=("none", "causal"))
    view, _ = _first_frame_view(tmp_path, info, layer=0)
    assert not view.first_token.ring.get_visible() and not view.ax.get_legend().get_visible()
    view, _ = _first_frame_view(tmp_path, info, layer=1)
    assert view.first_token.ring.get_visible() and view.ax.get_legend().get_visible()


def test_the_app_passes_each_layers_mask_to_the_video():
    from scenes import load_scene
    from particles.app.rerender import run_info
    masks = {}
    for name in ("quickstart", "causal_kpr", "three_layers"):
        scene = load_scene(name)
        masks[name] = run_info(scene, scene.build_heads(), 1.0).mask
    assert masks == {"quickstart": "none", "causal_kpr": "causal", "three_layers": ("none", "none", "causal")}
    two = load_scene("quickstart", overrides=['heads.mask="causal"'])   # heads' own masks count too
    assert run_info(two, two.build_heads(), 1.0).mask == "causal"


def test_curves_equal_but_for_round_off_in_their_tail_count_as_one():
    """The quickstart's identical heads log energy rates that part at ~1e-8 of their peak as
    the tokens merge (round-off): still one curve drawn over the other, so dashed and named."""
    from render.panels import coincident_with
    t = np.linspace(0, 25, 200)
    rate = 0.06 * np.exp(-t / 1.5)                                       # 3e-9 at the end
    twin = rate.copy()
    twin[-5:] = rate[-5:] * (1 + np.array([0.3, -0.2, 0.5, 2.0, -0.7]))   # the tail parts
    assert coincident_with([rate, twin], log_scale=False) == [None, 0]
    assert coincident_with([rate, twin]) == [None, None]    # 7 decades: drawn in log, the tail shows
    other = rate * 1.01
    assert coincident_with([rate, other], log_scale=False) == [None, None]
