"""The torch peer with observables (benchmarks/peers.torch_step_with_observables) against the
NumPy peer's step and observables, every key, in float32; skipped where torch is absent (it is
never a dependency of the project: run with a Python that has torch)."""
import math

import numpy as np
import pytest

import benchmark_scripts
from conftest import random_tokens

torch = pytest.importorskip("torch")


peers = benchmark_scripts.load("peers")


def _tokens(n, d, seed):
    return random_tokens(n, d, seed).astype(np.float32)


def _assert_same_observables(got, want):
    assert set(got) == set(want)
    for key, val in want.items():
        assert math.isfinite(got[key]), key
        assert got[key] == pytest.approx(val, rel=1e-5, abs=1e-6), key


# (n, d, H, r, rv, beta): full heads (the tokens carried as values), low rank (values and keys
# carried, q and k padded; row sums in the rank), r != rv, r > d, rv > d, and a large beta
# (entropy far below log n)
CASES = [(64, 6, 3, 6, 6, 1.0), (96, 16, 4, 4, 4, 1.5), (40, 6, 3, 4, 5, 2.5),
         (50, 3, 2, 5, 1, 0.7), (64, 8, 2, 2, 3, 9.0), (40, 4, 2, 2, 6, 1.2)]


@pytest.mark.parametrize("n,d,H,r,rv,beta", CASES)
def test_torch_peer_with_observables_matches_numpy_peer(n, d, H, r, rv, beta):
    Q, K, O, W = peers.make_factors(H, d, r, rv, scale=1.3, seed=n + d)
    x, dt = _tokens(n, d, 7), 0.05
    want_x, want = peers.numpy_step_with_observables(x, Q, K, O, W, beta, dt)
    got_x, got = peers.torch_step_with_observables(x, Q, K, O, W, beta, dt, device="cpu")
    assert isinstance(got_x, np.ndarray) and np.abs(got_x - want_x).max() < 2e-6
    assert np.abs(got_x - peers.torch_step(x, Q, K, O, W, beta, dt, device="cpu")).max() < 2e-6
    _assert_same_observables(got, want)
    for layout in peers.torch_observables_layouts(d, r, rv):   # the measured choice's rivals
        other_x, other = peers.torch_step_with_observables(x, Q, K, O, W, beta, dt, device="cpu",
                                                           layout=layout)
        assert np.abs(other_x - want_x).max() < 2e-6, layout
        _assert_same_observables(other, want)
    # the entropies are neither constant nor log n: the test sees the lse and the weighted keys
    ents = [got[f"entropy_mean_h{h}"] for h in range(H)]
    assert all(0.05 < e < math.log(n) - 0.01 for e in ents), ents


def test_torch_peer_with_observables_takes_the_flash_kernel_and_keeps_tensors():
    n, d, H = 48, 8, 2
    Q, K, O, W = (torch.as_tensor(a) for a in peers.make_factors(H, d, seed=3))
    x = torch.as_tensor(_tokens(n, d, 4))
    assert peers.torch_observables_kernel(x) == "flash"
    y, obs = peers.torch_step_with_observables(x, Q, K, O, W, 1.0, 0.01)
    assert isinstance(y, torch.Tensor) and y.shape == (n, d)
    assert torch.allclose(y.norm(dim=1), torch.ones(n), atol=1e-6)
    assert len(obs) == 4 + 11 * H


def test_torch_peer_math_fallback_agrees(monkeypatch):
    n, d, H, r, rv, beta = 40, 6, 3, 4, 5, 2.5
    Q, K, O, W = peers.make_factors(H, d, r, rv, scale=1.2, seed=15)
    x = _tokens(n, d, 16)
    flash = peers.torch_step_with_observables(x, Q, K, O, W, beta, 0.05, device="cpu")
    monkeypatch.setattr(peers, "_FLASH_WITH_LSE", None)
    assert peers.torch_observables_kernel(torch.zeros(1)) == "math"
    math_x, math_obs = peers.torch_step_with_observables(x, Q, K, O, W, beta, 0.05, device="cpu")
    assert np.abs(math_x - flash[0]).max() < 2e-6
    _assert_same_observables(math_obs, flash[1])
