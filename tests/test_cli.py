"""The command line end to end: through `main(argv)` in this process, and in a child process
where the process is the point (the installed entry point, a process without a GPU, a rule file
that registers rules)."""
import json
import sys

import pytest

from cli_runner import particles_cli, particles_process
from particles.output import load_log, load_trajectory


def test_run_bundled_scene_end_to_end(tmp_path):
    out = tmp_path / "qs"
    proc = particles_cli("run", "quickstart", "--out", out, "--steps", 60, "--set", "dynamics.beta=2.5",
                         "--set", "render.frames=6", "--set", "render.width=480", "--set", "render.height=270")
    assert proc.returncode == 0, proc.stderr
    assert "run completed: 60/60 steps on arch cpu" in proc.stdout
    for name in ("log.csv", "scene.toml", "run.json", "animation.mp4"):
        assert (out / name).is_file(), name
    log = load_log(out)
    assert log["step"][0] == 0 and log["step"][-1] == 60
    steps, times, tokens, meta = load_trajectory(out)
    assert tokens.shape[1:] == (64, 3) and steps[-1] == 60
    run = json.loads((out / "run.json").read_text())
    assert run["arch"] == "cpu" and run["seed"] == 0 and run["versions"]["taichi"]
    resolved = (out / "scene.toml").read_text()
    assert "beta = 2.5" in resolved  # the --set override reached the run
    assert meta["beta"] == [2.5]


def test_user_error_exits_2_with_message_and_no_traceback(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[tokens]\nn = 8\nd = 3\n[dynamics]\nbeeta = 2.0\n")
    proc = particles_cli("run", bad, "--out", tmp_path / "r")
    assert proc.returncode == 2
    assert "did you mean 'beta'" in proc.stderr and "bad.toml" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = particles_cli("run", "no_such_scene_anywhere")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


@pytest.mark.parametrize("error, code", [(ValueError("an internal slip"), 1),
                                          (FileNotFoundError("an internal slip"), 1),
                                          (KeyError("an internal slip"), 1)])
def test_an_internal_error_inside_a_command_is_a_bug_not_the_user_s(monkeypatch, error, code):
    """Only the ParticlesUserError family is the user's (exit 2, one paragraph); a bare
    ValueError (or any other) raised inside a command is a bug: exit 1 with the traceback."""
    from particles.app import cli
    from particles.errors import ParticlesUserError

    def fail(*args, **kwargs):
        raise error
    monkeypatch.setattr(cli, "_load", fail)
    proc = particles_cli("show", "quickstart")
    assert proc.returncode == code, proc.stderr
    assert "Traceback" in proc.stderr and "an internal slip" in proc.stderr
    assert "internal error: this is a bug in particles" in proc.stderr

    def refuse(*args, **kwargs):
        raise ParticlesUserError("a user's slip")
    monkeypatch.setattr(cli, "_load", refuse)
    proc = particles_cli("show", "quickstart")
    assert proc.returncode == 2 and proc.stderr.strip() == "error: a user's slip", proc.stderr


def test_scenes_show_new(tmp_path):
    proc = particles_cli("scenes")
    assert proc.returncode == 0 and "quickstart" in proc.stdout
    proc = particles_cli("show", "quickstart", "--set", "tokens.n=32")
    assert proc.returncode == 0 and "n = 32" in proc.stdout and "[dynamics]" in proc.stdout
    proc = particles_cli("new", "mine", cwd=tmp_path)
    assert proc.returncode == 0 and (tmp_path / "mine.toml").is_file()
    proc = particles_cli("run", "mine.toml", "--steps", 5, "--no-render", "--out", "r", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = particles_cli("new", "mine", cwd=tmp_path)
    assert proc.returncode == 2 and "already exists" in proc.stderr


def test_new_quotes_the_name_and_refuses_an_empty_one(tmp_path):
    proc = particles_cli("new", 'odd "name"', cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = particles_cli("show", 'odd "name".toml', cwd=tmp_path)   # the starter stays valid TOML
    assert proc.returncode == 0, proc.stderr
    assert 'name = "odd \\"name\\""' in proc.stdout
    for bad in ("", ".toml", "..", "somewhere/"):
        proc = particles_cli("new", bad, cwd=tmp_path)
        assert proc.returncode == 2 and "is not a scene name" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ['odd "name".toml']


def test_help_lists_commands():
    proc = particles_process("--help")
    assert proc.returncode == 0
    for command in ("run", "resume", "scenes", "show", "new", "render", "plot"):
        assert command in proc.stdout


def test_every_command_and_argument_says_what_it_does():
    from particles.app.cli import build_parser
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    for name, sub in commands.items():
        assert sub.description, f"particles {name} --help has no description"
        for action in sub._actions:
            assert action.help, f"particles {name}: argument {action.dest!r} has no help text"


# A process that sees no GPU: CUDA disabled for Taichi and hidden, the Vulkan loader pointed
# at a driver list that does not exist (so even Mesa's software device is gone).
NO_GPU_ENV = {"TI_ENABLE_CUDA": "0", "CUDA_VISIBLE_DEVICES": "", "VK_ICD_FILENAMES": "/nonexistent/icd.json",
              "VK_DRIVER_FILES": "/nonexistent/icd.json"}


@pytest.mark.skipif(sys.platform == "darwin", reason="Metal cannot be hidden from a process")
def test_gpu_request_without_gpu_is_an_error_not_a_fallback(tmp_path):
    proc = particles_process("run", "quickstart", "--arch", "gpu", "--steps", 2, "--no-render", "--out", tmp_path / "g",
                             env=NO_GPU_ENV)
    assert proc.returncode == 2, proc.stderr
    assert "no CUDA/Vulkan device is usable" in " ".join(proc.stderr.split()) and "Traceback" not in proc.stderr
    assert not (tmp_path / "g" / "run.json").exists()
    proc = particles_process("run", "quickstart", "--arch", "auto", "--steps", 2, "--no-render", "--out",
                             tmp_path / "a", env=NO_GPU_ENV)
    assert proc.returncode == 0, proc.stderr
    assert "on arch cpu" in proc.stdout


def test_user_rule_that_does_not_compile_names_the_rule_and_function(tmp_path):
    rule_file = tmp_path / "numpy_rule.py"
    rule_file.write_text("import numpy as np\nimport particles\n\n\ndef numpy_sigmoid(z):\n"
                         "    return 1 / (1 + np.exp(-z))\n\n\n"
                         "particles.register_rule('numpy_sigmoid', kernel=numpy_sigmoid)\n")
    proc = particles_process("run", "quickstart", "--set", f"dynamics.rule_file={rule_file}", "--set",
                             "dynamics.rule=numpy_sigmoid", "--steps", 2, "--no-render", "--out", tmp_path / "r")
    assert proc.returncode == 2, proc.stderr
    message = " ".join(proc.stderr.split())
    assert "rule 'numpy_sigmoid'" in message and "kernel function 'numpy_sigmoid'" in message
    assert "on arch 'cpu'" in message and "Traceback" not in proc.stderr


def test_render_and_plot_a_finished_run(tmp_path):
    out = tmp_path / "run"
    proc = particles_cli("run", "quickstart", "--out", out, "--steps", 20, "--no-render", "--quiet")
    assert proc.returncode == 0, proc.stderr
    proc = particles_cli("render", out, "--out", out / "again.gif", "--color-by", "entropy", "--view", "pca")
    assert proc.returncode == 0, proc.stderr
    import imageio.v3 as iio
    frames = iio.imread(out / "again.gif", index=None)
    steps, _, _, _ = load_trajectory(out)
    assert frames.shape[0] == len(steps)
    proc = particles_cli("plot", out)
    assert proc.returncode == 0 and (out / "summary.png").is_file() and (out / "summary.svg").is_file()
    proc = particles_cli("render", tmp_path)  # not a run directory
    assert proc.returncode == 2 and "not a run directory" in proc.stderr


def test_sweep_and_its_phase_diagram_from_the_command_line(tmp_path):
    sweep = tmp_path / "s.toml"
    sweep.write_text('scene = "quickstart"\n[axes]\n"dynamics.beta" = [1.0, 4.0]\n"tokens.seed" = {count = 2}\n'
                     '[record]\ntimes = [0.5, 1.0]\nobservables = ["eps"]\nclusters = true\n')
    proc = particles_cli("sweep", sweep, "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "out" / "results.csv").read_text().splitlines()
    assert len(text) == 1 + 2 * 2 * 2  # header + betas x seeds x times
    proc = particles_cli("plot", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert list((tmp_path / "out").glob("*.png"))
