"""Tokens of a transformer as particles: multi-head self-attention dynamics in Taichi.

    import particles
    sim = particles.Simulation(tokens, heads, beta=2.0, rule="softmax")

Names are imported on first use, so that ``import particles.heads`` (as ``scenes`` does)
never starts Taichi.
"""
import importlib as _importlib
import os as _os

__version__ = "0.1.0"
# Taichi's import banner is noise on a researcher's terminal; run.json records its version.
_os.environ.setdefault("ENABLE_TAICHI_HEADER_PRINT", "False")
# and its info lines ("Graphical python shell detected" in every notebook's first cell); its
# warnings and errors still show
_os.environ.setdefault("TI_LOG_LEVEL", "warn")

# public name -> the module that defines it
_EXPORTS = {
    "Head": "heads",
    "Rule": "rules", "register_rule": "rules", "get_rule": "rules", "registered_rules": "rules",
    "load_rule_file": "rules", "BUILTIN_RULES": "rules", "sinkhorn_rule": "rules",
    "Simulation": "simulation", "BlowUpError": "errors", "ParticlesError": "errors",
    "ParticlesUserError": "errors",
    "Attention": "attention", "alibi_slopes": "attention", "Rotary": "rotary", "Layer": "schedule", "Schedule": "schedule",
    "ArchError": "errors",
    "load_log": "output", "load_trajectory": "output",
    "Result": "result", "Trajectory": "result",
    "ExplicitRK": "integrators", "Adaptive": "integrators",
    "theory": None, "clusters": None, "paths": None, "integrators": None, "machine": None,
    "tuning": None,
}
# the application layer's entry points, for notebooks (imported on first use)
_APP_EXPORTS = {"run_scene": "particles.app.run", "resume_run": "particles.app.run",
                "build_simulation": "particles.app.build"}

__all__ = list(_EXPORTS) + list(_APP_EXPORTS) + ["__version__"]


def __getattr__(name):
    if name in _APP_EXPORTS:
        value = getattr(_importlib.import_module(_APP_EXPORTS[name]), name)
    elif name in _EXPORTS:
        module = _EXPORTS[name]
        value = (_importlib.import_module(f".{name}", __name__) if module is None
                 else getattr(_importlib.import_module(f".{module}", __name__), name))
    else:
        raise AttributeError(f"module 'particles' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
