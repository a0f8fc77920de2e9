"""Build a video's settings from a scene, and re-render a finished run from its trajectory."""
from __future__ import annotations

import errno
import os

from pathlib import Path

import numpy as np

from render.animation import Animation
from render.config import RenderConfig, RunInfo
from render.panels import is_panel_column

from particles.clusters import cluster_labels
from particles.normalisation import RADIAL
from particles.output import RunFileError
from particles.errors import ParticlesUserError

from .build import build_simulation, head_masks
from .film_facts import film_facts


def render_config(render_section, **overrides) -> RenderConfig:
    """RenderConfig from a scene's resolved [render] section (``scene.render``; its defaults are
    the schema's, filled at validation), plus overrides."""
    rc = {k: getattr(render_section, k) for k in ("view", "color_by", "color_head", "trails", "rotate",
                                                   "projection", "panels", "fps", "dpi", "width", "height")}
    rc.update({k: v for k, v in overrides.items() if v is not None})
    rc["panels"] = tuple(rc["panels"])
    return RenderConfig(**rc)


def head_bases(heads) -> list[np.ndarray]:
    """An orthonormal basis of each head's score range, most important direction first."""
    bases = []
    for head in heads:
        u, s, _ = np.linalg.svd(head.score)
        keep = s > 1e-9 * max(s[0], 1e-300)
        bases.append(u[:, keep] if keep.any() else u[:, :1])
    return bases


def run_info(scene, heads, beta: float) -> RunInfo:
    labels = layer_labels(scene)
    masks = layer_masks(scene)
    return RunInfo(name=scene.name, beta=float(beta), rule=scene.dynamics.rule, n_heads=len(heads),
                   n=scene.tokens.n, d=scene.tokens.d, geometry=scene.dynamics.geometry,
                   head_bases=head_bases(heads), layer_labels=labels,
                   mask=masks if labels else masks[0], token_labels=scene.token_strings(),
                   **film_facts(scene, heads, beta))


def layer_masks(scene) -> tuple:
    """Per layer (one without a schedule), the mask all its heads share, or "mixed"."""
    data = scene.data
    out = []
    for layer in [{}] + list(data.get("layers") or ()):
        masks = set(head_masks(layer.get("heads", data["heads"]), layer, data["dynamics"]))
        out.append(masks.pop() if len(masks) == 1 else "mixed")
    return tuple(out)


def layer_labels(scene) -> tuple | None:
    """'rule = softmax', 'rule = relu', 'rule = softmax, causal' per layer of a schedule (None without
    one): a layer's rule and mask are its own where it sets them, else the scene's [dynamics] ones."""
    layers = scene.data.get("layers") if isinstance(getattr(scene, "data", None), dict) else None
    if not layers:
        return None
    base_rule, base_mask = scene.dynamics.rule, getattr(scene.dynamics, "mask", "none")
    out = []
    for layer in [{}] + list(layers):
        rule, mask = layer.get("rule", base_rule), layer.get("mask", base_mask)
        out.append(f"rule = {rule}" + (f", {mask}" if mask and mask != "none" else ""))
    return tuple(out)


class UntrustedRuleFile(ValueError):
    """Re-rendering would execute the run's rule file, and the user has not allowed it."""


def rerender(run_dir, out=None, trust_rule_file: bool = False, echo=print, **overrides) -> Path:
    """Re-render the video of a finished (or interrupted) run from trajectory/ and log.csv,
    without re-simulating. overrides: view, color_by, fps, trails, ... (RenderConfig fields).
    Per-token colours (radial shadow, entropy) are recomputed from the saved tokens, which
    needs the rule: a user rule file is executed only with ``trust_rule_file`` (a run
    directory can come from anywhere, and its scene names the file to execute). A trajectory
    whose tokens turn non-finite is drawn up to its last finite state, and ``echo`` says
    where (one non-finite from its first state is refused: RunFileError)."""
    from particles.output import load_log, load_trajectory, refuse_link
    from scenes import load_scene

    run_dir = Path(run_dir)
    scene = load_scene(run_dir / "scene.toml")
    steps, times, tokens, meta = load_trajectory(run_dir)
    if tokens.ndim == 4:  # an ensemble: the video shows replica 0, as the live run does
        tokens = tokens[:, 0]
    finite = _finite_frames(run_dir, steps, times, tokens, echo)
    steps, times, tokens = steps[:finite], times[:finite], tokens[:finite]
    log = load_log(run_dir)
    if "replica" in log:
        keep = log["replica"] == 0
        log = {k: v[keep] for k, v in log.items()}
    heads = scene.build_heads()
    try:
        cfg = render_config(scene.render, **overrides)
    except ValueError as err:   # the scene's [render] was checked at load: an option is out of range
        given = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in overrides.items())
        raise ParticlesUserError(f"{err} (options given: {given or 'none'}; the other settings are "
                                 f"[render] in {str(run_dir / 'scene.toml')!r})") from None
    path = Path(out) if out else run_dir / ("rerender" + Path(scene.render.file).suffix)
    if path.suffix.lower() not in (".mp4", ".gif"):
        raise ParticlesUserError(f"output {str(path)!r}: the extension must be .mp4 or .gif")
    refuse_link(path)
    threshold = float(scene.log.cluster_threshold)
    sim = None
    if cfg.color_by in ("radial", "entropy"):  # per-token values: one evaluation per frame
        rule_file = scene.data["dynamics"].get("rule_file")
        if rule_file and not trust_rule_file:
            raise UntrustedRuleFile(
                f"colouring by {cfg.color_by} needs the run's rule, which is defined by the Python "
                f"file {rule_file} named in {run_dir / 'scene.toml'}; rendering would execute it. "
                "If you trust that file, pass --trust-rule-file; otherwise use --color-by index "
                "or cluster")
        sim = build_simulation(scene, tokens=tokens[0], heads=heads, beta=meta["beta"][0],
                               entropy_rate=False, echo=print if rule_file else None)
    panel_keys = [k for k in log if is_panel_column(k)]
    _probe_writable(path)
    try:
        _render_frames(path, cfg, scene, heads, meta, times, tokens, log, panel_keys, threshold, sim)
    except OSError as err:
        from particles.app.run_dir import is_machine_fault
        if is_machine_fault(err):
            raise
        # the encoder (ffmpeg) died while the frames were piped to it (a full disk, a
        # folder made read-only meanwhile): a fault of the machine, said as run says it
        raise OSError(errno.EIO, f"the video encoder stopped while writing the video ({err})",
                      str(path)) from None
    return path


def _finite_frames(run_dir: Path, steps, times, tokens, echo) -> int:
    """How many frames, from the first, hold finite tokens and times; the first that does not
    is named by its chunk and step (a video drawn from NaN shows nothing, silently)."""
    bad = ~np.isfinite(tokens).reshape(len(tokens), -1).all(axis=1) | ~np.isfinite(times)
    if not bad.any():
        return len(tokens)
    first = int(np.argmax(bad))
    from particles.output import read_chunk, trajectory_chunks
    chunk, frames = "?", 0
    for path in trajectory_chunks(run_dir / "trajectory"):
        frames += len(read_chunk(path, ("steps",))["steps"])
        if first < frames:
            chunk = str(path)
            break
    where = (f"the trajectory chunk {chunk!r} holds non-finite values (NaN or Inf) from step "
             f"{int(steps[first])} on (frame {first} of {len(tokens)})")
    if first == 0:
        raise RunFileError(f"{where}: there is no finite state to draw (the chunk is damaged, or "
                           "the run did not write it)")
    echo(f"warning: {where}: the video stops at step {int(steps[first - 1])}, the last finite "
         "state")
    return first


def _probe_writable(path: Path) -> None:
    """An OSError now (read-only folder, a path through a file, a folder in the way), before
    any frame is drawn, instead of a broken pipe from the encoder later."""
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "a folder is in the way of the video", str(path))
    probe = path.parent / f".{path.name}.probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as err:   # named by the video's path, not the probe's
        raise OSError(err.errno, err.strerror, str(path)) from None
    try:
        os.write(fd, b"probe")
    finally:
        os.close(fd)
        os.unlink(probe)


def _render_frames(path, cfg, scene, heads, meta, times, tokens, log, panel_keys, threshold, sim):
    try:
        anim = Animation(path, cfg, run_info(scene, heads, meta["beta"][0]), t_end=float(times[-1]),
                         final_tokens=tokens[-1])
    except ValueError as err:   # render (which imports no core) refuses settings it cannot draw
        raise ParticlesUserError(f"{err} (the options given or [render] in the run's scene.toml)") from None
    with anim:
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
            if scene.data["dynamics"].get("normalisation", "post") in RADIAL:
                radius = np.linalg.norm(x, axis=-1)   # the directions drawn, the radius as the norm colour
                values = {**(values or {}), "norm": radius}
                x = x / radius[:, None]
            anim.add_frame(x, float(t), {k: log[k][upto] for k in panel_keys}, token_values=values)
