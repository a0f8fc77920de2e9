"""A transformer block's forward pass in float64 NumPy: the mathematics of the layouts
``particles.pretrained`` reads (which supplies the tensors), one home for each piece.

    post-LN (BERT)      h' = LN_2(a + MLP(a)),  a = LN_1(h + Attn(h))
    pre-LN (GPT-2)      a = h + Attn(LN_1(h)),  h' = a + MLP(LN_2(a))
    pre-RMS (LLaMA)     as pre-LN with RMSNorm and the gated MLP down(silu(gate x) * up x)

Attn is the multi-head attention with its biases, grouped key/value heads, rotary positions
(``particles.Rotary``) and the causal mask: the flow's velocity at beta = 1 in flat space is
exactly ``attention``'s output on the same inputs. n x n per head: a reference and a
figure's, never the engine's hot path. Taichi-free.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import erf

from .rotary import Rotary
from .errors import ParticlesUserError

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish")


def layer_norm(x, gain, bias, eps: float) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    out = (x - mu) / np.sqrt(var + eps) * gain
    return out if bias is None else out + bias


def rms_norm(x, gain, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * gain


def activation(name: str, z: np.ndarray) -> np.ndarray:
    """gelu (erf, BERT), gelu_new / gelu_pytorch_tanh (the tanh form, GPT-2), relu, silu."""
    if name == "gelu":
        return 0.5 * z * (1.0 + erf(z / math.sqrt(2.0)))
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return 0.5 * z * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z ** 3)))
    if name == "relu":
        return np.maximum(z, 0.0)
    if name in ("silu", "swish"):
        return z / (1.0 + np.exp(-z))
    raise ParticlesUserError(f"activation {name!r}: expected one of {', '.join(ACTIVATIONS)}")


def _add(y, b):
    return y if b is None else y + b


@dataclass
class AttentionWeights:
    """A layer's attention as (out, in) matrices, their biases (None: absent) and shape."""

    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray
    bq: np.ndarray | None
    bk: np.ndarray | None
    bv: np.ndarray | None
    bo: np.ndarray | None
    heads: int
    kv_heads: int
    head_dim: int
    causal: bool
    rotary: Rotary | None = None


def attention(x, w: AttentionWeights, weights_out: bool = False):
    """The multi-head attention output sum_h softmax_j(q_i . k_j / sqrt(d_h)) v_j W_O,h + b_O on
    inputs x (n, d); with ``weights_out`` also the (H, n, n) weights."""
    x = np.asarray(x, dtype=np.float64)
    n, dh = x.shape[0], w.head_dim
    q, k, v = _add(x @ w.wq.T, w.bq), _add(x @ w.wk.T, w.bk), _add(x @ w.wv.T, w.bv)
    group = w.heads // w.kv_heads
    outs, maps = [], []
    for h in range(w.heads):
        kv = h // group
        qh, kh = q[:, h * dh:(h + 1) * dh], k[:, kv * dh:(kv + 1) * dh]
        if w.rotary is not None:
            qh, kh = w.rotary.apply(qh), w.rotary.apply(kh)
        s = qh @ kh.T / math.sqrt(dh)
        if w.causal:
            s = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        maps.append(p)
        outs.append(p @ v[:, kv * dh:(kv + 1) * dh])
    out = _add(np.concatenate(outs, axis=1) @ w.wo.T, w.bo)
    return (out, np.stack(maps)) if weights_out else out


@dataclass
class BlockWeights:
    """One block: its attention, its two norms ((gain, bias or None), eps) and its MLP as
    (out, in) matrices with biases: ``up`` (and ``gate`` for the gated MLP) then ``down``."""

    placement: str                  # "post-ln", "pre-ln" or "pre-rms"
    attention: AttentionWeights
    norm1: tuple
    norm2: tuple
    eps: float
    up: tuple                       # (W, b or None)
    down: tuple
    act: str
    gate: tuple | None = None


def norm_input(kind: str, x, norm: tuple, eps: float):
    """A pre-norm block's norm of x (``kind`` "pre-ln" or "pre-rms"), as its attention reads it."""
    return rms_norm(x, norm[0], eps) if kind == "pre-rms" else layer_norm(x, norm[0], norm[1], eps)


def mlp(x, b: BlockWeights) -> np.ndarray:
    up = _add(x @ b.up[0].T, b.up[1])
    if b.gate is not None:
        hidden = activation(b.act, _add(x @ b.gate[0].T, b.gate[1])) * up
    else:
        hidden = activation(b.act, up)
    return _add(hidden @ b.down[0].T, b.down[1])


def block(h, b: BlockWeights) -> np.ndarray:
    """The hidden state after the block, from the one entering it (n, d)."""
    h = np.asarray(h, dtype=np.float64)
    if b.placement == "post-ln":
        a = layer_norm(h + attention(h, b.attention), *b.norm1, b.eps)
        return layer_norm(a + mlp(a, b), *b.norm2, b.eps)
    a = h + attention(norm_input(b.placement, h, b.norm1, b.eps), b.attention)
    return a + mlp(norm_input(b.placement, a, b.norm2, b.eps), b)
