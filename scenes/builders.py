"""A resolved scene's tokens and heads: NumPy arrays and ``Head`` objects from the resolved
tables (``Scene.build_tokens`` / ``Scene.build_heads`` call these; the sweep builds each grid
point's heads here too).

Imports only the core's Taichi-free ``Head`` and the scenes' own generators, so the models and
the scene both use it without importing each other.
"""
from __future__ import annotations

import numpy as np

from particles.heads import Head

from . import configurations, head_builders


def build_tokens(tokens: dict) -> np.ndarray:
    """Initial tokens from a resolved [tokens] table: (n, d), or (R, n, d) if replicas > 1."""
    seed = tokens.get("seed", 0)
    reps = [_one_replica(tokens, seed + r) for r in range(tokens.get("replicas", 1))]
    return reps[0] if len(reps) == 1 else np.stack(reps)


def _one_replica(t: dict, seed: int) -> np.ndarray:
    n, d, init = t["n"], t["d"], t.get("init", "random")
    if init == "random":
        x = configurations.random(n, d, seed)
    elif init == "equiangular":
        x = configurations.equiangular(n, d, t.get("gamma", 0.0), seed)
    elif init == "orthogonal":
        x = configurations.orthogonal(n, d, seed)
    elif init == "clusters":
        x = configurations.clusters(n, d, t.get("clusters", 3), t.get("spread", 0.1), seed,
                                    centers=t.get("centers"))
    elif init == "file":
        x = configurations.from_file(t["path"], n, d)
    elif init == "text":
        x = configurations.text(t["model"], t["text"], t.get("layernorm", True), t.get("layer", 0))
    else:
        raise ValueError(f"unknown init {init!r}")
    noise = t.get("noise", 0.0)
    return configurations.perturb(x, noise, seed) if noise > 0 else x


def _matrix(value) -> np.ndarray:
    if isinstance(value, str):
        return np.asarray(np.load(value, allow_pickle=False), dtype=np.float64)
    return np.asarray(value, dtype=np.float64)


def build_head_entry(entry: dict, d: int) -> list[Head]:
    """The heads of one resolved heads entry ([[heads]] table, or [heads] with count)."""
    kind = entry["kind"]
    count = entry.get("count", 1)
    seed = entry.get("seed", 0)
    strengths = entry.get("strengths") or [entry.get("strength", 1.0)] * count
    if kind == "scalar":
        heads = head_builders.scalar(strengths, d)
    elif kind == "subspace":
        if "count" not in entry:            # one [[heads]] table
            basis = entry.get("basis")
            heads = [head_builders.subspace(
                d, strengths[0], block=entry.get("block"),
                basis=None if basis is None else _matrix(basis))]
        else:
            start = entry["block"][0] if "block" in entry else 0
            heads = head_builders.subspaces(d, strengths, entry["rank"], start)
    elif kind == "near_orthogonal":
        heads = head_builders.near_orthogonal(count, d, entry.get("rank", 1),
                                              entry.get("angle", 75.0), seed, strengths)
    elif kind == "random_symmetric":
        heads = [head_builders.random_symmetric(d, seed + h, s) for h, s in enumerate(strengths)]
    elif kind == "random":
        heads = [head_builders.random(d, entry.get("rank", d), seed + h, s)
                 for h, s in enumerate(strengths)]
    elif kind == "pretrained":
        heads = head_builders.pretrained(entry["model"], entry.get("layer", 0), entry.get("select"),
                                         entry.get("fold_layernorm", False),
                                         entry.get("rotary", "keep"),
                                         entry.get("value_from", "weights"),
                                         entry.get("biases", "keep"))
    elif kind == "matrix":
        vm = entry.get("value_matrix")
        heads = [head_builders.matrix(_matrix(entry["score"]), None if vm is None else _matrix(vm))]
    else:
        raise ValueError(f"unknown head kind {kind!r}")
    value, noise = entry.get("value", "aligned"), entry.get("value_noise", 0.0)
    return [head_builders.with_value(h, value, noise, seed + i) for i, h in enumerate(heads)]


def build_heads(heads, d: int) -> list[Head]:
    """All heads of a resolved scene's ``heads`` (a list of entries or one table)."""
    entries = heads if isinstance(heads, list) else [heads]
    return [h for entry in entries for h in build_head_entry(entry, d)]
