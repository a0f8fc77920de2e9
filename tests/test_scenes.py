"""The scene loader: validation, the broken-scene corpus, round trips, overrides, the library."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import numpy as np
import pytest

from particles.heads import Head
from scenes import Scene, SceneError, bundled_scenes, load_scene
from minilm import skip_without_minilm
from scenes import schema

HERE = Path(__file__).resolve().parent
BROKEN = HERE / "broken_scenes"
README = HERE.parent / "scenes" / "README.md"

MINIMAL = {"tokens": {"n": 6, "d": 4}}


def write(tmp_path: Path, text: str, name: str = "scene.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# ----------------------------------------------------------------------------- broken corpus

def expectations(path: Path) -> list[str]:
    out = []
    for line in path.read_text().splitlines():
        m = re.match(r"#\s*expect:\s*(.*\S)\s*$", line)
        if m:
            out.append(m.group(1))
        elif line.strip() and not line.startswith("#"):
            break
    return out


BROKEN_FILES = sorted(BROKEN.glob("*.toml"))


def test_corpus_is_large_enough():
    assert len(BROKEN_FILES) >= 20
    for p in BROKEN_FILES:
        assert expectations(p), f"{p.name} has no '# expect:' line"


@pytest.mark.parametrize("path", BROKEN_FILES, ids=[p.stem for p in BROKEN_FILES])
def test_broken_scene_reports_problem(path):
    with pytest.raises(SceneError) as info:
        load_scene(str(path))
    err = info.value
    message = str(err)
    assert isinstance(err, ValueError)
    assert str(path) in message.splitlines()[0], "the message must name the file"
    assert message.startswith(f"scene file '{path}': ")
    assert err.problems
    for want in expectations(path):
        assert want in message, f"expected {want!r} in:\n{message}"


def test_every_problem_is_reported_at_once():
    with pytest.raises(SceneError) as info:
        load_scene(str(BROKEN / "many_problems.toml"))
    assert len(info.value.problems) == 3
    assert "3 problems:\n  - " in str(info.value)


def test_missing_scene_file_is_named(tmp_path):
    missing = tmp_path / "nowhere.toml"
    with pytest.raises(SceneError, match=r"nowhere\.toml.*\n.*file not found"):
        load_scene(missing)


def test_unknown_bundled_name_lists_and_suggests():
    with pytest.raises(SceneError) as info:
        load_scene("quickstrat")
    message = str(info.value)
    assert "did you mean 'quickstart'?" in message
    assert "energy_monotone" in message


# ----------------------------------------------------------------------------- defaults

def test_defaults_are_filled():
    scene = Scene.from_dict(MINIMAL)
    d = scene.data
    assert d["name"] == "scene" and d["description"] == ""
    assert d["tokens"] == {"n": 6, "d": 4, "init": "random", "seed": 0, "noise": 0.0,
                           "replicas": 1}
    assert d["heads"] == [{"kind": "scalar", "strength": 1.0, "seed": 0, "value": "aligned",
                           "value_noise": 0.0}]
    assert d["dynamics"] == {"geometry": "sphere", "rule": "exp", "beta": 1.0, "dt": 0.01,
                             "steps": 1000, "integrator": "rk4", "dtype": "float32",
                             "arch": "cpu", "mask": "none", "alibi": False}
    assert d["log"] == {"every": 1, "energy": True, "radial": True, "entropy": True,
                        "entropy_rate": False, "clusters_every": 0, "cluster_threshold": 0.99,
                        "trajectory_every": 10}
    assert d["render"]["file"] == "animation.mp4" and d["render"]["frames"] == 150
    assert d["render"]["panels"] == ["energy", "energy_rate", "radial_dominance", "entropy", "gamma_bar"]
    assert d["output"] == {"dir": "runs", "final_checkpoint": True}
    assert scene.n_heads == 1 and scene.rule_file is None
    heads = scene.build_heads()
    assert len(heads) == 1 and isinstance(heads[0], Head)
    np.testing.assert_allclose(heads[0].score, np.eye(4))


def test_name_defaults_to_file_stem(tmp_path):
    p = write(tmp_path, "[tokens]\nn = 3\nd = 3\n", "my_run.toml")
    assert load_scene(p).name == "my_run"


def test_t_end_becomes_steps():
    s = Scene.from_dict({**MINIMAL, "dynamics": {"t_end": 1.1, "dt": 0.1}})
    assert s.data["dynamics"]["steps"] == 11 and "t_end" not in s.data["dynamics"]
    s = Scene.from_dict({**MINIMAL, "dynamics": {"t_end": 1.05, "dt": 0.1}})
    assert s.data["dynamics"]["steps"] == 11


def test_ints_accepted_for_floats_and_stored_as_floats():
    s = Scene.from_dict({**MINIMAL, "dynamics": {"beta": 2, "dt": 1}})
    assert s.data["dynamics"]["beta"] == 2.0 and isinstance(s.data["dynamics"]["beta"], float)


# ----------------------------------------------------------------------------- tokens / heads

def test_tokens_for_each_init(tmp_path):
    np.save(tmp_path / "pts.npy", np.array([[2.0, 0, 0], [0, 3.0, 0], [1, 1, 1]]))
    cases = [
        ({"init": "random"}, None),
        ({"init": "equiangular", "gamma": -0.5}, lambda x: np.allclose(
            (x @ x.T)[~np.eye(3, dtype=bool)], -0.5, atol=1e-12)),
        ({"init": "orthogonal"}, lambda x: np.allclose(x @ x.T, np.eye(3), atol=1e-12)),
        ({"init": "clusters", "clusters": 1, "spread": 0.0}, lambda x: np.allclose(x, x[0])),
        ({"init": "file", "path": "pts.npy"}, lambda x: np.allclose(x[0], [1, 0, 0])),
    ]
    for extra, check in cases:
        p = write(tmp_path, "")
        scene = Scene.from_dict({"tokens": {"n": 3, "d": 3, **extra}}, base_dir=tmp_path,
                                source=str(p))
        x = scene.build_tokens()
        assert x.shape == (3, 3) and x.dtype == np.float64
        np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-12)
        if check:
            assert check(x), extra
    # the file path is stored absolute
    scene = Scene.from_dict({"tokens": {"n": 3, "d": 3, "init": "file", "path": "pts.npy"}},
                            base_dir=tmp_path)
    assert scene.data["tokens"]["path"] == str((tmp_path / "pts.npy").resolve())


def test_replicas_and_noise():
    scene = Scene.from_dict({"tokens": {"n": 5, "d": 3, "replicas": 3, "noise": 0.01},
                             "dynamics": {"betas": [1.0, 2.0, 3.0]}})
    x = scene.build_tokens()
    assert x.shape == (3, 5, 3)
    np.testing.assert_allclose(np.linalg.norm(x, axis=-1), 1.0, atol=1e-12)
    assert not np.allclose(x[0], x[1])
    np.testing.assert_array_equal(x, scene.build_tokens())
    orth = Scene.from_dict({"tokens": {"n": 3, "d": 3, "init": "orthogonal", "replicas": 2}})
    y = orth.build_tokens()
    for r in range(2):
        np.testing.assert_allclose(y[r] @ y[r].T, np.eye(3), atol=1e-12)


def test_heads_table_forms():
    base = {"tokens": {"n": 8, "d": 6}}
    s = Scene.from_dict({**base, "heads": {"kind": "scalar", "strengths": [1.0, 2.0, 3.0]}})
    assert s.n_heads == 3 and s.data["heads"]["count"] == 3
    assert [h.score[0, 0] for h in s.build_heads()] == [1.0, 2.0, 3.0]

    s = Scene.from_dict({**base, "heads": {"kind": "subspace", "count": 3}})
    assert s.data["heads"]["rank"] == 2
    heads = s.build_heads()
    for a in heads:
        for b in heads:
            if a is not b:
                assert np.all(b.score @ a.score == 0)
    bases = s.head_bases()
    assert [b.shape for b in bases] == [(6, 2)] * 3

    s = Scene.from_dict({**base, "heads": {"kind": "subspace", "count": 2, "block": [1, 3]}})
    np.testing.assert_array_equal(np.diag(s.build_heads()[1].score), [0, 0, 0, 1, 1, 0])

    s = Scene.from_dict({**base, "heads": {"kind": "near_orthogonal", "count": 3, "rank": 2,
                                           "angle": 60.0, "seed": 3}})
    b = s.head_bases()
    sv = np.linalg.svd(b[0].T @ b[2], compute_uv=False)
    np.testing.assert_allclose(sv, 0.5, atol=1e-12)

    s = Scene.from_dict({**base, "heads": {"kind": "random", "count": 2, "rank": 2, "seed": 5}})
    h0, h1 = s.build_heads()
    assert h0.score_rank == 2 and not np.allclose(h0.score, h1.score)
    assert s.head_bases() == [None, None]

    s = Scene.from_dict({**base, "heads": {"kind": "random_symmetric", "count": 2,
                                           "value": "identity", "value_noise": 0.1}})
    for h in s.build_heads():
        np.testing.assert_allclose(h.score, h.score.T, atol=1e-15)
        assert 0 < np.max(np.abs(h.value - np.eye(6))) < 1


def test_heads_array_form(tmp_path):
    np.save(tmp_path / "m.npy", np.diag([1.0, 2.0, 3.0]))
    np.save(tmp_path / "basis.npy", np.array([[1.0, 1.0, 0.0]]))
    raw = {"tokens": {"n": 4, "d": 3}, "heads": [
        {"kind": "matrix", "score": "m.npy", "value_matrix": [[0, 1, 0], [1, 0, 0], [0, 0, 1]]},
        {"kind": "subspace", "basis": "basis.npy", "strength": 2.0},
        {"kind": "subspace", "basis": [[0, 0, 1]]},
        {"kind": "scalar", "strength": -1},
    ]}
    s = Scene.from_dict(raw, base_dir=tmp_path)
    assert s.n_heads == 4
    m, sub, sub2, sc = s.build_heads()
    np.testing.assert_allclose(m.score, np.diag([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(m.value, [[0, 1, 0], [1, 0, 0], [0, 0, 1]])
    np.testing.assert_allclose(sub.score, [[1, 1, 0], [1, 1, 0], [0, 0, 0]], atol=1e-14)
    np.testing.assert_allclose(sub2.score, np.diag([0, 0, 1.0]), atol=1e-15)
    np.testing.assert_allclose(sc.score, -np.eye(3))
    assert s.data["heads"][0]["score"] == str((tmp_path / "m.npy").resolve())


def test_rule_file_is_checked_not_executed(tmp_path):
    rule = tmp_path / "my_rule.py"
    rule.write_text("raise SystemExit('the loader must not execute rule files')\n")
    p = write(tmp_path, '[tokens]\nn = 4\nd = 3\n[dynamics]\nrule = "mine"\n'
                        'rule_file = "my_rule.py"\n')
    scene = load_scene(p)
    assert scene.rule_file == rule.resolve()
    assert scene.data["dynamics"]["rule"] == "mine"


def test_bool_is_not_int_and_int_is_not_bool():
    with pytest.raises(SceneError, match=r"\[log\] energy: expected true or false, got 1"):
        Scene.from_dict({**MINIMAL, "log": {"energy": 1}})
    with pytest.raises(SceneError, match=r"scene '<dict>'"):
        Scene.from_dict({"tokens": {"n": True, "d": 3}})


# ----------------------------------------------------------------------------- round trips

def test_round_trip_from_dict_and_toml(tmp_path):
    np.save(tmp_path / "pts.npy", np.eye(4)[:3])
    (tmp_path / "r.py").write_text("")
    text = """
name = "rt"
description = "round trip"
[tokens]
n = 3
d = 4
init = "file"
path = "pts.npy"
replicas = 2
noise = 0.1
[heads]
kind = "near_orthogonal"
count = 2
rank = 2
strengths = [1, 2]
[dynamics]
rule = "custom"
rule_file = "r.py"
betas = [1, 2]
t_end = 2.0
[render]
view = "heads"
"""
    scene = load_scene(write(tmp_path, text))
    again = Scene.from_dict(scene.data)
    assert again.data == scene.data
    saved = tmp_path / "elsewhere" / "saved.toml"
    saved.parent.mkdir()
    scene.save(saved)
    loaded = load_scene(saved)
    assert loaded.data == scene.data
    np.testing.assert_array_equal(loaded.build_tokens(), scene.build_tokens())
    assert tomllib.loads(scene.to_toml()) == scene.data


def test_modify_save_load(tmp_path):
    original = load_scene("quickstart")
    with pytest.raises(TypeError, match="frozen"):
        original.data["dynamics"]["beta"] = 2.5            # a validated scene never changes
    with pytest.raises(AttributeError, match="frozen"):
        original.name = "other"
    scene = original.replace(dynamics={"beta": 2.5}, tokens={"n": 20}, heads={"strengths": [0.5, 1.5]})
    assert original.dynamics.beta == 4.0 and scene.dynamics.beta == 2.5
    p = scene.save(tmp_path / "q.toml")
    loaded = load_scene(p)
    assert loaded.data == scene.data
    assert loaded.data["dynamics"]["beta"] == 2.5 and loaded.dynamics.beta == 2.5
    assert loaded.build_tokens().shape == (20, 3) and loaded.tokens.n == 20
    assert [h.kind for h in loaded.heads] == ["scalar"] and len(loaded.build_heads()) == 2


def test_replace_validates_again_and_names_the_key():
    scene = load_scene("quickstart")
    with pytest.raises(SceneError) as err:
        scene.replace(dynamics={"dtt": 0.1, "beta": -1.0})
    text = str(err.value)
    assert "2 problems" in text and "did you mean 'dt'?" in text and "[dynamics] beta" in text
    assert scene.replace(**{"dynamics.t_end": 1.0}).dynamics.steps == 20     # t_end replaces steps


# ----------------------------------------------------------------------------- overrides

def test_overrides():
    s = load_scene("quickstart", overrides=["dynamics.beta=3", "tokens.n=10",
                                            "dynamics.rule=relu", "render.enabled=false",
                                            "heads.strengths=[2.0, 0.5]", "name=other",
                                            "output.run_dir=runs/x"])
    assert s.data["dynamics"]["beta"] == 3.0
    assert s.data["tokens"]["n"] == 10 and s.build_tokens().shape == (10, 3)
    assert s.data["dynamics"]["rule"] == "relu"
    assert s.data["render"]["enabled"] is False
    assert s.data["heads"]["strengths"] == [2.0, 0.5]
    assert s.name == "other" and s.data["output"]["run_dir"] == "runs/x"
    s = load_scene("radial_shadow_sphere", overrides=["heads.1.strength=0.5"])
    assert s.data["heads"][1]["strength"] == 0.5


def test_override_values_are_validated():
    with pytest.raises(SceneError, match=r"\[dynamics\] beta: expected a number > 0, got -2"):
        load_scene("quickstart", overrides=["dynamics.beta=-2"])
    with pytest.raises(SceneError, match=r"unknown key 'bta' in \[dynamics\]"):
        load_scene("quickstart", overrides=["dynamics.bta=2"])


@pytest.mark.parametrize("bad,msg", [
    ("dynamics.beta", "expected 'section.key=value'"),
    ("=3", "non-empty dotted key"),
    ("dynamics..beta=3", "non-empty dotted key"),
    ("dynamics.beta.x=3", "is a value, not a table"),
    ("heads.x.strength=1", "index it with a number"),
])
def test_malformed_overrides(bad, msg):
    scene = "radial_shadow_sphere" if bad.startswith("heads") else "quickstart"
    with pytest.raises(SceneError, match=re.escape(msg)) as info:
        load_scene(scene, overrides=[bad])
    assert scene in str(info.value)
    with pytest.raises(SceneError, match="out of range"):
        load_scene("radial_shadow_sphere", overrides=["heads.5.strength=1"])


# ----------------------------------------------------------------------------- library

BUNDLED = bundled_scenes()
EXPECTED_LIBRARY = {
    "quickstart", "energy_monotone", "radial_shadow_sphere", "radial_shadow_flat",
    "critical_beta_h2_below", "critical_beta_h2_above", "critical_beta_h3",
    "heterogeneous_heads", "homogeneous_heads", "relu_vs_softmax_relu",
    "relu_vs_softmax_softmax", "entropy_rise", "near_orthogonal",
    "causal_kpr", "alibi_vs_none_alibi", "alibi_vs_none_none", "three_layers",
    "stops_when_still",
}


def test_library_is_complete():
    assert EXPECTED_LIBRARY <= set(BUNDLED)
    for name, (path, description) in BUNDLED.items():
        assert path.is_file() and path.stem == name
        assert description and "\n" not in description


# the fast tier builds these (each build compiles its kernels); the full suite builds all
FAST_SCENES = {"quickstart", "three_layers", "causal_kpr", "relu_vs_softmax_relu", "radial_shadow_flat"}


@pytest.mark.parametrize("name", [n if n in FAST_SCENES else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(BUNDLED)])
def test_bundled_scene_loads_and_builds(name):
    skip_without_minilm(name)
    path = BUNDLED[name][0]
    assert path.read_text().startswith("# "), "each bundled scene starts with a comment block"
    scene = load_scene(name)
    assert scene.name == name and scene.path == path
    t, heads = scene.data["tokens"], scene.build_heads()
    x = scene.build_tokens()
    shape = (t["n"], t["d"]) if t["replicas"] == 1 else (t["replicas"], t["n"], t["d"])
    assert x.shape == shape and x.dtype == np.float64
    np.testing.assert_allclose(np.linalg.norm(x, axis=-1), 1.0, atol=1e-12)
    assert len(heads) == scene.n_heads >= 1
    for h in heads:
        assert h.score.shape == h.value.shape == (t["d"], t["d"])
    assert t["n"] <= 64
    steps_work = t["n"] ** 2 * t["d"] * scene.n_heads * scene.data["dynamics"]["steps"]
    assert steps_work < 5e9, "bundled scenes must run in seconds on a CPU"
    assert Scene.from_dict(scene.data).data == scene.data
    assert tomllib.loads(scene.to_toml()) == scene.data


def test_critical_beta_scenes_match_theorem_19():
    import math
    for name, H, side in [("critical_beta_h2_below", 2, -1), ("critical_beta_h2_above", 2, 1),
                          ("critical_beta_h3", 3, 1)]:
        s = load_scene(name)
        t, dyn = s.data["tokens"], s.data["dynamics"]
        assert (t["init"], t["n"], t["d"], s.n_heads) == ("orthogonal", 8, 8, H)
        c = (math.sqrt((H - 1) ** 2 + 4) - (H - 1)) / 2
        beta_star = 0.5 * math.log(c * c * (t["n"] - 1) / (1 - c * c))
        assert side * (dyn["beta"] - beta_star) > 0
        assert f"{beta_star:.4f}" in s.description


# ----------------------------------------------------------------------------- README

def test_readme_documents_every_key():
    text = README.read_text()
    for section, keys in schema.all_keys().items():
        for key in keys:
            assert f"`{key}`" in text, f"{section}.{key} is not documented in scenes/README.md"
    for name in EXPECTED_LIBRARY:
        assert f"`{name}`" in text


def test_readme_example_is_a_valid_scene(tmp_path):
    text = README.read_text()
    blocks = re.findall(r"```toml\n(.*?)```", text, flags=re.S)
    full = next(b for b in blocks if "[output]" in b)
    scene = Scene.from_dict(tomllib.loads(full), base_dir=tmp_path)
    assert scene.build_tokens().shape == (2, 48, 6)
    assert scene.n_heads == 2 and scene.data["dynamics"]["steps"] == 500
    table = next(b for b in blocks if "near_orthogonal" in b)
    scene = Scene.from_dict({"tokens": {"n": 4, "d": 6}, **tomllib.loads(table)})
    assert scene.n_heads == 3


def test_scene_vocabularies_match_the_modules_that_own_them():
    """The engine's choices come from one list each (particles.vocabulary); render's own options
    keep a copy in the schema (scenes may not import render), held equal to render's here."""
    import particles.rules
    import particles.simulation
    import render.config
    from particles.integrators import INTEGRATORS
    assert set(schema.BUILTIN_RULES) == set(particles.rules.BUILTIN_RULES)
    assert set(schema.INTEGRATOR_NAMES) == set(INTEGRATORS)
    for name in ("VIEWS", "COLOR_BY", "PROJECTIONS", "PANELS"):
        assert tuple(getattr(schema, name)) == tuple(getattr(render.config, name)), name
    import particles.app.cli as cli
    assert cli.RENDER_VIEWS == schema.VIEWS and cli.RENDER_COLOR_BY == schema.COLOR_BY
    import particles.attention
    import particles.backend
    import particles.vocabulary as vocab
    assert tuple(particles.rules.BUILTIN_RULES) == vocab.BUILTIN_RULES
    # one list each, owned by the core's vocabulary: the schema and the engine use the same object
    assert schema.GEOMETRIES is vocab.GEOMETRIES is particles.simulation.GEOMETRIES
    assert schema.DTYPES is vocab.DTYPES is particles.simulation.DTYPES
    assert schema.MASKS is vocab.MASKS is particles.attention.MASKS
    assert schema.ARCHES is vocab.ARCHES is particles.backend.ARCH_CHOICES


def test_render_defaults_of_a_scene_equal_renders_own():
    """render keeps its API defaults (it imports no scene); a scene's [render] defaults equal them."""
    import dataclasses

    import render.config
    scene = Scene.from_dict({"tokens": {"n": 4, "d": 3}, "heads": {"kind": "scalar"}})
    for f in dataclasses.fields(render.config.RenderConfig):
        if hasattr(scene.render, f.name):
            mine = getattr(scene.render, f.name)
            theirs = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            assert (list(mine) if isinstance(mine, (list, tuple)) else mine) == \
                (list(theirs) if isinstance(theirs, tuple) else theirs), f.name


def test_builders_have_their_own_names_and_the_old_calls_warn():
    scene = load_scene("heterogeneous_heads", overrides=["tokens.replicas=2"])
    x = scene.build_tokens()
    heads = scene.build_heads()
    assert x.shape == (2, scene.tokens.n, scene.tokens.d) and scene.heads[0].kind == "scalar"
    assert len(heads) == scene.n_heads and all(isinstance(h, Head) for h in heads)
    with pytest.warns(DeprecationWarning, match=r"scene\.tokens\(\) is deprecated: call scene\.build_tokens\(\)"):
        old_x = scene.tokens()
    with pytest.warns(DeprecationWarning, match=r"scene\.heads\(\) is deprecated: call scene\.build_heads\(\)"):
        old_heads = scene.heads()
    np.testing.assert_array_equal(old_x, x)
    assert [h.score.tolist() for h in old_heads] == [h.score.tolist() for h in heads]
