"""Rotary position embeddings (RoPE) of a head: q_i and k_j rotated by angles proportional to
their positions i and j, so that the score <R_i q_i, R_j k_j> = <q_i, R_{j-i} k_j> depends on
the offset j - i. Taichi-free: the NumPy forward (``particles.forward``), the engine's
per-token terms (``particles.head_terms``) and the tests read the same tables.

The first ``dims`` components (all by default) form dims / 2 pairs; pair p turns by the angle
i * theta^(-2p / dims) at position i. The two layouts of trained models:

    "half"         pairs (p, p + dims/2)   (Hugging Face LLaMA / Mistral / Qwen2: rotate_half)
    "interleaved"  pairs (2p, 2p + 1)      (the original RoFormer / Meta LLaMA / GPT-J)

Positions are token indices 0..n-1 (the order of the tokens array).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import validation
from .errors import ParticlesUserError

PAIRINGS = ("half", "interleaved")


@dataclass(frozen=True)
class Rotary:
    """One head's rotary positions: base ``theta``, pair layout, rotated components (None: all)."""

    theta: float = 10000.0
    pairs: str = "half"
    dims: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "theta", validation.positive("rotary theta", self.theta))
        if self.pairs not in PAIRINGS:
            raise ParticlesUserError(f"rotary pairs must be one of {PAIRINGS}, got {self.pairs!r}")
        if self.dims is not None:
            dims = validation.integer("rotary dims", self.dims, 2)
            if dims % 2:
                raise ParticlesUserError(f"rotary dims must be even (components turn in pairs), "
                                         f"got {dims}")
            object.__setattr__(self, "dims", dims)

    def rotated(self, rank: int) -> int:
        """The number of rotated components of a head of score rank ``rank``."""
        dims = rank - rank % 2 if self.dims is None else self.dims
        if dims > rank:
            raise ParticlesUserError(f"rotary dims {dims} exceed the head's score rank {rank}")
        return dims

    def pairs_of(self, rank: int) -> np.ndarray:
        """(dims / 2, 2) component indices of the pairs, in frequency order."""
        half = self.rotated(rank) // 2
        p = np.arange(half)
        return np.stack([p, p + half] if self.pairs == "half" else [2 * p, 2 * p + 1], axis=1)

    def angles(self, rank: int, n: int) -> np.ndarray:
        """(n, dims / 2) angles i * theta^(-2p / dims) in float64."""
        dims = self.rotated(rank)
        inv_freq = self.theta ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)
        return np.arange(n, dtype=np.float64)[:, None] * inv_freq[None, :]

    def apply(self, v: np.ndarray, positions=None) -> np.ndarray:
        """v (n, rank) rotated, row i at position ``positions[i]`` (default i): the reference."""
        v = np.asarray(v, dtype=np.float64)
        n, rank = v.shape
        pos = np.arange(n) if positions is None else np.asarray(positions)
        ang = self.angles(rank, int(pos.max()) + 1)[pos]
        cos, sin = np.cos(ang), np.sin(ang)
        out = v.copy()
        a, b = self.pairs_of(rank).T
        out[:, a] = v[:, a] * cos - v[:, b] * sin
        out[:, b] = v[:, b] * cos + v[:, a] * sin
        return out
