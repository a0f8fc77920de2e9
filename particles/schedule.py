"""Depth as time: a schedule of layers, each with its own heads, rule and attention options.

Layer l holds for the steps in [starts[l], starts[l+1]) and the last one holds to the end
(a piecewise-constant vector field; the layer of a step is a function of the step count
alone, so a resumed run switches exactly where the uninterrupted one does). Every layer
has the same number of heads: the log's per-head columns are the heads of the layer in
force (the ``layer`` column says which). Weight sharing across layers is a layer listed
twice.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

from . import validation
from .errors import ParticlesTypeError, ParticlesUserError


@dataclass(frozen=True)
class Layer:
    """heads: as Simulation takes them; rule: None for the simulation's rule; attention:
    None, one ``particles.Attention`` for every head, or one per head."""

    heads: Sequence
    rule: object = None
    attention: object = None

    def __post_init__(self):
        if isinstance(self.heads, (str, bytes)) or not hasattr(self.heads, "__len__"):
            raise ParticlesTypeError(f"Layer heads must be a sequence of heads, got "
                                     f"{type(self.heads).__name__}")
        if len(self.heads) == 0:
            raise ParticlesUserError("Layer heads must hold at least one head, got none")
        if self.rule is not None and not isinstance(self.rule, str) and \
                type(self.rule).__name__ != "Rule":
            raise ParticlesTypeError(f"Layer rule must be None, a rule name or a particles.Rule, "
                                     f"got {type(self.rule).__name__}")


@dataclass(frozen=True)
class Schedule:
    layers: tuple
    starts: tuple  # the step at which each layer starts: starts[0] = 0, strictly increasing

    def __post_init__(self):
        for name, value in (("layers", self.layers), ("starts", self.starts)):
            if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
                raise ParticlesTypeError(f"Schedule {name} must be a sequence, got "
                                         f"{type(value).__name__}")
        layers = tuple(self.layers)
        starts = tuple(validation.step_count(f"Schedule starts[{i}]", s)
                       for i, s in enumerate(self.starts))
        object.__setattr__(self, "layers", layers)
        object.__setattr__(self, "starts", starts)
        if not layers:
            raise ParticlesUserError("a schedule needs at least one layer")
        if len(starts) != len(layers):
            raise ParticlesUserError(f"a schedule has {len(layers)} layers but {len(starts)} start steps")
        if starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:])):
            raise ParticlesUserError(f"layer start steps must begin at 0 and increase strictly, got {list(starts)}")
        for idx, layer in enumerate(layers):
            if not isinstance(layer, Layer):
                raise ParticlesTypeError(f"schedule layer {idx} must be a particles.Layer, got {type(layer).__name__}")

    @classmethod
    def every(cls, layers: Sequence[Layer], steps: int) -> "Schedule":
        """Layer l for the steps [l * steps, (l + 1) * steps); the last holds after."""
        steps = validation.step_count("steps (per layer)", steps, 1)
        return cls(tuple(layers), tuple(l * steps for l in range(len(layers))))

    def layer_at(self, step: int) -> int:
        """The index of the layer in force for the step from state ``step``."""
        return bisect.bisect_right(self.starts, int(step)) - 1
