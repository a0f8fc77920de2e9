"""`particles render` maps a write fault to the exit-2 paragraph `run` gives (issue 27), not
"internal error" with the encoder's traceback."""
import pytest

from particles.app.cli import main


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("render") / "run"
    assert main(["run", "quickstart", "--set", "tokens.n=8", "--steps", "10", "--no-render",
                 "--quiet", "--out", str(run)]) == 0
    return run


def test_render_write_faults_are_exit_2(run_dir, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "folder.mp4").mkdir()
    cases = [(tmp_path / "afile" / "x.mp4", "not a folder"),
             (tmp_path / "folder.mp4", "folder is in the way")]
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    import os
    if not os.access(ro, os.W_OK):       # (root can write anywhere: no read-only case then)
        cases.append((ro / "x.mp4", "permission denied"))
    for out, says in cases:
        capsys.readouterr()
        code = main(["render", str(run_dir), "--out", str(out)])
        err = " ".join(capsys.readouterr().err.split())
        assert code == 2 and says in err and "internal error" not in err, (out, err)
    assert main(["render", str(run_dir), "--out", str(tmp_path / "ok.mp4")]) == 0


def test_a_view_the_run_cannot_show_is_the_user_s_error(run_dir, tmp_path, capsys):
    """render raises a bare ValueError (it imports no core); the app turns it into the user's
    error where it hands render the options: exit 2, one paragraph, no traceback."""
    code = main(["render", str(run_dir), "--view", "circle", "--out", str(tmp_path / "c.mp4")])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "view='circle' needs d=2" in err and "Traceback" not in err, err
