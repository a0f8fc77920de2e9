"""Resume at its edges (issue 27): a completed run without checkpoints says so; --steps below
the newest checkpoint is refused even when run.json is stale (after a SIGKILL)."""
import json

from particles.app.cli import main


def run(out, *extra):
    return main(["run", "quickstart", "--set", "tokens.n=8", "--no-render", "--quiet",
                 "--out", str(out)] + [str(e) for e in extra])


def test_a_completed_run_without_checkpoints_says_it_is_complete(tmp_path, capsys):
    assert run(tmp_path / "r", "--steps", 5) == 0
    capsys.readouterr()
    assert main(["resume", str(tmp_path / "r"), "--steps", "10", "--no-render", "--quiet"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "no checkpoint" in err and "completed run" in err and "interrupt" not in err, err


def test_steps_below_the_newest_checkpoint_are_refused_though_run_json_is_stale(tmp_path, capsys):
    out = tmp_path / "r"
    assert run(out, "--steps", 20, "--checkpoint-every", 10) == 0
    info = json.loads((out / "run.json").read_text())
    info.update(status="running", steps_done=0)           # what a SIGKILL leaves
    (out / "run.json").write_text(json.dumps(info))
    before = (out / "log.csv").read_bytes()
    capsys.readouterr()
    assert main(["resume", str(out), "--steps", "15", "--no-render", "--quiet"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "already done 20 steps" in err, err
    assert (out / "log.csv").read_bytes() == before


def test_a_resume_refused_late_leaves_run_json_as_it_was(tmp_path, capsys):
    """scene.toml a symbolic link and --steps (the new length must be written to it): the
    refusal comes before any write, so run.json keeps its bytes and no video part is named."""
    out = tmp_path / "r"
    assert run(out, "--steps", 20, "--checkpoint-every", 10) == 0
    (tmp_path / "scene.toml").write_bytes((out / "scene.toml").read_bytes())
    (out / "scene.toml").unlink()
    (out / "scene.toml").symlink_to(tmp_path / "scene.toml")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    capsys.readouterr()
    assert main(["resume", str(out), "--steps", "30", "--quiet"]) == 2   # rendering, a part file
    err = " ".join(capsys.readouterr().err.split())
    assert "symbolic link" in err and "scene.toml" in err, err
    assert (out / "run.json").read_bytes() == before["run.json"]
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
