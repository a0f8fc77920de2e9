"""particles.atomic: the one way files are replaced (temp file, fsync, rename; no symlinks)."""
import os

import pytest

from particles.atomic import SymlinkRefused, atomic_write_text, open_append
from particles.output import LogWriter


def test_replaces_whole_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "a.txt"
    atomic_write_text(target, "first")
    atomic_write_text(target, "second")
    assert target.read_text() == "second"
    assert sorted(os.listdir(tmp_path)) == ["a.txt"]


def test_refuses_to_write_through_a_symlink(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    link = tmp_path / "run" / "log.csv"
    link.parent.mkdir()
    link.symlink_to(outside)
    with pytest.raises(SymlinkRefused, match="symbolic link"):
        atomic_write_text(link, "x")
    with pytest.raises(SymlinkRefused):
        open_append(link)
    with pytest.raises(SymlinkRefused):
        LogWriter(link, ["step"])
    assert outside.read_text() == "precious" and link.is_symlink()


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "b.txt"
    atomic_write_text(target, "old")

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space"):
        atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["b.txt"]


def test_the_command_line_refuses_a_planted_symlink_as_a_user_error(tmp_path):
    from cli_runner import particles_cli
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "log.csv").symlink_to(outside)
    proc = particles_cli("run", "quickstart", "--steps", 2, "--no-render", "--quiet", "--out", run_dir)
    # a folder holding a log is refused as another run's (no --overwrite): nothing is written
    assert proc.returncode == 2 and "already holds a run" in proc.stderr and "Traceback" not in proc.stderr
    assert outside.read_text() == "precious" and (run_dir / "log.csv").is_symlink()
    proc = particles_cli("plot", run_dir)   # reading through the link is refused too
    assert proc.returncode == 2 and "symbolic link" in proc.stderr and "Traceback" not in proc.stderr
    assert outside.read_text() == "precious"
