"""Which kernel path serves a simulation: what each path declares it can do, and the one chooser.

A path is a memory layout of the same mathematics (docs/MODEL.md), not a different model:

- ``fused``: k whole steps per kernel launch on the CPU, rows in vector lanes (small n);
- ``tiled``: a launch per kernel, register tiles and key blocks (large n, any arch);
- ``plain``: the straightforward per-kernel pass, for checking the others (never chosen
  by ``auto``).

Each declares the capabilities it serves; ``choose`` gives ``auto`` the fastest path that
declares everything the simulation uses, and refuses an explicit path that cannot serve it,
naming what is missing. Every path reads the integrator's tableau (``integrators``), so an
integrator needs no declaration. Taichi-free: the scene schema may import it.
"""
from __future__ import annotations

from dataclasses import dataclass

# Size limits of the fused path: loops over components and ranks are unrolled at compile
# time (12 s at d = 64 uncached).
FUSED_MAX_RANK = 64
FUSED_MAX_D = 64
# ``auto``'s preference between fused and tiled (both serve such sizes): fused while the pair
# work of an evaluation, n^2 H (r + rv + EXP_COST) multiply-add equivalents, stays under
# FUSED_MAX_WORK (float32), or n <= FUSED_MAX_N (float64, whose exp is libm per lane).
# Measured with two threads sharing a launch, tiled / fused time (RK4 unless said):
# (1024, 3, 4) 4.1, (1024, 16, 4) 2.1, (2048, 8, 3) 1.9, (1024, 32, 4) 1.4, (2048, 32, 4) 1.3,
# (4096, 3, 4) 1.3 (2.0e9), Euler (1024, 64, 8) rank 8 1.5 and full 1.0; (4096, 16, 4) 1.07
# (3.8e9); Euler (4096, 64, 8) rank 8 0.98 (5.4e9).
FUSED_MAX_N = 256
FUSED_MAX_WORK = 2.5e9
EXP_COST = 24  # the float32 exp and the weight bookkeeping, in multiply-adds per pair

PATHS = ("auto", "fused", "tiled", "plain")

# rule kinds: an exponential rule (exp, softmax: shifted exponentials), a kernel k(z), a
# position-aware kernel k(z, i, j, n)
RULE_KINDS = ("exponential", "kernel", "positional")


def pair_work(n: int, H: int, r: int, rv: int) -> float:
    """Multiply-add equivalents of one evaluation's pair pass (the auto path choice)."""
    return float(n) * n * H * (r + rv + EXP_COST)


def rule_kind(rule) -> str:
    if rule.positional:
        return "positional"
    return "exponential" if rule.exponential else "kernel"


@dataclass(frozen=True)
class Needs:
    """What a simulation uses, as the chooser sees it."""

    rules: frozenset            # of RULE_KINDS
    positions: bool             # masks, ALiBi, a head's own beta or rule
    layers: bool                # a Schedule of more than one layer
    entropy_rate: bool
    arch: str                   # "cpu" or a GPU arch's name
    n: int
    d: int
    H: int
    r: int
    rv: int
    dtype: str


@dataclass(frozen=True)
class PathSpec:
    name: str
    rules: frozenset
    positions: bool
    layers: bool
    entropy_rate: bool
    cpu_only: bool
    max_rank: int | None = None
    max_d: int | None = None

    def missing(self, needs: Needs) -> list[str]:
        """The capabilities ``needs`` uses that this path does not declare (empty: it serves)."""
        out = [f"rules of the form {_RULE_WORDS[k]}" for k in RULE_KINDS
               if k in needs.rules and k not in self.rules]
        if needs.positions and not self.positions:
            out.append("masks, ALiBi or a head's own rule or beta")
        if needs.layers and not self.layers:
            out.append("schedules of layers")
        if needs.entropy_rate and not self.entropy_rate:
            out.append("the entropy rate")
        if self.cpu_only and needs.arch != "cpu":
            out.append(f"arch {needs.arch!r} (it runs on the CPU only)")
        if self.max_rank is not None and max(needs.r, needs.rv) > self.max_rank:
            out.append(f"ranks above {self.max_rank} (got {max(needs.r, needs.rv)})")
        if self.max_d is not None and needs.d > self.max_d:
            out.append(f"d above {self.max_d} (got {needs.d})")
        return out


_RULE_WORDS = {"exponential": "exp/softmax", "kernel": "k(z)", "positional": "k(z, i, j, n)"}
_ALL_RULES = frozenset(RULE_KINDS)

# Fastest first: ``auto`` takes the first that serves (and, for fused, is small enough).
SPECS = (
    PathSpec("fused", rules=frozenset({"exponential", "kernel"}), positions=False, layers=False,
             entropy_rate=False, cpu_only=True, max_rank=FUSED_MAX_RANK, max_d=FUSED_MAX_D),
    PathSpec("tiled", rules=_ALL_RULES, positions=True, layers=True, entropy_rate=True, cpu_only=False),
    PathSpec("plain", rules=_ALL_RULES, positions=True, layers=True, entropy_rate=True, cpu_only=False),
)
SPEC = {s.name: s for s in SPECS}


def _fused_preferred(needs: Needs) -> bool:
    return needs.n <= FUSED_MAX_N or (needs.dtype == "float32"
                                      and pair_work(needs.n, needs.H, needs.r, needs.rv) <= FUSED_MAX_WORK)


def choose(requested: str, needs: Needs) -> str:
    """The path that runs: ``requested`` itself if it serves ``needs`` (else ValueError naming
    what it lacks), or for 'auto' the fastest that serves."""
    if requested not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {requested!r}")
    if requested != "auto":
        missing = SPEC[requested].missing(needs)
        if missing:
            raise ValueError(f"path {requested!r} cannot serve this simulation, which uses "
                             f"{'; '.join(missing)}. Use path 'auto' (or 'tiled', which serves all)")
        return requested
    for spec in SPECS:
        if spec.name == "plain" or spec.missing(needs):
            continue
        if spec.name == "fused" and not _fused_preferred(needs):
            continue
        return spec.name
    raise AssertionError("the tiled path serves every simulation")  # pragma: no cover
