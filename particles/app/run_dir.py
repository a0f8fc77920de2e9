"""A run directory holds one run: where it goes, its lock, --overwrite, and faults named plainly.

    new_run_dir(scene, out, overwrite)   the folder, created; refused if it already holds a run
    RunDirLock(folder)                   an exclusive lock for one process (released on exit,
                                         also by a crash: flock dies with its process)
    describe_os_error(err)               a machine fault (disk full, read-only, ...) in one sentence
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import time
from pathlib import Path

from particles.errors import ParticlesUserError
from particles.output import RunFileError, open_run_file, refuse_link, remove_file

LOCK = ".lock"
# What a run writes at the top of its folder (videos are added from run.json and by suffix).
RUN_FILES = ("run.json", "scene.toml", "log.csv", "checkpoint.npz", "previous-checkpoint.npz",
             "checkpoint.npz.new", "trajectory", "unusable-checkpoint.npz", "summary.png",
             "summary.svg")
VIDEO_SUFFIXES = (".mp4", ".gif")


class RunDirError(ParticlesUserError):
    """A run directory that cannot be used as asked (busy, holds another run, not a folder)."""


def holds_run(folder: Path) -> bool:
    """True when ``folder`` holds (part of) a run: any file a run writes is there."""
    folder = Path(folder)
    return any(os.path.lexists(folder / name) for name in RUN_FILES[:7])


def read_run_json(folder: Path) -> dict:
    """A run folder's run.json as a dict; {} when it is absent, unreadable or not an object
    (its readers then fall back on what else the folder says)."""
    try:   # open_run_file: a FIFO or device there is refused, not waited on (resume hung)
        with open_run_file(Path(folder) / "run.json") as fh:
            info = json.loads(fh.read())
    except (OSError, ValueError, RecursionError):
        return {}
    return info if isinstance(info, dict) else {}


def new_run_dir(scene, out: str | Path | None) -> Path:
    """``out``, else the scene's output.run_dir, else <output.dir>/<name>-<time>; created.

    ``out`` and ``run_dir`` are the run folder itself; ``dir`` is the folder that receives run
    folders. Each is refused where it was evidently meant as the other: an ``out`` that holds
    other runs' folders, a ``dir`` that holds a run."""
    output = scene.output
    if out is not None:
        run_dir = Path(out)
        _refuse_folder_of_runs(run_dir, scene.name)
    elif output.run_dir:
        run_dir = Path(output.run_dir)
    else:
        if holds_run(Path(output.dir)):
            raise RunDirError(
                f"[output] dir = {output.dir!r} holds a run itself, but dir is the folder that "
                f"receives run folders (a run goes to dir/<name>-<time>); for the run folder itself "
                f"use [output] run_dir, or --out")
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = Path(output.dir) / f"{scene.name}-{stamp}"
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"the output {str(run_dir)!r} is a file, not a folder; give --out a "
                          "folder (new or empty)")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def _refuse_folder_of_runs(folder: Path, name: str) -> None:
    """--out is the run folder itself: a folder of other runs' folders is the scene's
    [output] dir's meaning, said and refused rather than filled with this run's files."""
    if not folder.is_dir() or holds_run(folder):
        return
    try:
        inner = next((p for p in sorted(folder.iterdir()) if p.is_dir() and not p.is_symlink()
                      and holds_run(p)), None)
    except OSError:
        return   # an unreadable folder is reported when the run claims it
    if inner is not None:
        raise RunDirError(
            f"--out {str(folder)!r} holds other runs' folders ({inner.name}, ...), but --out is the "
            f"run folder itself: this run's files would lie among them. Give a new folder (--out "
            f"{str(folder / name)!r}), or, for a new <name>-<time> folder inside it, --set "
            f"output.dir={str(folder)!r}")


# What a sweep writes at the top of its folder (particles.app.sweep.format's names).
SWEEP_FILES = ("sweep.json", "results.csv", "units_done.txt")


def holds_sweep(folder: Path) -> bool:
    """True when ``folder`` holds (part of) a sweep's output."""
    return any(os.path.lexists(Path(folder) / name) for name in SWEEP_FILES)


def refuse_other_kind(folder: Path, kind: str) -> None:
    """A folder holds one kind of output: a run refuses a sweep's folder and a sweep a run's
    (``plot`` would show one and ignore the other). ``--overwrite`` does not change this."""
    other = holds_sweep(folder) if kind == "run" else holds_run(folder)
    if other:
        what = "a sweep's results (sweep.json, results.csv)" if kind == "run" else \
            "a run (run.json, log.csv, ...)"
        raise RunDirError(f"{str(folder)!r} already holds {what}: a {kind} there would mix its "
                          f"files with it. Choose another --out for the {kind}")


def claim_for_new_run(run_dir: Path, overwrite: bool, echo=print):
    """Under the folder's lock: refuse a folder that already holds a run (its files would mix
    with the new run's), unless ``overwrite``; a folder holding a sweep is refused always.

    Returns None when the folder holds no run, else (``overwrite``) the function that removes
    that run's files: the caller calls it only once the new run can no longer be refused, so
    that a refused run never leaves the folder without the previous one."""
    refuse_other_kind(run_dir, "run")
    if not holds_run(run_dir):
        return None
    if not overwrite:
        raise RunDirError(f"{str(run_dir)!r} already holds a run: a second run there would mix "
                          f"its files with the first. Continue it with `particles resume {run_dir}`, "
                          "pass --overwrite to replace it, or choose another --out")

    def replace() -> None:
        removed = clear_run(run_dir)
        if echo is not None:
            echo(f"--overwrite: removed the previous run's files from {run_dir} ({', '.join(removed)})")
    return replace


def clear_run(folder: Path) -> list[str]:
    """Remove the files of the run in ``folder`` (never following a link); returns their names.
    Files a run does not write are left alone."""
    folder = Path(folder)
    videos = set()
    for entry in folder.iterdir():
        name = entry.name
        if name.endswith(".tmp") or (name.endswith(VIDEO_SUFFIXES) and not entry.is_dir()):
            videos.add(name)
    removed = []
    for name in sorted(set(RUN_FILES) | videos):
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif os.path.lexists(path):
            remove_file(path)
        else:
            continue
        removed.append(name)
    return removed


class RunDirLock:
    """An exclusive advisory lock on a run (or sweep) folder for the life of one process.

    flock(2) on ``folder/.lock``: the kernel releases it when the process ends, however it
    ends, so a lock left by a killed run is never in the way (the file stays, unlocked)."""

    def __init__(self, folder: Path, what: str = "run"):
        self.folder, self.what = Path(folder), what
        self._fd = None

    def acquire(self) -> "RunDirLock":
        import fcntl
        path = refuse_link(self.folder / LOCK)
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as err:
            if is_machine_fault(err):
                raise
            raise RunDirError(self._not_a_lock(path, f"cannot be opened ({err.strerror})")) from None
        st = os.fstat(fd)   # of the file opened, so nothing can be swapped in after the check
        why = (None if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 else
               f"has {st.st_nlink} hard links (truncating it to write the process id would change "
               "the other file, outside the folder)" if stat.S_ISREG(st.st_mode) else
               "is not a regular file (a device, a pipe or a socket)")
        if why is not None:
            os.close(fd)
            raise RunDirError(self._not_a_lock(path, why))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunDirError(f"{str(self.folder)!r} is in use by another {self.what} (process "
                              f"{holder}); two at once would interleave their files. Wait for it "
                              "to finish, or choose another folder") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def _not_a_lock(self, path: Path, why: str) -> str:
        return (f"the lock file {str(path)!r} of this {self.what} folder {why}; nothing was "
                f"written. A {self.what} writes its process id there: remove {str(path)!r} (its "
                "own file is made again) and try again")

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)   # closing drops the flock
            self._fd = None

    def __del__(self):
        self.release()

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
        return False


_HINTS = {
    errno.ENOSPC: "the disk is full: free some space or write the run elsewhere (--out)",
    errno.EDQUOT: "the disk quota is exhausted: free some space or write the run elsewhere (--out)",
    errno.EROFS: "the file system is read-only: choose a writable folder (--out)",
    errno.EACCES: "permission denied: choose a folder you can write to (--out)",
    errno.EPERM: "the operation is not permitted there: choose another folder (--out)",
    errno.ENAMETOOLONG: "a file name is too long (at most 255 bytes per name): choose a shorter name",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EEXIST: "a file of that name is in the way",
    errno.EISDIR: "a folder is in the way where a file belongs",
    errno.ELOOP: "a symbolic link is in the way (particles never writes through links)",
    errno.EFBIG: "the file is too large for this file system",
    errno.EIO: "an input/output error on the disk",
}


def is_machine_fault(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in _HINTS


def describe_os_error(err: OSError) -> str:
    """One sentence for a fault of the machine: what failed, on which file, and what to do."""
    where = f" ({err.filename!r})" if getattr(err, "filename", None) else ""
    hint = _HINTS.get(err.errno, "")
    return f"{err.strerror or err}{where}: {hint}" if hint else f"{err.strerror or err}{where}"


__all__ = ["new_run_dir", "claim_for_new_run", "holds_run", "clear_run", "RunDirLock", "RunDirError", "RunFileError",
           "describe_os_error", "is_machine_fault"]
