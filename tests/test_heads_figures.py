"""`particles heads`: heads.png on scales that carry the sign and the theory's values, and
attention.png, each head's attention weights on the text (checked against the checkpoint's
own query and key tensors)."""
import math

import numpy as np

from particles import pretrained as P
from test_pretrained import make_checkpoint


def test_attention_weights_match_the_checkpoints_queries_and_keys(tmp_path):
    from particles.app.heads_cli import attention_weights
    make_checkpoint(tmp_path / "m", "bert", d=8, H=2, dtype=np.float64)
    ck = P.open_checkpoint(tmp_path / "m")
    lh = P.load_heads(ck, 0)
    x = np.random.default_rng(3).standard_normal((5, 8))
    (wq, wk, _, _), _ = P._layer_weights(ck, 0)
    dh = ck.head_dim
    for h, head in enumerate(lh.heads):
        s = 2.5 * (x @ wq[h * dh:(h + 1) * dh].T) @ (x @ wk[h * dh:(h + 1) * dh].T).T / math.sqrt(dh)
        ref = np.exp(s - s.max(axis=1, keepdims=True))
        ref /= ref.sum(axis=1, keepdims=True)
        assert np.allclose(attention_weights(head, x, 2.5), ref, rtol=0, atol=1e-12)
    causal = attention_weights(lh.heads[0], x, 2.5, causal=True)
    assert np.allclose(np.triu(causal, 1), 0.0) and np.allclose(causal.sum(axis=1), 1.0)


def test_cli_heads_with_a_text_draws_attention_maps_and_signed_scales(tmp_path):
    from particles.app.cli import main
    from particles.app.heads_cli import FIGURE_SCALES
    make_checkpoint(tmp_path / "m", "bert", d=8, H=2, dtype=np.float64)
    assert main(["heads", str(tmp_path / "m"), "--text", "the cat sat", "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "attention.png").stat().st_size > 1000
    cmap, limits, value, _ = FIGURE_SCALES["value_alignment"]
    assert (cmap, limits, value) == ("RdBu_r", (-1.0, 1.0), 1.0)      # a signed cosine: diverging, V = M at 1
    assert FIGURE_SCALES["asymmetry"][1:3] == ((0.0, None), 0.0)      # symmetric M at the foot
