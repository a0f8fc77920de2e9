"""Stop rules (particles.stop, issue 35): a run ends where the flow has stopped, each rule with
its reason in run.json, the summary and the command's message; the log and the film end there;
an interrupted run stops where the uninterrupted one did."""
import json
import os
import signal

import numpy as np
import pytest

import reference as ref
from particles import Attention, Head, Rotary, load_log, load_trajectory
from particles.app.run import resume_run, run_scene
from particles.simulation import Simulation
from particles.stop import attention_change
from scenes import SceneError, load_scene

QUIET = dict(render=False, progress=False, echo=lambda *a: None)


def _scene(*rules, steps=600):
    """Twelve tokens collapsing at beta = 1 (kinetic ~e^(-1.6 t)), logged every 0.25."""
    return load_scene("quickstart", overrides=[
        "tokens.n=12", "dynamics.rule=softmax", "dynamics.beta=1", "dynamics.dt=0.05",
        f"dynamics.steps={steps}", "dynamics.dtype=float64", "log.every=5", *rules])


def _run(tmp_path, *rules, **kw):
    result = run_scene(_scene(*rules), tmp_path / "run", **QUIET, **kw)
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    return result, info, load_log(tmp_path / "run")


def test_kinetic_rule_ends_the_run_with_its_reason(tmp_path):
    result, info, log = _run(tmp_path, "dynamics.stop_kinetic=1e-12", "dynamics.stop_window=1.0")
    assert result.status == "completed" and info["status"] == "completed"
    stop = info["summary"]["stopped"]
    assert 0 < stop["step"] < 600 and result.steps_done == stop["step"] == info["steps_done"]
    assert stop["reason"].startswith("stop rule: kinetic energy <= 1e-12 at every logged state from t = ")
    assert "stopped at step" in result.message and stop["reason"] in result.message
    # the rows that decided: every one in the window at most 1e-12, the one before it above
    t, k = log["time"], log["kinetic"]
    assert t[-1] == pytest.approx(stop["time"]) and log["step"][-1] == stop["step"]
    window = (t >= stop["time"] - 0.25 - 1.0 - 1e-9) & (t <= stop["time"] - 0.25 + 1e-9)
    assert np.all(k[window] <= 1e-12) and k[np.argmax(window) - 1] > 1e-12


def test_energy_rate_rule_ends_the_run_with_its_reason(tmp_path):
    result, info, log = _run(tmp_path, "dynamics.stop_energy_rate=1e-10", "dynamics.stop_window=0.5")
    stop = info["summary"]["stopped"]
    assert stop["reason"].startswith("stop rule: |dE/dt| <= 1e-10 at every logged state from t = ")
    rate = log["energy_rate_h0"]
    assert abs(rate[-2]) <= 1e-10 and np.max(np.abs(rate[:len(rate) // 2])) > 1e-10
    assert stop["step"] < 600


def test_cluster_rule_ends_the_run_with_its_reason(tmp_path):
    result, info, log = _run(tmp_path, "dynamics.stop_clusters=2.0", "log.cluster_threshold=0.999")
    stop = info["summary"]["stopped"]
    assert stop["reason"].startswith("stop rule: cluster count 1 (cos > 0.999) unchanged from t = ")
    since = float(stop["reason"].split("unchanged from t = ")[1].split(" ")[0])
    assert stop["time"] - since >= 2.0 and since > 0


def test_no_rule_met_runs_to_the_end(tmp_path):
    result, info, _ = _run(tmp_path, "dynamics.stop_kinetic=1e-40", "dynamics.steps=60")
    assert result.steps_done == 60 and "stopped" not in info["summary"]


def test_bad_stop_keys_are_refused_naming_them():
    with pytest.raises(SceneError, match=r"\[dynamics\] stop_window: applies to stop_kinetic, stop_energy_rate or stop_attention"):
        _scene("dynamics.stop_window=1.0")
    with pytest.raises(SceneError, match=r"\[dynamics\] stop_kinetic: expected a number > 0"):
        _scene("dynamics.stop_kinetic=-1")


@pytest.mark.parametrize("rules,cut_at", [
    (("dynamics.stop_clusters=2.0", "dynamics.stop_kinetic=1e-12", "dynamics.stop_window=1.0"), 30),
    (("dynamics.stop_attention=1e-6", "dynamics.stop_window=1.0"), 70)], ids=["clusters_kinetic", "attention"])
def test_an_interrupted_run_stops_where_the_uninterrupted_one_did(tmp_path, monkeypatch, rules, cut_at):
    want = run_scene(_scene(*rules), tmp_path / "whole", checkpoint_every=20, **QUIET)
    calls = {"n": 0}
    original = Simulation.advance

    def advance(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] == cut_at:
            os.kill(os.getpid(), signal.SIGINT)
        return out

    monkeypatch.setattr(Simulation, "advance", advance)
    cut = run_scene(_scene(*rules), tmp_path / "cut", checkpoint_every=20, **QUIET)
    assert cut.status == "interrupted" and cut.steps_done < want.steps_done
    monkeypatch.setattr(Simulation, "advance", original)
    done = resume_run(tmp_path / "cut", **QUIET)
    assert done.steps_done == want.steps_done < 600 and done.message == want.message
    assert (tmp_path / "cut" / "log.csv").read_bytes() == (tmp_path / "whole" / "log.csv").read_bytes()


# ---------------------------------------------------------------- the attention map's change

def _rotated(v, theta):
    """RoPE with pairs (p, p + r/2) at positions 0..n-1, written out (the reference's)."""
    n, r = v.shape
    half = r // 2
    ang = np.arange(n)[:, None] * theta ** (-2.0 * np.arange(half) / r)[None, :]
    a, b = v[:, :half], v[:, half:2 * half]
    return np.concatenate([a * np.cos(ang) - b * np.sin(ang), b * np.cos(ang) + a * np.sin(ang),
                           v[:, 2 * half:]], axis=1)


def _reference_weights(x, head, att, beta):
    """(n, n) w_ij in float64 from full matrices: reference.spec_weights, with the biases and
    rotary positions written out where a head has them."""
    if att.rotary is None and not head.has_biases:
        M = head.query.T @ head.key
        spec = ref.HeadSpec(rule=att.rule.name, beta=att.beta, mask=att.mask, window=att.window,
                            alibi=att.alibi)
        return ref.spec_weights(x, M, beta, spec)
    q = _rotated(x @ head.query.T + head.query_bias, att.rotary.theta)
    k = _rotated(x @ head.key.T + head.key_bias, att.rotary.theta)
    z = (att.beta or beta) * q @ k.T
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _reference_change(before, after, layer_before, layer_after, betas):
    worst = 0.0
    for r, beta in enumerate(betas):
        for hb, ab, ha, aa in zip(*layer_before, *layer_after):
            change = _reference_weights(after[r], ha, aa, beta) - _reference_weights(before[r], hb, ab, beta)
            worst = max(worst, 0.5 * np.abs(change).sum(axis=1).max())
    return worst


def test_attention_change_matches_a_float64_reference_in_chunks():
    """Masks, ALiBi, a head's own beta, the exp / softmax / relu rules, biases with rotary
    positions, two replicas with their own betas, and a layer switch between the two states:
    the chunked rows equal the full n x n reference to 1e-12, whatever the chunk."""
    rng = np.random.default_rng(3)
    n, d = 23, 4
    before = rng.normal(size=(2, n, d))
    before /= np.linalg.norm(before, axis=-1, keepdims=True)
    after = before + 0.05 * rng.normal(size=before.shape)
    after /= np.linalg.norm(after, axis=-1, keepdims=True)

    def head(rank, biases=False):
        q, k = rng.normal(size=(rank, d)), rng.normal(size=(rank, d))
        bias = dict(query_bias=rng.normal(size=rank), key_bias=rng.normal(size=rank)) if biases else {}
        return Head(q, k, np.eye(d), np.eye(d), **bias)

    heads = (head(4), head(2), head(4), head(4, biases=True))
    attention = (Attention(mask="causal_window", window=5, alibi=0.3, rule="softmax"),
                 Attention(mask="window", window=3, beta=2.5, rule="exp"),
                 Attention(rule="relu"),
                 Attention(rule="softmax", rotary=Rotary(theta=7.0)))
    other = (heads[2], heads[3], heads[0], heads[1])   # the layer after: heads reordered
    other_att = (attention[2], attention[3], attention[0], attention[1])
    betas = np.array([1.5, 4.0])
    for layer_after in ((heads, attention), (other, other_att)):
        want = _reference_change(before, after, (heads, attention), layer_after, betas)
        assert want > 0.01
        for chunk in (None, 1, 5, n):
            got = attention_change(before, after, (heads, attention), layer_after, betas, False, chunk)
            assert got == pytest.approx(want, rel=1e-12, abs=0)
    # normalised: the weights of the directions x / |x| (pre- and peri-LN states leave the sphere)
    radii = rng.uniform(0.5, 2.0, size=(2, n, 1))
    got = attention_change(radii * before, 3 * after, (heads, attention), (heads, attention), betas, True)
    assert got == pytest.approx(attention_change(before, after, (heads, attention), (heads, attention),
                                                 betas, False), rel=1e-12)


def _attention_scene(*rules, steps=600):
    return _scene("dynamics.stop_attention=1e-6", "dynamics.stop_window=1.0", "log.trajectory_every=5",
                  *rules, steps=steps)


def test_attention_rule_stops_where_the_reference_measure_first_holds_over_the_window(tmp_path):
    """The run's stop step is the one the float64 reference's A(t_k) gives, every logged state
    from the streak's start to the state before the stop at most 1e-6, the one before above."""
    result = run_scene(_attention_scene(), tmp_path / "run", **QUIET)
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    stop = info["summary"]["stopped"]
    assert stop["reason"].startswith("stop rule: attention change <= 1e-06 per unit time at every "
                                     "logged state from t = ")
    steps, times, tokens, _ = load_trajectory(tmp_path / "run")
    assert steps[-1] == stop["step"] == result.steps_done < 600
    # quickstart's two scalar heads (M = I) have the same rows: one is enough
    rate = [np.abs(ref.weights(tokens[k], np.eye(3), 1.0, "softmax")
                   - ref.weights(tokens[k - 1], np.eye(3), 1.0, "softmax")).sum(axis=1).max() / 2
            / (times[k] - times[k - 1]) for k in range(1, len(steps))]
    assert all(abs(a / 1e-6 - 1) > 1e-6 for a in rate)   # no decision at rounding
    held = np.array([False] + [a <= 1e-6 for a in rate])
    # the first state k after which the states since the streak's start span the window
    want = None
    for k in range(len(steps)):
        start = k
        while start > 0 and held[start - 1]:
            start -= 1
        if held[k] and times[k] - times[start] >= 1.0:
            want = k + 1
            break
    assert want is not None and steps[want] == stop["step"]
    assert not held[start - 1] and f"from t = {times[start]:g} to t = {times[want - 1]:g}" in stop["reason"]


def test_attention_rule_not_met_runs_to_the_end(tmp_path):
    """Up to t = 5 the attention rows still move faster than 1e-6 per unit time (the reference
    above says so: the streak starts after t = 6): the run is not stopped."""
    result = run_scene(_attention_scene(steps=100), tmp_path / "run", **QUIET)
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert result.steps_done == 100 and "stopped" not in info["summary"]


def test_attention_rule_refuses_rules_it_cannot_compute():
    with pytest.raises(SceneError, match=r"\[dynamics\] stop_attention: the attention rows are computed "
                                         r"for the built-in rules exp, softmax and relu, not rule = 'sinkhorn'"):
        _scene("dynamics.stop_attention=1e-6", "dynamics.rule=sinkhorn")
    with pytest.raises(SceneError, match=r"\[dynamics\] stop_attention: expected a number > 0"):
        _scene("dynamics.stop_attention=0")
    _scene("dynamics.stop_attention=1e-6", "dynamics.stop_window=2.0")   # the window applies to it


def test_attention_rule_state_survives_a_checkpoint_exactly():
    """state() through JSON (as a checkpoint holds it) and restore(): the restored writer holds
    the previous logged tokens bitwise, so its next rate and streak equal the original's."""
    from types import SimpleNamespace
    from particles.drive import State
    from particles.stop import StopRules, StopWriter
    rng = np.random.default_rng(5)
    sim = SimpleNamespace(dt=0.1, betas=np.array([2.0]), normalisation="post",
                          schedule=SimpleNamespace(layer_at=lambda step: 0),
                          layer_heads=((Head(np.eye(3), np.eye(3), np.eye(3), np.eye(3)),),),
                          layer_attention=((Attention(rule="softmax"),),))
    states = [rng.normal(size=(1, 9, 3)) for _ in range(4)]
    rules = StopRules(attention=10.0, window=0.2)
    first, second = StopWriter(rules, 1, 1), StopWriter(rules, 1, 1)
    first.start(sim, 0, 10)
    for k, x in enumerate(states[:3]):
        first.on_state(State(k, 0.1 * k, 10, x))
    second.restore(json.loads(json.dumps(first.state())))
    second.start(sim, 3, 10)
    assert second.state() == first.state() and np.array_equal(second.previous[2], states[2])
    for w in (first, second):
        w.on_state(State(3, 0.3, 10, states[3]))
    assert second.attention_rate == first.attention_rate > 0 and second.state() == first.state()


def test_attention_rule_on_a_head_with_a_rule_it_cannot_compute_exits_2_naming_the_file(tmp_path):
    """A head's own Sinkhorn rule: the command refuses the scene (exit 2, the file, the key and
    the head named) before any file of the run is written."""
    from cli_runner import particles_cli
    scene = tmp_path / "heads.toml"
    scene.write_text('name = "heads"\n[tokens]\nn = 8\nd = 3\n[[heads]]\nkind = "scalar"\n'
                     '[[heads]]\nkind = "scalar"\nrule = "sinkhorn"\n[dynamics]\nrule = "softmax"\nbeta = 1.0\n'
                     'dt = 0.05\nsteps = 10\nstop_attention = 1e-6\n[render]\nenabled = false\n')
    done = particles_cli("run", scene, "--out", tmp_path / "run")
    assert done.returncode == 2, done.stderr
    assert str(scene) in done.stderr and "[dynamics] stop_attention: the attention rows are computed " \
        "for the built-in rules exp, softmax and relu; head rule is 'sinkhorn'" in done.stderr
    assert not (tmp_path / "run").exists()


def test_attention_rule_refuses_a_simulation_it_cannot_watch():
    """Through the API (no scene to refuse first) the writer refuses at the loop's start."""
    from particles.drive import drive
    from particles.errors import ParticlesUserError
    from particles.stop import StopRules, StopWriter
    x = np.random.default_rng(0).normal(size=(6, 3))
    sim = Simulation(x, [np.eye(3), np.eye(3)], beta=1.0, dt=0.05, rule="softmax",
                     attention=[Attention(), Attention(rule="sinkhorn")])
    with pytest.raises(ParticlesUserError, match="stop rule attention: the attention rows are computed for "
                                                  "the built-in rules exp, softmax, relu; head 1 has rule 'sinkhorn'"):
        drive(sim, [StopWriter(StopRules(attention=1e-6), 1, 2)], 5)
    assert sim.step_count == 0
