"""A run: a resolved scene -> Simulation -> the drive loop -> its writers, in a run directory.

    run_scene() / resume_run():
        Ctrl-C and SIGTERM deferred (particles.app.interrupts), the folder locked (one run at
        a time), refused if it holds another run (unless --overwrite)
        write scene.toml (resolved) and run.json (versions, arch, seed, status "running")
        drive(sim, [log.csv, summary, trajectory/, video, checkpoint], steps)   (particles.drive)
        run.json with the status ("completed", "interrupted", "blow-up", "failed" + reason)

Row k of the log is the state after `step` steps (row 0 = the initial tokens).
An interrupt stops the loop at the next fully served state and writes a checkpoint there;
`resume` cuts the log and trajectory back to exactly what the checkpoint counts and continues,
so any number of interrupts give the same files, bitwise, as an uninterrupted run (the video
of a continuation goes to its own file). A fault of the machine (disk full, read-only) ends
the run as "failed" with the reason; what was computed before it stays readable.
"""
from __future__ import annotations

import errno
import json
import os
import platform
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from particles import __version__, backend, tuning, validation
from particles.errors import ParticlesUserError
from particles.drive import Driver, Stopped
from particles.observables import columns
from particles.normalisation import RADIAL, RADIUS_COLUMNS
from particles.output import RunFileError, atomic_write_text, chunk_name, refuse_link, remove_file, write_json
from particles.simulation import BlowUpError
from particles.stop import StopRules, StopWriter

from .build import build_simulation
from .checkpoint import (CheckpointWriter, content_hashes, read_checkpoint, scene_fingerprint,
                         write_checkpoint)
from .interrupts import DeferredInterrupts
from .progress import Progress
from .run_dir import (RunDirError, RunDirLock, claim_for_new_run, clear_run, describe_os_error,
                      is_machine_fault, new_run_dir, read_run_json)
from .run_writers import LogCsv, Trajectory, Video
from .summary import Summary, energy_note, frame_note, frames_of


@dataclass
class RunResult:
    """What ``run_scene`` / ``resume_run`` hand back: the run's files and headline figures.
    A notebook shows it as a table; ``.result`` is the log as a ``particles.Result`` (its
    ``.trajectory`` the saved tokens), so ``rr.result.summary()`` and ``rr.result.animate()``
    draw the run as the command line does."""
    run_dir: Path
    log: Path
    trajectory: Path | None          # the trajectory folder; rr.result.trajectory holds its tokens
    video: Path | None
    steps_done: int
    steps_total: int
    status: str                      # "completed", "interrupted", "blow-up", "failed"
    summary: dict = field(default_factory=dict)
    message: str = ""
    arch: str = ""

    @property
    def result(self):
        """The log as a ``particles.Result`` (read on first use), with the saved tokens as its
        ``trajectory`` and the run's parameters as its ``meta``."""
        cached = self.__dict__.get("_result")
        if cached is None:
            from particles.output import load_log, load_trajectory
            from particles.result import Result
            trajectory = None
            if self.trajectory is not None and Path(self.trajectory).exists():
                trajectory = load_trajectory(self.run_dir)
            log = load_log(self.log)
            cached = Result(log.data, final_tokens=None if trajectory is None else trajectory.tokens[-1],
                            trajectory=trajectory, meta=dict(trajectory.meta) if trajectory else {})
            self.__dict__["_result"] = cached
        return cached

    def _fields(self) -> list[tuple[str, object]]:
        s = self.summary or {}
        fields = [("status", self.status), ("steps", f"{self.steps_done}/{self.steps_total}"), ("arch", self.arch),
                  ("run_dir", str(self.run_dir))]
        fields += [(name, Path(path).name) for name, path in (("log", self.log), ("trajectory", self.trajectory),
                                                               ("video", self.video)) if path]
        if isinstance(s.get("final_eps"), float):
            fields.append(("final eps", s["final_eps"]))
        first, last = s.get("energy_first"), s.get("energy_last")
        if isinstance(first, float) and isinstance(last, float) and np.isfinite([first, last]).all():
            fields.append(("energy", f"{first:.6g} -> {last:.6g}"))
        c8 = s.get("condition8")
        if isinstance(c8, dict):
            fields.append(("Condition 8", f"n/a ({c8.get('why_not')})" if not c8.get("applies") else
                           "held throughout" if s.get("condition8_held") else "exceeded 1 at some state"))
        if self.message:
            fields.append(("message", self.message if len(self.message) <= 160 else self.message[:157] + "..."))
        return fields

    def __repr__(self) -> str:
        from particles import display
        return display.text("RunResult", self._fields()[:4])

    def _repr_html_(self) -> str:
        from particles import display
        return display.html_table("RunResult", self._fields(),
                                  note="rr.result: the log as a Result (.summary(), .animate(), .trajectory)")


def _versions() -> dict:
    import taichi
    return {"particles": __version__, "taichi": ".".join(map(str, taichi.__version__)),
            "numpy": np.__version__, "python": platform.python_version()}


def _fault(err: BaseException, folder: Path | None = None) -> str | None:
    """The reason a run failed, for a fault of the machine or of a run file; None for a bug.
    An error from a library (the video encoder) on a full disk counts as the full disk."""
    if is_machine_fault(err):
        return describe_os_error(err)
    if isinstance(err, RunFileError):
        return str(err)
    if folder is not None:
        try:
            st = os.statvfs(folder)
        except OSError:
            return None
        if st.f_bavail * st.f_frsize < 64 * 1024:
            return describe_os_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder))) \
                + f" ({type(err).__name__}: {err})"
    return None


def _overwrite_in_place(path: Path, info: dict) -> None:
    """run.json rewritten in its own blocks when the disk is too full for a temporary copy:
    the full record if it fits, else the status and reason alone."""
    brief = {k: info[k] for k in ("scene", "status", "reason", "steps_done", "steps_total") if k in info}
    for record in (info, brief):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(json.dumps(record, indent=2, sort_keys=True, default=str).encode() + b"\n")
            return
        except OSError:
            continue


def _tiles_recorded(run_dir: Path) -> dict:
    """The wide pass's tiles the run started with, by pass class (run.json "tiles"; from a
    run.json before they were recorded, its "tuning" when it names one set of tiles)."""
    info = read_run_json(run_dir)
    if "tiles" in info:
        return tuning.check_pins(info["tiles"], f"{str(run_dir / 'run.json')!r} key 'tiles'")
    labels = set(re.findall(r"wide (\d+x\d+x\d+)", str(info.get("tuning", ""))))
    return {"*": labels.pop()} if len(labels) == 1 else {}


def _segments_kept(run_dir: Path, resume_step: int) -> list[dict]:
    """The segments of the run that run.json records (each process that computed steps: its
    first and last step, versions and machine), as far as the files still hold them when it
    resumes from ``resume_step``. A run.json from before segments were recorded counts as
    one segment, from step 0, with its versions."""
    info = read_run_json(run_dir)
    if not info:
        return []
    segments = info.get("segments")
    if not isinstance(segments, list):
        segments = [{"start_step": 0, "versions": info.get("versions"), "machine": info.get("machine")}]
    kept = [dict(seg) for seg in segments if isinstance(seg, dict) and type(seg.get("start_step")) is int
            and seg["start_step"] < resume_step]
    if kept:   # the steps after the checkpoint are computed again by the new segment
        kept[-1]["end_step"] = resume_step
    return kept


def _scene_file_prefix(scene) -> str:
    """"scene file 'PATH': ", naming the file a scene was read from ("" for one made in Python)."""
    path = getattr(scene, "path", None)
    return f"scene file {str(path)!r}: " if path is not None else ""


@contextmanager
def _naming_scene_file(scene):
    """A refusal of the scene's content while it is built (a value the engine cannot take, a
    rule file, the render settings) names the scene file, as the loader's problems do."""
    try:
        yield
    except ParticlesUserError as err:   # (a bare ValueError is a bug: its traceback is enough)
        prefix = _scene_file_prefix(scene)
        if prefix and len(err.args) == 1 and isinstance(err.args[0], str) \
                and str(scene.path) not in err.args[0] \
                and not err.args[0].startswith("PARTICLES_"):   # the environment's, not the scene's
            err.args = (prefix + err.args[0],)
        raise


def _version_warning(run_dir: Path, previous: dict | None) -> str | None:
    """A warning when the versions that wrote the run differ from this process's."""
    if not isinstance(previous, dict):
        return None
    here = _versions()
    differ = [k for k in ("particles", "taichi") if previous.get(k) not in (None, here[k])]
    if not differ:
        return None
    then = ", ".join(f"{k} {previous[k]}" for k in differ)
    now = ", ".join(f"{k} {here[k]}" for k in differ)
    return (f"warning: {str(run_dir)!r} was written by {then}; this is {now}. The continuation "
            "may differ from an uninterrupted run made with one version; run.json records each "
            "segment's versions")


def stop_writer(scene, sim, log_every: int):
    """The scene's stop rules ([dynamics] stop_*) as a drive writer on the log's grid, or None."""
    rules = StopRules.from_dynamics(scene.data["dynamics"], scene.log.cluster_threshold)
    return StopWriter(rules, log_every, sim.n_heads) if rules.any else None


class Runner:
    """One run directory: builds the Simulation and the writers, drives it, records the outcome."""

    def __init__(self, scene, run_dir: Path, *, render: bool = True, progress: bool = True,
                 checkpoint_every: int = 0, echo=print, resume: bool = False, interrupts=None,
                 save_scene: bool = False, before_write=None):
        """``save_scene``: a resume records ``scene`` (its new length) in scene.toml, once
        nothing can refuse the resume any more. ``before_write``: called once everything that
        can refuse a new run (the build, its tuning, the render settings) has passed and before
        its first file is written (--overwrite removes the previous run's files there)."""
        self.scene, self.run_dir, self.echo = scene, Path(run_dir), echo
        self.interrupts = interrupts
        dyn, log, render_cfg = scene.dynamics, scene.log, scene.render
        self.steps_total = int(dyn.steps)
        self.checkpoint_every = int(checkpoint_every)
        self.show_progress = progress
        self.fingerprint = scene_fingerprint(scene)
        # a resume takes the tiles the run started with: other tiles sum in another order
        with _naming_scene_file(scene), tuning.pinned(_tiles_recorded(self.run_dir) if resume else None,
                                                      why="kept from run.json") as self.tiles:
            self.sim = sim = build_simulation(scene, echo=echo)
        if interrupts is not None:
            interrupts.raise_if_requested()   # a signal during the build and compile stops here
        self.log_every = int(log.every)
        traj_every = int(log.trajectory_every)
        clusters_every = int(log.clusters_every)
        self.render_on = bool(render and render_cfg.enabled)
        frames = max(1, int(render_cfg.frames))
        raw = max(1, self.steps_total // frames)
        self.frame_every = max(self.log_every, int(round(raw / self.log_every)) * self.log_every)
        if self.render_on and frames_of(self.steps_total, self.frame_every) != frames + 1:   # said, not silent
            echo(frame_note(frames, self.steps_total, self.frame_every, self.log_every))
        groups = tuple(g for g in ("energy", "radial", "entropy") if getattr(log, g))
        self.columns = columns(sim.n_heads, sim.entropy_rate_enabled, clusters_every > 0,
                               sim.ensemble, groups, layer=sim.scheduled)
        if sim.normalisation in RADIAL:   # each token's radius is state: logged
            self.columns += list(RADIUS_COLUMNS)
        note = energy_note(sim)
        if note and "energy" in groups:
            echo(f"note: {note}")
        if sim.normalisation != "post" and "energy" in groups:
            echo(f"note: normalisation {sim.normalisation!r}: energy is that of the directions "
                 "x_i/|x_i| (docs/MODEL.md), kinetic the state's own mean |xdot_i|^2; dE/dt = kinetic "
                 "(Theorem 11) holds for 'post' only")
        self.summary = Summary(sim.n_heads, 1e-5 if sim.dtype == "float32" else 1e-10, self.log_every,
                               energy_note=note, geometry=sim.geometry)
        self.stop = stop_writer(scene, sim, self.log_every)   # the scene's stop rules, or None
        self.stopped = None   # {"step", "time", "reason"} once a stop rule ended the run

        self.log_path = self.run_dir / "log.csv"
        self.video_path = self.run_dir / render_cfg.file if self.render_on else None
        traj_meta = {"scene": scene.name, "n": sim.n, "d": sim.d, "n_heads": sim.n_heads,
                     "replicas": sim.n_replicas, "ensemble": sim.ensemble,
                     "beta": sim.betas.tolist(), "rule": sim.rule.name, "geometry": sim.geometry,
                     "dt": sim.dt, "integrator": sim.integrator.name, "dtype": sim.dtype,
                     "arch": sim.arch, "seed": scene.tokens.seed, "every": traj_every}
        log_resume, first_chunk, first_frames = None, 0, 0
        # the render settings are checked (the Animation opens its file only with a frame)
        # before any file is touched
        with _naming_scene_file(scene):
            animation = self._open_animation(resume) if self.render_on else None
        self.segments_before: list[dict] = []
        if resume:
            for name in ("run.json", "scene.toml") if save_scene else ("run.json",):
                refuse_link(self.run_dir / name)   # refused before any file is touched
            tokens, state = read_checkpoint(
                self.run_dir, echo=echo, sim=sim, steps_total=self.steps_total,
                fingerprint=self.fingerprint, columns=self.columns, trajectory=traj_every > 0)
            sim.set_tokens(tokens, step=state["step"])
            self.segments_before = _segments_kept(self.run_dir, state["step"])
            warning = _version_warning(self.run_dir, self.segments_before[-1].get("versions")
                                       if self.segments_before else None)
            if warning:
                echo(warning)
            self.summary.restore(state["summary"])
            if self.stop is not None:
                self.stop.restore(state.get("stop") or {})
            log_resume = (state["log_rows"], state["log_bytes"])
            first_chunk, first_frames = state["trajectory_chunk"], state["trajectory_frames"]
            self._cut_trajectory_back(first_chunk)
        else:
            if interrupts is not None:
                interrupts.raise_if_requested()   # a signal during the build: nothing touched
            if before_write is not None:
                before_write()
            scene.save(self.run_dir / "scene.toml")
        if self.video_path is not None:
            refuse_link(self.video_path)
        self.first_step = sim.step_count   # where this process's segment of the run starts
        self.cluster_threshold = float(log.cluster_threshold)
        self.log = LogCsv(self.log_path, self.columns, self.log_every, clusters_every,
                          self.cluster_threshold, resume=log_resume)
        try:
            self.traj = (Trajectory(self.run_dir / "trajectory", traj_meta, traj_every, sim.ensemble,
                                    first_chunk=first_chunk, first_frames=first_frames)
                         if traj_every > 0 else None)
            color_by = render_cfg.color_by
            self.video = Video(animation, self.frame_every, self.log_every, sim.ensemble,
                               color_by in ("radial", "entropy"),
                               self.cluster_threshold if color_by == "cluster" else None) \
                if self.render_on else None
            # a completed run ends with a checkpoint unless the scene says not to: resume --steps extends it
            self.checkpoint = (CheckpointWriter(self.run_dir, self.checkpoint_every, self._checkpoint_state)
                               if self.checkpoint_every or scene.output.final_checkpoint else None)
            if interrupts is not None:
                interrupts.raise_if_requested()
                interrupts.arm()   # from here on a signal stops the loop at a served state
            # every refusal comes before this point: a refused resume leaves run.json as it was
            if save_scene:
                scene.save(self.run_dir / "scene.toml")
            self._write_run_json("running")
        except BaseException:   # a failed start (a full disk, a signal) leaves no file open
            self._close_quietly()
            raise

    def _close_quietly(self) -> None:
        for w in (getattr(self, name, None) for name in ("log", "traj", "video")):
            try:
                if w is not None:
                    w.close()
            except Exception:  # noqa: BLE001 - the error that stopped the start is the one to report
                pass

    @property
    def writers(self) -> list:
        return [w for w in (self.log, self.summary, self.traj, self.video, self.checkpoint, self.stop)
                if w is not None]

    # -- setup helpers ------------------------------------------------------------------------
    def _cut_trajectory_back(self, first_chunk: int) -> None:
        """Remove chunks the checkpoint does not count (and temporaries a kill left behind)."""
        folder = self.run_dir / "trajectory"
        if not folder.is_dir() or folder.is_symlink():
            return
        for path in folder.iterdir():
            index = path.name[len("chunk_"):-len(".npz")]
            stale_chunk = (path.name.startswith("chunk_") and path.name.endswith(".npz")
                           and not (index.isdigit() and path.name == chunk_name(int(index))
                                    and int(index) < first_chunk))
            if stale_chunk or path.name.endswith(".tmp"):
                remove_file(path)
        for path in self.run_dir.glob(".*.tmp"):
            remove_file(path)

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
        try:
            # a run with stop rules may end early: its panels' time axis grows with the run
            # instead of reserving the planned span, most of which would stay empty
            t_end = None if self.stop is not None else self.steps_total * sim.dt
            anim = Animation(path, cfg, info, t_end=t_end)
        except ValueError as err:   # render (which imports no core) refuses settings it cannot draw
            raise ParticlesUserError(f"[render]: {err}") from None   # here: the scene's
        anim.__enter__()
        return anim

    def _write_run_json(self, status: str, extra: dict | None = None) -> None:
        sim = self.sim
        versions, fingerprint = _versions(), backend.fingerprint()
        segment = {"start_step": self.first_step, "end_step": sim.step_count, "versions": versions,
                   "machine": fingerprint}
        info = {"scene": self.scene.name, "status": status, "steps_total": self.steps_total,
                "steps_done": sim.step_count, "arch_requested": self.scene.dynamics.arch, "arch": sim.arch,
                "dtype": sim.dtype, "seed": self.scene.tokens.seed,
                "versions": versions, "machine": fingerprint, "segments": self.segments_before + [segment],
                "path": sim.path, "implementation": sim.implementation,   # the code that ran
                "tuning": sim.tuning,   # speed choices: tiles measured per machine
                "tiles": self.tiles,   # the wide pass's tiles by pass class, which a resume keeps
                "files": {"log": "log.csv", "scene": "scene.toml",
                          "trajectory": "trajectory" if self.traj else None,
                          "video": self.video_path.name if self.video_path else None},
                "updated": time.strftime("%Y-%m-%dT%H:%M:%S")}
        if sim.adaptive is not None:   # adaptive steps: the tolerances and the steps taken
            info["adaptive"] = {"integrator": sim.integrator.name, "rtol": sim.adaptive.rtol,
                                "atol": sim.adaptive.atol, **sim.stepper.stats()}
        info.update(extra or {})
        try:
            write_json(self.run_dir / "run.json", info)
        except OSError as err:
            if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            _overwrite_in_place(self.run_dir / "run.json", info)  # the old file's blocks suffice
            raise

    def _checkpoint_state(self) -> dict:
        return {"step": self.sim.step_count, "steps_total": self.steps_total,
                "log_rows": self.log.rows_written, "log_bytes": self.log.bytes_written,
                "trajectory_frames": self.traj.frames_written if self.traj else 0,
                "trajectory_chunk": self.traj.next_chunk if self.traj else 0,
                "summary": self.summary.state(), "scene": self.fingerprint,
                "scene_keys": self.fingerprint.keys,   # a refusal names the keys that differ
                **({"stop": self.stop.state()} if self.stop is not None else {}),
                **({"adaptive": self.sim.stepper.state()} if self.sim.stepper is not None else {}),
                **content_hashes(self.run_dir, self.log.bytes_written,
                                 self.traj.next_chunk if self.traj else 0)}

    def write_checkpoint(self) -> None:
        """A checkpoint now, at a fully served state (the loop writes periodic ones itself)."""
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
        stop = self.interrupts.requested if self.interrupts is not None else None
        # max_chunk: a deferred Ctrl-C is seen within 16 steps, or ~2 s of work
        step = validation.evaluation_seconds(sim.n_replicas * sim.n_heads * sim.n ** 2, sim.d) \
            * len(sim.integrator.weights)
        driver = Driver(sim, self.writers, self.steps_total, check_every=check_every,
                        max_chunk=validation.steps_between_signal_checks(step), flush_seconds=2.0,
                        on_advance=on_advance, should_stop=stop)
        try:
            try:
                driver.run()
                if driver.end_reason:
                    self.stopped = {"step": sim.step_count, "time": sim.time, "reason": driver.end_reason}
                    message = (f"stopped at step {sim.step_count} of {self.steps_total} (t = {sim.time:g}): "
                               f"{driver.end_reason}")
            except Stopped:
                status = "interrupted"
                what = f" ({self.interrupts.name})" if self.interrupts is not None else ""
                message = (f"interrupted at step {sim.step_count} of {self.steps_total}{what}; "
                           f"everything up to it is saved. Continue with: particles resume {self.run_dir}")
                driver.drain()
                self.write_checkpoint()
            except KeyboardInterrupt:  # only without deferral (not the main thread)
                status = "interrupted"
                message = (f"interrupted at step {sim.step_count} of {self.steps_total}; resume "
                           f"continues from the last checkpoint: particles resume {self.run_dir}")
            except BlowUpError as err:
                status = "blow-up"
                message = (_scene_file_prefix(self.scene) + str(err)
                           + f" Outputs up to the last good step are in {self.run_dir}.")
                try:
                    driver.drain()
                except BlowUpError:  # the rows after the first bad one: none of them is valid
                    pass
        except Exception as err:  # noqa: BLE001 - a fault is recorded, then reported or re-raised
            reason = _fault(err, self.run_dir)
            try:   # the rows computed before the fault go to log.csv, as far as the disk allows
                driver.drain()
            except Exception:  # noqa: BLE001 - the fault above is the one to report
                pass
            try:
                self.close("failed", reason or f"internal error: {type(err).__name__}: {err}")
            except Exception:  # noqa: BLE001 - the original error is the one to report
                pass
            if reason is None:
                raise
            return self._result("failed", self._failed_message(reason))
        finally:
            progress.close()
        failure = self.close(status)
        if failure:
            return self._result("failed", self._failed_message(failure))
        return self._result(status, message)

    def _failed_message(self, reason: str) -> str:
        last = self.log.last_step
        rows = "log rows" if last is None else f"log rows (to step {last})"
        return (f"the run failed at step {self.sim.step_count} of {self.steps_total}: {reason}. The "
                f"{rows} and the trajectory chunks written before it are in {self.run_dir}"
                + (" (a checkpoint is there to resume from once the cause is fixed)"
                   if (self.run_dir / "checkpoint.npz").exists() else "")
                + (f"; the video {self.video_path.name} may be unplayable (an MP4 is finished only "
                   "when it is closed): make it again with `particles render` once the cause is fixed"
                   if self.video_path is not None else ""))

    def _result(self, status: str, message: str) -> RunResult:
        sim = self.sim
        return RunResult(self.run_dir, self.log_path, self.traj and self.traj.folder, self.video_path,
                         sim.step_count, self.steps_total, status, self._summary(), message, sim.arch)

    def _summary(self) -> dict:
        return {**self.summary.as_dict(), **({"stopped": self.stopped} if self.stopped else {})}

    def close(self, status: str, reason: str | None = None) -> str | None:
        """Close every writer, then record the status in run.json. A fault of the machine while
        doing so makes the run "failed" and is returned (a bug is raised)."""
        failure = None
        for w in (self.log, self.traj, self.video):
            if w is None:
                continue
            try:
                w.close()
            except Exception as err:  # noqa: BLE001 - the other writers still close
                failure = failure or _fault(err, self.run_dir)
                if failure is None:
                    raise
        if failure and reason is None:
            status, reason = "failed", failure
        extra = {"summary": self._summary()}
        if reason:
            extra["reason"] = reason
        try:
            self._write_run_json(status, extra)
        except Exception as err:  # noqa: BLE001
            failure = failure or _fault(err, self.run_dir)
            if failure is None:
                raise
        return failure


def _guarded(run_dir: Path, start, echo):
    """Lock ``run_dir``, build the Runner with ``start(interrupts)`` and run it, signals deferred."""
    with DeferredInterrupts() as interrupts, RunDirLock(run_dir):
        runner = start(interrupts)
        result = runner.run()
    if interrupts.requested() and result.status == "completed":
        echo(f"({interrupts.name} arrived as the run finished: it completed and every file is closed)")
    return result


def run_scene(scene, out: str | Path | None = None, *, render: bool = True, progress: bool = True,
              checkpoint_every: int = 0, echo=print, overwrite: bool = False) -> RunResult:
    """Run a resolved scene into a new run directory; returns where everything went.

    A folder that already holds a run is refused (RunDirError) unless ``overwrite``."""
    run_dir = new_run_dir(scene, out)

    def start(interrupts):
        # a previous run is refused here, or (--overwrite) removed only once this run is built
        # and nothing can refuse it any more: a refusal leaves the previous run as it was
        replace = claim_for_new_run(run_dir, overwrite, echo)
        writing = []

        def before_write():
            writing.append(True)
            if replace:
                replace()

        try:
            return Runner(scene, run_dir, render=render, progress=progress,
                          checkpoint_every=checkpoint_every, echo=echo, interrupts=interrupts,
                          before_write=before_write)
        except BaseException:   # before the first step (a signal, a full disk): nothing computed,
            if writing:         # nothing to keep
                clear_run(run_dir)
            raise

    return _guarded(run_dir, start, echo)


def _last_logged_step(run_dir: Path) -> int | None:
    """The step of log.csv's last complete row (read from its end), None where it has none."""
    try:
        with open(run_dir / "log.csv", "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - 65536))
            lines = fh.read().split(b"\n")[:-1]   # the last piece is cut (or empty)
        return int(lines[-1].split(b",", 1)[0]) if len(lines) > 1 else None
    except (OSError, ValueError, IndexError):
        return None


def _steps_done(run_dir: Path, steps_total: int | None = None, log_every: int = 1,
                echo=None) -> int | None:
    """The steps done, as the hashed files say: the newest readable checkpoint's step, or
    more where run.json records more and log.csv's rows reach that far (a run without a
    final checkpoint). run.json's steps_done is stale after a SIGKILL; one beyond the
    scene's steps or the log's last row is damaged, and said so. None when nothing can say."""
    from .checkpoint import CHECKPOINT, read_checkpoint_file
    recorded = read_run_json(run_dir).get("steps_done")
    checkpoint = None
    try:
        step = read_checkpoint_file(run_dir / CHECKPOINT)[1].get("step")
        if type(step) is int and 0 <= step <= (steps_total if steps_total is not None else step):
            checkpoint = step   # (past the scene's steps it is damaged: resume falls back)
    except (OSError, ValueError, RunFileError):
        pass
    if type(recorded) is not int or (checkpoint is not None and recorded <= checkpoint):
        return checkpoint if checkpoint is not None or type(recorded) is not int else recorded
    last = _last_logged_step(run_dir)
    believable = ((steps_total is None or recorded <= steps_total) and last is not None
                  and last <= recorded < last + max(1, log_every) + 1)
    if believable:
        return recorded
    evidence = [s for s in (checkpoint, last) if s is not None]
    done = max(evidence) if evidence else None
    if echo is not None:
        said = "; ".join(part for part in (
            f"its newest checkpoint (hashed) is at step {checkpoint}" if checkpoint is not None else "",
            f"log.csv's last row is step {last}" if last is not None else "",
            f"the scene has {steps_total} steps" if steps_total is not None and recorded > steps_total else "")
            if part)
        echo(f"warning: {str(run_dir / 'run.json')!r} says {recorded} steps are done, but {said}: "
             f"its steps_done is damaged and is not used"
             + (f"; the run has done {done} steps" if done is not None else ""))
    return done


def resume_run(run_dir: str | Path, *, steps: int | None = None, render: bool = True,
               progress: bool = True, checkpoint_every: int = 0, echo=print) -> RunResult:
    """Continue a run from its last checkpoint, appending to its log and trajectory.

    steps: a new total number of steps (to extend a finished run); default the scene's.
    """
    from scenes import load_scene
    run_dir = Path(run_dir)

    def start(interrupts):
        scene = load_scene(run_dir / "scene.toml")
        if steps is not None:
            done = _steps_done(run_dir, int(scene.dynamics.steps), int(scene.log.every), echo)
            if done is not None and int(steps) < done:
                # a shorter total would discard computed steps: refuse before touching a file
                raise RunDirError(f"resume --steps {int(steps)}: {str(run_dir)!r} has already done "
                                  f"{done} steps; --steps is the new total, give N >= {done} to "
                                  "extend the run")
            scene = scene.replace(dynamics={"steps": int(steps)})
        return Runner(scene, run_dir, render=render, progress=progress,
                      checkpoint_every=checkpoint_every, echo=echo, resume=True,
                      interrupts=interrupts, save_scene=steps is not None)

    return _guarded(run_dir, start, echo)


__all__ = ["run_scene", "resume_run", "Runner", "RunResult"]
