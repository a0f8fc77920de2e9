"""One way from a scene to a Simulation: ``build_simulation(scene)``.

Before anything is allocated the size is estimated from n, d, H, R and the dtype and refused
when it cannot fit in memory; after the dtype cast every parameter must still be finite.
"""
from __future__ import annotations

import numpy as np

from particles.attention import Attention, alibi_slopes
from particles.rules import get_rule, load_rule_file
from particles.schedule import Layer, Schedule
from particles.simulation import Simulation
from scenes.scene import build_heads
from scenes.schema import steps_from_time

SLOW_PAIRS = 1e11        # pairs per evaluation above which a run is announced as slow
CPU_PAIR_LIMIT = 1e13    # above this one evaluation takes hours on a CPU, in one kernel call
                         # that not even Ctrl-C can interrupt


def _sections(scene) -> dict:
    return scene.data if hasattr(scene, "data") else scene


def load_scene_rule(scene, echo=None) -> str:
    """Execute the scene's rule file (if any) and return its rule name, which must be registered."""
    dyn = _sections(scene)["dynamics"]
    rule_file = getattr(scene, "rule_file", None) or dyn.get("rule_file")
    if rule_file:
        if echo is not None:
            echo(f"executing rule file {rule_file} (named by the scene)")
        load_rule_file(rule_file)
    get_rule(dyn["rule"])  # a clear error if the rule file did not register it
    return dyn["rule"]


def estimate_bytes(n: int, d: int, n_heads: int, replicas: int, dtype: str,
                   entropy_rate: bool = False) -> int:
    """Memory a Simulation of this size takes at most (device arrays at the largest head
    ranks r = rv = d, plus the float64 host copies of the tokens)."""
    from particles.kernels import n_tok_slots
    item = 4 if dtype == "float32" else 8
    R, H, r = replicas, n_heads, d
    per_token = (4 * d                     # x, xdot and two integrator stages
                 + H * d + 4 * H           # head outputs, row statistics
                 + n_tok_slots(H)          # per-token observables
                 + H * 4 * r               # q, k, u, g
                 + (H * 3 * r if entropy_rate else 0))
    return R * n * (per_token * item + 3 * d * 8)


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
        import os
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_size(data: dict, n_heads: int, echo=None) -> None:
    """ValueError, with the figures, when the run cannot fit in memory; a warning when one
    step is so large that it takes hours."""
    tok, dyn = data["tokens"], data["dynamics"]
    n, d, R = int(tok["n"]), int(tok["d"]), int(tok.get("replicas", 1) or 1)
    entropy = bool(data.get("log", {}).get("entropy_rate", False))
    need = estimate_bytes(n, d, n_heads, R, dyn["dtype"], entropy)
    have = available_bytes()
    if have is not None and need > have:
        raise ValueError(f"[tokens] n = {n} (d = {d}, {n_heads} heads, {R} replicas, {dyn['dtype']}) "
                         f"needs about {need / 2**30:.1f} GiB of memory, but {have / 2**30:.1f} GiB "
                         "is available; use fewer tokens or replicas")
    pairs = float(R) * n_heads * n * n
    if pairs > CPU_PAIR_LIMIT and dyn.get("arch", "cpu") == "cpu":
        raise ValueError(f"[tokens] n = {n} ({n_heads} heads, {R} replicas) means {pairs:.2g} token "
                         "pairs per evaluation of the O(n^2) pair pass: on a CPU one evaluation "
                         "takes hours, inside a single kernel call that Ctrl-C cannot interrupt. "
                         f"Use fewer tokens (n^2 x heads x replicas up to {CPU_PAIR_LIMIT:.0e}) or "
                         "arch = 'gpu'")
    if pairs > SLOW_PAIRS and echo is not None:
        echo(f"warning: n = {n} means {pairs:.2g} token pairs per evaluation (the pair pass is "
             "O(n^2)); one step may take minutes to hours, and so does the warm-up")


def _check_finite_in_dtype(data: dict, heads, beta) -> None:
    """ValueError naming the key whose value overflows (or underflows to 0) in the run's dtype."""
    dyn = data["dynamics"]
    real = np.dtype(dyn["dtype"])
    limit = f"the largest {real.name} is {np.finfo(real).max:.3g}"

    def bad(key, value, why):
        return ValueError(f"[dynamics] {key} = {value!r} is {why} in {real.name} ({limit}, the "
                          f"smallest positive {np.finfo(real).tiny:.3g}); use dtype = 'float64' "
                          "or a value in range")

    for key, value in (("beta" if np.ndim(beta) == 0 else "betas", beta), ("dt", dyn["dt"])):
        with np.errstate(over="ignore", under="ignore"):
            cast = np.asarray(value, dtype=np.float64).astype(real)
        if not np.all(np.isfinite(cast)):
            raise bad(key, value, "not finite")
        if np.any(cast == 0):
            raise bad(key, value, "zero")
    _check_heads_in_dtype(real, "[heads]", heads, [])


def _check_heads_in_dtype(real, where: str, heads, attention) -> None:
    """Every head's matrices and its own beta and ALiBi slope stay finite in the run's dtype."""
    limit = f"the largest {real.name} is {np.finfo(real).max:.3g}"
    for i, head in enumerate(heads):
        parts = ((head.query, head.key, head.value_in, head.value_out) if hasattr(head, "query")
                 else head if isinstance(head, tuple) else (head,))
        for part in parts:
            with np.errstate(over="ignore"):
                if not np.all(np.isfinite(np.asarray(part, dtype=np.float64).astype(real))):
                    raise ValueError(f"{where} head {i}: a matrix entry is not finite in {real.name} "
                                     f"({limit}); use dtype = 'float64' or smaller strengths")
    for i, att in enumerate(attention):
        for key, value in (("beta", att.beta), ("alibi_slope", att.alibi)):
            with np.errstate(over="ignore", under="ignore"):
                cast = real.type(value or 0.0)
            if not np.isfinite(cast) or (value and cast == 0):
                raise ValueError(f"{where} head {i}: {key} = {value!r} is {'zero' if np.isfinite(cast) else 'not finite'} "
                                 f"in {real.name} ({limit}, the smallest positive "
                                 f"{np.finfo(real).tiny:.3g}); use dtype = 'float64' or a value in range")


def build_simulation(scene, *, tokens=None, heads=None, beta=None, entropy_rate=None,
                     echo=None) -> Simulation:
    """The Simulation a scene describes (a Scene, or its resolved sections as a dict).

    tokens, heads, beta: replace the scene's initial tokens, heads, beta(s) (a sweep's work
    unit stacks its replicas' tokens; a re-render starts from saved ones).
    entropy_rate: default the scene's ``log.entropy_rate``.
    """
    data = _sections(scene)
    dyn = data["dynamics"]
    rule = load_scene_rule(scene, echo)
    if heads is None:
        heads = scene.heads()
    if beta is None:
        beta = dyn.get("betas") or dyn["beta"]
    if tokens is None:
        check_size(data, len(heads), echo)
        tokens = scene.tokens()
    _check_finite_in_dtype(data, heads, beta)
    if entropy_rate is None:
        entropy_rate = data.get("log", {}).get("entropy_rate", False)
    attention = head_attention(data["heads"], {}, dyn, len(heads))
    real = np.dtype(dyn["dtype"])
    _check_heads_in_dtype(real, "[heads]", [], attention)
    layers = data.get("layers")
    if layers:
        heads = _schedule(data, heads, attention)
        for index, layer in enumerate(heads.layers[1:], start=1):
            _check_heads_in_dtype(real, f"[[layers]] #{index}", layer.heads, layer.attention)
        attention = None
    return Simulation(tokens, heads, beta=beta, rule=rule, geometry=dyn["geometry"], dt=dyn["dt"],
                      integrator=dyn["integrator"], dtype=dyn["dtype"], arch=dyn["arch"],
                      entropy_rate=entropy_rate, attention=attention)


def head_attention(entries, layer: dict, dyn: dict, n_heads: int) -> list[Attention]:
    """Each head's Attention: its own keys, else its layer's, else [dynamics]' (mask, window,
    rule; ALiBi slopes 2^(-8h/H) when alibi = true, unless the head gives alibi_slope)."""
    entries = entries if isinstance(entries, (list, tuple)) else [entries]
    rule = layer.get("rule", dyn["rule"])
    mask = layer.get("mask", dyn.get("mask", "none"))
    window = layer.get("window", dyn.get("window")) if "mask" in layer else dyn.get("window")
    alibi = layer.get("alibi", dyn.get("alibi", False))
    slopes = alibi_slopes(n_heads) if alibi else [0.0] * n_heads
    out = []
    for entry in entries:
        for _ in range(entry.get("count", 1)):
            h = len(out)
            head_mask = entry.get("mask", mask)
            out.append(Attention(mask=head_mask,
                                 window=entry.get("window") if "mask" in entry else window,
                                 alibi=float(entry.get("alibi_slope", slopes[h])),
                                 beta=entry.get("beta"), rule=entry.get("rule", rule)))
    return out


def _schedule(data, heads0, attention0) -> Schedule:
    """[heads] and [dynamics] as layer 0, then each [[layers]] table; a layer without heads
    shares layer 0's (weight sharing)."""
    dyn, d = data["dynamics"], data["tokens"]["d"]
    every = dyn.get("layer_every")
    layers, starts = [Layer(heads0, None, attention0)], [0]
    for index, layer in enumerate(data["layers"], start=1):
        entries = layer.get("heads", data["heads"])
        heads = build_heads(entries, d) if "heads" in layer else heads0
        layers.append(Layer(heads, None, head_attention(entries, layer, dyn, len(heads))))
        starts.append(steps_from_time(layer["start"] if every is None else index * every, dyn["dt"]))
    return Schedule(tuple(layers), tuple(starts))


__all__ = ["build_simulation", "load_scene_rule", "estimate_bytes", "check_size"]
