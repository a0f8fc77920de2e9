"""The one cluster labeller: tokens i, j are joined when cos(x_i, x_j) > threshold, and the
clusters are the connected components of that neighbour graph.

The log's ``clusters`` column, the sweep's cluster counts and the video's cluster colours all
come from here, at the scene's ``cluster_threshold``. The graph is built in blocks of rows
(at most ``max_elems`` cosines in memory at once, never a dense n x n matrix for large n) as a
sparse matrix, and scipy's ``connected_components`` labels it.
"""
from __future__ import annotations

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

MAX_ELEMS = 1 << 22


def _components(x: np.ndarray, threshold: float, max_elems: int) -> tuple[np.ndarray, np.ndarray]:
    """(min pairwise cosine per replica, component label per token (k * n,)) of finite x (k, n, d)."""
    k, n, _ = x.shape
    with np.errstate(invalid="ignore", divide="ignore"):   # a zero token: nan cosines, no pairs
        u = x / np.linalg.norm(x, axis=-1, keepdims=True)
    ut = np.swapaxes(u, 1, 2)
    rows = max(1, min(n, max_elems // max(k * n, 1)))
    mins = np.full(k, np.inf)
    src, dst = [], []
    for a in range(0, n, rows):
        b = min(a + rows, n)
        cos = np.matmul(u[:, a:b], ut)                    # (k, b - a, n)
        diag = np.arange(a, b)
        cos[:, diag - a, diag] = np.inf                   # the diagonal is no pair
        mins = np.minimum(mins, cos.min(axis=(1, 2)))
        cos[:, diag - a, diag] = -np.inf
        r, i, j = np.nonzero(cos > threshold)
        src.append(r * n + i + a)
        dst.append(r * n + j)
    if n == 1:
        mins[:] = 1.0
    src, dst = np.concatenate(src), np.concatenate(dst)
    graph = coo_matrix((np.ones(src.size, dtype=np.int8), (src, dst)), shape=(k * n, k * n))
    _, labels = connected_components(graph, directed=False)
    return mins, labels


def cluster_stats(x, threshold: float, max_elems: int = MAX_ELEMS) -> tuple[np.ndarray, np.ndarray]:
    """Minimum pairwise cosine and number of clusters of every replica of x (R, n, d).

    Non-finite replicas give (nan, nan). Replicas go in chunks of at most ``max_elems`` cosines.
    """
    x = np.asarray(x, dtype=np.float64)
    R, n, _ = x.shape
    mins, counts = np.full(R, np.nan), np.full(R, np.nan)
    ok = np.flatnonzero(np.isfinite(x).all(axis=(1, 2)))
    chunk = max(1, max_elems // max(n * n, 1))
    for start in range(0, ok.size, chunk):
        sel = ok[start:start + chunk]
        m, labels = _components(x[sel], threshold, max_elems)
        replica_of_component = np.empty(labels.max() + 1, dtype=np.int64)
        replica_of_component[labels] = np.arange(labels.size) // n
        mins[sel] = m
        counts[sel] = np.bincount(replica_of_component, minlength=sel.size)
    return mins, counts


def pairwise_extremes(x, threshold: float, block: int = 1024) -> tuple[float, int]:
    """(minimum pairwise cosine, number of clusters) of one configuration x (n, d), holding at
    most ``block`` rows of cosines at once."""
    x = np.asarray(x, dtype=np.float64)
    mins, labels = _components(x[None], threshold, max_elems=max(1, block) * len(x))
    return float(mins[0]), int(labels.max() + 1)


def cluster_labels(x, threshold: float, max_elems: int = MAX_ELEMS) -> np.ndarray:
    """Cluster label per token of x (n, d): 0, 1, ... in order of each cluster's smallest index."""
    x = np.asarray(x, dtype=np.float64)
    _, labels = _components(x[None], threshold, max_elems)
    first = np.full(labels.max() + 1, labels.size)
    np.minimum.at(first, labels, np.arange(labels.size))
    rank = np.empty_like(first)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    return rank[labels]


__all__ = ["cluster_stats", "cluster_labels", "pairwise_extremes"]
