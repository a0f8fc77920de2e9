"""No write leaves the run folder through a hard link (issue 27): resume refuses a log.csv
with more than one link and leaves the outside file as it was; a sweep announces the rule
file it executes."""
import os
import textwrap

import pytest

from particles.atomic import SymlinkRefused, open_append
from particles.output import LogWriter as LogCsv


def test_append_refuses_a_hard_linked_file(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    os.link(outside, tmp_path / "log.csv")
    with pytest.raises(SymlinkRefused, match="2 hard links"):
        open_append(tmp_path / "log.csv")
    assert outside.read_text() == "precious\n"


def test_resume_refuses_a_hard_linked_log_and_a_new_log_drops_the_link(tmp_path):
    outside = tmp_path / "outside.csv"
    outside.write_text("a,b\n1,2\n")
    run = tmp_path / "run"
    run.mkdir()
    os.link(outside, run / "log.csv")
    with pytest.raises(SymlinkRefused, match="hard links"):
        LogCsv(run / "log.csv", ["a", "b"], resume=(1, 8))
    assert outside.read_text() == "a,b\n1,2\n"
    log = LogCsv(run / "log.csv", ["a", "b"])
    log.close()
    assert outside.read_text() == "a,b\n1,2\n" and os.stat(run / "log.csv").st_nlink == 1


def test_resume_of_a_run_whose_log_is_hard_linked_is_exit_2(tmp_path, capsys):
    from particles.app.cli import main
    run = tmp_path / "run"
    assert main(["run", "quickstart", "--set", "tokens.n=8", "--steps", "10", "--no-render",
                 "--quiet", "--checkpoint-every", "5", "--out", str(run)]) == 0
    outside = tmp_path / "outside.csv"
    os.replace(run / "log.csv", outside)
    os.link(outside, run / "log.csv")
    before = outside.read_bytes()
    code = main(["resume", str(run), "--steps", "20", "--no-render", "--quiet"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "hard links" in err, err
    assert outside.read_bytes() == before


def test_a_sweep_announces_the_rule_file_it_executes(tmp_path):
    from particles.app.sweep.runner import run_sweep
    (tmp_path / "rule.py").write_text(textwrap.dedent("""
        import taichi as ti
        import particles

        def doubled(z):
            return ti.exp(2.0 * z)

        particles.register_rule("doubled", kernel=doubled, normalization="softmax")
    """))
    (tmp_path / "sweep.toml").write_text(textwrap.dedent("""
        name = "announce"
        [tokens]
        n = 6
        d = 3
        [heads]
        kind = "scalar"
        [dynamics]
        rule = "doubled"
        rule_file = "rule.py"
        steps = 2
        [axes]
        "dynamics.beta" = [1.0]
        [record]
        times = [0.0]
        observables = ["eps"]
    """))
    said = []
    run_sweep(tmp_path / "sweep.toml", tmp_path / "out", echo=said.append)
    assert any("executing rule file" in s and "rule.py" in s for s in said), said


def test_a_run_and_a_sweep_never_share_a_folder(tmp_path, capsys):
    from particles.app.cli import main
    run = tmp_path / "run"
    assert main(["run", "quickstart", "--set", "tokens.n=8", "--steps", "3", "--no-render",
                 "--quiet", "--out", str(run)]) == 0
    sweep = tmp_path / "sweep.toml"
    sweep.write_text('name = "kinds"\n[tokens]\nn = 6\nd = 3\n[heads]\nkind = "scalar"\n'
                     '[dynamics]\nsteps = 2\n[axes]\n"dynamics.beta" = [1.0]\n'
                     '[record]\ntimes = [0.0]\nobservables = ["eps"]\n')
    capsys.readouterr()
    assert main(["sweep", str(sweep), "--out", str(run)]) == 2
    assert "already holds a run" in " ".join(capsys.readouterr().err.split())
    assert not (run / "results.csv").exists() and not (run / "sweep.json").exists()
    out = tmp_path / "sweep-out"
    assert main(["sweep", str(sweep), "--out", str(out)]) == 0
    for extra in ([], ["--overwrite"]):
        capsys.readouterr()
        assert main(["run", "quickstart", "--set", "tokens.n=8", "--steps", "3", "--no-render",
                     "--quiet", "--out", str(out)] + extra) == 2
        assert "already holds a sweep" in " ".join(capsys.readouterr().err.split())
    assert not (out / "log.csv").exists() and (out / "results.csv").exists()


def test_an_unreachable_ray_address_is_exit_2_within_seconds(tmp_path, capsys):
    import time
    pytest.importorskip("ray")
    from particles.app.cli import main
    sweep = tmp_path / "sweep.toml"
    sweep.write_text('name = "ray"\n[tokens]\nn = 6\nd = 3\n[heads]\nkind = "scalar"\n'
                     '[dynamics]\nsteps = 2\n[axes]\n"dynamics.beta" = [1.0]\n'
                     '[record]\ntimes = [0.0]\nobservables = ["eps"]\n')
    t0 = time.monotonic()
    code = main(["sweep", str(sweep), "--out", str(tmp_path / "out"), "--executor", "ray",
                 "--address", "127.0.0.1:1"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "127.0.0.1:1" in err and time.monotonic() - t0 < 60, err
