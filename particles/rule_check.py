"""A user rule compiled alone on the active arch before the engine's kernels are built, so
that a function Taichi cannot compile (NumPy inside a kernel, a 64-bit exp on SPIR-V, ...)
is reported by rule, function and file instead of as a traceback from deep in the engine."""
import json
import os
import re
import signal
import time
import subprocess
import sys
from pathlib import Path

import numpy as np
import taichi as ti

from . import backend
from .kernel_math import rule_lift
from .rules import Rule, files_defining

PROBE_SECONDS = float(os.environ.get("PARTICLES_RULE_PROBE_SECONDS", "60"))   # per probe child

# the edge cases a rule meets in the pair loop: z = 0, small and large |z| (z = beta * s);
# a position-aware kernel also i == j (the diagonal every row sees), i = 0 and j = n - 1
Z_EDGES = (0.0, 0.5, -0.5, 30.0, -30.0, 1e4, -1e4)
POSITION_EDGES = ((0, 0, 1), (0, 0, 3), (1, 1, 3), (2, 2, 3), (0, 2, 3), (2, 0, 3), (1, 0, 2))
# The child probes a position-aware kernel further: every (i, j) for every n up to
# SMALL_N, and at the scene's own n every (i, j) up to EXHAUSTIVE_N tokens (a million pairs
# per z, well under a second), beyond it the first, middle and last EDGE_ROWS rows against
# the same rows and a band of BAND keys either side of the diagonal.
SMALL_N = 16
EXHAUSTIVE_N = 1024
EDGE_ROWS = 32
BAND = 64
AT_N = "probing n = "   # the child's progress on stdout: which n a crash or hang happened at
CHILD_ERROR = "probe error: "   # the child's own error, one JSON line on stdout
# Taichi's C++ log line: "[W 12/02/26 06:15:41.517 8616] [file.cpp:fn@66] message"
_TAICHI_LOG = re.compile(r"^\[[TDIWEC] \d\d/\d\d/\d\d \d\d:\d\d:\d\d\.\d+ \d+\]")
# Taichi holds its offline-cache lock for milliseconds while it loads or saves the cache's
# index; older than this, the process that made it was killed meanwhile (nothing holds it
# open: Taichi creates the file, closes it and deletes it when done).
STALE_LOCK_SECONDS = 60.0

_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[4])
try:
    from particles import backend
    backend.init("cpu")
    from particles.rules import get_rule, load_rule_file
    load_rule_file(sys.argv[2])
    from particles.rule_check import probe_edges, probe_positions
    probe_edges(get_rule(sys.argv[1]), sys.argv[3])
    probe_positions(get_rule(sys.argv[1]), sys.argv[3], int(sys.argv[5]))
except Exception as err:
    print(%r + json.dumps([type(err).__name__, str(err)]), flush=True)
    sys.exit(3)
print("probe ok")
""" % (CHILD_ERROR,)
_PROBED: dict = {}


from .errors import RuleCompileError  # noqa: E402  (a rule that does not compile: the one family)


def _first_lines(err: Exception, limit: int = 3) -> str:
    lines = [ln.strip() for ln in str(err).strip().splitlines()
             if ln.strip(" ^~")]  # drop the caret lines that underline source
    return " ".join(lines[-limit:]).rstrip(".") or type(err).__name__


def _sentence(text: str) -> str:
    text = text.rstrip()
    return text if text.endswith((".", "?", "!")) else text + "."


def check_rule_compiles(rule: Rule, dtype: str, n: int = 0) -> None:
    """Compile and run each of the rule's functions on one value; raise RuleCompileError naming
    the rule and the function that fails. Built-in rules are part of the engine: not probed.
    n: the number of tokens it will meet (0: unknown), probed in the child where affordable."""
    if rule.source == "built-in":
        return
    probe_in_child(rule, dtype, n)
    probe_edges(rule, dtype)


def _where(rule: Rule, source=None) -> str:
    return f"rule {rule.name!r} (from {source or rule.source})"


def probe_in_child(rule: Rule, dtype: str, n: int = 0) -> None:
    """Evaluate a rule from a file at its edge cases in a child process under a time limit,
    so a crash (SIGFPE from an integer division by zero at i == j, a segfault) or an
    endless loop becomes a RuleCompileError naming the rule instead of taking the process
    down. Rules defined elsewhere (a notebook) cannot be re-made in a child: skipped."""
    files = files_defining(rule.name)
    if not files:
        return
    source = Path(files[-1])
    n = int(n) if rule.positional else 0
    key = (rule.name, str(source), source.stat().st_mtime_ns, dtype, n)
    if key in _PROBED:
        return
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD, rule.name, str(source), dtype, root, str(n)],
                              capture_output=True, text=True, timeout=PROBE_SECONDS, env=env,
                              stdin=subprocess.DEVNULL, start_new_session=True)
    except subprocess.TimeoutExpired as err:
        raise RuleCompileError(
            f"{_where(rule, source)} did not return within {PROBE_SECONDS:g} s when evaluated "
            f"{_cases(rule, err.stdout)} in a separate process: it loops forever or is far too "
            "slow for the pair loop, which calls it n^2 times per step") from None
    if proc.returncode < 0:
        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}"
        hint = (" (an integer division or modulo by zero at a position it meets, e.g. i - j on the "
                "diagonal every row sees; divide floats, or guard the case)" if name == "SIGFPE" else "")
        raise RuleCompileError(
            f"{_where(rule, source)} crashed the process with {name}{hint} when evaluated "
            f"{_cases(rule, proc.stdout)}; nothing was run")
    if proc.returncode != 0 or "probe ok" not in proc.stdout:
        raise RuleCompileError(_child_failure(rule, source, proc))
    _PROBED[key] = True


def _cases(rule: Rule, child_stdout) -> str:
    """Which cases the child was evaluating when it crashed or hung (from its progress lines)."""
    if isinstance(child_stdout, bytes):
        child_stdout = child_stdout.decode(errors="replace")
    at = [ln[len(AT_N):] for ln in (child_stdout or "").splitlines() if ln.startswith(AT_N)]
    zs = f"z in {list(Z_EDGES)}"
    if not rule.positional:
        return f"at its edge cases ({zs})"
    if not at:
        return f"at its edge cases ({zs}, (i, j, n) in {list(POSITION_EDGES)})"
    n = int(at[-1])
    pairs = ("every position i, j < n" if n <= EXHAUSTIVE_N else
             f"rows i within {EDGE_ROWS} of 0, n / 2 and n - 1 against the same keys and keys "
             f"j within {BAND} of i")
    return f"with n = {n} tokens ({zs}, {pairs})"


def position_pairs(n: int) -> np.ndarray:
    """The (i, j) a position-aware kernel is probed at for n tokens, (m, 2) int32."""
    if n <= EXHAUSTIVE_N:
        i, j = np.indices((n, n)).reshape(2, -1)
        return np.stack([i, j], axis=1).astype(np.int32)
    half = EDGE_ROWS // 2
    rows = np.unique(np.concatenate([np.arange(EDGE_ROWS), np.arange(n // 2 - half, n // 2 + half),
                                     np.arange(n - EDGE_ROWS, n)]))
    pairs = set()
    for i in rows.tolist():
        pairs.update((i, j) for j in rows.tolist())
        pairs.update((i, j) for j in range(max(0, i - BAND), min(n, i + BAND + 1)))
    return np.array(sorted(pairs), dtype=np.int32)


def probe_positions(rule: Rule, dtype: str, n: int = 0) -> None:
    """Evaluate a position-aware kernel at every (i, j) of n = 1 .. SMALL_N tokens and at
    the scene's n (``position_pairs``), each z in Z_EDGES; each n is announced on stdout
    first, so that a crash or a hang names it. Run in the probe's child: a crash ends it."""
    if not rule.positional:
        return
    real = ti.f32 if dtype == "float32" else ti.f64
    taichi_fn = ti.func(rule.kernel)

    @ti.kernel
    def probe_at(z: real, pairs: ti.types.ndarray(dtype=ti.i32, ndim=2), n: ti.i32) -> real:
        total = ti.cast(0, real)
        for p in range(pairs.shape[0]):
            total += ti.cast(taichi_fn(z, pairs[p, 0], pairs[p, 1], n), real)
        return total

    for count in sorted(set(range(1, SMALL_N + 1)) | ({int(n)} if n > 0 else set())):
        print(f"{AT_N}{count}", flush=True)
        host = position_pairs(count)
        pairs = ti.ndarray(ti.i32, shape=host.shape)
        pairs.from_numpy(host)
        for z in Z_EDGES:
            probe_at(z, pairs, count)


def _child_failure(rule: Rule, source, proc) -> str:
    """The probe child's own error (its JSON line, else the last line of its stderr that is
    not Taichi's log), with Taichi's log lines set apart and a stale cache lock named."""
    own = [ln for ln in proc.stdout.splitlines() if ln.startswith(CHILD_ERROR)]
    lines = [ln.rstrip() for ln in proc.stderr.splitlines() if ln.strip()]
    taichi_log = [ln for ln in lines if _TAICHI_LOG.match(ln)]
    if own:
        try:
            kind, text = json.loads(own[-1][len(CHILD_ERROR):])
        except (ValueError, TypeError):
            kind, text = "Error", own[-1][len(CHILD_ERROR):]
        message = (text if kind == "RuleCompileError" else
                   f"{_where(rule, source)} failed when evaluated at its edge cases in a separate "
                   f"process: {kind}: {text}")
    else:
        rest = [ln for ln in lines if not _TAICHI_LOG.match(ln)]
        last = rest[-1].strip() if rest else f"exit status {proc.returncode}"
        message = (f"{_where(rule, source)} failed when evaluated at its edge cases in a separate "
                   f"process: {last}")
    message = _sentence(message)
    note = stale_cache_lock_note()
    if note:   # the note says what its "Lock ... failed" warnings mean
        taichi_log = [ln for ln in taichi_log if "ticache.lock" not in ln]
    if taichi_log:
        message += f" (Taichi's log in that process: {' | '.join(ln.strip() for ln in taichi_log[-3:])})"
    return message + (f" {note}" if note else "")


def kernel_cache_dir() -> Path:
    """Taichi's offline kernel cache of this process (TI_OFFLINE_CACHE_FILE_PATH, else its default)."""
    try:
        cfg = ti.lang.impl.current_cfg()
    except Exception:  # noqa: BLE001 - not initialised: the default configuration
        cfg = ti.lang.impl.default_cfg()
    return Path(os.environ.get("TI_OFFLINE_CACHE_FILE_PATH") or cfg.offline_cache_file_path)


def stale_cache_lock(cache_dir=None, now=None) -> tuple[Path, float] | None:
    """(path, age in seconds) of Taichi's kernel-cache lock when it is older than
    STALE_LOCK_SECONDS (left by a killed process: no process holds it), else None."""
    lock = Path(cache_dir or kernel_cache_dir()) / "ticache.lock"
    try:
        age = (time.time() if now is None else now) - lock.stat().st_mtime
    except OSError:
        return None
    return (lock, age) if age > STALE_LOCK_SECONDS else None


def stale_cache_lock_note(cache_dir=None) -> str:
    """A sentence naming a stale kernel-cache lock and its remedy, or ''."""
    stale = stale_cache_lock(cache_dir)
    if stale is None:
        return ""
    lock, age = stale
    return (f"Note: Taichi's kernel-cache lock {str(lock)!r} is {age / 60:.0f} min old and no "
            "process holds it (a process killed while saving the cache left it): until it is "
            "removed every process compiles its kernels again, saves none and warns 'Lock ... "
            f"failed'. Remove it (rm {'-r ' if lock.is_dir() else ''}{str(lock)!r}); nothing else in "
            "the cache need go.")


def probe_edges(rule: Rule, dtype: str) -> None:
    """Compile each of the rule's functions and run it at the edge cases; RuleCompileError
    naming the rule and the function that fails."""
    real = ti.f32 if dtype == "float32" else ti.f64
    weight, potential = rule_lift(rule, real)   # the passes' own lift, each compiled alone here
    for role, fn in (("kernel", rule.kernel), ("potential", rule.potential)):
        if fn is None:
            continue
        positional = role == "kernel" and rule.positional

        @ti.kernel
        def probe(z: real, i: ti.i32, j: ti.i32, n: ti.i32) -> real:
            value = ti.cast(0, real)
            if ti.static(role == "kernel"):
                value = weight(z, i, j, n)
            else:
                value = potential(z)
            return value

        try:
            for z in Z_EDGES:
                for i, j, n in (POSITION_EDGES if positional else ((0, 0, 1),)):
                    probe(z, i, j, n)
        except Exception as err:  # noqa: BLE001 - any compile failure is the rule's
            name = getattr(fn, "__name__", repr(fn))
            raise RuleCompileError(
                f"rule {rule.name!r} (from {rule.source}): its {role} function {name!r} does not "
                f"compile on arch {backend.active_arch()!r} in {dtype}: {_sentence(_first_lines(err))} A rule "
                "is compiled into a Taichi kernel: write it with Taichi math on one scalar z "
                "(or z, i, j, n for a position-aware kernel; ti.exp, ti.log, ti.max, ...), not NumPy or other Python objects") from None
