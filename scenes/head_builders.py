"""Builders for attention heads (``particles.heads.Head``).

Score matrices M_h:

- ``scalar``            M_h = lambda_h I, one head per strength
- ``subspace``          M = lambda P, P the orthogonal projector onto a coordinate
                        block [start, stop) or onto the span of a given basis
- ``subspaces``         ``count`` heads on consecutive disjoint blocks (M_h' M_h = 0 exactly)
- ``near_orthogonal``   ``count`` rank-r projectors, every pairwise principal angle equal
- ``random_symmetric``  GOE-like (A + A^T) / (2 sqrt d)
- ``random``            non-symmetric Q^T K with Gaussian (r x d) factors / sqrt d
- ``matrix``            an explicit M (and V)

Values: every builder makes aligned heads (V = M, the energy-consistent case of
Theorem 11); ``with_value`` turns a head into V = I ("identity") and/or adds a
seeded perturbation V = M + value_noise * E, E Gaussian d x d / sqrt d (Theorem 12).
"""
from __future__ import annotations

import math

import numpy as np

from particles.heads import Head
from particles.errors import ParticlesUserError
from particles.pretrained import load_heads

from .configurations import equiangular_coordinates, seeded_rng, random_frame

__all__ = [
    "scalar", "subspace", "subspaces", "subspace_basis", "near_orthogonal",
    "near_orthogonal_bases", "near_orthogonal_min_dim", "check_near_orthogonal",
    "check_subspaces", "random_symmetric", "random", "matrix", "with_value", "VALUE_MODES",
]

VALUE_MODES = ("aligned", "identity")


def _check_dim(d) -> int:
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
        raise ParticlesUserError(f"d must be an integer >= 1, got {d!r}")
    return int(d)


def _finite(name: str, x) -> float:
    x = float(x)
    if not math.isfinite(x):
        raise ParticlesUserError(f"{name} must be finite, got {x!r}")
    return x


def _projector_head(basis: np.ndarray, strength: float) -> Head:
    """M = V = strength * B B^T as factors Q = B^T, K = strength B^T (no sqrt of strength)."""
    bt = np.ascontiguousarray(basis.T)
    return Head.from_factors(bt, strength * bt)


# ----------------------------------------------------------------------------- values

def with_value(head: Head, value: str = "aligned", value_noise: float = 0.0, seed: int = 0) -> Head:
    """The same score, value V = M ("aligned") or V = I ("identity"), plus value_noise * E.

    E is a Gaussian d x d matrix / sqrt(d) from a stream of ``seed`` reserved for
    value noise. Aligned heads without noise are returned unchanged (factored).
    """
    if value not in VALUE_MODES:
        raise ParticlesUserError(f"value must be one of {', '.join(VALUE_MODES)}, got {value!r}")
    value_noise = _finite("value_noise", value_noise)
    if value_noise < 0:
        raise ParticlesUserError(f"value_noise must be >= 0, got {value_noise!r}")
    if value == "aligned" and value_noise == 0:
        return head
    d = head.dim
    v = head.value.copy() if value == "aligned" else np.eye(d)
    if value_noise > 0:
        v = v + value_noise * seeded_rng(seed, stream=2).standard_normal((d, d)) / math.sqrt(d)
    return Head.from_factors(head.query, head.key, value_out=np.eye(d), value_in=v)


# ----------------------------------------------------------------------------- scalar

def scalar(strengths, d: int) -> list[Head]:
    """One head per strength: M_h = V_h = lambda_h I (heterogeneous strengths allowed)."""
    d = _check_dim(d)
    if np.ndim(strengths) == 0:
        strengths = [strengths]
    return [Head.scalar(_finite("strength", s), d) for s in strengths]


# ----------------------------------------------------------------------------- subspaces

def subspace_basis(d: int, block=None, basis=None) -> np.ndarray:
    """Orthonormal d x k basis: coordinate block [start, stop) or an orthonormalised basis.

    ``basis`` is a list of k vectors of length d (rows); they must be linearly independent.
    """
    d = _check_dim(d)
    if (block is None) == (basis is None):
        raise ParticlesUserError("give exactly one of block = [start, stop] or basis = [[...], ...]")
    if block is not None:
        if len(block) != 2:
            raise ParticlesUserError(f"block must be [start, stop], got {list(block)!r}")
        start, stop = (int(b) for b in block)
        if not 0 <= start < stop <= d:
            raise ParticlesUserError(f"block [{start}, {stop}) must satisfy 0 <= start < stop <= d = {d}")
        basis = np.zeros((d, stop - start))
        basis[np.arange(start, stop), np.arange(stop - start)] = 1.0
        return basis
    b = np.asarray(basis, dtype=np.float64)
    if b.ndim == 1:
        b = b[None, :]
    if b.ndim != 2 or b.shape[1] != d:
        raise ParticlesUserError(f"basis must be a list of vectors of length d = {d} (shape (k, {d})), "
                                 f"got shape {b.shape}")
    if not np.all(np.isfinite(b)):
        raise ParticlesUserError("basis contains NaN or Inf")
    if b.shape[0] > d:
        raise ParticlesUserError(f"basis has {b.shape[0]} vectors, more than d = {d}")
    q, r = np.linalg.qr(b.T)
    diag = np.abs(np.diag(r))
    scale = max(float(np.max(np.linalg.norm(b, axis=1))), 1e-300)
    if diag.size == 0 or np.min(diag) <= 1e-10 * scale:
        raise ParticlesUserError(f"basis vectors are linearly dependent (or zero); "
                                 f"need {b.shape[0]} independent vectors")
    return q * np.sign(np.diag(r))


def subspace(d: int, strength: float = 1.0, block=None, basis=None) -> Head:
    """M = V = strength * P, P the orthogonal projector onto a block or a basis' span."""
    basis = subspace_basis(d, block=block, basis=basis)
    return _projector_head(basis, _finite("strength", strength))


def check_subspaces(d: int, count: int, rank: int, start: int = 0) -> None:
    """Raise ValueError (naming the minimum d) unless ``subspaces`` fits in d dimensions."""
    d = _check_dim(d)
    if rank < 1:
        raise ParticlesUserError(f"rank must be >= 1, got {rank}")
    stop = start + count * rank
    if start < 0 or stop > d:
        raise ParticlesUserError(f"{count} subspace heads of rank {rank} starting at coordinate {start} "
                                 f"need d >= {stop} (minimum d = {stop}), got d = {d}")


def subspaces(d: int, strengths, rank: int, start: int = 0) -> list[Head]:
    """len(strengths) heads on consecutive blocks [start + h rank, start + (h+1) rank).

    The blocks are disjoint coordinate blocks, so M_h' M_h = 0 exactly for h != h'.
    """
    check_subspaces(d, len(strengths), rank, start)
    return [subspace(d, s, block=[start + h * rank, start + (h + 1) * rank])
            for h, s in enumerate(strengths)]


# ----------------------------------------------------------------------------- near-orthogonal

def near_orthogonal_min_dim(count: int, rank: int, angle_deg: float = 75.0) -> int:
    """Smallest d for ``near_orthogonal``: count * rank (the Gram matrix of all the
    basis vectors, (G_equiangular kron I_rank), is positive definite for angles in (0, 90])."""
    return int(count) * int(rank)


def check_near_orthogonal(count: int, d: int, rank: int, angle_deg: float) -> None:
    """Raise ValueError (naming the minimum d) unless ``near_orthogonal`` can run."""
    d = _check_dim(d)
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 2:
        raise ParticlesUserError(f"near_orthogonal needs count >= 2 heads, got {count!r}")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
        raise ParticlesUserError(f"rank must be an integer >= 1, got {rank!r}")
    angle_deg = _finite("angle", angle_deg)
    if not 0 < angle_deg <= 90:
        raise ParticlesUserError(f"angle must lie in (0, 90] degrees, got {angle_deg:g}")
    need = near_orthogonal_min_dim(count, rank, angle_deg)
    if d < need:
        raise ParticlesUserError(f"near_orthogonal with count = {count} heads of rank {rank} needs "
                                 f"d >= count * rank = {need} (minimum d = {need}), got d = {d}")


def near_orthogonal_bases(count: int, d: int, rank: int = 1, angle_deg: float = 75.0,
                          seed: int = 0) -> list[np.ndarray]:
    """``count`` orthonormal d x rank bases B_h with B_h^T B_h' = cos(angle) I for h != h'.

    So every principal angle between every pair of subspaces equals ``angle_deg``.
    Construction: unit vectors g_1..g_count in R^count with <g_h, g_h'> = cos(angle)
    (an equiangular configuration), tensored with I_rank and embedded by a random
    orthonormal d x (count * rank) frame F = [F_1 ... F_count]:
    B_h = sum_k g_h[k] F_k. Needs d >= count * rank.
    """
    check_near_orthogonal(count, d, rank, angle_deg)
    angle_deg = float(angle_deg)
    cos = 0.0 if angle_deg == 90 else math.cos(math.radians(angle_deg))
    g = equiangular_coordinates(count, cos)          # count x count, rows at mutual cos
    frame = random_frame(d, count * rank, seeded_rng(seed))   # d x (count*rank), orthonormal
    eye = np.eye(rank)
    return [frame @ np.kron(g[h][:, None], eye) for h in range(count)]


def near_orthogonal(count: int, d: int, rank: int = 1, angle_deg: float = 75.0, seed: int = 0,
                    strength=1.0) -> list[Head]:
    """``count`` heads M_h = V_h = lambda_h B_h B_h^T on rank-``rank`` subspaces whose
    pairwise principal angles all equal ``angle_deg``; then
    ||M_h' M_h||_op = lambda_h lambda_h' cos(angle). ``strength`` is a number or a list."""
    bases = near_orthogonal_bases(count, d, rank, angle_deg, seed)
    strengths = [strength] * count if np.ndim(strength) == 0 else list(strength)
    if len(strengths) != count:
        raise ParticlesUserError(f"need {count} strengths, got {len(strengths)}")
    return [_projector_head(b, _finite("strength", s)) for b, s in zip(bases, strengths)]


# ----------------------------------------------------------------------------- random

def random_symmetric(d: int, seed: int = 0, strength: float = 1.0) -> Head:
    """M = V = strength * (A + A^T) / (2 sqrt d), A standard Gaussian d x d (GOE-like)."""
    d = _check_dim(d)
    a = seeded_rng(seed).standard_normal((d, d))
    return Head.from_matrices(_finite("strength", strength) * (a + a.T) / (2.0 * math.sqrt(d)))


def random(d: int, rank: int | None = None, seed: int = 0, strength: float = 1.0) -> Head:
    """Non-symmetric M = strength * Q^T K, Q and K Gaussian (rank x d) / sqrt d; V = M."""
    d = _check_dim(d)
    rank = d if rank is None else int(rank)
    if rank < 1:
        raise ParticlesUserError(f"rank must be >= 1, got {rank}")
    rng = seeded_rng(seed)
    q = rng.standard_normal((rank, d)) / math.sqrt(d)
    k = rng.standard_normal((rank, d)) / math.sqrt(d)
    return Head.from_factors(q, _finite("strength", strength) * k)


def matrix(score, value=None) -> Head:
    """A head from explicit d x d matrices M and (optionally) V; V defaults to M."""
    return Head.from_matrices(np.asarray(score, dtype=np.float64),
                              None if value is None else np.asarray(value, dtype=np.float64))


# ----------------------------------------------------------------------------- pretrained

def pretrained(model, layer: int = 0, select=None, fold_layernorm: bool = False,
               rotary: str = "keep", value_from: str = "weights", biases: str = "keep") -> list[Head]:
    """The heads of a trained model's layer (``particles.pretrained.load_heads``): a checkpoint
    folder or an installed package; M_h = W_Q,h^T W_K,h / sqrt(d_head), V_h = W_O,h W_V,h
    (``value_from = "score"``: V_h = M_h), with their biases unless ``biases = "drop"``. The
    rotary positions ride the heads' Attention (``particles.app.build.head_attention``)."""
    return load_heads(model, layer, select, fold_layernorm, rotary, value_from, biases).heads
