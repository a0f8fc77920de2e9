"""Scene keys for real heads: ``[tokens] init = "text"`` and ``[heads] kind = "pretrained"``.

``[tokens]``: ``text`` (the sentence), ``model`` (a checkpoint folder, relative to the scene's
folder, or an installed package name), ``layernorm`` (apply the embedding LayerNorm, BERT;
default true), ``layer`` (default 0: the embeddings; l > 0: the hidden state entering layer l,
from the model's own forward through layers 0..l-1). ``n`` and ``d`` come from the text and the model (given, they must agree), and
the loader writes the token strings as ``strings`` (so a run's scene.toml records them).

``[heads]`` (one table): ``model``, ``layer`` (default 0), ``select`` (head indices, default
all), ``fold_layernorm`` (default false), ``biases`` ("keep" | "drop": the query, key, value
and output biases carried, default "keep"), ``rotary`` ("keep" | "drop", LLaMA's rotary
positions, default "keep"; the loader writes ``rotary_theta`` and ``rotary_pairs`` when kept),
``value_from`` ("weights": V_h = W_O,h W_V,h; "score": V_h = M_h). A causal model's heads get
``mask = "causal"`` unless the table sets its own mask. The model is read while the scene is
validated, so a missing model or package is a problem of the scene (naming what to install).
"""
from __future__ import annotations

from pathlib import Path

from particles import pretrained

from . import specs as S

TOKEN_KEYS = ("text", "model", "layernorm", "layer", "strings")
HEAD_KEYS = ("model", "layer", "select", "fold_layernorm", "biases", "rotary", "rotary_theta",
             "rotary_pairs", "value_from")
VALUE_FROM = ("weights", "score")
ROTARY = pretrained.ROTARY
BIASES = pretrained.BIASES


def model_source(model: str, base_dir: Path) -> str:
    """A folder relative to the scene's folder (made absolute), else the package name as given."""
    p = (Path(base_dir) / Path(model).expanduser())
    if p.exists() or "/" in model or "\\" in model or model.startswith("."):
        return str(p.resolve())
    return model


def _model(sec, base_dir):
    m = sec.take("model", S.string(nonempty=True), required=True, store=False)
    if m is S.MISSING:
        return m
    src = model_source(m, base_dir)
    sec.out["model"] = src
    return src


def _problem(sec, exc, default_key: str) -> None:
    key = {"layer": "layer", "heads": "select", "rotary": "rotary", "biases": "biases",
           "layernorm": "layernorm",
           "text": "text"}.get(getattr(exc, "key", None), default_key)
    sec.problem(key, str(exc))


def tokens(sec, base_dir, n, d) -> None:
    """Validate init = "text" and fill n and d from the tokenized text and the model."""
    text = sec.take("text", S.string(nonempty=True), required=True)
    model = _model(sec, base_dir)
    layernorm = sec.take("layernorm", S.boolean(), True)
    layer = sec.take("layer", S.integer(0), 0)
    if S.MISSING in (text, model, layernorm, layer):
        return
    try:
        tt = pretrained.text_tokens(model, text, layernorm=layernorm, layer=layer)
    except pretrained.PretrainedError as exc:
        _problem(sec, exc, "model" if "text:" not in str(exc) else "text")
        return
    x = tt.x
    if sec.has("strings") and sec.raw["strings"] != tt.strings:
        sec.problem("strings", f"are {S.show(sec.raw['strings'])}, but the model's tokenizer gives "
                               f"{S.show(tt.strings)}; omit them (the loader writes them)")
    sec.out["strings"] = list(tt.strings)   # the token strings, recorded with the run's scene
    for key, given, got in (("n", n, x.shape[0]), ("d", d, x.shape[1])):
        if given is not S.MISSING and given is not None and given != got:
            what = "tokens in the text" if key == "n" else "the model's hidden size"
            sec.problem(key, f"is {given}, but init = 'text' gives {got} ({what}); omit it")
        sec.out[key] = got


def _select(v):
    if isinstance(v, list) and v and all(S.is_int(i) and i >= 0 for i in v) and \
            len(set(v)) == len(v):
        return list(v)
    raise S.BadValue(not isinstance(v, list) or not all(S.is_int(i) for i in v))


def head_entry(sec, base_dir, d) -> None:
    """Validate a [heads] kind = "pretrained" table (reads the model's config and one layer)."""
    for key in ("strength", "strengths"):
        sec.not_applicable(key, "to kind = 'pretrained' (the heads are the model's: pick them "
                                "with select; scale them with beta)")
    for key in ("value", "value_noise"):
        sec.not_applicable(key, "to kind = 'pretrained' (value_from = 'weights' keeps the "
                                "model's values, 'score' replaces them by M)")
    count = sec.take("count", S.integer(1), store=False) if sec.has("count") else None
    model = _model(sec, base_dir)
    layer = sec.take("layer", S.integer(0), 0)
    select = sec.take("select", S.Spec("a non-empty list of distinct head indices >= 0",
                                       _select)) if sec.has("select") else None
    fold = sec.take("fold_layernorm", S.boolean(), False)
    biases = sec.take("biases", S.choice(*BIASES), "keep")
    # "refuse" (the old default, recorded in older runs' scene.toml): "keep" for a model without
    # rotary positions; for one with them it is refused below, naming the choices
    rotary = sec.take("rotary", S.choice(*ROTARY, "refuse"), "keep")
    theta = sec.take("rotary_theta", S.number(), store=False) if sec.has("rotary_theta") else None
    pairs = sec.take("rotary_pairs", S.string(), store=False) if sec.has("rotary_pairs") else None
    value_from = sec.take("value_from", S.choice(*VALUE_FROM), "weights")
    sec.take("seed", S.integer(0), 0)
    if S.MISSING in (model, layer, select, fold, rotary, value_from, biases):
        return
    try:
        lh = pretrained.load_heads(model, layer, select, fold,
                                   "keep" if rotary == "refuse" else rotary, value_from, biases)
    except pretrained.PretrainedError as exc:
        _problem(sec, exc, "model")
        return
    sec.out["count"] = len(lh.heads)
    if count not in (None, S.MISSING) and count != len(lh.heads):
        sec.problem("count", f"is {count}, but the selection gives {len(lh.heads)} heads; omit it "
                             "(the heads are picked with select)")
    if d is not S.MISSING and lh.heads[0].dim != d:
        sec.problem("model", f"has hidden size {lh.heads[0].dim}, but [tokens] d = {d}; give "
                             f"d = {lh.heads[0].dim} or init = 'text' with this model")
    if lh.causal and not sec.has("mask"):
        sec.out["mask"] = "causal"
    if rotary == "refuse" and lh.rotary is not None:
        sec.problem("rotary", "'refuse' is no longer a choice: rotary positions are carried "
                              "exactly; give 'keep' (the default) or 'drop'")
    if rotary == "refuse":
        sec.out["rotary"] = "keep"
    got = (None, None) if lh.rotary is None else (lh.rotary.theta, lh.rotary.pairs)
    for key, given, value in (("rotary_theta", theta, got[0]), ("rotary_pairs", pairs, got[1])):
        if given not in (None, S.MISSING) and given != value:   # a run's scene.toml records them
            sec.problem(key, f"is {S.show(given)}, but the model's layer gives {S.show(value)}; "
                             "omit it (the loader writes it)")
        if value is not None:
            sec.out[key] = value
