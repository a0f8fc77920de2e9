"""The command line as a test drives it: `particles_cli` calls `main(argv)` in this process
(its kernels are then compiled once per test session, not once per call); `particles_process`
starts `python -m particles` where the process itself is what is tested (signals, the entry
point, a process that must not see a GPU, a rule file that registers rules)."""
import contextlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass


@dataclass
class Completed:
    returncode: int
    stdout: str
    stderr: str


def particles_cli(*args, cwd=None) -> Completed:
    """`particles ARGS` through `main(argv)`, with its output captured and `cwd` entered."""
    from particles.app.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        if cwd is not None:
            stack.callback(os.chdir, os.getcwd())
            os.chdir(cwd)
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        code = main([str(a) for a in args])
    return Completed(code, out.getvalue(), err.getvalue())


def particles_process(*args, cwd=None, timeout=300, env=None) -> Completed:
    """`python -m particles ARGS` in a child process, to its end."""
    proc = start_particles(*args, cwd=cwd, env=env)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return Completed(proc.returncode, stdout, stderr)


def start_particles(*args, cwd=None, env=None) -> subprocess.Popen:
    """`python -m particles ARGS` started in a child process (its output piped, as text), for
    a test that signals it or runs another beside it."""
    return subprocess.Popen([sys.executable, "-m", "particles", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                            env=dict(os.environ, MPLBACKEND="Agg", **(env or {})))
