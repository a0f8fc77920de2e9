"""Corrupt run files of every kind: a bad checkpoint falls back to the previous one (and the
result is still bitwise the uninterrupted run's), with neither the user gets one clear
paragraph (exit 2); broken logs, chunks and meta files are named, never a traceback."""
import io
import json

import numpy as np
import pytest

from particles.app.checkpoint import CHECKPOINT, PREVIOUS_CHECKPOINT
from particles.app.cli import main
from particles.app.run import resume_run, run_scene
from particles.output import RunFileError
from scenes import load_scene

QUIET = dict(render=False, progress=False, echo=lambda *a: None)


def tiny(steps):
    return load_scene("quickstart", overrides=["tokens.n=8", "log.every=1", "log.trajectory_every=2",
                                               "log.clusters_every=2", f"dynamics.steps={steps}"])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "run"
    run_scene(tiny(30), out, **QUIET)
    return out


@pytest.fixture
def half_run(tmp_path):
    """20 of 30 steps with checkpoints at 15 (previous) and 20 (newest)."""
    out = tmp_path / "run"
    run_scene(tiny(20), out, checkpoint_every=5, **QUIET)
    return out


def rewrite(path, tokens=None, **state_changes):
    with np.load(path) as data:
        x, state = data["tokens"], json.loads(str(data["state"]))
    state.update(state_changes)
    buf = io.BytesIO()
    np.savez(buf, tokens=x if tokens is None else tokens(x), state=np.array(json.dumps(state)))
    path.write_bytes(buf.getvalue())


def truncated(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def summary_of(path):
    with np.load(path) as data:
        return json.loads(str(data["state"]))["summary"]


CORRUPTIONS = {
    "truncated": truncated,
    "empty": lambda p: p.write_bytes(b""),
    "not a zip": lambda p: p.write_text("hello"),
    "negative step": lambda p: rewrite(p, step=-5),
    "huge step": lambda p: rewrite(p, step=10**9),
    "negative trajectory chunk": lambda p: rewrite(p, trajectory_chunk=-1),
    "too many frames": lambda p: rewrite(p, trajectory_frames=99),
    "rows not in the log": lambda p: rewrite(p, log_rows=3),
    "bytes past the log": lambda p: rewrite(p, log_bytes=10**7),
    "float step": lambda p: rewrite(p, step=20.0),
    "other scene": lambda p: rewrite(p, scene="0123456789abcdef"),
    "no summary": lambda p: rewrite(p, summary=None),
    "old format": lambda p: rewrite(p, format=1),
    "tokens off the sphere": lambda p: rewrite(p, tokens=lambda x: 2 * x),
    "tokens NaN": lambda p: rewrite(p, tokens=lambda x: np.where(x > 0.5, np.nan, x).astype(x.dtype)),
    "tokens shape": lambda p: rewrite(p, tokens=lambda x: x[:, :4]),
    "tokens dtype": lambda p: rewrite(p, tokens=lambda x: x.astype(np.float64)),
    "a link": lambda p: (p.unlink(), p.symlink_to(p.with_name(PREVIOUS_CHECKPOINT))),
}


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_a_bad_checkpoint_falls_back_to_the_previous_one(half_run, uninterrupted, kind):
    CORRUPTIONS[kind](half_run / CHECKPOINT)
    said = []
    result = resume_run(half_run, steps=30, render=False, progress=False, echo=said.append)
    assert result.status == "completed"
    assert any("resuming from previous-checkpoint.npz (step 15)" in s for s in said), said
    if kind != "a link":
        assert (half_run / "unusable-checkpoint.npz").is_file()   # kept, out of the rotation
    assert (half_run / "log.csv").read_bytes() == (uninterrupted / "log.csv").read_bytes()
    want = json.loads((uninterrupted / "run.json").read_text())["summary"]
    assert json.loads((half_run / "run.json").read_text())["summary"] == want


def test_with_no_usable_checkpoint_the_user_gets_one_paragraph(half_run, capsys):
    truncated(half_run / CHECKPOINT)
    rewrite(half_run / PREVIOUS_CHECKPOINT, step=-1)
    before = (half_run / "log.csv").read_bytes()
    assert main(["resume", str(half_run), "--steps", "30", "--quiet", "--no-render"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "no usable checkpoint" in err and "checkpoint.npz: it cannot be read" in err
    assert "previous-checkpoint.npz: 'step' is -1" in err and "Traceback" not in err
    assert (half_run / "log.csv").read_bytes() == before    # nothing was cut or written


def test_missing_checkpoints_say_how_to_get_one(tmp_path, capsys):
    out = tmp_path / "run"
    run_scene(tiny(10), out, **QUIET)
    for name in ("checkpoint.npz", "previous-checkpoint.npz"):   # as a SIGKILL before any
        (out / name).unlink(missing_ok=True)
    info = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps(dict(info, status="running")))
    assert main(["resume", str(out), "--steps", "20", "--quiet"]) == 2
    assert "no checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["log emptied", "log cut", "chunk truncated", "chunk missing",
                                    "scene edited"])
def test_damaged_files_around_the_checkpoints_are_named(half_run, capsys, damage):
    if damage == "log emptied":
        (half_run / "log.csv").write_bytes(b"")
    elif damage == "log cut":
        (half_run / "log.csv").write_bytes((half_run / "log.csv").read_bytes()[:300])
    elif damage == "chunk truncated":
        truncated(half_run / "trajectory" / "chunk_00000.npz")
    elif damage == "chunk missing":
        (half_run / "trajectory" / "chunk_00000.npz").unlink()
    else:
        scene = half_run / "scene.toml"
        scene.write_text(scene.read_text().replace("beta = 4.0", "beta = 3.0"))
    assert main(["resume", str(half_run), "--steps", "30", "--quiet", "--no-render"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "no usable checkpoint" in err and "Traceback" not in err
    word = {"log emptied": "log.csv", "log cut": "log.csv", "chunk truncated": "chunk_00000.npz",
            "chunk missing": "chunk_00000.npz", "scene edited": "different scene"}[damage]
    assert word in err


@pytest.mark.parametrize("damage", ["meta empty", "meta truncated", "chunk corrupt", "log empty",
                                    "log mixed", "scene empty"])
def test_render_and_plot_name_the_broken_file(tmp_path, capsys, damage):
    out = tmp_path / "run"
    run_scene(tiny(10), out, **QUIET)
    meta = out / "trajectory" / "meta.json"
    if damage == "meta empty":
        meta.write_text("")
    elif damage == "meta truncated":
        meta.write_text(meta.read_text()[:40])
    elif damage == "chunk corrupt":
        chunk = out / "trajectory" / "chunk_00000.npz"
        data = bytearray(chunk.read_bytes())
        data[len(data) // 2:] = b"\0" * (len(data) - len(data) // 2)
        chunk.write_bytes(bytes(data))
    elif damage == "log empty":
        (out / "log.csv").write_text("")
    elif damage == "log mixed":     # what two runs interleaving one log used to leave
        with open(out / "log.csv", "a") as fh:
            fh.write("1,2,3\n")
    else:
        (out / "scene.toml").write_text("")
    commands = [["render", str(out), "--out", str(tmp_path / "v.gif")]]
    if damage.startswith("log"):
        commands.append(["plot", str(out)])
    for argv in commands:
        assert main(argv) == 2, argv
        err = " ".join(capsys.readouterr().err.split())
        assert err.startswith("error: ") and "Traceback" not in err
        assert any(w in err for w in ("meta.json", "chunk_00000.npz", "log.csv", "scene.toml")), err


def test_loaders_raise_run_file_errors(tmp_path):
    from particles.output import load_log, load_trajectory
    (tmp_path / "log.csv").write_text("a,b\n1,2\n3\n")
    with pytest.raises(RunFileError, match="line 3"):
        load_log(tmp_path)
    (tmp_path / "trajectory").mkdir()
    (tmp_path / "trajectory" / "meta.json").write_text("{}")
    (tmp_path / "trajectory" / "chunk_00001.npz").write_bytes(b"")
    with pytest.raises(RunFileError, match="chunk_00000.npz"):
        load_trajectory(tmp_path)
