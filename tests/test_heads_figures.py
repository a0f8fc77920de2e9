"""`particles heads`: heads.png on scales that carry the sign and the theory's values, and
attention.png, each head's attention weights on the text (checked against the checkpoint's
own query and key tensors)."""
import math

import numpy as np

from particles import pretrained as P
from test_pretrained import make_checkpoint


def test_attention_maps_match_the_checkpoints_queries_and_keys(tmp_path):
    """pretrained.attention_maps (the figure's weights) against the checkpoint's tensors: the
    query and key biases inside the scores, and the causal, rotated llama layout too."""
    make_checkpoint(tmp_path / "m", "bert", d=8, H=2, dtype=np.float64)
    ck = P.open_checkpoint(tmp_path / "m")
    x = np.random.default_rng(3).standard_normal((5, 8))
    (wq, wk, _, _), (bq, bk, _, _) = P._layer_weights(ck, 0)
    dh = ck.head_dim
    for biases, on in (("keep", 1.0), ("drop", 0.0)):
        weights = P.attention_maps(P.load_heads(ck, 0, biases=biases), x, 2.5)[0]
        for h in range(2):
            q = x @ wq[h * dh:(h + 1) * dh].T + on * bq[h * dh:(h + 1) * dh]
            k = x @ wk[h * dh:(h + 1) * dh].T + on * bk[h * dh:(h + 1) * dh]
            s = 2.5 * q @ k.T / math.sqrt(dh)
            ref = np.exp(s - s.max(axis=1, keepdims=True))
            ref /= ref.sum(axis=1, keepdims=True)
            assert np.allclose(weights[h], ref, rtol=0, atol=1e-12)
    make_checkpoint(tmp_path / "l", "llama", d=8, H=2, dtype=np.float64)
    causal = P.attention_maps(P.load_heads(tmp_path / "l", 0), x, 2.5)[0]
    assert np.allclose(np.triu(causal[0], 1), 0.0) and np.allclose(causal.sum(axis=2), 1.0)
    unrotated = P.attention_maps(P.load_heads(tmp_path / "l", 0, rotary="drop"), x, 2.5)[0]
    assert np.max(np.abs(causal - unrotated)) > 1e-3 and np.allclose(causal[:, 0], unrotated[:, 0])


def test_cli_heads_with_a_text_draws_attention_maps_and_signed_scales(tmp_path, capsys):
    from particles.app.cli import main
    from particles.app.heads_cli import FIGURE_SCALES
    make_checkpoint(tmp_path / "m", "bert", d=8, H=2, dtype=np.float64)
    assert main(["heads", str(tmp_path / "m"), "--text", "the cat sat", "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "attention.png").stat().st_size > 1000
    assert "attention rows, the model's on its input against the flow's" in capsys.readouterr().out
    cmap, limits, value, _ = FIGURE_SCALES["value_alignment"]
    assert (cmap, limits, value) == ("RdBu_r", (-1.0, 1.0), 1.0)      # a signed cosine: diverging, V = M at 1
    assert FIGURE_SCALES["asymmetry"][1:3] == ((0.0, None), 0.0)      # symmetric M at the foot


def test_depth_figure_sets_the_flow_beside_the_models_hidden_states(tmp_path):
    from particles.app.heads_cli import depth_figure
    make_checkpoint(tmp_path / "m", "bert", d=8, H=2, dtype=np.float64)
    hidden = P.hidden_states(tmp_path / "m", "the cat sat")
    paths, rows = depth_figure(hidden, hidden[:1] * len(hidden), ["a"] * 5, tmp_path / "depth", "t")
    assert paths[0].stat().st_size > 10_000 and len(rows) == 2
    assert all(r["gram"] == r["gram_stay"] and r["cosine"] == r["cosine_stay"] for r in rows)
