"""Biases and rotary positions on the engine's heads (particles.head_terms, particles.rotary),
held to a float64 NumPy reference written here: rotations as complex multiplications."""
import numpy as np
import pytest

import particles
from particles import Rotary


def _complex_rotary(v, theta, pairs, dims):
    """Pair p of the first ``dims`` components as the complex number a + i b, times
    e^(i pos theta^(-2p/dims)): the rotation written a second way."""
    n = v.shape[0]
    half = dims // 2
    idx = np.arange(half)
    a, b = (idx, idx + half) if pairs == "half" else (2 * idx, 2 * idx + 1)
    z = (v[:, a] + 1j * v[:, b]) * np.exp(1j * np.outer(np.arange(n), theta ** (-2.0 * idx / dims)))
    out = v.copy()
    out[:, a], out[:, b] = z.real, z.imag
    return out


@pytest.mark.parametrize("pairs, dims", [("half", None), ("interleaved", None), ("interleaved", 2)])
def test_rotary_apply_is_the_complex_rotation(pairs, dims):
    v = np.random.default_rng(0).standard_normal((11, 6))
    got = Rotary(50.0, pairs, dims).apply(v)
    assert np.max(np.abs(got - _complex_rotary(v, 50.0, pairs, dims or 6))) < 1e-13
    # scores depend on the offset only: <R_i q, R_j k> = <q, R_{j-i} k>
    q, k = v[3], v[5]
    r = Rotary(50.0, pairs, dims)
    rq, rk = r.apply(np.stack([q] * 11)), r.apply(np.stack([k] * 11))
    assert np.allclose([rq[i] @ rk[i + 2] for i in range(9)], rq[0] @ rk[2], atol=1e-12)


def test_rotary_refuses_bad_options():
    with pytest.raises(ValueError, match="rotary pairs must be one of"):
        Rotary(10.0, "adjacent")
    with pytest.raises(ValueError, match="rotary dims must be even"):
        Rotary(10.0, dims=3)
    with pytest.raises(ValueError, match="exceed the head's score rank"):
        Rotary(10.0, dims=8).rotated(4)
    with pytest.raises(ValueError, match="query_bias must be a vector of length 2"):
        particles.Head.from_factors(np.ones((2, 3)), np.ones((2, 3)), query_bias=[1.0, 2.0, 3.0])


@pytest.mark.parametrize("geometry", ["flat", "sphere"])
def test_velocity_with_biases_and_rotary_matches_numpy(geometry):
    """Three heads of ranks 4, 4 and 2 (zero-padded by the engine): one interleaved, one
    half-split with a causal mask and its own beta, one with biases only; float64, 1e-12."""
    rng = np.random.default_rng(1)
    n, d = 9, 5
    x = rng.standard_normal((n, d))
    if geometry == "sphere":
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    specs = [(4, Rotary(30.0, "interleaved"), "none", None), (4, Rotary(10000.0, "half"), "causal", 0.7),
             (2, None, "none", None)]
    heads, attention, want = [], [], np.zeros((n, d))
    for r, rot, mask, beta in specs:
        Q, K, W = (rng.standard_normal((r, d)) for _ in range(3))
        O = rng.standard_normal((d, r))
        bq, bk, bv = (rng.standard_normal(r) for _ in range(3))
        heads.append(particles.Head.from_factors(Q, K, O, W, query_bias=bq, key_bias=bk, value_bias=bv))
        attention.append(particles.Attention(mask=mask, beta=beta, rotary=rot))
        q, k = x @ Q.T + bq, x @ K.T + bk
        if rot is not None:
            q, k = _complex_rotary(q, rot.theta, rot.pairs, r), _complex_rotary(k, rot.theta, rot.pairs, r)
        s = (beta or 1.3) * q @ k.T
        if mask == "causal":
            s = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
        w = np.exp(s - s.max(axis=1, keepdims=True))
        want += (w / w.sum(axis=1, keepdims=True)) @ (x @ W.T + bv) @ O.T
    if geometry == "sphere":
        want -= np.sum(want * x, axis=1, keepdims=True) * x
    sim = particles.Simulation(x, heads, beta=1.3, rule="softmax", geometry=geometry,
                               dtype="float64", attention=attention)
    assert sim.implementation == "plain"
    err = np.max(np.abs(sim.velocity() - want))
    assert err < 1e-12 * max(1.0, np.max(np.abs(want))), err
