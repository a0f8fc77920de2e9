"""A user-defined position-aware rule: sigmoid attention that fades with distance in the
sequence, registered without editing the package.

A kernel with four parameters, k(z, i, j, n), sees the pair's positions: i is the query
token's index, j the key token's, n the number of tokens (all integers). A key d positions
away counts 1 / (1 + d) as much as it would at distance 0.
"""
import taichi as ti

import particles


def sigmoid_recency(z, i, j, n):
    """k(z, i, j, n): sigmoid of the scaled score z = beta * s, divided by 1 + |i - j|."""
    return 1 / (1 + ti.exp(-z)) / (1 + ti.abs(i - j))


# a position-aware rule has no potential: the log's energy columns are NaN for it
particles.register_rule("sigmoid_recency", kernel=sigmoid_recency, normalization="softmax")
