"""One way from a scene to a Simulation: ``build_simulation(scene)``.

Before anything is allocated the size is estimated from n, d, H, R and the dtype and refused
when it cannot fit in memory; after the dtype cast every parameter must still be finite.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from particles import validation
from particles.errors import ParticlesTypeError, ParticlesUserError

from particles.attention import Attention, alibi_slopes
from particles.integrators import Adaptive
from particles.rotary import Rotary
from particles.rules import SINKHORN_ITERATIONS, get_rule, load_rule_file, sinkhorn_rule
from particles.schedule import Layer, Schedule
from particles.simulation import Simulation
from scenes.scene import Scene, build_heads
from scenes.schema import steps_from_time

SLOW_PAIRS = 1e11        # pairs per evaluation above which a run is announced as slow


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
    """Memory a Simulation of this size takes at most (``particles.validation.estimate_bytes``,
    the estimate the Simulation itself checks before it allocates)."""
    from particles.kernels import n_tok_slots
    return validation.estimate_bytes(n, d, n_heads, replicas, dtype, n_tok_slots(n_heads),
                                     entropy_rate)


def available_bytes() -> int | None:
    """Memory the system can give now (MemAvailable), None where it cannot say."""
    return validation.available_bytes()


def check_size(data: dict, n_heads: int, echo=None, shape=None) -> None:
    """ValueError, with the figures, when the run cannot fit in memory; a warning when one
    step is so large that it takes hours. shape: (R, n, d) of tokens given in place of the
    scene's (a sweep unit's stacked replicas, a re-render's saved tokens)."""
    tok, dyn = data["tokens"], data["dynamics"]
    if shape is not None:
        R, n, d = (1,) + tuple(shape) if len(shape) == 2 else tuple(shape)
    else:
        n, d, R = int(tok["n"]), int(tok["d"]), int(tok.get("replicas", 1) or 1)
    entropy = bool(data.get("log", {}).get("entropy_rate", False))
    need = estimate_bytes(n, d, n_heads, R, dyn["dtype"], entropy)
    have = available_bytes()
    if have is not None and need > have:
        raise ParticlesUserError(f"[tokens] n = {n} (d = {d}, {n_heads} heads, {R} replicas, "
                                 f"{dyn['dtype']}) needs about {need / 2**30:.1f} GiB of memory, but "
                                 f"{have / 2**30:.1f} GiB is available; use fewer tokens or replicas")
    pairs = float(R) * n_heads * n * n
    validation.pair_guard(n, n_heads, R, dyn.get("arch", "cpu"), "[tokens] ", d=d)
    if pairs > SLOW_PAIRS and echo is not None:
        echo(f"warning: n = {n} means {pairs:.2g} token pairs per evaluation (the pair pass is "
             "O(n^2)); one step may take minutes to hours, and so does the warm-up")


def _check_finite_in_dtype(data: dict, heads, beta) -> None:
    """ValueError naming the key whose value overflows (or underflows to 0) in the run's dtype
    (``particles.validation.dtype_problem``, the check the Simulation makes)."""
    dtype = data["dynamics"]["dtype"]
    for key, value in (("beta" if np.ndim(beta) == 0 else "betas", beta), ("dt", data["dynamics"]["dt"])):
        why = validation.dtype_problem(value, dtype)
        if why is not None:
            raise ParticlesUserError(f"[dynamics] {key} = {value!r} {why}; use dtype = 'float64' "
                                     "or a value in range")
    _check_heads_in_dtype(np.dtype(dtype), "[heads]", heads, [])


def _check_heads_in_dtype(real, where: str, heads, attention) -> None:
    """Every head's matrices and its own beta and ALiBi slope stay finite in the run's dtype."""
    for i, head in enumerate(heads):
        parts = ((head.query, head.key, head.value_in, head.value_out) if hasattr(head, "query")
                 else head if isinstance(head, tuple) else (head,))
        for part in parts:
            why = validation.factor_problem(part, real.name)   # the engine's own test
            if why is not None:
                raise ParticlesUserError(f"{where} head {i}: a matrix entry {why}; use dtype = "
                                         "'float64' or smaller strengths")
    for i, att in enumerate(attention):
        for key, value in (("beta", att.beta), ("alibi_slope", att.alibi)):
            why = validation.dtype_problem(value or 0.0, real.name)
            if why is not None:
                raise ParticlesUserError(f"{where} head {i}: {key} = {value!r} {why}; use dtype = "
                                         "'float64' or a value in range")


def build_simulation(scene, *, tokens=None, heads=None, beta=None, entropy_rate=None,
                     echo=None) -> Simulation:
    """The Simulation a scene describes (a Scene, or a scene's sections as a dict, such as
    ``scene.data``: validated as ``Scene.from_dict`` does).

    tokens, heads, beta: replace the scene's initial tokens, heads, beta(s) (a sweep's work
    unit stacks its replicas' tokens; a re-render starts from saved ones).
    entropy_rate: default the scene's ``log.entropy_rate``.
    """
    if isinstance(scene, Mapping):
        scene = Scene.from_dict(dict(scene))
    elif not isinstance(scene, Scene):
        raise ParticlesTypeError(f"build_simulation takes a Scene (scenes.load_scene) or a scene's "
                                 f"sections as a dict, got {type(scene).__name__}")
    data = _sections(scene)
    dyn = data["dynamics"]
    rule = load_scene_rule(scene, echo)
    if heads is None:
        heads = scene.build_heads()
    if beta is None:
        beta = dyn.get("betas") or dyn["beta"]
    # every path in (run, sweep unit, re-render) passes the same size check before allocating
    check_size(data, len(heads), echo, shape=None if tokens is None else np.shape(tokens))
    if tokens is None:
        tokens = scene.build_tokens()
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
    if "sinkhorn_iterations" in dyn or "sinkhorn_tolerance" in dyn:
        rule = sinkhorn_rule(dyn.get("sinkhorn_iterations", SINKHORN_ITERATIONS), dyn.get("sinkhorn_tolerance", 0.0))
    return Simulation(tokens, heads, beta=beta, rule=rule, geometry=dyn["geometry"], dt=dyn["dt"],
                      integrator=integrator_of(dyn), dtype=dyn["dtype"], arch=dyn["arch"],
                      entropy_rate=entropy_rate, attention=attention,
                      normalisation=dyn.get("normalisation", "post"), ngpt_alpha=dyn.get("ngpt_alpha", 1.0),
                      retraction=dyn.get("retraction", "normalise"))


def integrator_of(dyn: dict):
    """The integrator's name, or for an adaptive one (its rtol is filled) its settings."""
    if "rtol" not in dyn:
        return dyn["integrator"]
    return Adaptive(dyn["integrator"], rtol=dyn["rtol"], atol=dyn["atol"], dt_min=dyn.get("dt_min", 0.0),
                    dt_max=dyn.get("dt_max", float("inf")))


def head_masks(entries, layer: dict, dyn: dict) -> list[str]:
    """Each head's mask name: its own, else its layer's, else [dynamics]' ("none")."""
    entries = entries if isinstance(entries, (list, tuple)) else [entries]
    mask = layer.get("mask", dyn.get("mask", "none"))
    return [entry.get("mask", mask) for entry in entries for _ in range(entry.get("count", 1))]


def head_attention(entries, layer: dict, dyn: dict, n_heads: int) -> list[Attention]:
    """Each head's Attention: its own keys, else its layer's, else [dynamics]' (mask, window,
    rule; ALiBi slopes 2^(-8h/H) when alibi = true, unless the head gives alibi_slope; a
    pretrained entry's rotary positions, rotary_theta and rotary_pairs, as its loader wrote them)."""
    entries = entries if isinstance(entries, (list, tuple)) else [entries]
    rule = layer.get("rule", dyn["rule"])
    masks = head_masks(entries, layer, dyn)
    window = layer.get("window", dyn.get("window")) if "mask" in layer else dyn.get("window")
    alibi = layer.get("alibi", dyn.get("alibi", False))
    slopes = alibi_slopes(n_heads) if alibi else [0.0] * n_heads
    out = []
    for entry in entries:
        for _ in range(entry.get("count", 1)):
            h = len(out)
            out.append(Attention(mask=masks[h],
                                 window=entry.get("window") if "mask" in entry else window,
                                 alibi=float(entry.get("alibi_slope", slopes[h])),
                                 beta=entry.get("beta"), rule=entry.get("rule", rule),
                                 rotary=Rotary(entry["rotary_theta"], entry["rotary_pairs"])
                                 if "rotary_theta" in entry else None))
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


__all__ = ["build_simulation", "load_scene_rule", "estimate_bytes", "check_size", "head_masks"]
