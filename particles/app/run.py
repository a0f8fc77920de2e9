"""The run loop: a resolved scene -> Simulation -> observables -> writers (log, trajectory, video).

    run():
        write scene.toml (resolved) and run.json (versions, arch, seed)
        for s in start .. steps-1:
            tokens_s = tokens()                  only when a writer needs state s
            step: rule -> velocity -> integrator -> retraction -> step += 1,
                  observables of state s fused into the first stage when s % log.every == 0
            writers at state s: trajectory, cluster measures, video frame
            every checkpoint_every steps: checkpoint (atomic)
        final state: observables, trajectory, frame

Row k of the log is the state after `step` steps (row 0 = the initial tokens).
An interrupt (Ctrl-C, SIGTERM) or a blow-up ends the loop cleanly: everything computed
so far is already on disk, a checkpoint is written, and the result says how to resume.
"""
from __future__ import annotations

import json
import math
import platform
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from particles import __version__
from particles.observables import cluster_stats, columns
from particles.output import LogWriter, TrajectoryWriter, atomic_write_bytes, write_json
from .progress import Progress
from particles.rules import get_rule, load_rule_file
from particles.simulation import BlowUpError, Simulation

CHECKPOINT = "checkpoint.npz"
PREVIOUS_CHECKPOINT = "previous-checkpoint.npz"
PANEL_HISTORY_LIMIT = 20000


@dataclass
class RunResult:
    run_dir: Path
    log: Path
    trajectory: Path | None
    video: Path | None
    steps_done: int
    steps_total: int
    status: str                      # "completed", "interrupted", "blow-up"
    summary: dict = field(default_factory=dict)
    message: str = ""
    arch: str = ""


class Summary:
    """Running headline figures, so a long run keeps no rows in memory."""

    def __init__(self, n_heads: int, tolerance: float):
        self.n_heads, self.tol = n_heads, tolerance
        self.first_energy = self.last_energy = None
        self.final_eps = math.nan
        self.max_dominance = [0.0] * n_heads
        self.monotone = [True] * n_heads
        self._prev = {}

    def add(self, row: dict) -> None:
        if row.get("replica", 0) == 0:
            if self.first_energy is None:
                self.first_energy = row["energy"]
            self.last_energy = row["energy"]
            self.final_eps = row["eps"]
        for h in range(self.n_heads):
            key = (row.get("replica", 0), h)
            e = row[f"energy_h{h}"]
            if math.isnan(e):
                self.monotone[h] = None  # the rule has no potential: no energy to judge
            prev = self._prev.get(key)
            if self.monotone[h] and prev is not None and e < prev - self.tol * max(abs(prev), 1e-300):
                self.monotone[h] = False
            self._prev[key] = e
            self.max_dominance[h] = max(self.max_dominance[h], row[f"radial_dominance_h{h}"])

    def restore(self, saved: dict) -> None:
        """Continue the headline figures of a checkpointed run."""
        self.first_energy = saved.get("energy_first")
        self.max_dominance = list(saved.get("max_radial_dominance", self.max_dominance))
        self.monotone = list(saved.get("per_head_energy_monotone", self.monotone))

    def as_dict(self) -> dict:
        return {
            "final_eps": self.final_eps,
            "energy_first": self.first_energy,
            "energy_last": self.last_energy,
            "energy_change": (self.last_energy - self.first_energy)
            if self.first_energy is not None else math.nan,
            "max_radial_dominance": self.max_dominance,
            "condition8_held": all(d <= 1.0 for d in self.max_dominance),
            "per_head_energy_monotone": self.monotone,
        }


def _versions() -> dict:
    import taichi
    return {"particles": __version__, "taichi": ".".join(map(str, taichi.__version__)),
            "numpy": np.__version__, "python": platform.python_version()}


def _new_run_dir(scene, out: str | Path | None) -> Path:
    output = scene.data.get("output", {})
    if out is not None:
        run_dir = Path(out)
    elif output.get("run_dir"):
        run_dir = Path(output["run_dir"])
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = Path(output.get("dir", "runs")) / f"{scene.name}-{stamp}"
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


class _Interrupted(Exception):
    pass


class Runner:
    """Owns the loop and its writers for one run directory."""

    def __init__(self, scene, run_dir: Path, *, render: bool = True, progress: bool = True,
                 checkpoint_every: int = 0, echo=print, resume: bool = False):
        self.scene, self.run_dir, self.echo = scene, Path(run_dir), echo
        data = scene.data
        self.dyn, self.logcfg, self.rendercfg = data["dynamics"], data["log"], data["render"]
        self.steps_total = int(self.dyn["steps"])
        self.checkpoint_every = int(checkpoint_every)
        self.show_progress = progress
        rule_name = self.dyn["rule"]
        rule_file = getattr(scene, "rule_file", None)
        if rule_file:
            echo(f"executing rule file {rule_file} (named by the scene)")
            load_rule_file(rule_file)
        get_rule(rule_name)  # clear error if the rule file did not register it

        tokens = scene.tokens()
        heads = scene.heads()
        betas = self.dyn.get("betas") or self.dyn["beta"]
        self.sim = Simulation(tokens, heads, beta=betas, rule=rule_name,
                              geometry=self.dyn["geometry"], dt=self.dyn["dt"],
                              integrator=self.dyn["integrator"], dtype=self.dyn["dtype"],
                              arch=self.dyn["arch"], entropy_rate=self.logcfg.get("entropy_rate", False))
        sim = self.sim
        self.log_every = int(self.logcfg.get("every", 1))
        self.traj_every = int(self.logcfg.get("trajectory_every", 0))
        self.clusters_every = int(self.logcfg.get("clusters_every", 0))
        self.cluster_threshold = float(self.logcfg.get("cluster_threshold", 0.99))
        self.render_on = bool(render and self.rendercfg.get("enabled", True))
        frames = max(1, int(self.rendercfg.get("frames", 150)))
        raw = max(1, self.steps_total // frames)
        self.frame_every = max(self.log_every, int(round(raw / self.log_every)) * self.log_every)
        groups = tuple(g for g in ("energy", "radial", "entropy") if self.logcfg.get(g, True))
        self.columns = columns(sim.n_heads, sim.entropy_rate_enabled, self.clusters_every > 0,
                               sim.ensemble, groups)
        self.summary = Summary(sim.n_heads, 1e-5 if sim.dtype == "float32" else 1e-10)
        self.panel_history: dict[str, list] = {}
        self.extra: dict[tuple[int, int], dict] = {}

        self.log_path = self.run_dir / "log.csv"
        self.video_path = self.run_dir / self.rendercfg.get("file", "animation.mp4") if self.render_on else None
        traj_meta = {"scene": scene.name, "n": sim.n, "d": sim.d, "n_heads": sim.n_heads,
                     "replicas": sim.n_replicas, "ensemble": sim.ensemble,
                     "beta": sim.betas.tolist(), "rule": sim.rule.name, "geometry": sim.geometry,
                     "dt": sim.dt, "integrator": sim.integrator.name, "dtype": sim.dtype,
                     "arch": sim.arch, "seed": data["tokens"].get("seed"), "every": self.traj_every}
        first_chunk = 0
        if resume:
            self._load_checkpoint()
            first_chunk = self._resume_state["trajectory_chunk"]
            for stale in (self.run_dir / "trajectory").glob("chunk_*.npz"):
                if int(stale.stem.split("_")[1]) >= first_chunk:
                    stale.unlink()
            self._truncate_log(self._resume_state["log_rows"])
        else:
            scene.save(self.run_dir / "scene.toml")
        self.log = LogWriter(self.log_path, self.columns, append=resume)
        self.traj = (TrajectoryWriter(self.run_dir / "trajectory", traj_meta, first_chunk=first_chunk)
                     if self.traj_every > 0 else None)
        self.anim = None
        if self.render_on:
            self.anim = self._open_animation(resume)
        self._write_run_json("running")

    # -- setup helpers ------------------------------------------------------------------------
    def _open_animation(self, resume: bool):
        from render import Animation
        from .rerender import render_config, run_info
        sim = self.sim
        projection = self.rendercfg.get("projection", "pca_initial")
        if projection == "pca_final":  # the final tokens do not exist yet during a live run
            self.echo("render: projection 'pca_final' needs the finished run; the live video uses "
                      "'pca_initial' (re-render with `particles render RUN_DIR` afterwards)")
            projection = "pca_initial"
        cfg = render_config(self.rendercfg, projection=projection)
        info = run_info(self.scene, sim.heads, sim.betas[0])
        path = self.video_path
        if resume:  # a video cannot be appended to: the continuation goes to its own file
            k = 1
            while path.with_name(f"{path.stem}.part{k}{path.suffix}").exists():
                k += 1
            path = self.video_path = path.with_name(f"{path.stem}.part{k}{path.suffix}")
        anim = Animation(path, cfg, info, t_end=self.steps_total * sim.dt)
        anim.__enter__()
        return anim

    def _write_run_json(self, status: str, extra: dict | None = None) -> None:
        sim = self.sim
        info = {"scene": self.scene.name, "status": status, "steps_total": self.steps_total,
                "steps_done": sim.step_count, "arch_requested": self.dyn["arch"], "arch": sim.arch,
                "dtype": sim.dtype, "seed": self.scene.data["tokens"].get("seed"),
                "versions": _versions(), "files": {"log": "log.csv", "scene": "scene.toml",
                                                   "trajectory": "trajectory" if self.traj else None,
                                                   "video": self.video_path.name if self.video_path else None},
                "updated": time.strftime("%Y-%m-%dT%H:%M:%S")}
        info.update(extra or {})
        write_json(self.run_dir / "run.json", info)

    # -- checkpoints --------------------------------------------------------------------------
    def write_checkpoint(self) -> None:
        import io
        self._drain_rows()
        if self.traj:
            self.traj.flush()
        buf = io.BytesIO()
        state = {"step": self.sim.step_count, "log_rows": self.log.rows_written,
                 "trajectory_chunk": self.traj.next_chunk if self.traj else 0,
                 "summary": self.summary.as_dict()}
        np.savez(buf, tokens=self.sim.native_tokens(), state=np.array(json.dumps(state)))
        path, previous = self.run_dir / CHECKPOINT, self.run_dir / PREVIOUS_CHECKPOINT
        fresh = path.with_name(path.name + ".new")
        atomic_write_bytes(fresh, buf.getvalue())
        if path.exists():
            path.replace(previous)  # keep the last good one
        fresh.replace(path)

    def _load_checkpoint(self) -> None:
        path = self.run_dir / CHECKPOINT
        if not path.is_file():  # killed between the two renames of write_checkpoint
            path = self.run_dir / PREVIOUS_CHECKPOINT
        if not path.is_file():
            raise FileNotFoundError(f"no checkpoint in {str(self.run_dir)!r} (expected {CHECKPOINT}; "
                                    "run with --checkpoint-every N to write them)")
        with np.load(path) as data:
            tokens = data["tokens"]
            state = json.loads(str(data["state"]))
        self.sim.set_tokens(tokens, step=state["step"])
        self.summary.restore(state["summary"])
        self._resume_state = state

    def _truncate_log(self, rows: int) -> None:
        """Drop log rows written after the checkpoint (they will be recomputed identically)."""
        if not self.log_path.exists():
            return
        lines = self.log_path.read_text().splitlines(keepends=True)
        keep = lines[:1 + rows]
        if len(keep) != len(lines):
            self.log_path.write_text("".join(keep))

    # -- the loop -----------------------------------------------------------------------------
    def _drain_rows(self) -> list[dict]:
        rows = self.sim.take_rows()
        for row in rows:
            extra = self.extra.pop((row["step"], row.get("replica", 0)), None)
            if extra:
                row.update(extra)
            self.summary.add(row)
            if row.get("replica", 0) == 0 and self.render_on:
                self._remember(row)
        self.log.write(rows)
        return rows

    def _remember(self, row: dict) -> None:
        h = self.panel_history
        for key, value in row.items():
            if key == "time" or key == "energy" or key.startswith(("energy_h", "radial_dominance_h", "entropy_mean_h")):
                h.setdefault(key, []).append(value)
        if len(h["time"]) > PANEL_HISTORY_LIMIT:  # thin old points; the curve keeps its shape
            for key in h:
                h[key] = h[key][::2]

    def _needs_per_token(self) -> bool:
        return self.rendercfg.get("color_by", "index") in ("radial", "entropy")

    def _events_at(self, s: int, tokens: np.ndarray | None) -> None:
        sim = self.sim
        if tokens is None:
            return
        if self.traj and s % self.traj_every == 0:
            self.traj.add(s, s * sim.dt, tokens)
        if self.clusters_every and s % self.clusters_every == 0:
            mins, counts = cluster_stats(tokens if sim.ensemble else tokens[None], self.cluster_threshold)
            for b in range(sim.n_replicas):
                count = int(counts[b]) if np.isfinite(counts[b]) else math.nan
                self.extra[(s, b)] = {"min_cosine": float(mins[b]), "clusters": count}
        if self.anim is not None and (s % self.frame_every == 0 or s == self.steps_total):
            self._drain_rows()
            x0 = tokens[0] if sim.ensemble else tokens
            values = None
            if self._needs_per_token():
                values = {k: (v[0] if sim.ensemble else v) for k, v in sim.per_token().items()}
            log = {k: np.asarray(v) for k, v in self.panel_history.items()}
            self.anim.add_frame(x0, s * sim.dt, log, token_values=values)

    def _state_tokens(self) -> np.ndarray:
        x = self.sim.native_tokens()
        return x if self.sim.ensemble else x[0]

    def _wants_tokens(self, s: int) -> bool:
        return bool((self.traj and s % self.traj_every == 0)
                    or (self.clusters_every and s % self.clusters_every == 0)
                    or (self.anim is not None and (s % self.frame_every == 0 or s == self.steps_total)))

    def run(self) -> RunResult:
        sim = self.sim
        status, message = "completed", ""
        progress = Progress(self.steps_total, initial=sim.step_count, enabled=self.show_progress)
        previous_term = signal.getsignal(signal.SIGTERM)

        def on_term(signum, frame):
            raise _Interrupted()

        try:
            signal.signal(signal.SIGTERM, on_term)
        except ValueError:  # not the main thread
            previous_term = None
        last_flush = time.perf_counter()
        check_every = max(1, min(1000, self.steps_total // 100 or 1))
        try:
            try:
                while sim.step_count < self.steps_total:
                    s = sim.step_count
                    tokens = self._state_tokens() if self._wants_tokens(s) else None
                    sim.advance(1, observe_every=self.log_every)
                    self._events_at(s, tokens)
                    if sim.step_count % check_every == 0:
                        sim.check_finite()
                    now = time.perf_counter()
                    if now - last_flush > 2.0:
                        rows = self._drain_rows()
                        last_flush = now
                        last = rows[-1] if rows else None
                        progress.update(0, last and last["energy"],
                                        last and last.get("entropy_mean_h0"))
                    progress.update(1)
                    if self.checkpoint_every and sim.step_count % self.checkpoint_every == 0:
                        self.write_checkpoint()
                # the final state
                sim.check_finite()
                if self.checkpoint_every and sim.step_count % self.checkpoint_every:
                    self.write_checkpoint()  # lets `particles resume --steps` extend a finished run
                s = sim.step_count
                if s % self.log_every == 0:
                    sim.observe()
                self._events_at(s, self._state_tokens() if self._wants_tokens(s) else None)
                self._drain_rows()
            except (KeyboardInterrupt, _Interrupted):
                status = "interrupted"
                message = (f"interrupted at step {sim.step_count} of {self.steps_total}; everything up to "
                           f"it is saved. Continue with: particles resume {self.run_dir}")
                self._drain_rows()
                self.write_checkpoint()
            except BlowUpError as err:
                status = "blow-up"
                message = str(err) + f" Outputs up to the last good step are in {self.run_dir}."
                self._drain_rows()
        finally:
            progress.close()
            if previous_term is not None:
                signal.signal(signal.SIGTERM, previous_term)
            self.close(status)
        return RunResult(self.run_dir, self.log_path, self.traj and self.traj.folder, self.video_path,
                         sim.step_count, self.steps_total, status, self.summary.as_dict(), message, sim.arch)

    def close(self, status: str) -> None:
        self.log.close()
        if self.traj:
            self.traj.close()
        if self.anim is not None:
            self.anim.__exit__(None, None, None)
            self.anim = None
        self._write_run_json(status, {"summary": self.summary.as_dict()})


def run_scene(scene, out: str | Path | None = None, *, render: bool = True, progress: bool = True,
              checkpoint_every: int = 0, echo=print) -> RunResult:
    """Run a resolved scene into a new run directory; returns where everything went."""
    run_dir = _new_run_dir(scene, out)
    return Runner(scene, run_dir, render=render, progress=progress,
                  checkpoint_every=checkpoint_every, echo=echo).run()


def resume_run(run_dir: str | Path, *, steps: int | None = None, render: bool = True,
               progress: bool = True, checkpoint_every: int = 0, echo=print) -> RunResult:
    """Continue a run from its last checkpoint, appending to its log and trajectory.

    steps: a new total number of steps (to extend a finished run); default the scene's.
    """
    from scenes import load_scene
    run_dir = Path(run_dir)
    scene = load_scene(run_dir / "scene.toml")
    if steps is not None:
        scene.data["dynamics"]["steps"] = int(steps)
        scene.save(run_dir / "scene.toml")
    runner = Runner(scene, run_dir, render=render, progress=progress,
                    checkpoint_every=checkpoint_every, echo=echo, resume=True)
    return runner.run()


__all__ = ["run_scene", "resume_run", "Runner", "RunResult"]
