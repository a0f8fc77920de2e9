"""An interrupted run is indistinguishable from one that was not: interrupt at random moments
(inside a step block, a log write, a chunk write, a checkpoint, the final close), any number
of times, resume each time, and the log, trajectory and summary are bitwise those of the
uninterrupted run."""
import json
import os
import signal

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import particles.app.checkpoint as checkpoint_mod
from particles.app.run import resume_run, run_scene
from particles.drive import Driver
from particles.output import LogWriter, TrajectoryWriter, load_log, load_trajectory
from particles.simulation import Simulation
from scenes import load_scene

QUIET = dict(render=False, progress=False, echo=lambda *a: None)
STEPS = 40


def busy_scene(dtype="float32", steps=STEPS, seed=0):
    """Logs, counts clusters and saves the trajectory every step (the issue's racy case)."""
    return load_scene("quickstart", overrides=[
        "tokens.n=12", "log.every=1", "log.clusters_every=1", "log.trajectory_every=1",
        f"dynamics.steps={steps}", f"dynamics.dtype={dtype}", f"tokens.seed={seed}"])


_REFERENCE = {}


def reference(tmp_path_factory, dtype, seed=0):
    if (dtype, seed) not in _REFERENCE:
        out = tmp_path_factory.mktemp("reference") / f"{dtype}-{seed}"
        result = run_scene(busy_scene(dtype, seed=seed), out, **QUIET)
        assert result.status == "completed"
        _REFERENCE[dtype, seed] = (out, result.summary)
    return _REFERENCE[dtype, seed]


def assert_same_run(got_dir, want_dir):
    assert (got_dir / "log.csv").read_bytes() == (want_dir / "log.csv").read_bytes()
    s1, t1, x1, _ = load_trajectory(got_dir)
    s2, t2, x2, _ = load_trajectory(want_dir)
    assert np.array_equal(s1, s2) and np.array_equal(t1, t2)
    assert x1.dtype == x2.dtype and np.array_equal(x1, x2)
    got = json.loads((got_dir / "run.json").read_text())["summary"]
    want = json.loads((want_dir / "run.json").read_text())["summary"]
    assert got == want


MOMENTS = [(Simulation, "advance"), (LogWriter, "write"), (TrajectoryWriter, "flush"),
           (Driver, "drain"), (Simulation, "observe")]


class SignalAt:
    """Sends ``sig`` to this process on the k-th call of any watched function (before or after
    its body), the way a user's Ctrl-C lands at an arbitrary moment."""

    def __init__(self, monkeypatch, sig=signal.SIGINT):
        self.calls, self.at, self.after, self.sig = 0, None, False, sig
        for owner, name in MOMENTS:
            self._wrap(monkeypatch, owner, name)
        self._wrap(monkeypatch, checkpoint_mod, "write_checkpoint")
        import particles.app.run as run_mod
        monkeypatch.setattr(run_mod, "write_checkpoint", checkpoint_mod.write_checkpoint)

    def _wrap(self, monkeypatch, owner, name):
        original = getattr(owner, name)

        def wrapped(*args, **kwargs):
            self.calls += 1
            fire = self.at is not None and self.calls == self.at
            if fire and not self.after:
                os.kill(os.getpid(), self.sig)
            out = original(*args, **kwargs)
            if fire and self.after:
                os.kill(os.getpid(), self.sig)
            return out

        monkeypatch.setattr(owner, name, wrapped)

    def arm(self, k, after):
        self.calls, self.at, self.after = 0, k, after


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_interrupts_at_random_moments_then_resume_are_bitwise_equal(tmp_path_factory, dtype):

    @settings(max_examples=12, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(moments=st.lists(st.tuples(st.integers(1, 80), st.booleans(), st.sampled_from(
        [signal.SIGINT, signal.SIGTERM])), min_size=1, max_size=3),
        checkpoint_every=st.sampled_from([0, 7]), seed=st.sampled_from([0, 1, 2]))
    def check(moments, checkpoint_every, seed):
        want_dir, _ = reference(tmp_path_factory, dtype, seed)
        with pytest.MonkeyPatch.context() as mp:
            out = tmp_path_factory.mktemp("interrupted") / "run"
            trap = SignalAt(mp)
            k, after, sig = moments[0]
            trap.sig = sig
            trap.arm(k, after)
            result = run_scene(busy_scene(dtype, seed=seed), out, checkpoint_every=checkpoint_every,
                               **QUIET)
            for k, after, sig in moments[1:] + [(None, False, sig)] * 4:
                if result.status == "completed":
                    break
                assert result.status == "interrupted", result.message
                assert json.loads((out / "run.json").read_text())["status"] == "interrupted"
                trap.sig = sig
                trap.arm(k, after)
                result = resume_run(out, checkpoint_every=checkpoint_every, **QUIET)
            assert result.status == "completed" and result.steps_done == STEPS
        assert_same_run(out, want_dir)

    check()


def test_two_interrupts_keep_every_row(tmp_path_factory, monkeypatch):
    """The issue's first reproduction: Ctrl-C, resume, Ctrl-C, resume lost rows 600..1005."""
    want_dir, _ = reference(tmp_path_factory, "float32")
    out = tmp_path_factory.mktemp("twice") / "run"
    trap = SignalAt(monkeypatch)
    trap.arm(30, False)
    assert run_scene(busy_scene(), out, checkpoint_every=5, **QUIET).status == "interrupted"
    trap.arm(20, True)
    assert resume_run(out, checkpoint_every=5, **QUIET).status == "interrupted"
    rows = load_log(out)["step"]
    assert np.array_equal(rows, np.arange(len(rows)))   # nothing lost, nothing doubled so far
    trap.arm(None, False)
    assert resume_run(out, checkpoint_every=5, **QUIET).status == "completed"
    assert_same_run(out, want_dir)


def test_a_kill_after_the_checkpoint_leaves_junk_that_resume_cuts_away(tmp_path_factory, monkeypatch):
    """What a SIGKILL leaves after the last checkpoint (rows, a chunk, a half row, a temporary
    file) is cut back to exactly what the checkpoint counts."""
    want_dir, _ = reference(tmp_path_factory, "float32")
    out = tmp_path_factory.mktemp("killed") / "run"
    trap = SignalAt(monkeypatch)
    trap.arm(40, False)
    assert run_scene(busy_scene(), out, checkpoint_every=5, **QUIET).status == "interrupted"
    trap.arm(None, False)
    with open(out / "log.csv", "ab") as fh:
        fh.write(b"999,1.0,2.0,3.0\n12,0.5")
    chunks = sorted((out / "trajectory").glob("chunk_*.npz"))
    (out / "trajectory" / f"chunk_{len(chunks):05d}.npz").write_bytes(chunks[-1].read_bytes())
    (out / "trajectory" / f".chunk_{len(chunks) + 1:05d}.npz.123.abcd.tmp").write_bytes(b"half")
    assert resume_run(out, **QUIET).status == "completed"
    assert_same_run(out, want_dir)
    assert not list((out / "trajectory").glob("*.tmp"))


def test_resume_extends_a_finished_run_bitwise(tmp_path_factory):
    want_dir, _ = reference(tmp_path_factory, "float32")
    out = tmp_path_factory.mktemp("extended") / "run"
    assert run_scene(busy_scene(steps=STEPS // 2), out, checkpoint_every=6, **QUIET).status == "completed"
    assert resume_run(out, steps=STEPS, **QUIET).status == "completed"
    assert_same_run(out, want_dir)


def test_resume_with_fewer_steps_than_done_is_refused_and_changes_nothing(tmp_path):
    from particles.app.run_dir import RunDirError
    out = tmp_path / "run"
    assert run_scene(busy_scene(steps=12), out, checkpoint_every=6, **QUIET).status == "completed"
    before = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    with pytest.raises(RunDirError, match="has already done 12 steps; --steps is the new total"):
        resume_run(out, steps=6, **QUIET)
    assert {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before


def test_no_cluster_count_is_lost_to_a_video_frame_or_a_timed_flush(tmp_path):
    """Row s used to reach the log before the log had counted the clusters of state s when a
    frame (a writer wanting current rows) fell on s, or the wall-clock flush came during the
    step from s: NaN clusters, differing between otherwise identical runs."""
    from particles.app.build import build_simulation
    from particles.app.run_writers import LogCsv
    from particles.drive import Every, Writer
    from particles.observables import columns

    class Frames(Writer):
        current_rows = True
        needs = frozenset({"tokens"})

        def __init__(self):
            self.trigger, self.observe = Every(6), Every(1)

    scene = busy_scene()
    sim = build_simulation(scene)
    log = LogCsv(tmp_path / "log.csv", columns(sim.n_heads, False, True, False,
                                               ("energy", "radial", "entropy")), 1, 3, 0.99)
    Driver(sim, [log, Frames()], 30, flush_seconds=0.0).run()
    log.close()
    rows = load_log(tmp_path)
    counted = rows["step"] % 3 == 0
    assert counted.sum() == 11 and np.all(np.isfinite(rows["clusters"][counted]))


def test_ctrl_c_while_a_run_is_built_stops_at_once_and_leaves_no_half_run(tmp_path, monkeypatch):
    """Building and compiling has nothing to save: the signal raises at once (no waiting for a
    long warm-up) and the folder is left without a half-made run."""
    import particles.app.run as run_mod
    real = run_mod.Trajectory

    def trajectory_then_signal(*args, **kwargs):   # scene.toml, log.csv, trajectory/ exist now
        made = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return made

    monkeypatch.setattr(run_mod, "Trajectory", trajectory_then_signal)
    with pytest.raises(KeyboardInterrupt):
        run_scene(busy_scene(), tmp_path / "run", **QUIET)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [".lock"]
    monkeypatch.setattr(run_mod, "Trajectory", real)
    assert run_scene(busy_scene(), tmp_path / "run", **QUIET).status == "completed"
