"""The one validation of the engine's inputs, shared by the Python API and the scene loader.

Imports NumPy only (never Taichi), so ``scenes`` can call it at load time. Every check raises
``ParticlesUserError`` (a ValueError) or ``ParticlesTypeError`` (also a TypeError) whose
message names the argument, what was given and what is allowed, e.g.::

    dt = 1e-50 is zero in float32 (the largest float32 is 3.4e+38, the smallest positive
    1.18e-38); use dtype 'float64' or a value in range
"""
from __future__ import annotations

import math
import numbers
import os

import numpy as np

from .errors import ParticlesTypeError, ParticlesUserError


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(value) -> str:
    return type(value).__name__


# ----------------------------------------------------------------------------- scalars

MAX_STEPS = 10**12   # a run of more steps could never finish (and step counts stay exact)


def integer(name: str, value, minimum: int | None = None, maximum: int | None = None) -> int:
    """A whole number (int or NumPy integer, not bool, not float, not a string) in
    [minimum, maximum]."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, np.integer)):
        raise ParticlesTypeError(f"{name} must be an integer, got {_show(value)} ({_kind(value)})")
    value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        allowed = (f"from {minimum} to {maximum}" if minimum is not None and maximum is not None
                   else f">= {minimum}" if minimum is not None else f"<= {maximum}")
        raise ParticlesUserError(f"{name} must be an integer {allowed}, got {_show(value)}")
    return value


def step_count(name: str, value, minimum: int = 0) -> int:
    """A number of steps or a step index: an integer from ``minimum`` to MAX_STEPS."""
    return integer(name, value, minimum, MAX_STEPS)


def real_number(name: str, value) -> float:
    """A real scalar (int, float, NumPy real or a 0-d real array), finite."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.integer, np.floating)):
        what = "complex" if isinstance(value, (complex, np.complexfloating)) else _kind(value)
        raise ParticlesTypeError(f"{name} must be a real number, got {_show(value)} ({what})")
    out = float(value)
    if not np.isfinite(out):
        raise ParticlesUserError(f"{name} must be a finite number, got {_show(value)}")
    return out


def dtype_problem(value, dtype: str) -> str | None:
    """Why ``value`` (a number or array) does not survive the cast to ``dtype``, or None.

    Not finite after the cast (too large), or a nonzero value that becomes zero (too small).
    """
    real = np.dtype(dtype)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        x = np.asarray(value, dtype=np.float64)
        cast = x.astype(real)
    limits = (f"the largest {real.name} is {np.finfo(real).max:.3g}, the smallest positive "
              f"{np.finfo(real).tiny:.3g}")
    if not np.all(np.isfinite(cast)):
        return f"is not finite in {real.name} ({limits})"
    if np.any((cast == 0) & (x != 0)):
        return f"is zero in {real.name} ({limits})"
    return None


def factor_problem(value, dtype: str) -> str | None:
    """Why a head's factor cannot run in the dtype, or None: an entry overflows it, or the
    whole factor vanishes in it (entries far below the head's scale may round to 0: harmless)."""
    problem = dtype_problem(value, dtype)
    if problem is None or "not finite" in problem:
        return problem
    return problem if np.any(value) and not np.any(np.asarray(value).astype(dtype)) else None


def in_dtype(name: str, value, dtype: str, hint: str = "use dtype 'float64' or a value in range"):
    """Refuse a value that overflows, or underflows to zero, in the run's dtype."""
    why = dtype_problem(value, dtype)
    if why is not None:
        shown = _show(value) if np.ndim(value) == 0 else "an entry"
        raise ParticlesUserError(f"{name} = {shown} {why}; {hint}" if np.ndim(value) == 0
                                 else f"{name}: {shown} {why}; {hint}")


def positive(name: str, value, dtype: str | None = None) -> float:
    """A real number > 0, finite (and in the dtype's range when one is given)."""
    out = real_number(name, value)
    if not out > 0:
        raise ParticlesUserError(f"{name} must be a positive number (> 0), got {_show(value)}")
    if dtype is not None:
        in_dtype(name, out, dtype)
    return out


def non_negative(name: str, value, dtype: str | None = None) -> float:
    out = real_number(name, value)
    if not out >= 0:
        raise ParticlesUserError(f"{name} must be a number >= 0, got {_show(value)}")
    if dtype is not None:
        in_dtype(name, out, dtype)
    return out


def choice(name: str, value, allowed) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ParticlesUserError(f"{name} must be one of {', '.join(map(repr, allowed))}, "
                                 f"got {_show(value)}")
    return value


# ----------------------------------------------------------------------------- arrays

def _shape_of(name: str, value) -> tuple:
    if isinstance(value, (str, bytes, dict, set)) or value is None:
        raise ParticlesTypeError(f"{name} must be an array of real numbers, got {_show(value)} "
                                 f"({_kind(value)})")
    try:
        return np.shape(value)
    except (ValueError, TypeError):
        raise ParticlesTypeError(f"{name} must be a rectangular array of real numbers (rows of "
                                 f"equal length), got a ragged {_kind(value)}") from None


def real_array(name: str, value, dtype: str | None = None) -> np.ndarray:
    """A float64 copy of a real, finite array (refuses complex, strings, objects, ragged)."""
    _shape_of(name, value)
    try:
        with np.errstate(all="ignore"):
            raw = np.asarray(value)
    except (ValueError, TypeError):
        raise ParticlesTypeError(f"{name} must be a rectangular array of real numbers, got a ragged "
                                 f"or mixed {_kind(value)}") from None
    if raw.dtype.kind == "c":
        raise ParticlesTypeError(f"{name} must be real, got complex values (dtype {raw.dtype}); "
                                 "pass the real part explicitly if that is meant")
    if raw.dtype.kind not in "iuf":
        raise ParticlesTypeError(f"{name} must be an array of real numbers, got dtype {raw.dtype}"
                                 f" ({_kind(value)})")
    x = raw.astype(np.float64)
    if not np.all(np.isfinite(x)):
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(x))[0])
        raise ParticlesUserError(f"{name} must be finite, got NaN or Inf (first at index {bad})")
    if dtype is not None:
        in_dtype(name, x, dtype)
    return x


def tokens_shape(value, name: str = "tokens") -> tuple[int, int, int, bool]:
    """(R, n, d, ensemble) of tokens of shape (n, d) or (R, n, d), n, d, R >= 1, without
    converting them (the memory check comes before any copy)."""
    shape = _shape_of(name, value)
    if len(shape) not in (2, 3) or min(shape, default=0) < 1:
        raise ParticlesUserError(f"{name} must have shape (n, d) or (R, n, d) with n, d and R >= 1, "
                                 f"got shape {tuple(shape)}")
    R, n, d = (1,) + tuple(shape) if len(shape) == 2 else tuple(shape)
    return int(R), int(n), int(d), len(shape) == 3


def tokens(value, dtype: str | None = None, name: str = "tokens",
           geometry: str | None = None) -> tuple[np.ndarray, bool]:
    """Tokens as float64 (R, n, d) and whether an ensemble was given."""
    R, n, d, ensemble = tokens_shape(value, name)
    x = real_array(name, value, dtype).reshape(R, n, d)
    if geometry == "sphere":
        norms = np.linalg.norm(x, axis=-1)
        if np.any(norms == 0):
            where = tuple(int(i) for i in np.argwhere(norms == 0)[0])
            raise ParticlesUserError(f"{name}: token {where[-1]}"
                                     f"{f' of replica {where[0]}' if ensemble else ''} is the zero "
                                     "vector, which has no place on the sphere")
    return x, ensemble


def betas(value, replicas: int, dtype: str | None = None, name: str = "beta") -> np.ndarray:
    """One inverse temperature, or one per replica: real, finite, > 0, in the dtype."""
    if np.ndim(value) == 0 and not isinstance(value, (str, bytes)):
        b = positive(name, value, dtype)
        return np.full(replicas, b)
    arr = real_array(name, value)
    if arr.ndim != 1 or arr.size != replicas:
        raise ParticlesUserError(f"{name} must be a number or one value per replica ({replicas}), "
                                 f"got shape {arr.shape}")
    if not np.all(arr > 0):
        raise ParticlesUserError(f"{name} must be positive (> 0), got {_show(value)}")
    if dtype is not None:
        in_dtype(name, arr, dtype)
    return arr.copy()


# ----------------------------------------------------------------------------- memory

def available_bytes() -> int | None:
    """Memory the system can give now (MemAvailable), None where it cannot say."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def estimate_bytes(n: int, d: int, n_heads: int, replicas: int, dtype: str, tok_slots: int,
                   entropy_rate: bool = False) -> int:
    """Memory a Simulation of this size takes at most (device arrays at the largest head
    ranks r = rv = d, plus the float64 host copies of the tokens)."""
    item = 4 if dtype == "float32" else 8
    R, H, r = replicas, n_heads, d
    per_token = (4 * d                     # x, xdot and two integrator stages
                 + H * d + 4 * H           # head outputs, row statistics
                 + tok_slots               # per-token observables
                 + H * 4 * r               # q, k, u, g
                 + (H * 3 * r if entropy_rate else 0))
    return R * n * (per_token * item + 3 * d * 8)


def memory(need: int, what: str, have: int | None = None) -> None:
    """Refuse, with the figures, a size that cannot fit in the memory available now."""
    have = available_bytes() if have is None else have
    if have is not None and need > have:
        raise ParticlesUserError(f"{what} needs about {need / 2**30:.1f} GiB of memory, but "
                                 f"{have / 2**30:.1f} GiB is available; use fewer tokens or replicas")


# ----------------------------------------------------------------------------- pairs

# One evaluation of the O(n^2) pair pass is one kernel call per head pass, and a signal
# (Ctrl-C, SIGTERM) is seen only between kernel calls (in a run, between steps). A pair costs
# about 2d + 24 operations (score, value, exponential). Measured on the development machine
# (2-core AMD EPYC, shared, load ~10): 2.6-3.1 ns per pair at d = 3 (n = 16384, 32768),
# 14.4 ns at d = 64 (n = 4096, 8 heads): about 0.2 ns per operation and core.
NS_PER_PAIR_OPERATION = 0.2
EVALUATION_SECONDS = 5.0     # the longest evaluation a CPU run may have without the override
STEP_CHECK_SECONDS = 2.0     # a run looks for a signal at least this often (whole steps)
PAIR_LIMIT_VARIABLE = "PARTICLES_MAX_PAIRS"


def _cores() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    threads = os.environ.get("TI_CPU_MAX_NUM_THREADS", "")
    return max(1, min(cores, int(threads)) if threads.isdigit() and int(threads) > 0 else cores)


def evaluation_seconds(pairs: float, d: int, cores: int | None = None) -> float:
    """Estimated seconds of one evaluation of ``pairs`` token pairs at dimension d on the CPU."""
    return float(pairs) * (2 * d + 24) * NS_PER_PAIR_OPERATION * 1e-9 / (cores or _cores())


def cpu_pair_limit(d: int = 3, cores: int | None = None) -> float:
    """Pairs per evaluation allowed on a CPU: those of EVALUATION_SECONDS at dimension d
    (1.7e9 at d = 3 on 2 cores, 3.3e8 at d = 64), or PARTICLES_MAX_PAIRS."""
    text = os.environ.get(PAIR_LIMIT_VARIABLE, "").strip()
    if not text:
        return EVALUATION_SECONDS / evaluation_seconds(1, d, cores)
    try:
        limit = float(text)
    except ValueError:
        limit = math.nan
    if not limit > 0:
        raise ParticlesUserError(f"{PAIR_LIMIT_VARIABLE} = {text!r} must be a positive number of "
                                 "token pairs per evaluation (n^2 x heads x replicas)")
    return limit


def pair_guard(n: int, n_heads: int, replicas: int, arch: str, where: str = "", d: int = 3,
               cores: int | None = None) -> None:
    """Refuse a CPU system whose one evaluation would hold off Ctrl-C and SIGTERM for more
    than seconds (EVALUATION_SECONDS), naming its size, the wait and the override."""
    pairs = float(replicas) * n_heads * n * n
    limit = cpu_pair_limit(d, cores)
    if arch != "cpu" or pairs <= limit:
        return
    cores = cores or _cores()
    raise ParticlesUserError(
        f"{where or 'tokens: '}n = {n} ({n_heads} heads, {replicas} replicas, d = {d}) means "
        f"{pairs:.2g} token pairs per evaluation of the O(n^2) pair pass: on this CPU ({cores} "
        f"cores) one evaluation takes about {_duration(evaluation_seconds(pairs, d, cores))} "
        f"(about {NS_PER_PAIR_OPERATION * (2 * d + 24) / 2:.3g} ns per pair on 2 shared cores, as measured), "
        "inside kernel calls that Ctrl-C and SIGTERM wait for. Use fewer tokens (n^2 x heads x "
        f"replicas up to {limit:.2g} here) or arch 'gpu', or accept the wait: "
        f"{PAIR_LIMIT_VARIABLE}={_ceil_e(pairs)} in the environment")


def steps_between_signal_checks(step_seconds: float, most: int = 16) -> int:
    """Steps a run advances between two looks for a signal: at most ``most``, and no more
    than STEP_CHECK_SECONDS of estimated work (one step for a large system)."""
    return int(max(1, min(most, STEP_CHECK_SECONDS // max(step_seconds, 1e-12))))


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.0f} h"


def _ceil_e(value: float) -> str:
    """A short number at least ``value`` (2.3e12 -> '3e12')."""
    exponent = int(math.floor(math.log10(value)))
    return f"{math.ceil(value / 10 ** exponent)}e{exponent}"


__all__ = ["MAX_STEPS", "integer", "step_count", "real_number", "positive", "non_negative", "choice", "dtype_problem",
           "in_dtype", "real_array", "tokens_shape", "tokens", "betas", "available_bytes",
           "estimate_bytes", "memory", "evaluation_seconds", "cpu_pair_limit", "pair_guard",
           "steps_between_signal_checks"]
