"""Attention heads as factored bilinear forms.

A head is stored as factors so that low-rank heads cost n^2 r, not n^2 d:

    score  M = Q^T K        (Q, K: r x d)        s_ij = <Q x_i, K x_j>
    value  V = O W          (O: d x rv, W: rv x d) f_i = O sum_j w_ij (W x_j)

A full d x d matrix M is the factorisation Q = I, K = M (r = d); likewise V = I V.

Optional biases, as a trained layer has them (``particles.head_terms`` adds them after the
projection): q_i = Q x_i + b_q, k_j = K x_j + b_k, u_j = W x_j + b_v. A query bias is a per-key
score term <b_q, K x_j>; a key bias a per-query constant (no effect on the softmax weights);
a value bias the constant drift O b_v once the weights sum to 1. None (the default): no term,
and the kernels are exactly those of a head without biases.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import validation
from .errors import ParticlesUserError


def _as_matrix(name: str, a, rows: int | None, cols: int | None) -> np.ndarray:
    """A real, finite float64 matrix of the given shape (None: any), or a ValueError/TypeError
    naming ``name``."""
    m = validation.real_array(name, a)
    if m.ndim != 2 or min(m.shape) < 1 or (cols is not None and m.shape[1] != cols) \
            or (rows is not None and m.shape[0] != rows):
        want = f"({rows if rows is not None else 'r'}, {cols if cols is not None else 'd'})"
        raise ParticlesUserError(f"{name} must be a matrix of shape {want} with every side >= 1, "
                                 f"got shape {m.shape}")
    return m


@dataclass(frozen=True)
class Head:
    """One attention head: score factors (query, key) and value factors (value_out, value_in)."""

    query: np.ndarray      # r x d
    key: np.ndarray        # r x d
    value_out: np.ndarray  # d x rv
    value_in: np.ndarray   # rv x d
    query_bias: np.ndarray | None = None   # r, or None
    key_bias: np.ndarray | None = None     # r, or None
    value_bias: np.ndarray | None = None   # rv, or None

    def __post_init__(self):
        q = _as_matrix("query", self.query, None, None)
        d = q.shape[1]
        k = _as_matrix("key", self.key, q.shape[0], d)
        w = _as_matrix("value_in", self.value_in, None, d)
        o = _as_matrix("value_out", self.value_out, d, w.shape[0])
        for name, value in (("query", q), ("key", k), ("value_out", o), ("value_in", w)):
            object.__setattr__(self, name, value)
        for name, size in (("query_bias", q.shape[0]), ("key_bias", q.shape[0]),
                           ("value_bias", w.shape[0])):
            b = getattr(self, name)
            if b is not None:
                b = validation.real_array(name, b)
                if b.shape != (size,):
                    raise ParticlesUserError(f"{name} must be a vector of length {size} (the "
                                             f"head's {'value' if name == 'value_bias' else 'score'}"
                                             f" rank), got shape {b.shape}")
                object.__setattr__(self, name, b)

    @property
    def has_biases(self) -> bool:
        return any(b is not None for b in (self.query_bias, self.key_bias, self.value_bias))

    @property
    def dim(self) -> int:
        return self.query.shape[1]

    @property
    def score_rank(self) -> int:
        return self.query.shape[0]

    @property
    def value_rank(self) -> int:
        return self.value_in.shape[0]

    @property
    def score(self) -> np.ndarray:
        """The d x d score matrix M = Q^T K."""
        return self.query.T @ self.key

    @property
    def value(self) -> np.ndarray:
        """The d x d value matrix V = O W."""
        return self.value_out @ self.value_in

    @classmethod
    def from_matrices(cls, score, value=None) -> "Head":
        """Head from full d x d matrices M and V (V defaults to M, the paper's aligned case)."""
        m = validation.real_array("score matrix M", score)
        d = m.shape[-1] if m.ndim == 2 else 0
        m = _as_matrix("score matrix M", m, d, d)
        v = m if value is None else _as_matrix("value matrix V", value, d, d)
        eye = np.eye(d)
        return cls(query=eye, key=m.copy(), value_out=eye.copy(), value_in=v.copy())

    @classmethod
    def from_factors(cls, query, key, value_out=None, value_in=None, *, query_bias=None,
                     key_bias=None, value_bias=None) -> "Head":
        """Head from factors M = Q^T K (r x d each) and V = O W (O: d x rv, W: rv x d),
        with optional biases (see the module's docstring).

        Without value factors, V = M (aligned) with O = Q^T, W = K.
        """
        q = validation.real_array("query factor Q", query)
        d = q.shape[-1] if q.ndim == 2 else 0
        q = _as_matrix("query factor Q", q, None, d)
        k = _as_matrix("key factor K", key, q.shape[0], d)
        if value_out is None and value_in is None:
            o, w = q.T.copy(), k.copy()
        elif value_out is None or value_in is None:
            raise ParticlesUserError("give both value factors (value_out O: d x rv, value_in W: rv x d) or neither")
        else:
            w = _as_matrix("value factor W (value_in)", value_in, None, d)
            o = _as_matrix("value factor O (value_out)", value_out, d, w.shape[0])
        return cls(query=q, key=k, value_out=o, value_in=w, query_bias=query_bias,
                   key_bias=key_bias, value_bias=value_bias)

    @classmethod
    def scalar(cls, strength: float, dim: int) -> "Head":
        """M = V = strength * I (the paper's scalar head)."""
        strength = validation.real_number("strength", strength)
        dim = validation.integer("dim", dim, 1)
        return cls.from_matrices(strength * np.eye(dim))
