"""One way from a scene to a Simulation: ``build_simulation(scene)``."""
from __future__ import annotations

from particles.rules import get_rule, load_rule_file
from particles.simulation import Simulation


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
    return Simulation(tokens, heads, beta=beta, rule=rule, geometry=dyn["geometry"], dt=dyn["dt"],
                      integrator=dyn["integrator"], dtype=dyn["dtype"], arch=dyn["arch"],
                      entropy_rate=entropy_rate)


__all__ = ["build_simulation", "load_scene_rule"]
