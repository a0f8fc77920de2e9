"""Per-head attention options: the head's rule and beta, its mask and its positional bias.

Positions are token indices 0..n-1 (the order of the tokens array). For head h:

    mask     which keys j row i sees:   "none"           all j
                                        "causal"         j <= i
                                        "window"         |i - j| <= window
                                        "causal_window"  i - window <= j <= i
             Masked pairs take no part in the weights nor in the normalisation
             (softmax: N_i sums over the visible keys; mean: N_i is their count).
    alibi    slope m >= 0 of the ALiBi bias: z_ij = beta s_ij - m |i - j|.
    beta     the head's own inverse temperature (None: the replica's beta).
    rule     the head's own rule (None: the simulation's rule).
    rotary   ``particles.Rotary`` (RoPE): q_i and k_j rotated by their positions before the
             scores (None: no rotation; see ``particles.rotary``).

Every mask is a band j in [i - below, i + above] clipped to [0, n), so the pair loops
visit only the visible keys: a causal head does about half the pair work.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, replace

from . import validation
from .errors import ParticlesTypeError, ParticlesUserError
from .rotary import Rotary
from .rules import Rule, get_rule

from .vocabulary import MASKS
UNBOUNDED = 1 << 30  # a band edge farther than any token


@dataclass(frozen=True)
class Attention:
    """One head's options; the default is plain full attention with the simulation's rule."""

    mask: str = "none"
    window: int | None = None
    alibi: float = 0.0
    beta: float | None = None
    rule: Rule | str | None = None
    rotary: Rotary | None = None

    def __post_init__(self):
        if not isinstance(self.mask, str) or self.mask not in MASKS:
            raise ParticlesUserError(f"mask must be one of {MASKS}, got {self.mask!r}")
        windowed = self.mask in ("window", "causal_window")
        if windowed and (not isinstance(self.window, numbers.Integral) or isinstance(self.window, bool)
                         or self.window < 0):
            raise ParticlesUserError(f"mask {self.mask!r} needs a window, an integer >= 0 (got {self.window!r})")
        if not windowed and self.window is not None:
            raise ParticlesUserError(f"window is given but mask is {self.mask!r}; use mask 'window' or "
                                     "'causal_window'")
        if windowed:
            object.__setattr__(self, "window", int(self.window))
        object.__setattr__(self, "alibi", validation.non_negative("alibi (the ALiBi slope)", self.alibi))
        if self.beta is not None:
            object.__setattr__(self, "beta", validation.positive("beta (the head's own)", self.beta))
        if self.rule is not None and not isinstance(self.rule, (str, Rule)):
            raise ParticlesTypeError(f"rule must be None, a rule name or a particles.Rule, got "
                                     f"{type(self.rule).__name__}")
        if isinstance(self.rule, str):
            object.__setattr__(self, "rule", get_rule(self.rule))
        if self.rotary is not None and not isinstance(self.rotary, Rotary):
            raise ParticlesTypeError(f"rotary must be None or a particles.Rotary, got "
                                     f"{type(self.rotary).__name__}")

    @property
    def band(self) -> tuple[int, int]:
        """(below, above): row i sees keys i - below .. i + above."""
        # a window wider than any sequence is no limit (and must stay an int32 in the kernels)
        below = min(self.window, UNBOUNDED) if self.mask in ("window", "causal_window") else UNBOUNDED
        above = 0 if self.mask in ("causal", "causal_window") else below
        return below, above

    @property
    def masked(self) -> bool:
        return self.mask != "none"

    @property
    def positional(self) -> bool:
        """Does the head see positions at all (mask, bias or a position-aware rule)?"""
        return (self.masked or self.alibi > 0 or self.rotary is not None
                or bool(self.rule is not None and self.rule.positional))

    @property
    def has_potential(self) -> bool:
        """Full, unbiased attention with a rule that has a potential: the energy is defined."""
        return not self.positional and self.rule is not None and self.rule.has_potential


def alibi_slopes(n_heads: int) -> list[float]:
    """The ALiBi paper's slopes: the geometric sequence 2^(-8 h / H), h = 1..H."""
    return [2.0 ** (-8.0 * h / n_heads) for h in range(1, n_heads + 1)]


def resolve(attention, n_heads: int, rule: Rule) -> tuple[Attention, ...]:
    """One Attention per head, each with its rule filled in (``rule`` where it has none).

    attention: None (plain heads), one Attention for every head, or a sequence of H.
    """
    if attention is None:
        attention = Attention()
    if isinstance(attention, Attention):
        attention = [attention] * n_heads
    if isinstance(attention, (str, bytes, dict)) or not hasattr(attention, "__iter__"):
        raise ParticlesTypeError(f"attention must be None, a particles.Attention or one per head "
                                 f"({n_heads}), got {type(attention).__name__}")
    attention = list(attention)
    if len(attention) != n_heads:
        raise ParticlesUserError(f"attention has {len(attention)} entries for {n_heads} heads; give "
                                 "one particles.Attention for every head or one per head")
    out = []
    for h, a in enumerate(attention):
        if not isinstance(a, Attention):
            raise ParticlesTypeError(f"attention[{h}] must be a particles.Attention, got "
                                     f"{type(a).__name__}")
        out.append(a if a.rule is not None else replace(a, rule=rule))
    return tuple(out)
