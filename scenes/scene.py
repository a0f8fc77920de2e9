"""A scene: a validated TOML description of one run (tokens, heads, dynamics, log,
render, output), and what it builds (the initial tokens, the heads).

    scene = load_scene("quickstart", overrides=["dynamics.beta=3.0"])
    scene.build_tokens()    # (n, d), or (R, n, d) for an ensemble of R replicas
    scene.build_heads()     # list[particles.heads.Head]
    scene.to_toml()     # the resolved scene, every default filled

Sections are typed, frozen models (``scene.dynamics.dt``); ``scene.data`` is the resolved
dict, deep-frozen; ``scene.replace(...)`` makes a changed scene and validates it again.
"""
from __future__ import annotations

import copy
import difflib
import os
import tomllib
from pathlib import Path

import numpy as np
import tomli_w

from particles.atomic import atomic_write_text
from particles.errors import ParticlesUserError
from particles.heads import Head

from . import models, schema
from .builders import build_head_entry, build_heads, build_tokens
from .errors import SceneError
from .specs import has_control_character

LIBRARY = Path(__file__).resolve().parent / "library"


# ----------------------------------------------------------------------------- the scene

class Scene:
    """A validated, frozen scene. Build one with ``load_scene`` or ``Scene.from_dict``.

    Sections are typed models (``scenes.models``): ``scene.dynamics.dt``, ``scene.log.every``,
    ``scene.tokens.n``, ``scene.heads[0].kind``; ``scene.build_tokens()`` and
    ``scene.build_heads()`` build the initial tokens and the heads. ``scene.data`` is the resolved
    dict, deep-frozen. A changed scene comes from ``scene.replace(...)``, validated again.
    """

    __slots__ = ("_data", "_models", "source", "path")

    def __init__(self, data: dict, source: str = "<dict>", path: Path | None = None):
        object.__setattr__(self, "_data", models.freeze(data))
        object.__setattr__(self, "_models", models.section_models(self._data))
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "path", path)

    def __setattr__(self, name, value):
        raise AttributeError(models.FROZEN_MESSAGE)

    @property
    def data(self) -> dict:
        """The resolved scene (every default filled), deep-frozen."""
        return self._data

    @property
    def tokens(self) -> models.Tokens:
        """[tokens] (``scene.tokens.n``); the initial tokens are ``build_tokens()``."""
        return self._models["tokens"]

    @property
    def heads(self) -> models.Heads:
        """The heads entries (``scene.heads[0].kind``); the Head objects are ``build_heads()``."""
        return self._models["heads"]

    def build_tokens(self) -> np.ndarray:
        """The initial tokens: float64 unit vectors, (n, d), or (R, n, d) when replicas = R > 1."""
        return build_tokens(models.thaw(self.data["tokens"]))

    def build_heads(self) -> list[Head]:
        """The heads (``particles.heads.Head``), in file order."""
        return build_heads(models.thaw(self.data["heads"]), self.data["tokens"]["d"])

    @property
    def dynamics(self) -> models.Dynamics:
        return self._models["dynamics"]

    @property
    def log(self) -> models.Log:
        return self._models["log"]

    @property
    def render(self) -> models.Render:
        return self._models["render"]

    @property
    def output(self) -> models.Output:
        return self._models["output"]

    def replace(self, **changes) -> "Scene":
        """A new scene with ``changes``, validated again (SceneError lists every problem).

            scene.replace(dynamics={"steps": 500, "beta": 2.0}, name="hot")
            scene.replace(**{"dynamics.steps": 500})
        """
        base = self.path.parent if self.path is not None else None
        return Scene.from_dict(models.merged(self._data, changes), source=self.source, base_dir=base,
                               path=self.path)

    # construction --------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict, source: str = "<dict>", base_dir=None,
                  path: Path | None = None) -> "Scene":
        """Validate a raw or resolved scene dict; relative paths start at ``base_dir`` (default:
        the current folder). Raises SceneError listing every problem."""
        if not isinstance(d, dict):
            raise SceneError(source, [f"expected a table (dict), got {type(d).__name__}"],
                             is_file=path is not None)
        base = Path(base_dir) if base_dir is not None else Path.cwd()
        default_name = _folder_name(path.stem) if path is not None else "scene"
        try:
            data, problems = schema.resolve(copy.deepcopy(d), base, default_name)
        except RecursionError:   # thousands of nested tables or arrays
            raise SceneError(source, ["tables or arrays are nested too deeply"],
                             is_file=path is not None) from None
        if problems:
            raise SceneError(source, problems, is_file=path is not None)
        return cls(data, source, path)

    @classmethod
    def from_file(cls, path, overrides=()) -> "Scene":
        """Read, override and validate a scene file."""
        p = Path(path)
        source = str(path)
        if not p.is_file():
            raise SceneError(source, [f"file not found: '{p.resolve()}'"])
        raw = read_toml(p, source)
        try:
            raw = apply_overrides(raw, overrides, source)
        except RecursionError:
            raise SceneError(source, ["tables or arrays are nested too deeply"]) from None
        return cls.from_dict(raw, source=source, base_dir=p.resolve().parent, path=p.resolve())

    # contents ------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.data["name"]

    @property
    def description(self) -> str:
        return self.data["description"]

    @property
    def n_heads(self) -> int:
        heads = self.data["heads"]
        if isinstance(heads, dict):
            return heads.get("count", 1)
        return len(heads)

    @property
    def replicas(self) -> int:
        return self.data["tokens"].get("replicas", 1)

    @property
    def rule_file(self) -> Path | None:
        f = self.data["dynamics"].get("rule_file")
        return None if f is None else Path(f)

    def token_strings(self) -> tuple[str, ...] | None:
        """The tokens' strings of a text scene (init = "text"), one per token, as the model's
        tokenizer gave them when the scene was validated (recorded as [tokens] strings); else None."""
        strings = self.data["tokens"].get("strings")
        return None if strings is None else tuple(strings)

    def head_bases(self) -> list[np.ndarray | None]:
        """Per head, an orthonormal d x k basis of its subspace (subspace and near_orthogonal
        heads), else None; for views that project onto each head's subspace."""
        heads = self.data["heads"]
        entries = heads if isinstance(heads, list) else [heads]
        out: list = []
        for entry, built in zip(entries, _split(self.build_heads(), entries)):
            if entry["kind"] in ("subspace", "near_orthogonal"):
                out += [np.ascontiguousarray(h.query.T) for h in built]
            else:
                out += [None] * len(built)
        return out

    # output --------------------------------------------------------------------
    def to_toml(self) -> str:
        """The resolved scene as TOML (every default filled, paths absolute)."""
        # a comment ends at a newline, and TOML allows no other control character in one: the
        # name and the path are escaped, so any folder name gives a file that reads back
        header = (f"# resolved scene '{_escaped(self.name)}'"
                  + (f" (from {_escaped(str(self.path))})" if self.path else "") + "\n")
        return header + tomli_w.dumps(_plain(self.data))

    def save(self, path) -> Path:
        """Write ``to_toml()`` to ``path`` (atomically, never through a link)."""
        return atomic_write_text(Path(path), self.to_toml())

    def __eq__(self, other) -> bool:
        return isinstance(other, Scene) and self.data == other.data

    def __repr__(self) -> str:
        t = self.data["tokens"]
        return (f"Scene({self.name!r}: n={t['n']}, d={t['d']}, heads={self.n_heads}, "
                f"rule={self.data['dynamics']['rule']!r}, source={self.source!r})")


def _folder_name(stem: str) -> str:
    """A file's stem as a scene's default name, which names run folders: a control character
    (a newline in the file name), '/' or '\\' becomes '_' (a name given in the file is checked)."""
    return "".join("_" if c in "/\\" or has_control_character(c) else c for c in stem)


def _escaped(text: str) -> str:
    """``text`` with each control character (and the line separators) as a \\xNN or \\uNNNN
    escape, for a one-line comment."""
    return "".join(ascii(c)[1:-1] if has_control_character(c) or c == "\\" else c
                   for c in text)


def _split(heads: list, entries: list) -> list[list]:
    out, i = [], 0
    for e in entries:
        k = e.get("count", 1)
        out.append(heads[i:i + k])
        i += k
    return out


def _plain(v):
    """Plain Python values for tomli_w (no numpy scalars)."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    return v


# ----------------------------------------------------------------------------- overrides

def parse_override(text: str):
    """'section.key=value' -> (['section', 'key'], value); value parsed as TOML, else a string."""
    if not isinstance(text, str) or "=" not in text:
        raise ParticlesUserError(f"override {text!r}: expected 'section.key=value'")
    key, value = text.split("=", 1)
    parts = [p.strip() for p in key.strip().split(".")]
    if not key.strip() or any(not p for p in parts):
        raise ParticlesUserError(f"override {text!r}: expected 'section.key=value' with a non-empty "
                                 "dotted key")
    value = value.strip()
    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value
    except RecursionError:
        raise ParticlesUserError(f"override {text!r}: the value is nested too deeply") from None
    return parts, parsed


def apply_overrides(raw: dict, overrides, source: str = "<dict>") -> dict:
    """A copy of ``raw`` with each 'section.key=value' applied (list entries by index:
    'heads.0.strength=2'). Raises SceneError listing every malformed override."""
    if isinstance(overrides, str):
        overrides = [overrides]
    out = copy.deepcopy(raw)
    problems = []
    for text in overrides or ():
        try:
            parts, value = parse_override(text)
            node = out
            for i, part in enumerate(parts[:-1]):
                node = _descend(node, part, parts[:i + 1], text)
            _assign(node, parts[-1], value, parts, text)
        except ParticlesUserError as exc:
            problems.append(str(exc))
    if problems:
        raise SceneError(source, problems)
    return out


def _descend(node, part, where, text):
    if isinstance(node, list):
        idx = _index(node, part, where, text)
        return node[idx]
    if not isinstance(node, dict):
        raise ParticlesUserError(f"override {text!r}: '{'.'.join(where[:-1])}' is not a table")
    if part not in node:
        node[part] = {}
    if not isinstance(node[part], (dict, list)):
        raise ParticlesUserError(f"override {text!r}: '{'.'.join(where)}' is a value, not a table")
    return node[part]


def _assign(node, part, value, where, text):
    if isinstance(node, list):
        node[_index(node, part, where, text)] = value
    elif isinstance(node, dict):
        node[part] = value
    else:
        raise ParticlesUserError(f"override {text!r}: '{'.'.join(where[:-1])}' is not a table")


def _index(node: list, part: str, where, text) -> int:
    try:
        idx = int(part)
    except ValueError:
        raise ParticlesUserError(f"override {text!r}: '{'.'.join(where[:-1])}' is a list; index it with "
                                 f"a number (0..{len(node) - 1}), got '{part}'") from None
    if not 0 <= idx < len(node):
        raise ParticlesUserError(f"override {text!r}: index {idx} out of range 0..{len(node) - 1}")
    return idx


# ----------------------------------------------------------------------------- loading

def read_toml(path: Path, source: str, error=SceneError) -> dict:
    """The TOML file as a dict; syntax or read errors become `error` naming `source`."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise error(source, [f"invalid TOML: {exc}"]) from None
    except RecursionError:
        raise error(source, ["invalid TOML: tables or arrays are nested too deeply"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(source, [f"cannot read the file: {exc}"]) from None


def bundled_scenes() -> dict[str, tuple[Path, str]]:
    """Bundled scene name -> (path, one-line description), sorted by name."""
    return library_listing(LIBRARY)


def library_listing(folder: Path) -> dict[str, tuple[Path, str]]:
    """Name -> (path, first line of `description`) for every .toml file in a folder."""
    out = {}
    for p in sorted(Path(folder).glob("*.toml")):
        try:
            with open(p, "rb") as fh:
                desc = tomllib.load(fh).get("description", "")
        except (OSError, tomllib.TOMLDecodeError):
            desc = ""
        line = desc.strip().splitlines()[0] if isinstance(desc, str) and desc.strip() else ""
        out[p.stem] = (p, line)
    return out


def load_scene(name_or_path, overrides=()) -> Scene:
    """A scene from a .toml path or a bundled scene name, with 'section.key=value' overrides
    applied before validation. Raises SceneError (a ValueError) listing every problem."""
    if isinstance(name_or_path, Scene):
        return name_or_path
    text = os.fspath(name_or_path)
    looks_like_path = (isinstance(name_or_path, os.PathLike) or text.endswith(".toml")
                       or "/" in text or os.sep in text)
    if looks_like_path:
        return Scene.from_file(text, overrides)
    library = bundled_scenes()
    if text in library:
        return Scene.from_file(library[text][0], overrides)
    if Path(text).is_file():
        return Scene.from_file(text, overrides)
    close = difflib.get_close_matches(text, list(library), n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    raise SceneError(text, [f"no scene file '{text}' and no bundled scene of that name; {hint}"
                            f"bundled scenes: {', '.join(library)}"], is_file=False)
