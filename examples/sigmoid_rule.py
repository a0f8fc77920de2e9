"""A user-defined interaction rule: sigmoid attention, registered without editing the package."""
import taichi as ti

import particles


def sigmoid(z):
    """Kernel k(z) of the scaled score z = beta * s (Taichi math; a `def`, not a lambda)."""
    return 1 / (1 + ti.exp(-z))


def softplus(z):
    """Its potential K with K' = k, so the log has energies."""
    return ti.log(1 + ti.exp(z))


particles.register_rule("sigmoid", kernel=sigmoid, normalization="softmax", potential=softplus)
