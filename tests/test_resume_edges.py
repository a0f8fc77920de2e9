"""Resume at its edges (issue 27): a completed run without checkpoints says so; --steps below
the newest checkpoint is refused even when run.json is stale (after a SIGKILL)."""
import json

import numpy as np

from particles.app.cli import main


def run(out, *extra):
    return main(["run", "quickstart", "--set", "tokens.n=8", "--no-render", "--quiet",
                 "--out", str(out)] + [str(e) for e in extra])


def test_a_completed_run_without_checkpoints_says_it_is_complete(tmp_path, capsys):
    assert run(tmp_path / "r", "--steps", 5, "--set", "output.final_checkpoint=false") == 0
    assert not (tmp_path / "r" / "checkpoint.npz").exists()
    capsys.readouterr()
    assert main(["resume", str(tmp_path / "r"), "--steps", "10", "--no-render", "--quiet"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "completed run without a checkpoint" in err and "it is complete" in err, err
    assert "final checkpoint" in err and "interrupt" not in err and "Ctrl-C" not in err, err


def test_a_completed_run_ends_with_a_checkpoint_and_extends_to_the_longer_run(tmp_path):
    """No --checkpoint-every: the run still ends with checkpoint.npz (scene default), and
    resume --steps 30 of the 20-step run gives the 30-step run's log and trajectory."""
    from particles import load_trajectory
    assert run(tmp_path / "short", "--steps", 20) == 0
    assert (tmp_path / "short" / "checkpoint.npz").is_file()
    assert main(["resume", str(tmp_path / "short"), "--steps", "30", "--no-render", "--quiet"]) == 0
    assert run(tmp_path / "whole", "--steps", 30) == 0
    assert (tmp_path / "short" / "log.csv").read_bytes() == (tmp_path / "whole" / "log.csv").read_bytes()
    extended, whole = load_trajectory(tmp_path / "short"), load_trajectory(tmp_path / "whole")
    assert all(np.array_equal(a, b) for a, b in zip(extended[:3], whole[:3]))


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


def test_a_resume_across_versions_warns_and_run_json_keeps_every_segment(tmp_path, capsys):
    """run.json written by 'particles 0.0.1' (as an older run.json, without segments): the
    resume names both versions, and run.json then holds that segment and the new one."""
    import particles
    out = tmp_path / "r"
    assert run(out, "--steps", 20) == 0
    info = json.loads((out / "run.json").read_text())
    del info["segments"]
    info["versions"]["particles"] = "0.0.1"
    (out / "run.json").write_text(json.dumps(info))
    capsys.readouterr()
    assert main(["resume", str(out), "--steps", "30", "--no-render", "--quiet"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert f"particles 0.0.1; this is particles {particles.__version__}" in said, said
    assert main(["resume", str(out), "--steps", "40", "--no-render", "--quiet"]) == 0
    assert "warning" not in capsys.readouterr().out          # the newest segment is this version's
    segments = json.loads((out / "run.json").read_text())["segments"]
    assert [(s["start_step"], s["end_step"], s["versions"]["particles"]) for s in segments] == [
        (0, 20, "0.0.1"), (20, 30, particles.__version__), (30, 40, particles.__version__)]
    assert all(s["machine"]["model"] == info["machine"]["model"] for s in segments[1:])


def test_harmless_edits_do_not_block_a_resume_and_a_refusal_names_the_keys(tmp_path, capsys):
    """Issue 39.5: name, description or [render] fps changed in a run's scene.toml made resume
    say "written for a different scene", naming no key."""
    out = tmp_path / "r"
    assert run(out, "--steps", 10) == 0
    scene = out / "scene.toml"
    text = scene.read_text()
    for old, new in (('name = "quickstart"', 'name = "renamed"'), ("fps = 20", "fps = 30"),
                     ('description = "', 'description = "edited: ')):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    scene.write_text(text)
    assert main(["resume", str(out), "--steps", "20", "--no-render", "--quiet"]) == 0
    assert run(tmp_path / "whole", "--steps", 20) == 0      # and it is still the uninterrupted run
    assert (out / "log.csv").read_bytes() == (tmp_path / "whole" / "log.csv").read_bytes()
    text = scene.read_text()
    scene.write_text(text.replace("beta = 4.0", "beta = 5.0").replace("seed = 0\nnoise", "seed = 3\nnoise"))
    capsys.readouterr()
    assert main(["resume", str(out), "--steps", "30", "--no-render", "--quiet"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "scene.toml's dynamics.beta, tokens.seed differ from the run's" in err, err


def test_a_checkpoint_of_a_version_that_hashed_every_key_still_resumes(tmp_path):
    """Checkpoints written before the harmless keys were left out hold the hash of them all."""
    import io
    from particles.app.checkpoint import scene_fingerprint
    from scenes import load_scene
    out = tmp_path / "r"
    assert run(out, "--steps", 10) == 0
    with np.load(out / "checkpoint.npz") as data:
        tokens, state = data["tokens"], json.loads(str(data["state"]))
    state["scene"] = scene_fingerprint(load_scene(out / "scene.toml")).legacy
    del state["scene_keys"]
    buffer = io.BytesIO()
    np.savez(buffer, tokens=tokens, state=np.array(json.dumps(state)))
    (out / "checkpoint.npz").write_bytes(buffer.getvalue())
    assert main(["resume", str(out), "--steps", "20", "--no-render", "--quiet"]) == 0


def test_a_damaged_steps_done_is_not_trusted_over_the_checkpoints(tmp_path, capsys):
    """Issue 39.6: steps_done edited to 100000 while the checkpoints are at step 20 made
    `resume --steps 30` refuse ("has already done 100000 steps")."""
    out = tmp_path / "r"
    assert run(out, "--steps", 20, "--checkpoint-every", 10) == 0
    info = json.loads((out / "run.json").read_text())
    info["steps_done"] = 100000
    (out / "run.json").write_text(json.dumps(info))
    capsys.readouterr()
    assert main(["resume", str(out), "--steps", "30", "--no-render"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "says 100000 steps are done, but its newest checkpoint (hashed) is at step 20; log.csv's " \
           "last row is step 20; the scene has 20 steps: its steps_done is damaged" in said, said
    assert json.loads((out / "run.json").read_text())["steps_done"] == 30
    assert run(tmp_path / "whole", "--steps", 30) == 0
    assert (out / "log.csv").read_bytes() == (tmp_path / "whole" / "log.csv").read_bytes()


def test_a_run_without_a_final_checkpoint_keeps_the_steps_its_log_shows(tmp_path, capsys):
    """run.json beyond the newest checkpoint is believed where log.csv reaches that far (the
    run ended without a final checkpoint): --steps below it would discard computed steps."""
    out = tmp_path / "r"
    assert run(out, "--steps", 25, "--checkpoint-every", 10, "--set", "output.final_checkpoint=false") == 0
    capsys.readouterr()
    assert main(["resume", str(out), "--steps", "22", "--no-render", "--quiet"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "has already done 25 steps" in err and "damaged" not in err, err
