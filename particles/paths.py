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

A path is served by one or more implementations (the code that runs), listed in its row
as data: when each applies (rule kinds, positions, mixed rules, the entropy rate, arch, a
least n) and which of the Simulation's per-kernel operands it reads. ``choose`` returns a
``Plan``: the path, the implementation of every pair pass (one per distinct rule of a layer)
and the operands to allocate. Each kernel module registers its factory under its
implementation's name (``register``); ``Simulation`` builds only what the plan names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .vocabulary import NORMALISATIONS
from .errors import ParticlesUserError

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
WIDE_MIN_N = 512  # from this many tokens the wide pass serves exponential rules (benchmarks/step.py)

PATHS = ("auto", "fused", "tiled", "plain")

# rule kinds: an exponential rule (exp, softmax: shifted exponentials), a kernel k(z), a
# position-aware kernel k(z, i, j, n)
RULE_KINDS = ("exponential", "kernel", "positional", "sinkhorn")


def pair_work(n: int, H: int, r: int, rv: int) -> float:
    """Multiply-add equivalents of one evaluation's pair pass (the auto path choice)."""
    return float(n) * n * H * (r + rv + EXP_COST)


def rule_kind(rule) -> str:
    if rule.normalization == "sinkhorn":   # doubly stochastic weights: a pass of their own
        return "sinkhorn"
    if rule.positional:
        return "positional"
    return "exponential" if rule.exponential else "kernel"


@dataclass(frozen=True)
class PassNeeds:
    """What one pair pass (the heads of one rule in one layer) uses."""

    rule: str              # one of RULE_KINDS
    positions: bool        # its layer has masks, ALiBi or a head's own beta
    mixed_rules: bool      # its layer has heads with other rules (each rule its own pass)
    entropy_rate: bool     # q and k are kept for the entropy rate
    arch: str
    n: int
    head_terms: bool = False   # its layer has biases or rotary positions (particles.head_terms)


@dataclass(frozen=True)
class Needs:
    """What a simulation uses, as the chooser sees it (``passes``: its pair passes, in order)."""

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
    passes: tuple = ()
    normalisation: str = "post"   # where the LayerNorm sits (particles.normalisation)
    head_terms: bool = False    # biases or rotary positions in some layer
    adaptive: bool = False      # adaptive steps (particles.adaptive): per-kernel operations


# the Simulation's per-kernel arrays an implementation may read or write (besides the state,
# the factors, beta and the observables' buffers, which every path has)
OPERANDS = ("q", "k", "u", "g", "f", "row")


@dataclass(frozen=True)
class Implementation:
    """One code of a path, as data: what it serves and the operands it reads or writes.
    ``steps``: it advances whole steps (the fused kernel), else it is one pair pass."""

    name: str
    rules: frozenset
    positions: bool = False
    mixed_rules: bool = False
    entropy_rate: bool = False
    arch: str = "any"            # "cpu", "gpu" (any GPU arch) or "any"
    min_n: int = 0
    operands: frozenset = frozenset()
    steps: bool = False
    head_terms: bool = False     # biases and rotary added to q, k, u after project

    def serves(self, p: PassNeeds) -> bool:
        return (p.rule in self.rules and (self.positions or not p.positions)
                and (self.head_terms or not p.head_terms)
                and (self.mixed_rules or not p.mixed_rules)
                and (self.entropy_rate or not p.entropy_rate)
                and (self.arch == "any" or (self.arch == "cpu") == (p.arch == "cpu"))
                and p.n >= self.min_n)


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
    implementations: tuple = field(default=())   # preferred first
    # LayerNorm placements (particles.normalisation): transforms around a pair pass, so every
    # path that calls one pass per evaluation serves them; the fused whole step only "post"
    normalisations: frozenset = frozenset({"post"})
    head_terms: bool = False     # query/key/value biases and rotary positions
    adaptive: bool = True        # adaptive steps (an embedded pair under error control)

    def implementation_for(self, p: PassNeeds) -> Implementation:
        """The first of this path's implementations that serves pass ``p``."""
        found = next((i for i in self.implementations if i.serves(p)), None)
        if found is None:
            extras = [w for w, on in (("masks, ALiBi or a head's own beta", p.positions),
                                      ("the entropy rate", p.entropy_rate)) if on]
            raise ValueError(f"no pair pass of path {self.name!r} serves rules of the form "
                             f"{_RULE_WORDS[p.rule]} with {' or '.join(extras) or 'these heads'}")
        return found

    def missing(self, needs: Needs) -> list[str]:
        """The capabilities ``needs`` uses that this path does not declare (empty: it serves)."""
        out = [f"rules of the form {_RULE_WORDS[k]}" for k in RULE_KINDS
               if k in needs.rules and k not in self.rules]
        if needs.positions and not self.positions:
            out.append("masks, ALiBi or a head's own rule or beta")
        if needs.head_terms and not self.head_terms:
            out.append("query/key/value biases or rotary positions")
        if needs.layers and not self.layers:
            out.append("schedules of layers")
        if needs.normalisation not in self.normalisations:
            out.append(f"normalisation {needs.normalisation!r} (a LayerNorm placement other than "
                       "the paper's sphere, 'post'; the tiled and plain paths serve it)")
        if needs.entropy_rate and not self.entropy_rate:
            out.append("the entropy rate")
        if needs.adaptive and not self.adaptive:
            out.append("adaptive steps (integrator 'dopri5', 'bs32' or particles.Adaptive) or "
                       "retraction 'exp' (stepped outside the fused kernel)")
        if self.cpu_only and needs.arch != "cpu":
            out.append(f"arch {needs.arch!r} (it runs on the CPU only)")
        if self.max_rank is not None and max(needs.r, needs.rv) > self.max_rank:
            out.append(f"ranks above {self.max_rank} (got {max(needs.r, needs.rv)})")
        if self.max_d is not None and needs.d > self.max_d:
            out.append(f"d above {self.max_d} (got {needs.d})")
        return out


_RULE_WORDS = {"exponential": "exp/softmax", "kernel": "k(z)", "positional": "k(z, i, j, n)",
               "sinkhorn": "Sinkhorn (doubly stochastic)"}
_ALL_RULES = frozenset(RULE_KINDS)

_EXP = frozenset({"exponential"})
_PAIR_RULES = frozenset({"exponential", "kernel", "positional"})   # one normalisation per row
_NORMALISATIONS = frozenset(NORMALISATIONS)
_PER_KERNEL = frozenset({"q", "k", "u", "g", "f", "row"})
# the implementations, each registered by its kernel module under its name
FUSED = Implementation("fused", frozenset({"exponential", "kernel"}), steps=True)  # kernels_fused
WIDE = Implementation("wide", _EXP, arch="cpu", min_n=WIDE_MIN_N,                 # kernels_wide
                      operands=frozenset({"f", "row"}))
FAST = Implementation("fast", _EXP, positions=True, entropy_rate=True, arch="cpu",  # kernels
                      operands=frozenset({"f", "row"}))   # (q, k too for the entropy rate)
GPU = Implementation("gpu", _PAIR_RULES, positions=True, mixed_rules=True, entropy_rate=True,
                     arch="gpu", operands=_PER_KERNEL)                                # kernels_gpu
PLAIN = Implementation("plain", _PAIR_RULES, positions=True, mixed_rules=True, entropy_rate=True,
                       operands=_PER_KERNEL, head_terms=True)                         # kernels

SINKHORN = Implementation("sinkhorn", frozenset({"sinkhorn"}), mixed_rules=True,       # sinkhorn
                          operands=_PER_KERNEL)
# Fastest first: ``auto`` takes the first that serves (and, for fused, is small enough).
SPECS = (
    PathSpec("fused", rules=frozenset({"exponential", "kernel"}), positions=False, layers=False,
             entropy_rate=False, cpu_only=True, max_rank=FUSED_MAX_RANK, max_d=FUSED_MAX_D,
             implementations=(FUSED,)),
    PathSpec("tiled", rules=_ALL_RULES, positions=True, layers=True, entropy_rate=True, cpu_only=False,
             implementations=(WIDE, FAST, GPU, PLAIN, SINKHORN), head_terms=True, normalisations=_NORMALISATIONS),
    PathSpec("plain", rules=_ALL_RULES, positions=True, layers=True, entropy_rate=True, cpu_only=False,
             implementations=(PLAIN, SINKHORN), head_terms=True, normalisations=_NORMALISATIONS),
)
SPEC = {s.name: s for s in SPECS}
IMPLEMENTATIONS = {i.name: i for s in SPECS for i in s.implementations}


@dataclass(frozen=True)
class Plan:
    """What runs: the path, the implementation of each pair pass (one for a whole-step
    implementation) and the per-kernel operands to allocate at full size."""

    path: str
    implementations: tuple
    operands: frozenset
    reduction: str = "serial"    # the observables' column reduction (REDUCTIONS)

    @property
    def implementation(self) -> str:
        """The implementations' names, distinct, in pass order ("wide", "fast+plain")."""
        return "+".join(dict.fromkeys(i.name for i in self.implementations))

    @property
    def steps(self) -> bool:
        return any(i.steps for i in self.implementations)


# The per-token observables' column reduction over tokens (registered like the passes): one
# thread per (replica, slot) on the CPU (kernels), parallel chunks and a finish over them on a
# GPU (kernels_gpu), where a loop over n on one thread would serialise the launch.
REDUCTIONS = {"cpu": "serial", "gpu": "chunked"}

_FACTORIES: dict[str, Callable] = {}


def register(name: str, factory: Callable) -> None:
    """A kernel module's factory for implementation ``name`` (declared in SPECS) or for a
    reduction (REDUCTIONS)."""
    if name not in IMPLEMENTATIONS and name not in REDUCTIONS.values():
        raise ValueError(f"no implementation {name!r} is declared in paths.SPECS")
    _FACTORIES[name] = factory


def factory(name: str) -> Callable:
    """The registered factory of implementation ``name``."""
    if name not in _FACTORIES:
        raise LookupError(f"implementation {name!r} has no factory: its kernel module was not imported")
    return _FACTORIES[name]


def plan(path: str, needs: Needs) -> Plan:
    """The implementations of path ``path`` (which serves ``needs``) and their operands."""
    spec = SPEC[path]
    if spec.implementations[0].steps:  # whole steps: one implementation runs everything
        chosen = spec.implementations[:1]
    else:
        passes = needs.passes or (PassNeeds(next(iter(sorted(needs.rules))), needs.positions, False,
                                            needs.entropy_rate, needs.arch, needs.n),)
        chosen = tuple(spec.implementation_for(p) for p in passes)
    operands = frozenset().union(*(i.operands for i in chosen))
    if needs.entropy_rate:
        operands |= {"q", "k"}   # the entropy rate's pass reads them
    return Plan(path, chosen, operands, REDUCTIONS["cpu" if needs.arch == "cpu" else "gpu"])


def _fused_preferred(needs: Needs) -> bool:
    return needs.n <= FUSED_MAX_N or (needs.dtype == "float32"
                                      and pair_work(needs.n, needs.H, needs.r, needs.rv) <= FUSED_MAX_WORK)


def choose(requested: str, needs: Needs) -> Plan:
    """The plan that runs: path ``requested`` itself if it serves ``needs`` (else ValueError
    naming what it lacks), or for 'auto' the fastest that serves; with its implementations."""
    return plan(choose_path(requested, needs), needs)


def choose_path(requested: str, needs: Needs) -> str:
    """The path's name alone (see ``choose``)."""
    if requested not in PATHS:
        raise ParticlesUserError(f"path must be one of {PATHS}, got {requested!r}")
    if requested != "auto":
        missing = SPEC[requested].missing(needs)
        if missing:
            raise ParticlesUserError(f"path {requested!r} cannot serve this simulation, which uses "
                                     f"{'; '.join(missing)}. Use path 'auto' (or 'tiled', which serves all)")
        return requested
    for spec in SPECS:
        if spec.name == "plain" or spec.missing(needs):
            continue
        if spec.name == "fused" and not _fused_preferred(needs):
            continue
        return spec.name
    raise AssertionError("the tiled path serves every simulation")  # pragma: no cover
