"""A run: a resolved scene -> Simulation -> the drive loop -> its writers, in a run directory.

    run():
        write scene.toml (resolved) and run.json (versions, arch, seed)
        drive(sim, [log.csv, summary, trajectory/, video, checkpoint], steps)   (particles.drive)
        run.json with the status and the summary

Row k of the log is the state after `step` steps (row 0 = the initial tokens).
An interrupt (Ctrl-C, SIGTERM) or a blow-up ends the loop cleanly: everything computed
so far is already on disk, a checkpoint is written, and the result says how to resume.
"""
from __future__ import annotations

import platform
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from particles import __version__
from particles.drive import Driver
from particles.observables import columns
from particles.output import write_json
from particles.simulation import BlowUpError

from .build import build_simulation
from .checkpoint import CheckpointWriter, read_checkpoint
from .progress import Progress
from .run_dir import new_run_dir, truncate_log
from .run_writers import LogCsv, Trajectory, Video
from .summary import Summary


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


def _versions() -> dict:
    import taichi
    return {"particles": __version__, "taichi": ".".join(map(str, taichi.__version__)),
            "numpy": np.__version__, "python": platform.python_version()}


class _Interrupted(Exception):
    pass


class Runner:
    """One run directory: builds the Simulation and the writers, drives it, records the outcome."""

    def __init__(self, scene, run_dir: Path, *, render: bool = True, progress: bool = True,
                 checkpoint_every: int = 0, echo=print, resume: bool = False):
        self.scene, self.run_dir, self.echo = scene, Path(run_dir), echo
        dyn, log, render_cfg = scene.dynamics, scene.log, scene.render
        self.steps_total = int(dyn.steps)
        self.checkpoint_every = int(checkpoint_every)
        self.show_progress = progress
        self.sim = sim = build_simulation(scene, echo=echo)
        self.log_every = int(log.every)
        traj_every = int(log.trajectory_every)
        clusters_every = int(log.clusters_every)
        self.render_on = bool(render and render_cfg.enabled)
        frames = max(1, int(render_cfg.frames))
        raw = max(1, self.steps_total // frames)
        self.frame_every = max(self.log_every, int(round(raw / self.log_every)) * self.log_every)
        groups = tuple(g for g in ("energy", "radial", "entropy") if getattr(log, g))
        self.columns = columns(sim.n_heads, sim.entropy_rate_enabled, clusters_every > 0,
                               sim.ensemble, groups)
        self.summary = Summary(sim.n_heads, 1e-5 if sim.dtype == "float32" else 1e-10, self.log_every)

        self.log_path = self.run_dir / "log.csv"
        self.video_path = self.run_dir / render_cfg.file if self.render_on else None
        traj_meta = {"scene": scene.name, "n": sim.n, "d": sim.d, "n_heads": sim.n_heads,
                     "replicas": sim.n_replicas, "ensemble": sim.ensemble,
                     "beta": sim.betas.tolist(), "rule": sim.rule.name, "geometry": sim.geometry,
                     "dt": sim.dt, "integrator": sim.integrator.name, "dtype": sim.dtype,
                     "arch": sim.arch, "seed": scene.tokens.seed, "every": traj_every}
        first_chunk = 0
        if resume:
            tokens, state = read_checkpoint(self.run_dir)
            sim.set_tokens(tokens, step=state["step"])
            self.summary.restore(state["summary"])
            first_chunk = state["trajectory_chunk"]
            for stale in (self.run_dir / "trajectory").glob("chunk_*.npz"):
                if int(stale.stem.split("_")[1]) >= first_chunk:
                    stale.unlink()
            truncate_log(self.log_path, state["log_rows"])
        else:
            scene.save(self.run_dir / "scene.toml")
        self.cluster_threshold = float(log.cluster_threshold)
        self.log = LogCsv(self.log_path, self.columns, self.log_every, clusters_every,
                          self.cluster_threshold, append=resume)
        self.traj = (Trajectory(self.run_dir / "trajectory", traj_meta, traj_every, sim.ensemble,
                                first_chunk=first_chunk) if traj_every > 0 else None)
        color_by = render_cfg.color_by
        self.video = Video(self._open_animation(resume), self.frame_every, self.log_every, sim.ensemble,
                           color_by in ("radial", "entropy"),
                           self.cluster_threshold if color_by == "cluster" else None) \
            if self.render_on else None
        self.checkpoint = (CheckpointWriter(self.run_dir, self.checkpoint_every, self._checkpoint_state)
                           if self.checkpoint_every else None)
        self._write_run_json("running")

    @property
    def writers(self) -> list:
        return [w for w in (self.log, self.summary, self.traj, self.video, self.checkpoint) if w is not None]

    # -- setup helpers ------------------------------------------------------------------------
    def _open_animation(self, resume: bool):
        from render import Animation
        from .rerender import render_config, run_info
        sim = self.sim
        projection = self.scene.render.projection
        if projection == "pca_final":  # the final tokens do not exist yet during a live run
            self.echo("render: projection 'pca_final' needs the finished run; the live video uses "
                      "'pca_initial' (re-render with `particles render RUN_DIR` afterwards)")
            projection = "pca_initial"
        cfg = render_config(self.scene.render, projection=projection)
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
                "steps_done": sim.step_count, "arch_requested": self.scene.dynamics.arch, "arch": sim.arch,
                "dtype": sim.dtype, "seed": self.scene.tokens.seed,
                "versions": _versions(), "files": {"log": "log.csv", "scene": "scene.toml",
                                                   "trajectory": "trajectory" if self.traj else None,
                                                   "video": self.video_path.name if self.video_path else None},
                "updated": time.strftime("%Y-%m-%dT%H:%M:%S")}
        info.update(extra or {})
        write_json(self.run_dir / "run.json", info)

    def _checkpoint_state(self) -> dict:
        return {"step": self.sim.step_count, "log_rows": self.log.rows_written,
                "trajectory_chunk": self.traj.next_chunk if self.traj else 0,
                "summary": self.summary.as_dict()}

    def write_checkpoint(self) -> None:
        """A checkpoint now (the loop writes them itself; this is for an interrupted run)."""
        from .checkpoint import write_checkpoint
        for w in self.writers:
            w.flush()
        write_checkpoint(self.run_dir, self.sim.native_tokens(), self._checkpoint_state())

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> RunResult:
        sim = self.sim
        status, message = "completed", ""
        progress = Progress(self.steps_total, initial=sim.step_count, enabled=self.show_progress)

        def on_advance(steps, rows):
            if rows:
                last = rows[-1]
                progress.update(0, last["energy"], last.get("entropy_mean_h0"))
            progress.update(steps)

        check_every = max(1, min(1000, self.steps_total // 100 or 1))
        driver = Driver(sim, self.writers, self.steps_total, check_every=check_every,
                        flush_seconds=2.0, on_advance=on_advance)
        previous_term = signal.getsignal(signal.SIGTERM)

        def on_term(signum, frame):
            raise _Interrupted()

        try:
            signal.signal(signal.SIGTERM, on_term)
        except ValueError:  # not the main thread
            previous_term = None
        try:
            try:
                driver.run()
            except (KeyboardInterrupt, _Interrupted):
                status = "interrupted"
                message = (f"interrupted at step {sim.step_count} of {self.steps_total}; everything up to "
                           f"it is saved. Continue with: particles resume {self.run_dir}")
                driver.drain()
                self.write_checkpoint()
            except BlowUpError as err:
                status = "blow-up"
                message = str(err) + f" Outputs up to the last good step are in {self.run_dir}."
                driver.drain()
        finally:
            progress.close()
            if previous_term is not None:
                signal.signal(signal.SIGTERM, previous_term)
            self.close(status)
        return RunResult(self.run_dir, self.log_path, self.traj and self.traj.folder, self.video_path,
                         sim.step_count, self.steps_total, status, self.summary.as_dict(), message, sim.arch)

    def close(self, status: str) -> None:
        for w in (self.log, self.traj, self.video):
            if w is not None:
                w.close()
        self._write_run_json(status, {"summary": self.summary.as_dict()})


def run_scene(scene, out: str | Path | None = None, *, render: bool = True, progress: bool = True,
              checkpoint_every: int = 0, echo=print) -> RunResult:
    """Run a resolved scene into a new run directory; returns where everything went."""
    run_dir = new_run_dir(scene, out)
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
        scene = scene.replace(dynamics={"steps": int(steps)})
        scene.save(run_dir / "scene.toml")
    runner = Runner(scene, run_dir, render=render, progress=progress,
                    checkpoint_every=checkpoint_every, echo=echo, resume=True)
    return runner.run()


__all__ = ["run_scene", "resume_run", "Runner", "RunResult"]
