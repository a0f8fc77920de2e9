"""A run directory holds one run: reuse refused (or --overwrite), one process at a time,
no write through a symbolic link, a full disk or a read-only folder a clear failure."""
import errno
import json
import os
import subprocess
import time

import numpy as np
import pytest

from cli_runner import particles_cli, start_particles
from particles.app.run import resume_run, run_scene
from particles.app.run_dir import RunDirError, RunDirLock
from particles.atomic import SymlinkRefused
from particles.output import RunFileError, load_log, load_trajectory
from scenes import load_scene

QUIET = dict(render=False, progress=False, echo=lambda *a: None)


def tiny(steps=20, seed=0, **extra):
    overrides = ["tokens.n=8", "log.every=1", "log.trajectory_every=2", f"dynamics.steps={steps}",
                 f"tokens.seed={seed}"] + [f"{k}={v}" for k, v in extra.items()]
    return load_scene("quickstart", overrides=overrides)


def read_checkpoint_step(run_dir) -> int:
    from particles.app.checkpoint import CHECKPOINT, read_checkpoint_file
    return read_checkpoint_file(run_dir / CHECKPOINT)[1]["step"]


# ----------------------------------------------------------------------------- one run per folder

def test_a_second_run_into_a_run_directory_is_refused(tmp_path):
    out = tmp_path / "R"
    run_scene(tiny(40), out, checkpoint_every=10, **QUIET)
    before = (out / "log.csv").read_bytes()
    with pytest.raises(RunDirError, match="already holds a run.*resume.*--overwrite"):
        run_scene(tiny(10, seed=1), out, **QUIET)
    assert (out / "log.csv").read_bytes() == before


def test_overwrite_leaves_only_the_new_run(tmp_path):
    out = tmp_path / "R"
    run_scene(tiny(40), out, checkpoint_every=10, **QUIET)
    (out / "notes.txt").write_text("mine")
    result = run_scene(tiny(10, seed=1), out, overwrite=True, **QUIET)
    assert result.status == "completed"
    steps, _, _, _ = load_trajectory(out)
    assert np.array_equal(steps, np.arange(0, 11, 2))        # no stale frames of the old run
    assert not (out / "previous-checkpoint.npz").exists()     # resume cannot pick up the old run:
    assert read_checkpoint_step(out) == 10                     # the checkpoint is the new run's end
    assert (out / "notes.txt").read_text() == "mine"          # files a run does not write stay
    fresh = run_scene(tiny(10, seed=1), tmp_path / "fresh", **QUIET)
    assert (out / "log.csv").read_bytes() == fresh.log.read_bytes()


def test_a_locked_folder_is_refused_and_a_stale_lock_is_not(tmp_path):
    out = tmp_path / "R"
    out.mkdir()
    (out / ".lock").write_text("99999999\n")   # left by a killed run: the file, not the lock
    assert run_scene(tiny(), out, **QUIET).status == "completed"
    lock = RunDirLock(out).acquire()
    try:
        with pytest.raises(RunDirError, match="in use by another run"):
            resume_run(out, steps=30, **QUIET)
    finally:
        lock.release()


def test_two_processes_on_one_folder(tmp_path):
    """The second of two runs started on the same --out exits 2; the first is unharmed."""
    out = tmp_path / "R"
    first = start_particles("run", "quickstart", "--out", out, "--steps", 10**6, "--no-render", "--quiet",
                "--set", "tokens.n=8", "--set", "log.every=1")
    deadline = time.time() + 120
    while time.time() < deadline and not (out / "run.json").exists():
        time.sleep(0.1)
    # the second in this process (the lock is held by another process either way): no start-up
    second = particles_cli("run", "quickstart", "--out", out, "--steps", 10, "--no-render", "--quiet")
    err2 = second.stderr
    first.send_signal(2)
    _, err1 = first.communicate(timeout=120)
    assert second.returncode == 2 and "in use by another run" in " ".join(err2.split()) and "Traceback" not in err2
    assert first.returncode == 130, err1
    widths = {len(line.split(",")) for line in (out / "log.csv").read_text().splitlines()}
    assert len(widths) == 1


def test_two_sweeps_on_one_folder(tmp_path):
    from particles.app.sweep import Sweep, run_sweep
    sweep = Sweep.from_dict({"name": "lock", "scene": "quickstart", "tokens": {"n": 8},
                             "dynamics": {"steps": 4}, "axes": {"dynamics.beta": [1.0, 2.0]},
                             "record": {"times": [0.0], "observables": ["eps"]}}, source="test")
    out = tmp_path / "S"
    out.mkdir()
    lock = RunDirLock(out, "sweep").acquire()
    try:
        with pytest.raises(RunDirError, match="in use by another sweep"):
            run_sweep(sweep, out)
    finally:
        lock.release()
    table = run_sweep(sweep, out)
    rows = table.read_text().splitlines()
    run_sweep(sweep, out)                                    # a rerun adds nothing
    assert table.read_text().splitlines() == rows and len(rows) == 3


# ----------------------------------------------------------------------------- symbolic links

@pytest.fixture
def victim(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    return outside


def test_resume_never_writes_through_a_linked_log_or_trajectory(tmp_path, victim):
    out = tmp_path / "R"
    run_scene(tiny(20), out, checkpoint_every=10, **QUIET)
    (out / "log.csv").unlink()
    (out / "log.csv").symlink_to(victim / "precious.txt")
    with pytest.raises(SymlinkRefused, match="symbolic link"):
        resume_run(out, steps=30, **QUIET)
    assert (victim / "precious.txt").read_text() == "keep me"

    out2 = tmp_path / "R2"
    run_scene(tiny(20), out2, checkpoint_every=10, **QUIET)
    for chunk in (out2 / "trajectory").iterdir():
        (victim / chunk.name).write_bytes(chunk.read_bytes())
    import shutil
    shutil.rmtree(out2 / "trajectory")
    (out2 / "trajectory").symlink_to(victim)
    with pytest.raises(SymlinkRefused, match="symbolic link"):
        resume_run(out2, steps=30, **QUIET)
    assert (victim / "precious.txt").read_text() == "keep me"
    assert sorted(p.name for p in victim.iterdir()).count("chunk_00000.npz") == 1


def test_overwrite_removes_links_not_their_targets(tmp_path, victim):
    out = tmp_path / "R"
    out.mkdir()
    (out / "trajectory").symlink_to(victim)
    (out / "log.csv").symlink_to(victim / "precious.txt")
    with pytest.raises(RunDirError):
        run_scene(tiny(), out, **QUIET)
    assert run_scene(tiny(), out, overwrite=True, **QUIET).status == "completed"
    assert not (out / "log.csv").is_symlink() and not (out / "trajectory").is_symlink()
    assert sorted(p.name for p in victim.iterdir()) == ["precious.txt"]
    assert (victim / "precious.txt").read_text() == "keep me"


def test_atomic_writes_refuse_a_link_instead_of_following_it(tmp_path, victim):
    from particles.output import atomic_write_text, write_json
    (tmp_path / "run.json").symlink_to(victim / "precious.txt")
    with pytest.raises(SymlinkRefused, match="symbolic link"):
        write_json(tmp_path / "run.json", {"status": "running"})
    assert (victim / "precious.txt").read_text() == "keep me"
    # a link planted at a temporary name is never opened (O_EXCL | O_NOFOLLOW, fresh names)
    atomic_write_text(tmp_path / "x.txt", "a")
    assert (tmp_path / "x.txt").read_text() == "a" and not list(tmp_path.glob("*.tmp"))


def test_plot_and_render_refuse_a_planted_link(tmp_path, victim):
    out = tmp_path / "R"
    run_scene(tiny(20), out, **QUIET)
    (out / "summary.png").symlink_to(victim / "precious.txt")
    (out / "rerender.mp4").symlink_to(victim / "precious.txt")
    for args in (("plot", out), ("render", out)):
        proc = particles_cli(*args)
        assert proc.returncode == 2 and "symbolic link" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    assert (victim / "precious.txt").read_text() == "keep me"


# ----------------------------------------------------------------------------- faults of the machine

@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs where the test may mount one (root), else None."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        yield None
        return
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _check_failed_run(out, result):
    assert result.status == "failed" and "disk is full" in result.message
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "failed" and "disk is full" in info["reason"]
    rows = load_log(out)                          # every row on disk is whole and readable
    assert np.array_equal(rows["step"], np.arange(len(rows["step"])))
    steps, _, _, _ = load_trajectory(out)
    assert np.all(np.diff(steps) == 1)


def test_a_full_disk_fails_the_run_clearly_and_keeps_what_was_written(small_disk, tmp_path, monkeypatch):
    scene = load_scene("quickstart", overrides=["tokens.n=32", "log.every=1", "log.trajectory_every=1",
                                                "dynamics.steps=4000", "log.clusters_every=0",
                                                "render.color_by=index"])
    if small_disk is not None:           # the real thing
        out = small_disk / "R"
        result = run_scene(scene, out, checkpoint_every=50, **QUIET)
        _check_failed_run(out, result)
        return
    import particles.output as output    # no tmpfs here: the 40th chunk write finds the disk full
    real = output.atomic_write_bytes
    calls = []

    def full(path, data):
        calls.append(path)
        if len(calls) > 40:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, data)

    monkeypatch.setattr(output, "atomic_write_bytes", full)
    out = tmp_path / "R"
    result = run_scene(scene, out, checkpoint_every=50, **QUIET)
    monkeypatch.setattr(output, "atomic_write_bytes", real)
    _check_failed_run(out, result)


def test_out_that_cannot_be_a_run_directory_exits_2(tmp_path):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    long_name = tmp_path / ("n" * 300)
    cases = [(a_file, "is a file"), (a_file / "sub", "not a folder"), (long_name, "too long")]
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)],
                                            capture_output=True).returncode == 0:
        cases.append((ro / "R", "read-only"))
    try:
        for out, says in cases:
            proc = particles_cli("run", "quickstart", "--out", out, "--steps", 5, "--no-render")
            assert proc.returncode == 2 and says in " ".join(proc.stderr.split()), (out, proc.stderr)
            assert "Traceback" not in proc.stderr
    finally:
        subprocess.run(["umount", "-l", str(ro)], capture_output=True)


# ----------------------------------------------------------------------------- --out and [output] dir

def _a_run_in(folder):
    folder.mkdir(parents=True)
    (folder / "run.json").write_text("{}")
    return folder


def test_out_is_the_run_folder_and_output_dir_its_parent(tmp_path):
    from particles.app.run_dir import new_run_dir
    assert new_run_dir(tiny(), tmp_path / "R") == tmp_path / "R"
    made = new_run_dir(tiny(**{"output.dir": str(tmp_path / "all")}), None)
    assert made.parent == tmp_path / "all" and made.name.startswith("quickstart-") and made.is_dir()
    assert new_run_dir(tiny(**{"output.run_dir": str(tmp_path / "exact")}), None) == tmp_path / "exact"


def test_out_given_a_folder_of_runs_says_it_is_the_run_folder_itself(tmp_path):
    _a_run_in(tmp_path / "runs" / "quickstart-20260101-000000")
    proc = particles_cli("run", "quickstart", "--out", tmp_path / "runs", "--steps", 5, "--no-render")
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "holds other runs' folders (quickstart-20260101-000000, ...), but --out is the run folder itself" in said
    assert f"--set output.dir='{tmp_path / 'runs'}'" in said and not (tmp_path / "runs" / "log.csv").exists()


def test_output_dir_that_holds_a_run_says_it_is_the_parent(tmp_path):
    run = _a_run_in(tmp_path / "my_run")
    proc = particles_cli("run", "quickstart", "--set", f"output.dir={run}", "--steps", 5, "--no-render")
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"[output] dir = '{run}' holds a run itself, but dir is the folder that receives run folders" in said
    assert "use [output] run_dir, or --out" in said and list(run.iterdir()) == [run / "run.json"]


def test_run_help_says_what_out_is(capsys):
    from particles.app.cli import main
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "--out DIR the run folder itself, as the scene's [output] run_dir" in said
    assert "inside the scene's [output] dir" in said
