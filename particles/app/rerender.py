"""Build a video's settings from a scene, and re-render a finished run from its trajectory."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from render.animation import Animation
from render.config import RenderConfig, RunInfo

from particles.clusters import cluster_labels

from .build import build_simulation


def render_config(render_section: dict, **overrides) -> RenderConfig:
    """RenderConfig from a scene's resolved [render] section (plus overrides)."""
    rc = {**render_section, **{k: v for k, v in overrides.items() if v is not None}}
    return RenderConfig(view=rc.get("view", "auto"), color_by=rc.get("color_by", "index"),
                        color_head=rc.get("color_head", 0), trails=rc.get("trails", 0),
                        rotate=rc.get("rotate", False), projection=rc.get("projection", "pca_initial"),
                        panels=tuple(rc.get("panels", ("energy", "radial_dominance", "entropy"))),
                        fps=rc.get("fps", 30), dpi=rc.get("dpi", 100),
                        width=rc.get("width", 1280), height=rc.get("height", 720))


def head_bases(heads) -> list[np.ndarray]:
    """An orthonormal basis of each head's score range, most important direction first."""
    bases = []
    for head in heads:
        u, s, _ = np.linalg.svd(head.score)
        keep = s > 1e-9 * max(s[0], 1e-300)
        bases.append(u[:, keep] if keep.any() else u[:, :1])
    return bases


def run_info(scene, heads, beta: float) -> RunInfo:
    dyn, tok = scene.data["dynamics"], scene.data["tokens"]
    return RunInfo(name=scene.name, beta=float(beta), rule=dyn["rule"], n_heads=len(heads),
                   n=tok["n"], d=tok["d"], geometry=dyn["geometry"], head_bases=head_bases(heads))


def rerender(run_dir, out=None, **overrides) -> Path:
    """Re-render the video of a finished (or interrupted) run from trajectory/ and log.csv,
    without re-simulating. overrides: view, color_by, fps, trails, ... (RenderConfig fields).
    Per-token colours (radial shadow, entropy) are recomputed from the saved tokens."""
    from particles.output import load_log, load_trajectory
    from scenes import load_scene

    run_dir = Path(run_dir)
    scene = load_scene(run_dir / "scene.toml")
    steps, times, tokens, meta = load_trajectory(run_dir)
    if tokens.ndim == 4:  # an ensemble: the video shows replica 0, as the live run does
        tokens = tokens[:, 0]
    log = load_log(run_dir)
    if "replica" in log:
        keep = log["replica"] == 0
        log = {k: v[keep] for k, v in log.items()}
    heads = scene.heads()
    cfg = render_config(scene.data["render"], **overrides)
    path = Path(out) if out else run_dir / ("rerender" + Path(scene.data["render"]["file"]).suffix)
    if path.suffix.lower() not in (".mp4", ".gif"):
        raise ValueError(f"output {str(path)!r}: the extension must be .mp4 or .gif")
    threshold = float(scene.data["log"].get("cluster_threshold", 0.99))
    sim = None
    if cfg.color_by in ("radial", "entropy"):  # per-token values: one evaluation per frame
        sim = build_simulation(scene, tokens=tokens[0], heads=heads, beta=meta["beta"][0],
                               entropy_rate=False)
    panel_keys = [k for k in log if k in ("time", "energy") or
                  k.startswith(("energy_h", "radial_dominance_h", "entropy_mean_h"))]
    with Animation(path, cfg, run_info(scene, heads, meta["beta"][0]), t_end=float(times[-1]),
                   final_tokens=tokens[-1]) as anim:
        for x, t in zip(tokens, times):
            upto = log["time"] <= t + 1e-12
            values = None
            if cfg.color_by == "cluster":   # the log's labelling, at the scene's threshold
                values = {"cluster": cluster_labels(x, threshold)}
            if sim is not None:
                sim.set_tokens(x)
                sim.observe()
                sim.take_rows()
                values = sim.per_token()
            if cfg.color_by == "cluster":   # the log's labelling, at the scene's threshold
                values = {"cluster": cluster_labels(x, threshold)}
            anim.add_frame(x, float(t), {k: log[k][upto] for k in panel_keys}, token_values=values)
    return path
