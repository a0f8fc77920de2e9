"""Faults of a run as a hostile user makes them (issue 31 items 2, 3, 4, 10; issue 39 item 3):
--overwrite keeps the previous run until the new one can no longer be refused, a lock file
that is not a file of its own is refused, a full disk keeps every row computed before it,
render says where a trajectory turns NaN, and a path with a newline makes a usable run."""
import errno
import json
import os
import stat
import subprocess

import numpy as np
import pytest

from cli_runner import particles_cli
from particles.app.run import run_scene
from particles.app.run_dir import RunDirError, RunDirLock
from particles.output import load_log, load_trajectory
from scenes import load_scene

QUIET = dict(render=False, progress=False, echo=lambda *a: None)
SMALL = ["--set", "tokens.n=8", "--steps", "6", "--quiet"]


def snapshot(folder):
    """Every file under ``folder`` (the lock aside) with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lock"}


# ----------------------------------------------------------------------------- 31.2 --overwrite

@pytest.mark.parametrize("refusal", [
    ["--set", "tokens.n=10000000"],                      # the build: too many pairs per evaluation
    ["--set", "render.view=circle"],                     # the render settings, checked by render
    ["--set", "render.fps=100000"],                      # the render settings, checked at load
    ["--set", "heads.strengths=[1e300, 1.0]"],           # the build: not finite in float32
], ids=["pairs", "view", "fps", "dtype"])
def test_overwrite_keeps_the_previous_run_when_the_new_one_is_refused(tmp_path, refusal):
    out = tmp_path / "ow"
    assert particles_cli("run", "quickstart", *SMALL, "--no-render", "--out", out).returncode == 0
    before = snapshot(out)
    assert "run.json" in before and "log.csv" in before
    done = particles_cli("run", "quickstart", *SMALL, "--overwrite", "--out", out, *refusal)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "removed the previous run" not in done.stdout
    assert snapshot(out) == before   # nothing removed, nothing written


def test_overwrite_keeps_the_previous_run_when_the_tuning_is_refused(tmp_path, monkeypatch):
    """A refusal of the environment's settings while the run is built (issue 31: with
    PARTICLES_TUNING=wide=0x0x0 at n = 600 the folder was left holding only .lock; which sizes
    consult the tiles depends on the kernel path, so the build's refusal is made here): the
    previous run stays, and the message names the variable, not the scene."""
    from particles.app import run as run_module
    from particles.errors import ParticlesUserError
    out = tmp_path / "ow"
    assert particles_cli("run", "quickstart", *SMALL, "--no-render", "--out", out).returncode == 0
    before = snapshot(out)

    def refused(scene, **kwargs):
        raise ParticlesUserError("PARTICLES_TUNING: wide tiles '0x0x0' are not allowed")

    monkeypatch.setattr(run_module, "build_simulation", refused)
    done = particles_cli("run", "quickstart", *SMALL, "--no-render", "--overwrite", "--out", out)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("error: PARTICLES_TUNING: wide tiles '0x0x0' are not allowed")
    assert snapshot(out) == before


def test_render_settings_are_refused_at_load_naming_the_file_and_key(tmp_path):
    done = particles_cli("run", "quickstart", "--set", "render.fps=100000", "--out", tmp_path / "r")
    assert done.returncode == 2
    assert "quickstart.toml" in done.stderr and "[render] fps" in done.stderr and "240" in done.stderr
    assert not (tmp_path / "r").exists()


def test_the_scene_limits_of_render_settings_are_renders_own():
    """The schema's [render] ranges (scenes cannot import render) equal RenderConfig's."""
    from render.config import RenderConfig
    from scenes import schema
    cases = {"fps": (1, schema.RENDER_FPS_MAX), "dpi": schema.RENDER_DPI,
             "width": schema.RENDER_PIXELS, "height": schema.RENDER_PIXELS}
    for key, (lo, hi) in cases.items():
        for value in (lo, hi):
            RenderConfig(**{key: value})
            load_scene("quickstart", overrides=[f"render.{key}={value}"])
        for value in (lo - 1, hi + 1):
            with pytest.raises(ValueError):
                RenderConfig(**{key: value})
            with pytest.raises(ValueError, match=rf"\[render\] {key}"):
                load_scene("quickstart", overrides=[f"render.{key}={value}"])


def test_overwrite_still_replaces_a_run(tmp_path):
    out = tmp_path / "ow"
    assert particles_cli("run", "quickstart", *SMALL, "--no-render", "--out", out).returncode == 0
    done = particles_cli("run", "quickstart", "--set", "tokens.n=8", "--steps", "3", "--quiet",
                         "--no-render", "--overwrite", "--out", out)
    assert done.returncode == 0 and "removed the previous run" in done.stdout
    assert json.loads((out / "run.json").read_text())["steps_done"] == 3


# ----------------------------------------------------------------------------- 31.3 the lock

@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim" / "important.txt"
    path.parent.mkdir()
    path.write_text("precious\n")
    return path


def test_a_hard_linked_lock_is_refused_not_truncated(tmp_path, victim):
    run = tmp_path / "hx"
    assert particles_cli("run", "quickstart", *SMALL, "--no-render", "--out", run).returncode == 0
    before = snapshot(run)
    os.unlink(run / ".lock")
    os.link(victim, run / ".lock")
    for args in (["resume", run, "--steps", "8", "--quiet"],
                 ["run", "quickstart", *SMALL, "--no-render", "--overwrite", "--out", run]):
        done = particles_cli(*args)
        assert done.returncode == 2 and "hard links" in done.stderr and ".lock" in done.stderr, done.stderr
        assert victim.read_text() == "precious\n" and snapshot(run) == before
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    os.link(victim, sweep / ".lock")
    with pytest.raises(RunDirError, match="lock file .* of this sweep folder has 3 hard links"):
        RunDirLock(sweep, "sweep").acquire()
    assert victim.read_text() == "precious\n"


def test_a_lock_that_is_not_a_regular_file_is_refused(tmp_path):
    run = tmp_path / "fifo"
    run.mkdir()
    os.mkfifo(run / ".lock")   # opened for writing it would block, or write into a pipe
    with pytest.raises(RunDirError, match="not a regular file"):
        RunDirLock(run).acquire()
    assert stat.S_ISFIFO(os.lstat(run / ".lock").st_mode)
    if os.geteuid() == 0:      # a device node: only root can make one
        dev = tmp_path / "dev"
        dev.mkdir()
        os.mknod(dev / ".lock", stat.S_IFCHR | 0o600, os.makedev(1, 3))   # as /dev/null
        done = particles_cli("run", "quickstart", *SMALL, "--no-render", "--out", dev)
        assert done.returncode == 2 and "not a regular file" in done.stderr
        assert stat.S_ISCHR(os.lstat(dev / ".lock").st_mode)
    lock = RunDirLock(tmp_path / "fine")   # a plain lock still works
    (tmp_path / "fine").mkdir()
    lock.acquire()
    assert (tmp_path / "fine" / ".lock").read_text() == f"{os.getpid()}\n"
    lock.release()


# ----------------------------------------------------------------------------- 31.4 full disk

def logged_steps(run_dir):
    return [int(s) for s in load_log(run_dir / "log.csv")["step"]]


def test_a_full_disk_keeps_every_row_computed_before_it(tmp_path, monkeypatch):
    """The disk fills while a trajectory chunk is written (--no-render, the rows still in
    memory): every row up to the state the run stopped at is in log.csv."""
    import particles.output as output
    real = output.atomic_write_bytes

    def disk_full_at_chunk_2(path, data):
        if path.name == "chunk_00002.npz":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, data)

    monkeypatch.setattr(output, "atomic_write_bytes", disk_full_at_chunk_2)
    scene = load_scene("quickstart", overrides=["tokens.n=8", "dynamics.steps=1500"])
    result = run_scene(scene, tmp_path / "r", **QUIET)
    assert result.status == "failed" and "disk is full" in result.message
    assert 745 <= result.steps_done < 1500   # chunk 2 holds the states 500..745
    assert logged_steps(tmp_path / "r") == list(range(0, result.steps_done + 1, 5))
    assert f"log rows (to step {logged_steps(tmp_path / 'r')[-1]})" in result.message
    assert json.loads((tmp_path / "r" / "run.json").read_text())["status"] == "failed"


def test_a_log_write_that_fails_keeps_whole_rows_in_order(tmp_path, monkeypatch):
    """The log's own write fails part-way through a batch: the rows that fit stay, whole and
    in order, and no later row is written after the gap."""
    from particles.app import run_writers
    real, budget = run_writers.LogWriter.write, {"rows": 37}

    def write_until_full(self, rows):
        if budget["rows"] < len(rows):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
        budget["rows"] -= len(rows)
        return real(self, rows)

    monkeypatch.setattr(run_writers.LogWriter, "write", write_until_full)
    scene = load_scene("quickstart", overrides=["tokens.n=8", "dynamics.steps=600"])
    result = run_scene(scene, tmp_path / "r", **QUIET)
    assert result.status == "failed"
    assert logged_steps(tmp_path / "r") == list(range(0, 37 * 5, 5))
    assert "log rows (to step 180)" in result.message


def test_a_start_that_fails_on_a_full_disk_leaves_nothing_open_or_half_written(tmp_path, monkeypatch):
    """The disk fills while the run's files are first written (trajectory/meta.json here):
    exit 2, no file of the run left open (a notebook kept log.csv open), no half-made run."""
    import particles.output as output
    real = output.write_json

    def full_at_meta(path, obj):
        if path.name == "meta.json":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, obj)

    monkeypatch.setattr(output, "write_json", full_at_meta)
    out = tmp_path / "r"
    done = particles_cli("run", "quickstart", *SMALL, "--no-render", "--out", out)
    assert done.returncode == 2 and "disk is full" in done.stderr, done.stderr
    assert [p.name for p in out.iterdir()] == [".lock"]
    assert not [fd for fd in os.listdir("/proc/self/fd") if str(out) in _target(fd)]


def _target(fd) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small file system (root only)")
def test_a_64_kib_file_system(tmp_path):
    """A real full disk: the log holds every row in order up to the step it names, and never
    falls behind the trajectory (a row's room comes before a chunk's)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        scene = load_scene("quickstart", overrides=["dynamics.steps=1500"])
        result = run_scene(scene, disk / "r", **QUIET)
        assert result.status == "failed" and "disk is full" in result.message
        steps = logged_steps(disk / "r")
        assert steps and steps == list(range(0, steps[-1] + 1, 5))
        assert f"log rows (to step {steps[-1]})" in result.message
        traj = load_trajectory(disk / "r").steps if list((disk / "r/trajectory").glob("chunk_*")) else []
        assert len(traj) == 0 or traj[-1] <= steps[-1]
    finally:
        subprocess.run(["umount", str(disk)], check=False)


# ----------------------------------------------------------------------------- 31.10 NaN render

def test_render_says_where_the_trajectory_turns_non_finite(tmp_path):
    run = tmp_path / "r"
    assert particles_cli("run", "quickstart", "--set", "tokens.n=8", "--steps", "30", "--quiet",
                         "--no-render", "--set", "log.trajectory_every=5", "--set", "render.width=160",
                         "--set", "render.height=120", "--out", run).returncode == 0
    chunk = run / "trajectory" / "chunk_00000.npz"
    with np.load(chunk) as data:
        arrays = dict(data)
    arrays["tokens"][4:, 3] = np.nan   # from the fifth frame (step 20) on
    np.savez_compressed(chunk, **arrays)
    done = particles_cli("render", run, "--out", tmp_path / "v.gif")
    assert done.returncode == 0, done.stderr
    assert "chunk_00000.npz" in done.stdout and "non-finite" in done.stdout
    assert "from step 20" in done.stdout and "stops at step 15" in done.stdout
    from PIL import Image
    assert Image.open(tmp_path / "v.gif").n_frames == 4
    arrays["tokens"][0, 0] = np.inf    # nothing finite to draw: refused, naming the chunk
    np.savez_compressed(chunk, **arrays)
    done = particles_cli("render", run, "--out", tmp_path / "w.gif")
    assert done.returncode == 2 and "chunk_00000.npz" in done.stderr and "step 0" in done.stderr
    assert not (tmp_path / "w.gif").exists()


def test_render_options_out_of_range_are_named(tmp_path):
    run = tmp_path / "r"
    assert particles_cli("run", "quickstart", *SMALL, "--no-render", "--out", run).returncode == 0
    done = particles_cli("render", run, "--fps", "100000", "--out", tmp_path / "v.gif")
    assert done.returncode == 2 and "--fps 100000" in done.stderr and "240" in done.stderr


# ----------------------------------------------------------------------------- 39.3 odd paths

def test_a_newline_in_the_paths_makes_a_run_that_resumes_and_renders(tmp_path):
    folder = tmp_path / "sc\nenes"
    folder.mkdir()
    scene = folder / "s\n.toml"   # no name in the file: the default name is the file's, made plain
    scene.write_text('[tokens]\nn = 8\nd = 3\n[dynamics]\nsteps = 6\n[log]\ntrajectory_every = 2\n'
                     "[render]\nenabled = false\nwidth = 160\nheight = 120\n")
    run = tmp_path / "n\nl\x1b"
    assert particles_cli("run", scene, "--quiet", "--out", run).returncode == 0
    first = (run / "scene.toml").read_text().split("\n")[0]
    assert first.startswith("# resolved scene 's_' (from ") and "sc\\nenes/s\\n.toml)" in first
    for args in (["resume", run, "--steps", "10", "--quiet", "--no-render"],   # writes scene.toml again
                 ["resume", run, "--steps", "12", "--quiet", "--no-render"],
                 ["render", run, "--out", tmp_path / "v.gif"]):
        done = particles_cli(*args)
        assert done.returncode == 0, (args, done.stderr)
    assert "n\\nl\\x1b" in (run / "scene.toml").read_text().split("\n")[0]
    assert logged_steps(run)[-1] == 12


def test_a_scene_error_keeps_each_problem_on_its_line(tmp_path):
    from scenes import SceneError
    missing = tmp_path / "a\nb" / "none.toml"
    with pytest.raises(SceneError) as info:
        load_scene(missing)
    lines = str(info.value).split("\n")
    assert len(lines) == 2 and lines[0].startswith("scene file '") and "a\\nb" in lines[0]
    assert "a\\nb" in lines[1] and info.value.source == str(missing)
