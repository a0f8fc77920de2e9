"""One way from a scene to a Simulation: ``build_simulation(scene)``."""
from __future__ import annotations

from particles.attention import Attention, alibi_slopes
from particles.rules import get_rule, load_rule_file
from particles.schedule import Layer, Schedule
from particles.simulation import Simulation
from scenes.scene import build_heads
from scenes.schema import steps_from_time


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
    if tokens is None:
        tokens = scene.tokens()
    if heads is None:
        heads = scene.heads()
    if beta is None:
        beta = dyn.get("betas") or dyn["beta"]
    if entropy_rate is None:
        entropy_rate = data.get("log", {}).get("entropy_rate", False)
    attention = head_attention(data["heads"], {}, dyn, len(heads))
    layers = data.get("layers")
    if layers:
        heads = _schedule(data, heads, attention)
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


__all__ = ["build_simulation", "load_scene_rule"]
