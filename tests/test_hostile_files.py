"""Files that are not files: a FIFO (reading it waits for a writer that never comes), a device
(/dev/zero reads without end), a folder, where the program reads a file of its own (the log,
run.json, a trajectory chunk, a checkpoint's config, weights and tokenizer). Each is refused
by name before it is read, never waited on; each read runs in a thread with a time limit so
that a regression fails here instead of hanging the suite."""
import json
import os
import stat
import threading

import pytest

from particles import output


def within(seconds, fn, *args):
    """fn(*args) run in a thread: its result, or its exception re-raised; fails if it is still
    running after ``seconds`` (a FIFO being waited on)."""
    box = {}

    def target():
        try:
            box["value"] = fn(*args)
        except BaseException as err:  # noqa: BLE001 - handed back to the test
            box["error"] = err
    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"{getattr(fn, '__name__', fn)} waited on a file that is not one"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def plant(path, kind: str):
    """Put a FIFO, a device that reads zeros without end, or a folder at ``path``."""
    if path.exists() or path.is_symlink():
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        try:   # a node like /dev/zero's (character device 1, 5); without root, a link to it
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 5))
        except PermissionError:
            path.symlink_to("/dev/zero")
    else:
        path.mkdir()


KINDS = ["fifo", "device", "folder"]


# ----------------------------------------------------------------------------- run files

@pytest.mark.parametrize("kind", KINDS)
def test_load_log_refuses_a_log_that_is_not_a_file(tmp_path, kind):
    plant(tmp_path / "log.csv", kind)
    with pytest.raises((output.RunFileError, FileNotFoundError), match="log.csv") as err:
        within(10, output.load_log, tmp_path / "log.csv")
    assert "not a regular file" in str(err.value) or kind == "folder"


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_json_that_is_not_a_file_is_refused(tmp_path, kind):
    plant(tmp_path / "run.json", kind)
    with pytest.raises(output.RunFileError, match="run.json'.*not a regular file"):
        within(10, output.read_json, tmp_path / "run.json")


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_trajectory_chunk_that_is_not_a_file_is_refused(tmp_path, kind):
    folder = tmp_path / "trajectory"
    folder.mkdir()
    (folder / "meta.json").write_text(json.dumps({"schema": 1}))
    plant(folder / output.chunk_name(0), kind)
    refused = (output.RunFileError, output.SymlinkRefused)   # a link is refused as a link
    with pytest.raises(refused, match="chunk_00000.npz'.*(not a regular file|symbolic link)"):
        within(10, output.load_trajectory, tmp_path)
    with pytest.raises(refused, match="chunk_00000.npz'"):
        within(10, output.count_frames, folder, 1)


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_log_prefix_check_refuses_a_log_that_is_not_a_file(tmp_path, kind):
    """resume checks the log's first bytes: a FIFO there hung it."""
    plant(tmp_path / "log.csv", kind)
    with pytest.raises((output.RunFileError, output.SymlinkRefused),
                       match="log.csv'.*(not a regular file|symbolic link)"):
        within(10, output.check_log_prefix, tmp_path / "log.csv", ["step"], 0, 5)


# ----------------------------------------------------------------------------- checkpoints

@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "tokenizer.json"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_checkpoint_file_that_is_not_a_file_is_refused(tmp_path, name, kind):
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    from particles import pretrained as P
    from test_pretrained import make_checkpoint
    make_checkpoint(tmp_path / "m", "bert", d=8, H=2)
    plant(tmp_path / "m" / name, kind)

    def use():
        P.text_tokens(P.open_checkpoint(tmp_path / "m"), "the cat sat")
    with pytest.raises(P.PretrainedError, match=f"{name}' .*is not a regular file"):
        within(10, use)


@pytest.mark.parametrize("kind", KINDS)
def test_the_resume_reader_of_run_json_does_not_wait_on_a_fifo(tmp_path, kind):
    """run_dir.read_run_json (resume's steps done, segments, status): a FIFO as run.json hung
    `particles resume` past SIGTERM; it is read as absent."""
    from particles.app.run_dir import read_run_json
    plant(tmp_path / "run.json", kind)
    assert within(10, read_run_json, tmp_path) == {}


@pytest.mark.parametrize("kind", KINDS)
def test_a_checkpoint_that_is_not_a_file_is_unusable_not_waited_on(tmp_path, kind):
    """checkpoint.npz as a FIFO hung `particles resume` past SIGTERM; it is an unusable
    checkpoint, named."""
    from particles.app import checkpoint
    plant(tmp_path / "checkpoint.npz", kind)
    with pytest.raises(output.RunFileError, match="cannot be read.*not a regular file"):
        within(10, checkpoint.read_checkpoint_file, tmp_path / "checkpoint.npz")
