"""Interaction rules: a kernel k(z) of the scaled score z = beta * s, a normalisation
of the weights over j, and optionally the potential K (K' = k) that defines the energy.

Rules are plain Python functions of one scalar, written with Taichi math
(``ti.exp``, ``ti.max``, ...); the kernel factory lifts them into the pair loop.
A user registers a rule from their own file without editing the package::

    import taichi as ti
    import particles

    def sigmoid(z):
        return 1 / (1 + ti.exp(-z))

    def softplus(z):              # its potential: softplus' = sigmoid
        return ti.log(1 + ti.exp(z))

    particles.register_rule("sigmoid", kernel=sigmoid, normalization="softmax", potential=softplus)

Taichi compiles the functions from their source, so they must be ``def`` functions
(not lambdas) using Taichi math.

A rule may also see the pair's positions: a kernel with four parameters,
``k(z, i, j, n)`` (i the query's token index, j the key's, n the number of tokens),
is position-aware; one with a single parameter compiles exactly as before. A
position-aware rule has no potential (the energy is NaN): positions break the
symmetry a potential needs.
"""
from __future__ import annotations

import importlib.util
import inspect
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import ParticlesUserError

NORMALIZATIONS = ("softmax", "mean")   # of a user's rule; the built-in "sinkhorn" has its own pass


@dataclass(frozen=True)
class Rule:
    name: str
    kernel: Callable | None
    normalization: str
    potential: Callable | None = None
    # k(z) = e^z exactly: the engine then shifts by the row maximum (flash-attention
    # style), keeps the energy in log form, and can compute the entropy rate.
    exponential: bool = False
    source: str = "built-in"
    positional: bool = False  # kernel k(z, i, j, n) instead of k(z)

    @property
    def has_potential(self) -> bool:
        return not self.positional and (self.exponential or self.potential is not None)


SINKHORN_ITERATIONS = 20   # the built-in rule's (docs/MODEL.md, "Sinkhorn attention": its convergence)


@dataclass(frozen=True)
class SinkhornRule(Rule):
    """Doubly stochastic weights (particles.sinkhorn): e^z scaled by row and column factors,
    ``iterations`` column-then-row normalisations after the first row one (the softmax), fewer
    once every column sums to 1 within ``tolerance`` (0: always all). No potential: the
    energy is NaN."""

    iterations: int = SINKHORN_ITERATIONS
    tolerance: float = 0.0

    @property
    def has_potential(self) -> bool:
        return False


def sinkhorn_rule(iterations: int = SINKHORN_ITERATIONS, tolerance: float = 0.0) -> SinkhornRule:
    """The Sinkhorn rule with its own iteration limit and tolerance; ``rule="sinkhorn"`` is
    this with the defaults. Scenes: [dynamics] sinkhorn_iterations, sinkhorn_tolerance."""
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 0:
        raise ParticlesUserError(f"sinkhorn iterations must be a whole number >= 0, got {iterations!r}")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
        raise ParticlesUserError(f"sinkhorn tolerance must be a number in [0, 1) (0: every "
                                 f"iteration), got {tolerance!r}")
    return SinkhornRule("sinkhorn", None, "sinkhorn", exponential=True, iterations=int(iterations),
                        tolerance=float(tolerance))


def _kernel_arity(name: str, fn: Callable) -> int:
    """1 for k(z), 4 for a position-aware k(z, i, j, n); anything else is refused."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    count = sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    if count not in (1, 4):
        raise ParticlesUserError(f"rule {name!r}: the kernel takes {count} arguments; write k(z) or the "
                                 "position-aware k(z, i, j, n) (i, j token indices, n tokens)")
    return count


# the built-in rules in Taichi's own max (ti.func maps the builtin to ti.max), so that this
# registry of plain functions never imports Taichi: scenes and Attention read it
def _relu(z):
    return max(z, 0)


def _relu_potential(z):
    p = max(z, 0)
    return p * p / 2


_REGISTRY: dict[str, Rule] = {
    "exp": Rule("exp", None, "mean", exponential=True),
    "softmax": Rule("softmax", None, "softmax", exponential=True),
    "relu": Rule("relu", _relu, "mean", _relu_potential),
    "sinkhorn": sinkhorn_rule(),
}
BUILTIN_RULES = tuple(_REGISTRY)
_LOADED_FILES: dict[Path, list[str]] = {}


def register_rule(name: str, kernel: Callable, normalization: str = "softmax",
                  potential: Callable | None = None, *, overwrite: bool = False) -> Rule:
    """Register an interaction rule under ``name`` so scenes and the API can use it.

    kernel: k(z) of the scaled score z = beta * s, written with Taichi math, or the
        position-aware k(z, i, j, n) (then there is no potential).
    normalization: 'softmax' (w_ij = k / sum_j k) or 'mean' (w_ij = k / n).
    potential: K with K' = k, used for the energy; without it energies are NaN.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ParticlesUserError(f"rule name must be an identifier-like string, got {name!r}")
    if name in BUILTIN_RULES:
        raise ParticlesUserError(f"rule {name!r} is built in and cannot be replaced")
    if name in _REGISTRY and not overwrite:
        if _same_definition(_REGISTRY[name], kernel, normalization, potential):
            return _REGISTRY[name]   # a notebook cell run again: keep the rule (and its kernels)
        raise ParticlesUserError(f"rule {name!r} is already registered with another definition "
                                 "(pass overwrite=True to replace it)")
    for role, fn in (("kernel", kernel), ("potential", potential)):
        if fn is None and role == "potential":
            continue
        if not callable(fn):
            raise ParticlesTypeError(f"rule {name!r}: {role} must be a function of the scaled score z")
        if getattr(fn, "__name__", "") == "<lambda>":
            raise ParticlesUserError(f"rule {name!r}: the {role} is a lambda; Taichi compiles rules from their "
                                     "source, so write it as a `def` function")
    if normalization not in NORMALIZATIONS:
        raise ParticlesUserError(f"rule {name!r}: normalization must be one of {NORMALIZATIONS}, "
                                 f"got {normalization!r}")
    positional = _kernel_arity(name, kernel) == 4
    if positional and potential is not None:
        raise ParticlesUserError(f"rule {name!r}: a position-aware kernel k(z, i, j, n) has no potential "
                                 "(the energy is undefined); register it without one")
    if potential is not None and _kernel_arity(name, potential) != 1:
        raise ParticlesUserError(f"rule {name!r}: the potential must be a function K(z) of the scaled score")
    source = getattr(getattr(kernel, "__code__", None), "co_filename", "user code")
    rule = Rule(name, kernel, normalization, potential, source=source, positional=positional)
    _REGISTRY[name] = rule
    return rule


def _code_key(fn):
    code = getattr(fn, "__code__", None)
    return None if code is None else (code.co_code, code.co_consts, code.co_names)


def _same_definition(rule: Rule, kernel, normalization, potential) -> bool:
    """The same rule written again (same normalization, kernel and potential code)."""
    return (rule.normalization == normalization and rule.kernel is not None
            and _code_key(rule.kernel) == _code_key(kernel)
            and (rule.potential is None) == (potential is None)
            and (potential is None or _code_key(rule.potential) == _code_key(potential)))


def get_rule(name: str) -> Rule:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ParticlesUserError(f"unknown rule {name!r}; registered rules: {', '.join(sorted(_REGISTRY))}. "
                                 "A user rule must be registered first (scene key dynamics.rule_file)") from None


def registered_rules() -> dict[str, Rule]:
    return dict(_REGISTRY)


from .errors import MissingFileError, ParticlesTypeError, ParticlesUserError, RuleFileError  # noqa: E402  (a rule file that cannot run: the one family)


def _forget(module_name: str, before: set) -> None:
    """Undo a failed rule file: its module and any rule it registered before failing."""
    sys.modules.pop(module_name, None)
    for name in set(_REGISTRY) - before:
        del _REGISTRY[name]


def _user_line(err: BaseException, path: Path) -> str:
    frames = [f for f in traceback.extract_tb(err.__traceback__) if Path(f.filename) == path]
    return f" at line {frames[-1].lineno}" if frames else ""


def files_defining(name: str) -> list[Path]:
    """The rule files loaded so far that registered rule ``name``, in load order."""
    return [path for path, names in _LOADED_FILES.items() if name in names]


def load_rule_file(path: str | Path) -> list[str]:
    """Execute a user's Python file that calls ``register_rule``; returns the names it added."""
    path = Path(path).resolve()
    if not path.is_file():
        raise MissingFileError(f"rule file {str(path)!r} does not exist")
    if path in _LOADED_FILES:  # executing it again would re-register its rules
        return _LOADED_FILES[path]
    before = set(_REGISTRY)
    module_name = f"particles_user_rules_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except KeyboardInterrupt:
        _forget(module_name, before)
        raise
    except SyntaxError as err:
        _forget(module_name, before)
        raise RuleFileError(f"rule file {str(path)!r} has a syntax error at line {err.lineno}: "
                            f"{err.msg}") from None
    except BaseException as err:  # noqa: BLE001 - user code may raise anything, sys.exit included
        _forget(module_name, before)
        what = (f"called sys.exit({err.code!r})" if isinstance(err, SystemExit)
                else f"raised {type(err).__name__}: {err}")
        line = _user_line(err, path)
        raise RuleFileError(f"rule file {str(path)!r} {what}{line} while it was executed; "
                            "nothing was computed. A rule file should only define its functions "
                            "and call particles.register_rule") from None
    _LOADED_FILES[path] = sorted(set(_REGISTRY) - before)
    return _LOADED_FILES[path]
