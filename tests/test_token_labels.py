"""Token labels (issue 25's leftover): a text scene's token strings reach the video as
RunInfo.token_labels, and each token's dot is labelled with its string up to 48 tokens."""
from __future__ import annotations

import numpy as np
import pytest

from render import Animation, RenderConfig, RunInfo
from render.views import TOKEN_LABEL_CHARS, TOKEN_LABELS_MAX

SMALL = dict(width=320, height=180, fps=10, dpi=50)
WORDS = ("[CLS]", "the", "cat", "sat", "on", "the", "mat", "$x$", "extraordinarily", "[SEP]")


def _first_frame(tmp_path, info, d, view="auto"):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((info.n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    anim = Animation(tmp_path / "v.mp4", RenderConfig(view=view, **SMALL), info, t_end=1.0)
    anim.add_frame(x, 0.0, {"time": np.array([0.0])})
    anim.close()
    return anim, x


def _texts(view):
    return [a for a in view.dynamic_artists() if hasattr(a, "get_text")]


@pytest.mark.parametrize("d", [2, 3, 5])
def test_frames_label_each_token_with_its_string(tmp_path, d):
    info = RunInfo("text", 1.0, "softmax", 1, len(WORDS), d, token_labels=WORDS)
    anim, x = _first_frame(tmp_path, info, d)
    view = anim._views[0]
    texts = [t.get_text() for t in view.labels.texts]
    assert texts[:8] == list(WORDS[:8])                  # '$x$' stays literal (no mathtext)
    assert texts[8] == "extraordina\u2026" and len(texts[8]) == TOKEN_LABEL_CHARS
    assert all(t in view.dynamic_artists() for t in view.labels.texts)
    assert not any(t.get_parse_math() for t in view.labels.texts)
    if d == 2:                                           # beside the token's dot, offset from it
        np.testing.assert_allclose([t.xy for t in view.labels.texts], x)
        assert all(t.get_position() != (0, 0) for t in view.labels.texts)
    assert "token labels" not in anim._info_text.get_text()


def test_sphere_labels_fade_for_tokens_behind_it(tmp_path):
    info = RunInfo("text", 1.0, "softmax", 1, len(WORDS), 3, token_labels=WORDS)
    anim, x = _first_frame(tmp_path, info, 3)
    view = anim._views[0]
    depth = view.camera.project(x)[:, 2]
    assert [t.get_alpha() < 1 for t in view.labels.texts] == list(depth < 0)


def test_heads_view_labels_every_panel(tmp_path):
    bases = [np.eye(4)[:, :2], np.eye(4)[:, 2:]]
    info = RunInfo("text", 1.0, "softmax", 2, len(WORDS), 4, head_bases=bases, token_labels=WORDS)
    anim, _ = _first_frame(tmp_path, info, 4, view="heads")
    assert [len(v.labels.texts) for v in anim._views] == [len(WORDS), len(WORDS)]


def test_frames_without_strings_have_no_labels(tmp_path):
    anim, _ = _first_frame(tmp_path, RunInfo("plain", 1.0, "softmax", 1, 10, 3), 3)
    view = anim._views[0]
    assert view.labels is None and _texts(view) == []
    assert "token labels" not in anim._info_text.get_text()


def test_more_than_48_tokens_get_no_labels_and_the_caption_says_so(tmp_path):
    n = TOKEN_LABELS_MAX + 1
    info = RunInfo("long text", 1.0, "softmax", 1, n, 3, token_labels=[f"w{i}" for i in range(n)])
    anim, _ = _first_frame(tmp_path, info, 3)
    assert anim._views[0].labels is None and _texts(anim._views[0]) == []
    assert f"token labels are shown only up to {TOKEN_LABELS_MAX} tokens (n = {n})" in anim._info_text.get_text()
    info = RunInfo("text", 1.0, "softmax", 1, TOKEN_LABELS_MAX, 3,
                   token_labels=[f"w{i}" for i in range(TOKEN_LABELS_MAX)])
    anim, _ = _first_frame(tmp_path, info, 3)
    assert len(anim._views[0].labels.texts) == TOKEN_LABELS_MAX


@pytest.mark.parametrize("labels", [("a", "b"), ["a"] * 9 + [3], "abcdefghij"])
def test_run_info_wants_one_string_per_token(labels):
    with pytest.raises(ValueError, match=r"RunInfo.token_labels must be one string per token \(n = 10\)"):
        RunInfo("text", 1.0, "softmax", 1, 10, 3, token_labels=labels)


# ----------------------------------------------------------------------------- the app layer

def _text_scene(tmp_path):
    pytest.importorskip("safetensors.numpy")
    pytest.importorskip("tokenizers")
    from test_pretrained import make_checkpoint
    from scenes import Scene
    make_checkpoint(tmp_path / "m", "bert", d=8, H=2)
    data = {"name": "tiny_text",
            "tokens": {"init": "text", "model": "m", "text": "the cat sat on the mat"},
            "heads": {"kind": "pretrained", "model": "m", "layer": 1},
            "dynamics": {"rule": "softmax", "steps": 4, "dt": 0.05},
            "log": {"every": 2, "trajectory_every": 2}, "render": {"frames": 3, "width": 320, "height": 180, "fps": 5}}
    return Scene.from_dict(data, base_dir=tmp_path)


TINY_STRINGS = ("[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]")


def test_the_app_passes_a_text_scenes_strings_to_the_video(tmp_path):
    from scenes import load_scene
    from particles.app.rerender import run_info
    scene = _text_scene(tmp_path)
    assert scene.token_strings() == TINY_STRINGS
    assert run_info(scene, scene.build_heads(), 1.0).token_labels == TINY_STRINGS
    again = load_scene(scene.save(tmp_path / "scene.toml"))   # what rerender reads
    assert run_info(again, again.build_heads(), 1.0).token_labels == TINY_STRINGS
    plain = load_scene("quickstart")
    assert plain.token_strings() is None
    assert run_info(plain, plain.build_heads(), 1.0).token_labels is None


@pytest.mark.slow
def test_run_and_rerender_of_a_text_scene_label_the_tokens(tmp_path, monkeypatch):
    """A finished text run's video and `particles render` of it: every frame labels the tokens."""
    import render.animation as animation
    from particles.app.cli import main
    scene = _text_scene(tmp_path)
    path = scene.save(tmp_path / "tiny_text.toml")
    seen = []
    real_add = animation.Animation.add_frame

    def add_frame(self, *a, **kw):
        real_add(self, *a, **kw)
        seen.append((self.path.name, tuple(t.get_text() for t in self._views[0].labels.texts)))

    monkeypatch.setattr(animation.Animation, "add_frame", add_frame)
    out = tmp_path / "run"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    assert main(["render", str(out), "--out", str(out / "again.gif")]) == 0
    names = {name for name, _ in seen}
    assert len(names) == 2 and "again.gif" in names
    assert all(labels == TINY_STRINGS for _, labels in seen)


def test_tokens_on_one_spot_share_one_label(tmp_path):
    """A cluster's labels would pile into a blot: the first token's string says how many more."""
    info = RunInfo("text", 1.0, "softmax", 1, 4, 2, token_labels=("the", "cat", "sat", "mat"))
    x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1e-4], [1.0, -1e-4]])
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    anim = Animation(tmp_path / "v.mp4", RenderConfig(**SMALL), info, t_end=1.0)
    anim.add_frame(x, 0.0, {"time": np.array([0.0])})
    texts = anim._views[0].labels.texts
    assert [(t.get_visible(), t.get_text()) for t in texts][:2] == [(True, "the +2"), (True, "cat")]
    assert not texts[2].get_visible() and not texts[3].get_visible()
    anim.add_frame(np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]]), 0.5,
                   {"time": np.array([0.0, 0.5])})         # apart again: each its own label
    assert [(t.get_visible(), t.get_text()) for t in texts] == [(True, s) for s in ("the", "cat", "sat", "mat")]
    anim.close()
