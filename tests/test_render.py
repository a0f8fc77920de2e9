"""Tests of the render package with fabricated tokens and logs (the engine is not used)."""

from __future__ import annotations

import numpy as np
import pytest

import imageio.v3 as iio

from render import Animation, RenderConfig, RunInfo, plot_quantity, plot_summary
from particles.clusters import cluster_labels
from particles.output import load_log
from render.colors import cluster_colors
from render.views import pca_basis

SMALL = dict(width=320, height=180, fps=10)


# --------------------------------------------------------------------------- fabricated data
def collapsing_tokens(n: int, d: int, frames: int, seed: int = 0, flat: bool = False):
    """Random unit vectors sliding toward one point (flat: Gaussian cloud contracting)."""
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal((n, d))
    if not flat:
        x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    target = np.zeros(d)
    target[0] = 1.0
    out = []
    for k in range(frames):
        s = 0.8 * k / max(frames - 1, 1)
        x = (1 - s) * x0 + s * target
        out.append(x if flat else x / np.linalg.norm(x, axis=1, keepdims=True))
    return out


def fake_log(times, heads: int, n: int) -> dict[str, np.ndarray]:
    t = np.asarray(times, dtype=float)
    log = {"step": np.arange(t.size), "time": t, "energy": 1 + np.tanh(t), "kinetic": np.exp(-t),
           "gamma_bar": np.tanh(t), "eps": 1 - np.tanh(t) + 1e-6}
    for h in range(heads):
        log[f"energy_h{h}"] = (1 + np.tanh(t)) / heads
        log[f"energy_rate_h{h}"] = np.exp(-t) * (1 + h)
        log[f"radial_dominance_h{h}"] = 0.05 * np.exp(2.0 * t) * (1 + h)
        log[f"entropy_mean_h{h}"] = np.log(n) * (1 - 0.5 * np.exp(-t))
    return log


def render(path, cfg: RenderConfig, info: RunInfo, frames: int = 4, t_end: float = 2.0,
           token_values=None, flat=False, **kw):
    xs = collapsing_tokens(info.n, info.d, frames, flat=flat)
    times = np.linspace(0.0, t_end, frames)
    log = fake_log(times, info.n_heads, info.n)
    with Animation(path, cfg, info, t_end=t_end, **kw) as anim:
        for i, (t, x) in enumerate(zip(times, xs)):
            tv = token_values(x) if token_values else None
            anim.add_frame(x, t, {k: v[: i + 1] for k, v in log.items()}, tv)
    return anim


def info_for(d: int, n: int = 40, heads: int = 2, **kw) -> RunInfo:
    return RunInfo("test scene", 1.5, "exp", heads, n, d, kw.pop("geometry", "sphere"), **kw)


# --------------------------------------------------------------------------- files
@pytest.mark.parametrize("ext", ["mp4", "gif"])
def test_video_roundtrip(tmp_path, ext):
    path = tmp_path / f"run.{ext}"
    anim = render(path, RenderConfig(**SMALL), info_for(3), frames=6)
    assert anim.frames_written == 6
    frames = iio.imread(path, index=None)
    assert frames.shape[:3] == (6, 180, 320)
    props = iio.improps(path, index=None)
    assert props.shape[1:3] == (180, 320)
    for f in frames:
        assert f[..., :3].std() > 20                      # not blank
    for a, b in zip(frames[:-1], frames[1:]):
        assert np.abs(a.astype(int) - b.astype(int)).mean() > 0.3   # moving
    if ext == "gif":
        meta = iio.immeta(path, index=0)
        assert meta["loop"] == 0 and meta["duration"] == 100     # 1/fps at fps=10


def test_odd_size_is_padded_for_mp4(tmp_path):
    path = tmp_path / "odd.mp4"
    render(path, RenderConfig(width=321, height=181, fps=10), info_for(2), frames=2)
    assert iio.imread(path, index=None).shape[1:3] == (182, 322)


def test_bad_extension(tmp_path):
    with pytest.raises(ValueError, match=r"\.mp4.*\.gif"):
        Animation(tmp_path / "run.avi", RenderConfig(), info_for(3))


def test_interrupted_run_leaves_playable_file(tmp_path):
    path = tmp_path / "broken.mp4"
    info = info_for(3)
    xs = collapsing_tokens(info.n, info.d, 3)
    with pytest.raises(RuntimeError, match="boom"):
        with Animation(path, RenderConfig(**SMALL), info) as anim:
            for k, x in enumerate(xs):
                anim.add_frame(x, 0.1 * k, {"time": np.arange(k + 1) * 0.1})
            raise RuntimeError("boom")
    assert iio.imread(path, index=None).shape[0] == 3


def test_panel_curve_grows_to_the_right_edge(tmp_path):
    """With t_end known, the curve reaches the right part of its panel only at the end."""
    path = tmp_path / "panel.gif"
    info = info_for(3, heads=1)
    frames, t_end = 8, 4.0
    times = np.linspace(0, t_end, frames)
    log = {"time": times, "energy_h0": 1 + np.tanh(times)}        # one curve: head 0 blue, no legend
    cfg = RenderConfig(width=640, height=360, fps=10, panels=("energy",))
    shots = []
    with Animation(path, cfg, info, t_end=t_end) as anim:
        for i, x in enumerate(collapsing_tokens(info.n, 3, frames)):
            anim.add_frame(x, times[i], {k: v[: i + 1] for k, v in log.items()})
        box = anim.regions()["panel:energy"]
    video = iio.imread(path, index=None)
    x0, y0, x1, y1 = box
    right = slice(x0 + int(0.8 * (x1 - x0)), x1 - 3)
    inner = slice(y0 + 3, y1 - 3)
    blue = np.array([31, 119, 180])

    def blue_pixels(frame):
        patch = frame[inner, right, :3].astype(int)
        return int((np.abs(patch - blue).sum(axis=-1) < 60).sum())

    assert blue_pixels(video[0]) == 0
    assert blue_pixels(video[-1]) > 5
    shots.append(video)


VIEW_CASES = {
    "circle d=2": (dict(), dict(d=2)),
    "flat d=2": (dict(trails=2), dict(d=2, geometry="flat")),
    "sphere d=3 rotate trails": (dict(rotate=True, trails=3), dict(d=3)),
    "flat d=3 rotate": (dict(rotate=True), dict(d=3, geometry="flat")),
    "pca d=8": (dict(trails=2), dict(d=8)),
    "pca d=8 given 3-d basis": (dict(projection=np.eye(8)[:, :3]), dict(d=8)),
    "cluster colours": (dict(color_by="cluster"), dict(d=3)),
}


@pytest.mark.parametrize("case", list(VIEW_CASES))
def test_views_render(tmp_path, case):
    cfg_kw, info_kw = VIEW_CASES[case]
    info = info_for(**info_kw)
    labels = (lambda x: {"cluster": cluster_labels(x, 0.99)}) if cfg_kw.get("color_by") == "cluster" else None
    anim = render(tmp_path / "v.mp4", RenderConfig(**SMALL, **cfg_kw), info, frames=3,
                  flat=info.geometry == "flat", token_values=labels)
    assert anim.frames_written == 3
    frames = iio.imread(tmp_path / "v.mp4", index=None)
    assert frames.shape[0] == 3 and frames[-1].std() > 20


def _orthonormal_bases(d: int, heads: int, k: int, seed: int = 3):
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, d)))
    return [q[:, h * k:(h + 1) * k] for h in range(heads)]


@pytest.mark.parametrize("k", [1, 2, 3])
def test_heads_view(tmp_path, k):
    info = info_for(9, heads=3, head_bases=_orthonormal_bases(9, 3, k))
    anim = render(tmp_path / "h.gif", RenderConfig(view="heads", trails=2, **SMALL), info, frames=3)
    assert anim.frames_written == 3
    assert len([r for r in anim.regions() if r.startswith("view")]) == 3


@pytest.mark.parametrize("mode", ["radial", "entropy"])
def test_colour_by_observable(tmp_path, mode):
    info = info_for(3, heads=2)

    def values(x):
        return {f"radial_h1": x[:, 0] - 0.2, "entropy_h1": np.log(info.n) * (0.5 + 0.25 * (1 + x[:, 1])),
                "cluster": cluster_labels(x, 0.99)}

    anim = render(tmp_path / "c.mp4", RenderConfig(color_by=mode, color_head=1, **SMALL), info,
                  frames=3, token_values=values)
    assert anim.frames_written == 3


def test_colour_by_observable_needs_values(tmp_path):
    info = info_for(3)
    with pytest.raises(ValueError, match="radial_h0"):
        render(tmp_path / "c.mp4", RenderConfig(color_by="radial", **SMALL), info, frames=1)


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize("kw", [dict(view="cube"), dict(color_by="mass"), dict(trails=-1),
                                dict(fps=0), dict(width=10), dict(panels=("energy", "bogus")),
                                dict(projection="pca_middle"), dict(projection=np.ones((8, 4))),
                                dict(color_head=-1), dict(color_limits=(1.0, 0.0))])
def test_config_rejects_bad_values(kw):
    with pytest.raises(ValueError):
        RenderConfig(**kw)


def test_run_info_and_animation_checks(tmp_path):
    with pytest.raises(ValueError, match="geometry"):
        RunInfo("x", 1.0, "exp", 1, 10, 3, "torus")
    with pytest.raises(ValueError, match="head_bases"):
        RunInfo("x", 1.0, "exp", 2, 10, 4, head_bases=[np.eye(4)[:, :2]])
    with pytest.raises(ValueError, match="orthonormal"):
        RunInfo("x", 1.0, "exp", 1, 10, 4, head_bases=[np.ones((4, 2))])
    assert RunInfo("x", 1.0, "exp", 1, 10, 4).log_n == pytest.approx(np.log(10))
    with pytest.raises(ValueError, match="heads"):
        Animation(tmp_path / "a.mp4", RenderConfig(view="heads"), info_for(4))
    with pytest.raises(ValueError, match="d=2"):
        Animation(tmp_path / "a.mp4", RenderConfig(view="circle"), info_for(3))
    with pytest.raises(ValueError, match="final_tokens"):
        Animation(tmp_path / "a.mp4", RenderConfig(projection="pca_final"), info_for(8))
    with pytest.raises(ValueError, match="color_head"):
        Animation(tmp_path / "a.mp4", RenderConfig(color_head=5), info_for(3))
    with Animation(tmp_path / "a.mp4", RenderConfig(**SMALL), info_for(3)) as anim:
        with pytest.raises(ValueError, match="shape"):
            anim.add_frame(np.zeros((5, 3)), 0.0, {})


def test_pca_final_uses_given_final_tokens(tmp_path):
    info = info_for(8)
    xs = collapsing_tokens(info.n, 8, 3)
    with Animation(tmp_path / "f.gif", RenderConfig(projection="pca_final", **SMALL), info,
                   final_tokens=xs[-1]) as anim:
        for k, x in enumerate(xs):
            anim.add_frame(x, float(k), None)
    assert anim.frames_written == 3


# --------------------------------------------------------------------------- helpers
def test_colour_by_cluster_needs_the_labels(tmp_path):
    """render never labels clusters itself: the run's one labeller gives them (the log's)."""
    with pytest.raises(ValueError, match="token_values\\['cluster'\\]"):
        render(tmp_path / "c.gif", RenderConfig(color_by="cluster", **SMALL), info_for(3), frames=1)


def test_cluster_labels_and_colours():
    a = np.array([1.0, 0.0, 0.0])
    b = np.array([0.0, 1.0, 0.0])
    x = np.stack([a, b, a, a + 1e-3 * b, np.array([0.0, 0.0, 1.0]), b])
    labels = cluster_labels(x, 0.99)
    assert list(labels) == [0, 1, 0, 0, 2, 1]
    cols = cluster_colors(labels)
    assert np.allclose(cols[0], cols[2]) and not np.allclose(cols[0], cols[1])
    assert np.allclose(cols[4][:3], 0.55)                  # singleton: grey


def test_pca_basis_is_orthonormal_even_when_degenerate():
    x = np.tile(np.eye(6)[0], (10, 1))                    # all tokens equal
    B = pca_basis(x, 3)
    assert B.shape == (6, 3) and np.allclose(B.T @ B, np.eye(3))


# --------------------------------------------------------------------------- figures
def test_plot_summary_and_quantity(tmp_path):
    log = fake_log(np.linspace(0, 3, 50), heads=3, n=32)
    csv = tmp_path / "log.csv"
    names = list(log)
    np.savetxt(csv, np.column_stack([log[k] for k in names]), delimiter=",", header=",".join(names),
               comments="")
    for source, stem in ((load_log(csv), tmp_path / "out" / "summary"), (log, tmp_path / "dict_summary")):
        paths = plot_summary(source, stem)
        assert [p.suffix for p in paths] == [".png", ".svg"]
        assert all(p.is_file() and p.stat().st_size > 1000 for p in paths)
    png = iio.imread(tmp_path / "out" / "summary.png")
    assert png[..., :3].std() > 10
    out = plot_quantity(load_log(csv), "energy_rate", tmp_path / "rate.png")
    assert out.is_file()
    assert plot_quantity(log, "eps", tmp_path / "eps.svg").is_file()
    with pytest.raises(ValueError, match="unknown quantity"):
        plot_quantity(log, "nonsense", tmp_path / "x.png")


def test_summary_subplot_of_nan_energies_keeps_the_time_axis_and_says_why():
    from render.figures import _draw_group, new_figure
    t = np.linspace(0.0, 16.0, 41)
    cols = {"time": t, "energy": np.full_like(t, np.nan), "energy_h0": np.full_like(t, np.nan)}
    ax = new_figure(4, 3).add_subplot()
    _draw_group(ax, t, "energy", [(None, "energy"), (0, "energy_h0")], cols)
    assert ax.get_xlim() == (0.0, 16.0)
    assert any("no potential" in text.get_text() for text in ax.texts)


def test_an_energy_panel_without_a_potential_says_why_it_is_empty(tmp_path):
    """Masked, biased and scheduled runs log NaN energies: the panel says so instead of
    standing empty with a 0..1 axis."""
    info = info_for(3)
    xs = collapsing_tokens(info.n, 3, 2)
    notes = {}
    for case, nan in (("masked", True), ("plain", False)):
        log = fake_log([0.0, 1.0], info.n_heads, info.n)
        if nan:
            for key in [k for k in log if k == "energy" or k.startswith("energy_h")]:
                log[key] = np.full_like(log[key], np.nan, dtype=float)
        with Animation(tmp_path / f"{case}.gif", RenderConfig(**SMALL), info, t_end=1.0) as anim:
            for i, x in enumerate(xs):
                anim.add_frame(x, float(i), {k: v[: i + 1] for k, v in log.items()})
            energy = next(p for p in anim._panels.panels if p.name == "energy")
            notes[case] = [t.get_text() for t in energy.ax.texts]
    assert any("no potential" in text for text in notes["masked"])
    assert not any("no potential" in text for text in notes["plain"])


def test_radial_dominance_is_not_drawn_once_the_tokens_have_stopped(tmp_path):
    """rho_h = R_h / T_h is a ratio of round-off once T_h has fallen below the summary's floor
    (RunInfo.tangent_floor x T_h at the first row): from that row on the curve is not drawn,
    and the panel says from when; a run whose T_h stays above the floor is drawn whole."""
    times = np.linspace(0.0, 3.0, 4)
    drawn = {}
    for case, floor in (("floor", 1e-6), ("none", None)):
        info = info_for(3, tangent_floor=floor)
        log = fake_log(times, info.n_heads, info.n)
        for h in range(info.n_heads):
            log[f"tangent_power_h{h}"] = np.array([1.0, 1e-3, 1e-7, 1e-9])   # below 1e-6 from t = 2
        xs = collapsing_tokens(info.n, 3, times.size)
        with Animation(tmp_path / f"{case}.gif", RenderConfig(**SMALL), info, t_end=3.0) as anim:
            for i, x in enumerate(xs):
                anim.add_frame(x, float(times[i]), {k: v[: i + 1] for k, v in log.items()})
            panel = next(p for p in anim._panels.panels if p.name == "radial_dominance")
            drawn[case] = ([np.isfinite(np.asarray(line.get_ydata(), dtype=float)).sum()
                            for line in panel.lines], [t.get_text() for t in panel.ax.texts])
    assert drawn["floor"][0] == [2, 2] and any("not drawn from t = 2" in s for s in drawn["floor"][1])
    assert drawn["none"][0] == [4, 4] and not any("not drawn" in s for s in drawn["none"][1])


def test_scheduled_run_frames_name_the_layer(tmp_path):
    """A log with a `layer` column (a layer schedule): the title shows the layer of the frame."""
    info = info_for(3)
    xs = collapsing_tokens(info.n, 3, 3)
    log = fake_log([0.0, 1.0, 2.0], info.n_heads, info.n)
    log["layer"] = np.array([0, 1, 2])
    stamps = []
    with Animation(tmp_path / "layers.gif", RenderConfig(**SMALL), info, t_end=2.0) as anim:
        for i, x in enumerate(xs):
            anim.add_frame(x, float(i), {k: v[: i + 1] for k, v in log.items()})
            stamps.append(anim._time_text.get_text())
    assert stamps == ["layer 0   t = 0.000", "layer 1   t = 1.000", "layer 2   t = 2.000"]
    with Animation(tmp_path / "plain.gif", RenderConfig(**SMALL), info, t_end=2.0) as anim:
        anim.add_frame(xs[0], 0.0, {k: v[:1] for k, v in fake_log([0.0], info.n_heads, info.n).items()})
        assert anim._time_text.get_text() == "t = 0.000"


# --------------------------------------------------------------------------- coincident curves
def test_coincidence_is_judged_point_by_point_on_the_drawn_scale():
    """three_layers' rho_h1 runs 0.016..16 while rho_h0 runs 3.4..22 once the layers part them,
    then both grow to ~1e12 (no tangent power left): within 1e-5 of the largest value they were
    one curve; point by point in log space they are two. Linear tails parting at 1e-8 of the
    peak (round-off) still count as one curve, and a log panel tells 1% apart."""
    from render.panels import coincident_with
    t = np.linspace(0.0, 12.0, 121)
    h0 = np.where(t < 4, 0.5, 3.4 * np.exp(0.3 * (t - 4)))
    h1 = np.where(t < 4, 0.5, 0.016 * np.exp(0.9 * (t - 4)))
    h0[t > 8], h1[t > 8] = 1e12, 1e12
    assert coincident_with([h0, h1]) == [None, None]
    assert coincident_with([h0, h1], log_scale=False) == [None, 0]     # drawn to 1e12 linearly: one line
    assert coincident_with([h0[t < 4], h1[t < 4]]) == [None, 0]        # equal while layer 0 lasts
    rate = 0.06 * np.exp(-np.linspace(0.0, 25.0, 121) / 1.5)           # 3e-9 at the end
    tail = rate.copy()
    tail[-5:] *= 1.5
    assert coincident_with([rate, tail], log_scale=False) == [None, 0]
    assert coincident_with([rate, tail], log_scale=True) == [None, None]
    assert coincident_with([rate, rate * 1.01], log_scale=True) == [None, None]
    assert coincident_with([rate, rate * (1 + 1e-9)], log_scale=True) == [None, 0]
    nan = np.full_like(t, np.nan)
    assert coincident_with([nan, nan]) == [None, None]                  # nothing drawn: nothing hidden
    gap = rate.copy()
    gap[3] = np.nan
    assert coincident_with([rate, gap]) == [None, None]                 # a gap is drawn: not the same


# --------------------------------------------------------------------------- colour carries information
def test_index_colours_are_sequential_so_first_and_last_differ():
    """causal_kpr's "early tokens dark": a sequential map, lightness rising with the index
    (the cyclic wheel gave token 0 and token 63 one colour)."""
    from render.colors import index_colors
    for n in (4, 10, 64):
        c = index_colors(n)[:, :3]
        lum = c @ np.array([0.2126, 0.7152, 0.0722])
        assert np.all(np.diff(lum) > 0)
        assert np.abs(c[0] - c[-1]).sum() > 1.0


def test_cluster_count_means_groups_of_two_or_more(tmp_path):
    from render.colors import cluster_count, singleton_count
    labels = np.array([0, 0, 1, 2, 2, 2, 3, 4])
    assert (cluster_count(labels), singleton_count(labels)) == (2, 3)
    info = info_for(3, n=8)
    with Animation(tmp_path / "cc.gif", RenderConfig(color_by="cluster", **SMALL), info) as anim:
        anim.add_frame(collapsing_tokens(8, 3, 1)[0], 0.0, {"time": np.zeros(1)}, {"cluster": labels})
        assert "2 clusters, 3 singletons" in anim._info_text.get_text()


def test_colour_limits_follow_the_data_and_a_shared_value_is_said(tmp_path):
    """The critical_beta scenes: every token has the same a_i (symmetry) and it grows; the bar
    widens with it instead of saturating every token, and the caption says colour carries nothing."""
    info = info_for(8, n=8)
    x = collapsing_tokens(8, 8, 1)[0]
    with Animation(tmp_path / "r.gif", RenderConfig(color_by="radial", **SMALL), info) as anim:
        for k, a in enumerate((0.1, 0.5, 2.0)):
            anim.add_frame(x, 0.1 * k, {"time": 0.1 * np.arange(k + 1)}, {"radial_h0": np.full(8, a)})
        lo, hi = anim._colorizer.limits
        assert lo == -hi and hi >= 2.0                       # diverging, centred on 0, widened to 2
        assert "every token has the same a^0_i = 2" in anim._info_text.get_text()
        c = anim._colorizer.colors(x, {"radial_h0": np.full(8, 2.0)})
        assert not np.allclose(c[0], anim._colorizer.cmap(1.0))   # not the saturated end


def test_flat_tokens_coloured_by_their_distance_from_the_origin(tmp_path):
    info = info_for(3, n=20, geometry="flat")
    x = collapsing_tokens(20, 3, 1, flat=True)[0]
    with Animation(tmp_path / "n.gif", RenderConfig(color_by="norm", **SMALL), info) as anim:
        anim.add_frame(x, 0.0, {"time": np.zeros(1)})
        norms = np.linalg.norm(x, axis=1)
        c = anim._colorizer.colors(x, None)
        assert np.allclose(c, anim._colorizer.cmap(anim._colorizer.norm(norms)))
        assert "|x_i|" in anim._colorizer.label
