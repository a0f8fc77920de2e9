"""A user rule compiled alone on the active arch before the engine's kernels are built, so
that a function Taichi cannot compile (NumPy inside a kernel, a 64-bit exp on SPIR-V, ...)
is reported by rule, function and file instead of as a traceback from deep in the engine."""
import taichi as ti

from . import backend
from .rules import Rule


class RuleCompileError(ValueError):
    """A rule's kernel or potential does not compile on the active arch."""


def _first_lines(err: Exception, limit: int = 3) -> str:
    lines = [ln.strip() for ln in str(err).strip().splitlines()
             if ln.strip(" ^~")]  # drop the caret lines that underline source
    return " ".join(lines[-limit:]).rstrip(".") or type(err).__name__


def check_rule_compiles(rule: Rule, dtype: str) -> None:
    """Compile and run each of the rule's functions on one value; raise RuleCompileError naming
    the rule and the function that fails. Built-in rules are part of the engine: not probed."""
    if rule.source == "built-in":
        return
    real = ti.f32 if dtype == "float32" else ti.f64
    for role, fn in (("kernel", rule.kernel), ("potential", rule.potential)):
        if fn is None:
            continue
        taichi_fn = ti.func(fn)
        positional = role == "kernel" and rule.positional

        @ti.kernel
        def probe(z: real) -> real:
            value = ti.cast(0, real)
            if ti.static(positional):
                value = ti.cast(taichi_fn(z, 1, 0, 2), real)
            else:
                value = ti.cast(taichi_fn(z), real)
            return value

        try:
            probe(0.5)
        except Exception as err:  # noqa: BLE001 - any compile failure is the rule's
            name = getattr(fn, "__name__", repr(fn))
            raise RuleCompileError(
                f"rule {rule.name!r} (from {rule.source}): its {role} function {name!r} does not "
                f"compile on arch {backend.active_arch()!r} in {dtype}: {_first_lines(err)}. A rule "
                "is compiled into a Taichi kernel: write it with Taichi math on one scalar z "
                "(or z, i, j, n for a position-aware kernel; ti.exp, ti.log, ti.max, ...), not NumPy or other Python objects") from None
