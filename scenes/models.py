"""Typed, frozen views of a resolved scene: one model per section.

    scene.dynamics.dt        scene.log.cluster_threshold        scene.render.view
    scene.tokens.n           scene.build_tokens()   (the initial tokens, a NumPy array)
    scene.heads[0].kind      scene.build_heads()    (the Head objects)

Every field is the resolved value (defaults filled by ``scenes.schema``, which validates and
words every error); a key that does not apply (e.g. ``gamma`` for random tokens) is None.
Models are frozen: a changed scene comes from ``scene.replace(...)``, which validates again.
The resolved data itself is deep-frozen (``FrozenDict`` / ``FrozenList``), so nothing can
change a scene after validation.
"""
from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, fields, make_dataclass

from particles.errors import ParticlesTypeError

from . import schema
from .builders import build_heads, build_tokens

FROZEN_MESSAGE = "a Scene is frozen after validation: make a changed one with scene.replace(...)"


def thaw(v):
    """Plain dicts and lists (mutable copies) of a frozen structure."""
    if isinstance(v, dict):
        return {k: thaw(x) for k, x in v.items()}
    if isinstance(v, list):
        return [thaw(x) for x in v]
    return v


def freeze(v):
    if isinstance(v, dict):
        return FrozenDict({k: freeze(x) for k, x in v.items()})
    if isinstance(v, list):
        return FrozenList(freeze(x) for x in v)
    return v


def _refuse(self, *args, **kwargs):
    raise ParticlesTypeError(FROZEN_MESSAGE)


class FrozenDict(dict):
    """A dict that refuses every change; ``copy.deepcopy`` gives a plain, mutable dict."""

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = __ior__ = _refuse

    def __deepcopy__(self, memo):
        return thaw(self)

    def __copy__(self):
        return dict(self)

    def __reduce__(self):
        return freeze, (thaw(self),)


class FrozenList(list):
    """A list that refuses every change; ``copy.deepcopy`` gives a plain, mutable list."""

    __setitem__ = __delitem__ = append = extend = insert = pop = remove = clear = sort = reverse = \
        __iadd__ = __imul__ = _refuse

    def __deepcopy__(self, memo):
        return thaw(self)

    def __copy__(self):
        return list(self)

    def __reduce__(self):
        return freeze, (thaw(self),)


def _model(name: str, keys, doc: str):
    cls = make_dataclass(name, [(k, object, None) for k in keys], frozen=True)
    cls.__doc__ = doc
    cls.__module__ = __name__
    return cls


Dynamics = _model("Dynamics", schema.DYNAMICS_KEYS, "[dynamics]: rule, beta(s), dt, steps, integrator, dtype, arch.")
Log = _model("Log", schema.LOG_KEYS, "[log]: what the log records and how often.")
Render = _model("Render", schema.RENDER_KEYS, "[render]: the video.")
Output = _model("Output", schema.OUTPUT_KEYS, "[output]: where run directories go.")
HeadEntry = _model("HeadEntry", schema.HEAD_KEYS, "One [[heads]] table (or the [heads] table).")
_TokensFields = _model("_TokensFields", schema.TOKEN_KEYS, "")


def _renamed(old: str, new: str) -> None:
    warnings.warn(f"{old} is deprecated: call {new} ({old.rstrip('()')} is the section itself)",
                  DeprecationWarning, stacklevel=3)


@dataclass(frozen=True)
class Tokens(_TokensFields):
    """[tokens]: n, d, init and its keys (the initial tokens: ``scene.build_tokens()``)."""

    def __call__(self):
        """Deprecated: ``scene.build_tokens()``."""
        _renamed("scene.tokens()", "scene.build_tokens()")
        return build_tokens(_section_dict(self))


class Heads(tuple):
    """The [[heads]] entries (a one-entry tuple for a [heads] table); the heads themselves:
    ``scene.build_heads()``."""

    def __new__(cls, entries, raw, d: int):
        self = super().__new__(cls, entries)
        self._raw, self._d = raw, d
        return self

    def __call__(self):
        """Deprecated: ``scene.build_heads()``."""
        _renamed("scene.heads()", "scene.build_heads()")
        return build_heads(thaw(self._raw), self._d)


def _section_dict(model) -> dict:
    return {f.name: thaw(getattr(model, f.name)) for f in fields(model) if getattr(model, f.name) is not None}


def _build(cls, section):
    known = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in section.items() if k in known})


def section_models(data) -> dict:
    """The typed models of a resolved scene's sections."""
    heads = data["heads"]
    entries = heads if isinstance(heads, list) else [heads]
    return {"tokens": _build(Tokens, data["tokens"]),
            "heads": Heads([_build(HeadEntry, e) for e in entries], heads, data["tokens"]["d"]),
            "dynamics": _build(Dynamics, data["dynamics"]),
            "log": _build(Log, data["log"]),
            "render": _build(Render, data["render"]),
            "output": _build(Output, data.get("output", {}))}


def merged(data, changes: dict) -> dict:
    """A mutable copy of ``data`` with ``changes`` applied: section -> {key: value} (merged key
    by key; None removes a key), or "section.key" -> value, or top-level keys."""
    out = copy.deepcopy(data)
    for key, value in changes.items():
        if "." in key:
            section, _, sub = key.partition(".")
            value = {sub: value}
            key = section
        if key in schema.SECTIONS and isinstance(value, dict) and isinstance(out.get(key), dict):
            for sub, v in value.items():
                if v is None:
                    out[key].pop(sub, None)
                else:
                    out[key][sub] = thaw(v)
                    other = {"steps": "t_end", "t_end": "steps", "strength": "strengths",
                             "strengths": "strength", "beta": "betas"}.get(sub)
                    if key in ("dynamics", "heads") and other and other != "betas":
                        out[key].pop(other, None)   # the alternative key goes
        else:
            out[key] = thaw(value)
    return out


__all__ = ["Tokens", "Heads", "HeadEntry", "Dynamics", "Log", "Render", "Output", "FrozenDict",
           "FrozenList", "freeze", "thaw", "section_models", "merged"]
