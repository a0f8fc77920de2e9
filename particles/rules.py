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
"""
from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import taichi as ti

NORMALIZATIONS = ("softmax", "mean")


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

    @property
    def has_potential(self) -> bool:
        return self.exponential or self.potential is not None


def _relu(z):
    return ti.max(z, 0)


def _relu_potential(z):
    p = ti.max(z, 0)
    return p * p / 2


_REGISTRY: dict[str, Rule] = {
    "exp": Rule("exp", None, "mean", exponential=True),
    "softmax": Rule("softmax", None, "softmax", exponential=True),
    "relu": Rule("relu", _relu, "mean", _relu_potential),
}
BUILTIN_RULES = tuple(_REGISTRY)
_LOADED_FILES: dict[Path, list[str]] = {}


def register_rule(name: str, kernel: Callable, normalization: str = "softmax",
                  potential: Callable | None = None, *, overwrite: bool = False) -> Rule:
    """Register an interaction rule under ``name`` so scenes and the API can use it.

    kernel: k(z) of the scaled score z = beta * s, written with Taichi math.
    normalization: 'softmax' (w_ij = k / sum_j k) or 'mean' (w_ij = k / n).
    potential: K with K' = k, used for the energy; without it energies are NaN.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"rule name must be an identifier-like string, got {name!r}")
    if name in BUILTIN_RULES:
        raise ValueError(f"rule {name!r} is built in and cannot be replaced")
    if name in _REGISTRY and not overwrite:
        if _same_definition(_REGISTRY[name], kernel, normalization, potential):
            return _REGISTRY[name]   # a notebook cell run again: keep the rule (and its kernels)
        raise ValueError(f"rule {name!r} is already registered with another definition "
                         "(pass overwrite=True to replace it)")
    for role, fn in (("kernel", kernel), ("potential", potential)):
        if fn is None and role == "potential":
            continue
        if not callable(fn):
            raise TypeError(f"rule {name!r}: {role} must be a function of the scaled score z")
        if getattr(fn, "__name__", "") == "<lambda>":
            raise ValueError(f"rule {name!r}: the {role} is a lambda; Taichi compiles rules from their "
                             "source, so write it as a `def` function")
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"rule {name!r}: normalization must be one of {NORMALIZATIONS}, "
                         f"got {normalization!r}")
    source = getattr(getattr(kernel, "__code__", None), "co_filename", "user code")
    rule = Rule(name, kernel, normalization, potential, source=source)
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
        raise ValueError(f"unknown rule {name!r}; registered rules: {', '.join(sorted(_REGISTRY))}. "
                         "A user rule must be registered first (scene key dynamics.rule_file)") from None


def registered_rules() -> dict[str, Rule]:
    return dict(_REGISTRY)


class RuleFileError(ValueError):
    """A user's rule file that cannot be executed (syntax error, an exception, sys.exit)."""


def _forget(module_name: str, before: set) -> None:
    """Undo a failed rule file: its module and any rule it registered before failing."""
    sys.modules.pop(module_name, None)
    for name in set(_REGISTRY) - before:
        del _REGISTRY[name]


def _user_line(err: BaseException, path: Path) -> str:
    import traceback
    frames = [f for f in traceback.extract_tb(err.__traceback__) if Path(f.filename) == path]
    return f" at line {frames[-1].lineno}" if frames else ""


def load_rule_file(path: str | Path) -> list[str]:
    """Execute a user's Python file that calls ``register_rule``; returns the names it added."""
    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"rule file {str(path)!r} does not exist")
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
