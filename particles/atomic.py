"""The one way this project replaces a file: atomically, durably, never through a symlink.

A temporary file is created in the target's own directory (so the rename stays on one file
system), written, fsync'ed, then ``os.replace``d onto the target: a reader sees the old
file or the new one, never a torn one, and a crash leaves at most a stray temporary file.
A target that is a symbolic link is refused (a link planted in a run directory must not
redirect a write elsewhere); the temporary file is opened with O_EXCL | O_NOFOLLOW.
"""
from __future__ import annotations

import os
import stat
import secrets
from pathlib import Path


from .errors import SymlinkRefused  # noqa: E402  (a write through a link: the one family)


def refuse_symlink(path) -> Path:
    """``path``, unless it is a symbolic link (writing through it could change a file elsewhere)."""
    path = Path(path)
    if path.is_symlink():
        raise SymlinkRefused(f"refusing to write {str(path)!r}: it is a symbolic link "
                             f"(to {os.readlink(path)!r}); particles never writes through a link, "
                             "which could change a file outside the run directory. Remove the "
                             "link or choose another path")
    return path


def atomic_write_bytes(path, data: bytes) -> Path:
    """Replace ``path`` with ``data`` atomically (temporary file, fsync, rename)."""
    path = Path(path)
    refuse_symlink(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_folder(path.parent)   # the rename itself survives a power cut
    return path


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder if str(folder) else ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass   # some file systems cannot fsync a folder; the data itself is synced
    finally:
        os.close(fd)


def atomic_write_text(path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def refuse_hard_link(path) -> None:
    """SymlinkRefused when ``path`` is a file with more than one hard link: a write in place
    (append, truncate) would change a file outside the run folder too."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        raise SymlinkRefused(f"{str(path)!r} has {st.st_nlink} hard links: appending to it or "
                             "cutting it back would change a file outside the run folder as well; "
                             "nothing was written. Replace it by a copy of its own (cp FILE "
                             "FILE.copy && mv FILE.copy FILE) or remove the other link")


def open_append(path, **kwargs):
    """Open ``path`` for appending (text), refusing a symbolic link (O_NOFOLLOW) and a file
    with more than one hard link."""
    path = Path(path)
    refuse_symlink(path)
    refuse_hard_link(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
    return os.fdopen(os.open(path, flags, 0o644), "a", **kwargs)


__all__ = ["atomic_write_bytes", "atomic_write_text", "open_append", "refuse_symlink", "refuse_hard_link",
           "SymlinkRefused"]
