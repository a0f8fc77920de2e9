"""The scene schema: every section and key, their types, defaults and checks.

``resolve(raw, base_dir, default_name)`` turns the dict read from a TOML file into
the *resolved* scene data (every default filled, relative paths made absolute,
``t_end`` turned into ``steps``) and the list of every problem found. It never
raises on a user's mistake and never executes user code (a ``rule_file`` is only
checked to exist). ``scenes/README.md`` documents each key listed here.
"""
from __future__ import annotations

import difflib
import math
from pathlib import Path

import numpy as np

from particles.integrators import INTEGRATORS, Adaptive
from particles import validation
from particles.errors import ParticlesUserError
from particles.vocabulary import ARCHES, BUILTIN_RULES, DTYPES, GEOMETRIES, MASKS, NORMALISATIONS

from . import configurations, head_builders, pretrained_keys
from .specs import (MISSING, BadValue, Spec, boolean, choice, has_control_character, int_pair,
                    integer, number, number_list, show, string, type_name, vectors)

SECTIONS = ("tokens", "heads", "dynamics", "log", "render", "output")
TOP_KEYS = ("name", "description") + SECTIONS + ("layers",)

INITS = ("random", "equiangular", "orthogonal", "clusters", "file", "text")
TOKEN_KEYS = ("n", "d", "init", "seed", "gamma", "clusters", "spread", "centers", "path",
              "noise", "replicas") + pretrained_keys.TOKEN_KEYS
INIT_ONLY = {"gamma": "equiangular", "clusters": "clusters", "spread": "clusters",
             "centers": "clusters", "path": "file", **{k: "text" for k in pretrained_keys.TOKEN_KEYS}}

HEAD_KINDS = ("scalar", "subspace", "near_orthogonal", "random_symmetric", "random", "matrix",
              "pretrained")
# a head's own attention options (any kind): rule, beta, mask, window, ALiBi slope
HEAD_ATTENTION_KEYS = ("rule", "beta", "mask", "window", "alibi_slope")
HEAD_KEYS = ("kind", "count", "strength", "strengths", "seed", "value", "value_noise", "block",
             "basis", "rank", "angle", "score", "value_matrix") + HEAD_ATTENTION_KEYS + \
    pretrained_keys.HEAD_KEYS
# keys that only some kinds take, per form ("array" = [[heads]], "table" = [heads] + count)
KIND_KEYS = {
    "array": {"scalar": (), "subspace": ("block", "basis"), "random_symmetric": (),
              "random": ("rank",), "matrix": ("score", "value_matrix")},
    "table": {"scalar": (), "subspace": ("block", "rank"), "near_orthogonal": ("rank", "angle"),
              "random_symmetric": (), "random": ("rank",), "matrix": ("score", "value_matrix"),
              "pretrained": pretrained_keys.HEAD_KEYS},
}
KIND_SPECIFIC = ("block", "basis", "rank", "angle", "score", "value_matrix") + pretrained_keys.HEAD_KEYS
VALUES = head_builders.VALUE_MODES

# the integrator registry owns its names (rk4 first: the default)
INTEGRATOR_NAMES = tuple(sorted(INTEGRATORS, key=lambda name: name != "rk4"))
ADAPTIVE_NAMES = tuple(name for name in INTEGRATOR_NAMES if isinstance(INTEGRATORS[name], Adaptive))
MAX_STEPS = validation.MAX_STEPS   # one limit for the scene loader and the API
DYNAMICS_KEYS = ("geometry", "rule", "rule_file", "beta", "betas", "dt", "steps", "t_end",
                 "integrator", "dtype", "arch", "mask", "window", "alibi", "layer_every",
                 "normalisation", "ngpt_alpha", "sinkhorn_iterations",
                 "sinkhorn_tolerance", "rtol", "atol", "dt_min", "dt_max",
                 "stop_kinetic", "stop_energy_rate", "stop_clusters", "stop_attention", "stop_window",
                 "retraction")
LAYER_KEYS = ("start", "heads", "rule", "mask", "window", "alibi")
LOG_KEYS = ("every", "energy", "radial", "entropy", "entropy_rate", "clusters_every",
            "cluster_threshold", "trajectory_every")
VIEWS = ("auto", "circle", "sphere", "pca", "heads")
COLOR_BY = ("index", "cluster", "radial", "entropy", "norm")
PROJECTIONS = ("pca_initial", "pca_final")
PANELS = ("energy", "energy_rate", "radial_dominance", "entropy", "gamma_bar")
RENDER_KEYS = ("enabled", "file", "frames", "fps", "view", "color_by", "color_head", "trails",
               "rotate", "projection", "panels", "dpi", "width", "height", "claim")
RENDER_EXTENSIONS = (".mp4", ".gif")
# render.RenderConfig's ranges (scenes cannot import render; tests/test_faults_run.py checks
# that the two agree), so a scene is refused at load, naming its file and key, not mid-run
RENDER_FPS_MAX, RENDER_DPI, RENDER_PIXELS = 240, (10, 1000), (64, 8192)
OUTPUT_KEYS = ("dir", "run_dir", "final_checkpoint")

SECTION_KEYS = {"tokens": TOKEN_KEYS, "heads": HEAD_KEYS, "dynamics": DYNAMICS_KEYS,
                "log": LOG_KEYS, "render": RENDER_KEYS, "output": OUTPUT_KEYS, "layers": LAYER_KEYS}




# ----------------------------------------------------------------------------- sections

def _suggest(key: str, allowed, where: str) -> str:
    close = difflib.get_close_matches(key, list(allowed), n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{close[0]}'?"
    homes = [s for s, keys in SECTION_KEYS.items() if key in keys and f"[{s}]" not in where]
    homes.sort(key=lambda s: s in ("heads", "layers"))  # a head's own rule/beta/mask: second
    if homes:
        return f"; it belongs in [{homes[0]}]"
    return f" (allowed: {', '.join(allowed)})"


class _Section:
    """Reads one table: converts each key, fills defaults, records problems."""

    def __init__(self, problems: list, raw, label: str, allowed, name: str):
        self.problems = problems
        self.label = label          # "[dynamics]" or "[[heads]] #1"
        self.out: dict = {}
        self.ok = isinstance(raw, dict)
        if not self.ok:
            problems.append(f"{name}: expected a table {label}, got {show(raw)} "
                            f"({type_name(raw)})")
            raw = {}
        self.raw = raw
        for key in raw:
            if key not in allowed:
                problems.append(f"unknown key '{key}' in {label}{_suggest(key, allowed, label)}")

    def problem(self, key: str, text: str) -> None:
        self.problems.append(f"{self.label} {key}: {text}")

    def has(self, key: str) -> bool:
        return key in self.raw

    def take(self, key: str, spec: Spec, default=MISSING, required: bool = False, store=True):
        """The converted value, or ``default`` when absent; MISSING when absent/invalid."""
        if key not in self.raw:
            if required:
                self.problem(key, f"missing (required): give {spec.expected}")
                return MISSING
            if default is not MISSING and store:
                self.out[key] = default
            return default
        v = self.raw[key]
        try:
            value = spec.convert(v)
        except BadValue as bad:
            kind = f" ({type_name(v)})" if bad.wrong_type else ""
            self.problem(key, f"expected {spec.expected}, got {show(v)}{kind}{bad.hint}")
            return MISSING
        if store:
            self.out[key] = value
        return value

    def not_applicable(self, key: str, why: str) -> None:
        if key in self.raw:
            self.problem(key, f"does not apply {why}; remove it")


def _path_value(sec: _Section, key: str, base_dir: Path, suffixes=None, required=False):
    """A file path relative to the scene's folder, stored absolute; must exist."""
    p = sec.take(key, string(nonempty=True), required=required, store=False)
    if p is MISSING:
        return MISSING
    full = (base_dir / Path(p).expanduser()).resolve()
    if suffixes and full.suffix.lower() not in suffixes:
        sec.problem(key, f"expected a {' / '.join(suffixes)} file, got {show(p)}")
        return MISSING
    if not full.is_file():
        sec.problem(key, f"file not found: '{full}' (from {show(p)}; relative paths start at the "
                         f"scene file's folder '{base_dir}')")
        return MISSING
    sec.out[key] = str(full)
    return str(full)


def _catch(sec: _Section, key: str, fn, *args, **kwargs):
    """Run a builder; turn its refusal (a ParticlesUserError) into a problem of ``key``."""
    try:
        return fn(*args, **kwargs)
    except ParticlesUserError as exc:
        sec.problem(key, str(exc))
        return MISSING


# ----------------------------------------------------------------------------- [tokens]

def _tokens(problems, raw, base_dir: Path) -> dict:
    sec = _Section(problems, raw, "[tokens]", TOKEN_KEYS, "tokens")
    if not sec.ok:
        return sec.out
    text_init = sec.raw.get("init") == "text"   # n and d then come from the text and the model
    n = sec.take("n", integer(2), required=not text_init)
    d = sec.take("d", integer(2), required=not text_init)
    init = sec.take("init", choice(*INITS), "random")
    sec.take("seed", integer(0), 0)
    for key, only in INIT_ONLY.items():
        if init is not MISSING and init != only:
            sec.not_applicable(key, f"to init = '{init}' (only to init = '{only}')")
    if init == "equiangular":
        gamma = sec.take("gamma", number(), 0.0)
        if gamma is not MISSING and n is not MISSING:
            lo, hi = configurations.equiangular_range(n)
            if not lo - 1e-12 <= gamma <= hi + 1e-12:
                sec.problem("gamma", f"expected a number in [-1/(n-1), 1] = [{lo:.6g}, 1] for "
                                     f"n = {n}, got {show(gamma)}")
            elif d is not MISSING:
                _catch(sec, "init", configurations.check_equiangular, n, d, gamma)
    elif init == "orthogonal":
        if n is not MISSING and d is not MISSING and n > d:
            sec.problem("init", f"'orthogonal' needs n <= d (at most d orthonormal vectors in "
                                f"R^d), got n = {n} > d = {d}")
    elif init == "clusters":
        centers = MISSING
        if sec.has("centers"):
            centers = sec.take("centers", vectors(d if d is not MISSING else None))
            if centers is not MISSING and any(not any(r) for r in centers):
                sec.problem("centers", "a centre is the zero vector; it cannot be normalised")
                centers = MISSING
        k_default = len(centers) if centers is not MISSING else 3
        k = sec.take("clusters", integer(1), k_default)
        sec.take("spread", number(0), 0.1)
        if k is not MISSING and n is not MISSING and k > n:
            sec.problem("clusters", f"expected at most n = {n} clusters, got {k}")
        if k is not MISSING and centers is not MISSING and len(centers) != k:
            sec.problem("centers", f"expected {k} centres (one per cluster), got {len(centers)}")
    elif init == "file":
        if not sec.has("path"):
            sec.problem("path", "missing (required for init = 'file'): give the path of a "
                                ".npy, .npz or .csv file")
        path = _path_value(sec, "path", base_dir, suffixes=(".npy", ".npz", ".csv"))
        if path is not MISSING:
            _catch(sec, "path", configurations.from_file, path,
                   n if n is not MISSING else None, d if d is not MISSING else None)
    elif init == "text":
        pretrained_keys.tokens(sec, base_dir, n, d)
    sec.take("noise", number(0), 0.0)
    sec.take("replicas", integer(1), 1)
    return sec.out


# ----------------------------------------------------------------------------- heads

def _matrix_value(sec: _Section, key: str, d, base_dir: Path, required=False):
    """A d x d matrix: nested list, or the path of a .npy file (stored absolute)."""
    if key not in sec.raw:
        if required:
            sec.problem(key, "missing (required for kind = 'matrix'): give a d x d nested list "
                             "or the path of a .npy file")
        return MISSING
    if isinstance(sec.raw[key], str):
        path = _path_value(sec, key, base_dir, suffixes=(".npy",))
        if path is MISSING:
            return MISSING
        try:
            m = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            sec.problem(key, f"could not read '{path}': {exc}")
            return MISSING
        if d is not MISSING and m.shape != (d, d):
            sec.problem(key, f"'{path}' holds shape {m.shape}, expected ({d}, {d})")
            return MISSING
        return np.asarray(m, dtype=np.float64)
    rows = d if d is not MISSING else None
    m = sec.take(key, vectors(rows, rows, square=True))
    return MISSING if m is MISSING else np.asarray(m)


def _basis_value(sec: _Section, d, base_dir: Path):
    if isinstance(sec.raw.get("basis"), str):
        path = _path_value(sec, "basis", base_dir, suffixes=(".npy",))
        if path is MISSING:
            return MISSING
        try:
            return np.asarray(np.load(path, allow_pickle=False), dtype=np.float64)
        except (OSError, ValueError) as exc:
            sec.problem("basis", f"could not read '{path}': {exc}")
            return MISSING
    b = sec.take("basis", vectors(d if d is not MISSING else None))
    return MISSING if b is MISSING else np.asarray(b)


def _head_entry(problems, raw, label: str, form: str, d, base_dir: Path) -> dict:
    """One head table: ``form`` is "array" ([[heads]]) or "table" ([heads], maybe with count)."""
    sec = _Section(problems, raw, label, HEAD_KEYS, "heads")
    if not sec.ok:
        return sec.out
    kinds = tuple(KIND_KEYS[form])
    if form == "array" and sec.raw.get("kind") == "near_orthogonal":
        sec.problem("kind", "'near_orthogonal' builds several heads together: use one [heads] "
                            "table with kind = 'near_orthogonal' and count >= 2, not [[heads]]")
        return sec.out
    if "kind" not in sec.raw:
        sec.problem("kind", f"missing (required): give one of {', '.join(map(repr, HEAD_KINDS))}")
        return sec.out
    kind = sec.take("kind", choice(*kinds))
    if kind is MISSING:
        return sec.out
    for key in ("count", "strengths"):
        if form == "array":
            sec.not_applicable(key, "to a [[heads]] entry (one head each); use a single [heads] "
                                    "table for several heads built together")
    other = "table" if form == "array" else "array"
    for key in KIND_SPECIFIC:
        if key not in KIND_KEYS[form][kind]:
            if key in KIND_KEYS[other].get(kind, ()):
                where = ("a [[heads]] entry (only in a [heads] table with count)" if form == "array"
                         else "a [heads] table (only in a [[heads]] entry, one head each)")
                sec.not_applicable(key, f"to kind = '{kind}' in {where}")
            else:
                sec.not_applicable(key, f"to kind = '{kind}'")
    if kind == "pretrained":
        _head_attention(sec)
        pretrained_keys.head_entry(sec, base_dir, d)
        return {k: sec.out[k] for k in HEAD_KEYS if k in sec.out}

    count = 1
    strengths = MISSING
    if form == "table":
        given = sec.raw.get("strengths")
        default_count = len(given) if isinstance(given, list) and given else 1
        count = sec.take("count", integer(1), default_count)
        if kind == "near_orthogonal" and count is not MISSING and count < 2:
            sec.problem("count", f"near_orthogonal needs count >= 2, got {count}")
            count = MISSING
        if kind == "matrix" and count is not MISSING and count != 1:
            sec.problem("count", "kind = 'matrix' makes one head: use one [[heads]] table per "
                                 f"matrix, got count = {count}")
            count = MISSING
    if kind == "matrix":
        sec.not_applicable("strength", "to kind = 'matrix' (scale the matrix itself)")
        sec.not_applicable("strengths", "to kind = 'matrix' (scale the matrix itself)")
    elif form == "table" and sec.has("strengths"):
        if sec.has("strength"):
            sec.problem("strengths", "give either strength (all heads) or strengths (one per "
                                     "head), not both")
        strengths = sec.take("strengths", number_list(
            length=count if count is not MISSING else None))
    else:
        s = sec.take("strength", number(), 1.0)
        if s is not MISSING and count is not MISSING:
            strengths = [s] * count
    seed = sec.take("seed", integer(0), 0)
    value = sec.take("value", choice(*VALUES), "aligned")
    sec.take("value_noise", number(0), 0.0)
    _head_attention(sec)

    # kind-specific keys, and a trial build to catch impossible geometry
    ready = d is not MISSING and count is not MISSING and seed is not MISSING
    if kind == "subspace":
        if form == "array":
            if sec.has("block") == sec.has("basis"):
                sec.problem("block", "give exactly one of block = [start, stop] or basis = "
                                     "[[...], ...] (a list of vectors or a .npy path)")
            elif sec.has("block"):
                block = sec.take("block", int_pair())
                if block is not MISSING and d is not MISSING and block[1] > d:
                    sec.problem("block", f"block [{block[0]}, {block[1]}) is out of range: "
                                         f"stop must be <= d = {d}")
            else:
                basis = _basis_value(sec, d, base_dir)
                if basis is not MISSING and d is not MISSING:
                    _catch(sec, "basis", head_builders.subspace_basis, d, basis=basis)
        else:
            block = sec.take("block", int_pair()) if sec.has("block") else None
            rank_default = MISSING
            if block not in (None, MISSING):
                rank_default = block[1] - block[0]
            elif d is not MISSING and count is not MISSING:
                rank_default = d // count
            if sec.has("rank"):
                rank = sec.take("rank", integer(1))
                if rank is not MISSING and block not in (None, MISSING) and \
                        rank != block[1] - block[0]:
                    sec.problem("rank", f"rank = {rank} disagrees with block {block} of size "
                                        f"{block[1] - block[0]}; give one of them")
                    rank = MISSING
            elif rank_default is not MISSING and rank_default < 1:
                sec.problem("count", f"{count} subspace heads do not fit in d = {d} dimensions "
                                     "(each needs rank >= 1)")
                rank = MISSING
            else:
                rank = rank_default
                if rank is not MISSING:
                    sec.out["rank"] = rank
            if ready and rank is not MISSING and block is not MISSING and strengths is not MISSING:
                start = block[0] if block else 0
                _catch(sec, "block" if block else "rank", head_builders.check_subspaces,
                       d, count, rank, start)
    elif kind == "near_orthogonal":
        rank = sec.take("rank", integer(1), 1)
        angle = sec.take("angle", number(0, 90, lo_open=True), 75.0)
        if ready and rank is not MISSING and angle is not MISSING:
            _catch(sec, "count", head_builders.check_near_orthogonal, count, d, rank, angle)
    elif kind == "random":
        default_rank = d if d is not MISSING else MISSING
        rank = sec.take("rank", integer(1), default_rank)
    elif kind == "matrix":
        score = _matrix_value(sec, "score", d, base_dir, required=True)
        if sec.has("value_matrix"):
            if value == "identity":
                sec.problem("value", "value = 'identity' conflicts with value_matrix; give one")
            vm = _matrix_value(sec, "value_matrix", d, base_dir)
            if vm is not MISSING and score is not MISSING:
                _catch(sec, "value_matrix", head_builders.matrix, score, vm)
    # order the resolved entry like HEAD_KEYS
    return {k: sec.out[k] for k in HEAD_KEYS if k in sec.out}


def _mask_keys(sec: _Section, mask_default) -> None:
    """mask and its window: the window is required by the windowed masks, refused elsewhere."""
    given = sec.has("mask")
    mask = sec.take("mask", choice(*MASKS), mask_default)
    if mask in ("window", "causal_window"):
        sec.take("window", integer(0), required=True)
    elif sec.has("window") and given and mask is MISSING:
        pass   # the mask itself is wrong (reported): the window cannot be judged
    elif sec.has("window") and mask is MISSING:
        # a head's or layer's window goes with its own mask; it is never applied on its own
        sec.problem("window", "applies with this table's own mask = 'window' or 'causal_window' "
                              "(a window is not combined with an inherited mask); add the mask "
                              "here or remove the window")
    elif sec.has("window"):
        sec.problem("window", f"applies to mask = 'window' or 'causal_window' only (mask is "
                              f"{show(mask)}); remove it or set the mask")


def _head_attention(sec: _Section) -> None:
    """A head's own rule, beta, mask (+ window) and ALiBi slope; absent keys inherit the
    layer's / [dynamics]' values (rule names are checked once the rule_file is known)."""
    sec.take("rule", string(nonempty=True)) if sec.has("rule") else None
    sec.take("beta", number(0, lo_open=True)) if sec.has("beta") else None
    if sec.has("mask") or sec.has("window"):
        _mask_keys(sec, MISSING)
    sec.take("alibi_slope", number(0)) if sec.has("alibi_slope") else None


def _heads(problems, raw, d, base_dir: Path, where: str = ""):
    """Resolved heads: a list (array form) or a dict (table form); and the head count.
    ``where`` prefixes the labels (a layer's heads)."""
    if raw is MISSING:
        return [{"kind": "scalar", "strength": 1.0, "seed": 0, "value": "aligned",
                 "value_noise": 0.0}], 1
    if isinstance(raw, list):
        if not raw:
            problems.append(f"{where}heads: expected at least one head ([[heads]] tables), got an "
                            "empty list; omit heads for one scalar head of strength 1")
            return [], None
        out = [_head_entry(problems, h, f"{where}[[heads]] #{i}", "array", d, base_dir)
               for i, h in enumerate(raw)]
        return out, len(raw)
    if isinstance(raw, dict):
        out = _head_entry(problems, raw, f"{where}[heads]", "table", d, base_dir)
        return out, out.get("count")
    problems.append(f"heads: expected a table [heads] or an array of tables [[heads]], got "
                    f"{show(raw)} ({type_name(raw)})")
    return {}, None


# ----------------------------------------------------------------------------- [dynamics]

def steps_from_t_end(t_end: float, dt: float) -> int:
    """ceil(t_end / dt), tolerant of rounding (1.1 / 0.1 gives 11, not 12)."""
    r = t_end / dt
    if not math.isfinite(r):   # t_end / dt beyond float range: more steps than any run takes
        return MAX_STEPS + 1
    k = round(r)
    return max(1, int(k) if abs(r - k) <= 1e-9 * max(1.0, r) else math.ceil(r))


def _dynamics(problems, raw, base_dir: Path, replicas) -> dict:
    sec = _Section(problems, raw, "[dynamics]", DYNAMICS_KEYS, "dynamics")
    if not sec.ok:
        return sec.out
    sec.take("geometry", choice(*GEOMETRIES), "sphere")
    rule = sec.take("rule", string(nonempty=True), "exp")
    if sec.has("rule_file"):
        _path_value(sec, "rule_file", base_dir, suffixes=(".py",))
    elif rule is not MISSING and rule not in BUILTIN_RULES:
        close = difflib.get_close_matches(rule, BUILTIN_RULES, n=1)
        hint = f"did you mean '{close[0]}'? Or " if close else ""
        sec.problem("rule", f"'{rule}' is not a built-in rule ({', '.join(BUILTIN_RULES)}); "
                            f"{hint}give rule_file = 'my_rule.py' (a Python file that registers "
                            "it with particles.register_rule)")
    sec.take("beta", number(0, lo_open=True), 1.0)
    if sec.has("betas"):
        betas = sec.take("betas", number_list(0, lo_open=True))
        if betas is not MISSING and replicas is not MISSING and len(betas) != replicas:
            sec.problem("betas", f"expected one beta per replica ([tokens] replicas = {replicas}), "
                                 f"got {len(betas)} values")
    dt = sec.take("dt", number(0, lo_open=True), 0.01)
    if sec.has("steps") and sec.has("t_end"):
        sec.problem("steps", "give either steps or t_end, not both")
        return sec.out
    if sec.has("t_end"):
        t_end = sec.take("t_end", number(0, lo_open=True), store=False)
        if t_end is not MISSING and dt is not MISSING:
            steps = steps_from_t_end(t_end, dt)
            if steps > MAX_STEPS:
                sec.problem("t_end", f"t_end / dt = {steps:.3g} steps, more than the {MAX_STEPS} "
                                     "a run can take")
            else:
                sec.out["steps"] = steps
    else:
        steps = sec.take("steps", integer(1), 1000)
        if steps is not MISSING and steps > MAX_STEPS:
            sec.problem("steps", f"{steps} steps could never finish; at most {MAX_STEPS}")
    integrator = sec.take("integrator", choice(*INTEGRATOR_NAMES), "rk4")
    dtype = sec.take("dtype", choice(*DTYPES), "float32")
    if dtype is not MISSING:   # the API's check (particles.validation), so the two never drift
        for key in ("beta", "betas", "dt"):
            value = sec.out.get(key, MISSING)
            why = validation.dtype_problem(value, dtype) if value is not MISSING else None
            if why is not None:
                sec.problem(key, f"{key} = {show(value)} {why}; use dtype = 'float64' or a value "
                                 "in range")
    sec.take("arch", choice(*ARCHES), "cpu")
    _mask_keys(sec, "none")
    sec.take("alibi", boolean(), False)
    if sec.has("layer_every"):
        sec.take("layer_every", number(0, lo_open=True))
    _normalisation_keys(sec)
    _adaptive_keys(sec, integrator, dtype)
    _stop_keys(sec)
    _retraction_key(sec, integrator)
    return {k: sec.out[k] for k in DYNAMICS_KEYS if k in sec.out}


def _retraction_key(sec, integrator) -> None:
    """normalise (the default, not stored) or exp: the exact step on the sphere
    (particles.lie), with integrator euler (Lie-Euler) or heun (commutator-free, order 2)."""
    if not sec.has("retraction"):
        return
    if sec.take("retraction", choice("normalise", "exp")) != "exp":
        return
    if sec.out.get("geometry") != "sphere":
        sec.problem("retraction", "'exp' rotates tokens on the sphere; with geometry = 'flat' remove it")
    if integrator is not MISSING and integrator not in ("euler", "heun"):
        sec.problem("retraction", f"'exp' steps with integrator = 'euler' (Lie-Euler) or 'heun' (its "
                                  f"commutator-free Lie-group form, order 2), not '{integrator}'")


def _stop_keys(sec) -> None:
    """Stop rules (particles.stop), stored only when given: the run ends once the kinetic
    energy, |dE/dt| or the attention map's change rate stays at most stop_kinetic /
    stop_energy_rate / stop_attention over stop_window, or the cluster count is unchanged for
    stop_clusters (times)."""
    windowed = ("stop_kinetic", "stop_energy_rate", "stop_attention")
    given = [key for key in windowed + ("stop_clusters",) if sec.has(key)]
    for key in given:
        sec.take(key, number(0, lo_open=True))
    rule = sec.out.get("rule")
    if "stop_attention" in given and isinstance(rule, str) and rule not in ("exp", "softmax", "relu"):
        sec.problem("stop_attention", f"the attention rows are computed for the built-in rules exp, "
                                      f"softmax and relu, not rule = {rule!r}; remove stop_attention "
                                      "or use one of them")
    if sec.has("stop_window"):
        if not set(windowed) & set(given):
            sec.problem("stop_window", "applies to stop_kinetic, stop_energy_rate or stop_attention "
                                       "(the time they must hold for); give one of them or remove it")
        else:
            sec.take("stop_window", number(0))


def _adaptive_keys(sec, integrator, dtype) -> None:
    """The tolerances of an adaptive integrator (particles.Adaptive's checks, each naming its
    key); rtol and atol are filled only for one, so other scenes read as before."""
    keys = ("rtol", "atol", "dt_min", "dt_max")
    if integrator is MISSING:
        return
    if not isinstance(INTEGRATORS[integrator], Adaptive):
        for key in keys:
            sec.not_applicable(key, f"with integrator '{integrator}' (a fixed step): the adaptive "
                                    f"integrators {', '.join(map(repr, ADAPTIVE_NAMES))} take it")
        return
    defaults = Adaptive()
    rtol = sec.take("rtol", number(0, 1, lo_open=True, hi_open=True), defaults.rtol)
    sec.take("atol", number(0), defaults.atol)
    dt_min = sec.take("dt_min", number(0), store=sec.has("dt_min"))
    dt_max = sec.take("dt_max", number(0, lo_open=True), store=sec.has("dt_max"))
    if dt_min is not MISSING and dt_max is not MISSING and dt_max <= dt_min:
        sec.problem("dt_max", f"dt_max = {show(dt_max)} must exceed dt_min = {show(dt_min)}")
    if rtol is not MISSING and dtype is not MISSING:
        floor = 4 * float(np.finfo(dtype).eps)
        if rtol < floor:
            sec.problem("rtol", f"rtol = {show(rtol)} is below what {dtype} resolves (4 eps = "
                                f"{floor:.2g}); use a larger rtol or dtype = 'float64'")


def _normalisation_keys(sec) -> None:
    """Where the LayerNorm sits (particles.normalisation); stored only when given, so a scene
    without them keeps its fingerprint."""
    if sec.has("normalisation"):
        placement = sec.take("normalisation", choice(*NORMALISATIONS))
        if placement not in (MISSING, "post") and sec.out.get("geometry") != "sphere":
            sec.problem("normalisation", f"'{placement}' places a LayerNorm, which needs geometry = "
                                         "'sphere' (flat space has no normalisation)")
    if sec.has("ngpt_alpha"):
        sec.take("ngpt_alpha", number(0, lo_open=True))
        if sec.out.get("normalisation") != "ngpt":
            sec.problem("ngpt_alpha", "nGPT's step scale applies only with normalisation = 'ngpt'")
    # the doubly stochastic normalisation's iterations (particles.sinkhorn), likewise
    for key, spec in (("sinkhorn_iterations", integer(0)), ("sinkhorn_tolerance", number(0, 1, hi_open=True))):
        if sec.has(key):
            sec.take(key, spec)
            if sec.out.get("rule") != "sinkhorn":
                sec.problem(key, "applies to rule = 'sinkhorn' (the doubly stochastic normalisation)")


# ----------------------------------------------------------------------------- [[layers]]

def steps_from_time(t: float, dt: float):
    """t / dt as a whole number of steps, or None when t is not a multiple of dt."""
    r = t / dt
    if not math.isfinite(r):
        return None
    k = round(r)
    return int(k) if abs(r - k) <= 1e-9 * max(1.0, r) else None


def _layers(problems, raw, dyn: dict, d, base_dir: Path, n_heads):
    """The layers after the first ([heads] and [dynamics] are layer 0): each a table with its
    start time (or [dynamics] layer_every), optionally its own heads, rule, mask and alibi."""
    if raw is MISSING:
        if "layer_every" in dyn:
            problems.append("[dynamics] layer_every: applies to a scene with [[layers]]; remove it "
                            "or add the layers")
        return MISSING
    if not isinstance(raw, list) or not raw:
        problems.append(f"layers: expected an array of tables [[layers]] (one per layer after the "
                        f"first), got {show(raw)} ({type_name(raw)})")
        return MISSING
    every = dyn.get("layer_every")
    dt = dyn.get("dt")
    out, previous = [], 0.0
    for idx, layer in enumerate(raw, start=1):
        label = f"[[layers]] #{idx}"
        sec = _Section(problems, layer, label, LAYER_KEYS, "layers")
        if not sec.ok:
            continue
        if every is not None:
            sec.not_applicable("start", "when [dynamics] layer_every is given (layer l starts at "
                                        "l * layer_every)")
            start = idx * every
        else:
            start = sec.take("start", number(0, lo_open=True), required=True)
        if start is not MISSING and dt is not None:
            if start <= previous:
                sec.problem("start", f"layers must start in increasing time after 0, got {start:g} "
                                     f"after {previous:g}")
            elif steps_from_time(start, dt) is None:
                sec.problem("start" if every is None else "layer_every",
                            f"a layer switches between steps: {start:g} is not a multiple of "
                            f"dt = {dt:g}")
            previous = start
        if sec.has("heads"):
            heads, count = _heads(problems, sec.raw["heads"], d, base_dir, where=f"{label} ")
            sec.out["heads"] = heads
            if count is not None and n_heads is not None and count != n_heads:
                sec.problem("heads", f"has {count} heads, layer 0 has {n_heads}: every layer needs "
                                     "the same number of heads (the log's columns are per head)")
        if sec.has("rule"):
            sec.take("rule", string(nonempty=True))
        if sec.has("mask") or sec.has("window"):
            _mask_keys(sec, MISSING)
        if sec.has("alibi"):
            sec.take("alibi", boolean())
        out.append({k: sec.out[k] for k in LAYER_KEYS if k in sec.out})
    return out


def _named_rules(data) -> list[tuple[str, str]]:
    """(where, rule) of every rule a head or layer names."""
    entries = []
    for where, heads in [("", data["heads"])] + [(f"[[layers]] #{i} ", layer.get("heads", []))
                                                 for i, layer in enumerate(data.get("layers", []), 1)]:
        entries += [(f"{where}head", h) for h in (heads if isinstance(heads, list) else [heads])]
    entries += [(f"[[layers]] #{i}", layer) for i, layer in enumerate(data.get("layers", []), 1)]
    return [(where, entry["rule"]) for where, entry in entries if entry.get("rule") is not None]


def _check_rule_names(problems, data) -> None:
    """Every rule a head or layer names is built in or comes from [dynamics] rule_file; with
    [dynamics] stop_attention, one whose attention rows particles.stop computes."""
    named = _named_rules(data)
    if "stop_attention" in data["dynamics"]:
        for where, rule in named:
            if rule not in ("exp", "softmax", "relu"):
                problems.append(f"[dynamics] stop_attention: the attention rows are computed for the built-in "
                                f"rules exp, softmax and relu; {where} rule is '{rule}'; remove stop_attention "
                                "or use one of them")
    if "rule_file" in data["dynamics"]:
        return
    for where, rule in named:
        if rule not in BUILTIN_RULES:
            problems.append(f"{where} rule: '{rule}' is not a built-in rule ({', '.join(BUILTIN_RULES)}); "
                            "give [dynamics] rule_file = 'my_rule.py' that registers it")


# ----------------------------------------------------------------------------- [log]

def _log(problems, raw) -> dict:
    sec = _Section(problems, raw, "[log]", LOG_KEYS, "log")
    if not sec.ok:
        return sec.out
    sec.take("every", integer(1), 1)
    sec.take("energy", boolean(), True)
    sec.take("radial", boolean(), True)
    sec.take("entropy", boolean(), True)
    sec.take("entropy_rate", boolean(), False)
    sec.take("clusters_every", integer(0), 0)
    sec.take("cluster_threshold", number(-1, 1, lo_open=True, hi_open=True), 0.99)
    sec.take("trajectory_every", integer(0), 10)
    return sec.out


# ----------------------------------------------------------------------------- [render]

def _render(problems, raw, n_heads, log: dict) -> dict:
    sec = _Section(problems, raw, "[render]", RENDER_KEYS, "render")
    if not sec.ok:
        return sec.out
    sec.take("enabled", boolean(), True)
    f = sec.take("file", string(nonempty=True), "animation.mp4")
    if f is not MISSING and Path(f).suffix not in RENDER_EXTENSIONS:
        sec.problem("file", f"expected a file name ending in .mp4 or .gif, got {show(f)}")
    elif f is not MISSING and isinstance(f, str) and (Path(f).name != f or f in (".", "..")):
        sec.problem("file", f"expected a plain file name (the video is written inside the run "
                            f"directory), got {show(f)}")
    sec.take("frames", integer(1), 150)
    sec.take("fps", integer(1, RENDER_FPS_MAX), 30)
    sec.take("view", choice(*VIEWS), "auto")
    color_by = sec.take("color_by", choice(*COLOR_BY), "index")
    needs = {"cluster": ("clusters_every", "set [log] clusters_every >= 1"),
             "radial": ("radial", "set [log] radial = true"),
             "entropy": ("entropy", "set [log] entropy = true")}
    if color_by in needs:
        key, fix = needs[color_by]
        if key in log and not log[key]:
            sec.problem("color_by", f"'{color_by}' needs the per-token values the log computes: "
                                    f"{fix}")
    head = sec.take("color_head", integer(0), 0)
    if head is not MISSING and n_heads is not None and head >= n_heads:
        sec.problem("color_head", f"expected a head index in 0..{n_heads - 1} (the scene has "
                                  f"{n_heads} head{'s' if n_heads != 1 else ''}), got {head}")
    sec.take("trails", integer(0), 0)
    sec.take("rotate", boolean(), False)
    sec.take("projection", choice(*PROJECTIONS), "pca_initial")
    sec.take("panels", Spec("a list of panel names from " + ", ".join(
        f"'{p}'" for p in PANELS), _panels), list(PANELS))
    sec.take("dpi", integer(*RENDER_DPI), 100)
    sec.take("width", integer(*RENDER_PIXELS), 1280)
    sec.take("height", integer(*RENDER_PIXELS), 720)
    sec.take("claim", string(), "")   # what the film shows, one line under its title
    return sec.out


def _panels(v):
    if not isinstance(v, list) or not all(isinstance(p, str) for p in v):
        raise BadValue(True)
    bad = [p for p in v if p not in PANELS]
    if bad:
        close = difflib.get_close_matches(bad[0], PANELS, n=1)
        raise BadValue(False, f"; unknown panel '{bad[0]}'" +
                   (f" (did you mean '{close[0]}'?)" if close else ""))
    if len(set(v)) != len(v):
        raise BadValue(False, "; a panel is listed twice")
    return list(v)


# ----------------------------------------------------------------------------- [output]

def _output(problems, raw) -> dict:
    sec = _Section(problems, raw, "[output]", OUTPUT_KEYS, "output")
    if not sec.ok:
        return sec.out
    sec.take("dir", string(nonempty=True), "runs")
    if sec.has("run_dir"):
        sec.take("run_dir", string(nonempty=True))
    sec.take("final_checkpoint", boolean(), True)
    return sec.out


# ----------------------------------------------------------------------------- the scene

def resolve(raw: dict, base_dir: Path, default_name: str) -> tuple[dict, list[str]]:
    """Resolved scene data and the list of problems (empty when the scene is valid)."""
    problems: list[str] = []
    base_dir = Path(base_dir).resolve()
    for key, value in raw.items():
        if key not in TOP_KEYS:
            if isinstance(value, dict):
                close = difflib.get_close_matches(key, SECTIONS, n=1)
                hint = f"; did you mean [{close[0]}]?" if close else \
                    f" (sections: {', '.join(f'[{s}]' for s in SECTIONS)})"
                problems.append(f"unknown section [{key}]{hint}")
            else:
                problems.append(f"unknown top-level key '{key}'{_suggest(key, TOP_KEYS, '')}")

    data: dict = {}
    top = _Section(problems, {k: v for k, v in raw.items() if k in ("name", "description")},
                   "top level", ("name", "description"), "")
    top.label = "top-level"
    name = top.take("name", string(nonempty=True), default_name)
    if name is not MISSING and any(c in name for c in "/\\"):
        top.problem("name", f"must not contain '/' or '\\' (it names the run folder), got "
                            f"{show(name)}")
    elif name is not MISSING and has_control_character(name):
        top.problem("name", f"must not contain control characters such as a newline or a null "
                            f"byte (it names the run folder), got {show(name)}")
    top.take("description", string(), "")
    data.update(top.out)

    tokens = _tokens(problems, raw.get("tokens", {}), base_dir)
    data["tokens"] = tokens
    d = tokens.get("d", MISSING)
    heads, n_heads = _heads(problems, raw.get("heads", MISSING), d, base_dir)
    data["heads"] = heads
    data["dynamics"] = _dynamics(problems, raw.get("dynamics", {}), base_dir,
                                 tokens.get("replicas", MISSING))
    layers = _layers(problems, raw.get("layers", MISSING), data["dynamics"], d, base_dir, n_heads)
    if layers is not MISSING:
        data["layers"] = layers
    _check_rule_names(problems, data)
    data["log"] = _log(problems, raw.get("log", {}))
    data["render"] = _render(problems, raw.get("render", {}), n_heads, data["log"])
    data["output"] = _output(problems, raw.get("output", {}))
    return data, problems


def all_keys() -> dict[str, tuple[str, ...]]:
    """Every key of every section (for the README and its test)."""
    return {"top level": ("name", "description"), **SECTION_KEYS}
