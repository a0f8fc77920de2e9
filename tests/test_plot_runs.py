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
    from particles.app.cli import _run_title
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
