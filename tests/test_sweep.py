"""Parameter sweeps (particles.app.sweep): the file format and its errors, the grid and its work
units, ensemble = single replicas, resume after a kill, local = Ray, the plots, the CLI hook."""
from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

import numpy as np
import pytest

import reference
from particles import Simulation
from particles.observables import pairwise_extremes
from particles.app.sweep import (LEDGER, ResultStore, SweepError, Sweep, cli_sweep, is_sweep_dir,
                                 load_results, load_sweep, run_sweep)
from particles.app.sweep.executors import cluster_stats, run_unit
from scenes.scene import build_heads, build_tokens

SMALL = """\
name = "small"
batch = {batch}

[tokens]
n = 8
d = 3

[heads]
kind = "scalar"
count = 2
strengths = [1.0, 0.5]

[dynamics]
rule = "softmax"
dt = 0.1
steps = 20

[axes]
"dynamics.beta" = [0.5, 2.0, 6.0]
"tokens.seed" = {{count = 4}}

[record]
times = [0.0, 0.5, 2.0]
observables = ["eps", "energy", "radial_dominance_h1", "entropy_mean_h0"]
clusters = true
threshold = 0.9
clustering_time = {{threshold = 0.6, every = 1}}
"""


def write(tmp_path, text, name="sweep.toml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def table(path) -> dict[str, np.ndarray]:
    cols = load_results(path)
    cols.pop("unit")           # unit ids depend on the batch size; everything else must not
    return cols


def assert_same_table(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if a[k].dtype.kind == "f":
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        else:
            assert list(a[k]) == list(b[k]), k


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """The small sweep in one unit, in this process: the table the other runs must give."""
    d = tmp_path_factory.mktemp("ref")
    path = write(d, SMALL.format(batch=256))
    out = run_sweep(path, d / "out")
    return path, out, table(out)


# ----------------------------------------------------------------------------- the file

def test_grid_units_and_columns(reference_run):
    path, out, cols = reference_run
    sweep = load_sweep(path)
    assert sweep.n_replicas == 12 and len(sweep.units) == 1
    assert sweep.units[0]["betas"] == [0.5] * 4 + [2.0] * 4 + [6.0] * 4     # first axis slowest
    assert [t["seed"] for t in sweep.units[0]["tokens"]] == [0, 1, 2, 3] * 3
    assert cols["point"].size == 12 * 3                                     # replicas x times
    assert list(np.unique(cols["time"])) == [0.0, 0.5, 2.0]
    assert set(np.unique(cols["clusters"])) <= set(range(1, 9))
    assert np.all(cols["H"] == 2) and np.all(cols["tokens.n"] == 8)
    header = (out).read_text().splitlines()[0].split(",")
    assert header[:2] == ["unit", "point"] and header[-2:] == ["clusters", "clustering_time"]
    assert is_sweep_dir(out.parent) and not is_sweep_dir(path.parent)


def test_ranges_and_batching(tmp_path):
    sweep = Sweep.from_dict({
        "tokens": {"n": 6, "d": 3},
        "axes": {"heads.count": [1, 2],
                 "tokens.init": ["random", "clusters"],
                 "dynamics.beta": {"from": 1, "to": 100, "num": 3, "log": True},
                 "tokens.seed": {"count": 2, "start": 5}},
        "dynamics": {"steps": 4}, "batch": 5}, base_dir=tmp_path)
    assert sweep.axes[2][1] == [1, 10, 100] and sweep.axes[3][1] == [5, 6]
    # heads.count changes the kernel: separate units; init, seed and beta vary inside one
    # ensemble; 12 replicas per head count, batch 5 -> 3 near-equal units each
    assert [len(u["betas"]) for u in sweep.units] == [4, 4, 4, 4, 4, 4]
    assert {u["scene"]["heads"]["count"] for u in sweep.units[:3]} == {1}
    inits = {t["init"] for u in sweep.units[:3] for t in u["tokens"]}
    assert inits == {"random", "clusters"}
    steps = Sweep.from_dict({"tokens": {"n": 4, "d": 3}, "axes": {
        "dynamics.dt": {"from": 0.01, "to": 0.03, "step": 0.01},
        "tokens.n": {"from": 4, "to": 16, "num": 3, "log": True}}}, base_dir=tmp_path)
    assert steps.axes[0][1] == pytest.approx([0.01, 0.02, 0.03])
    assert steps.axes[1][1] == [4, 8, 16] and all(type(v) is int for v in steps.axes[1][1])


def test_scene_reference_and_inline_merge(tmp_path):
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub", """\
        [tokens]
        n = 5
        d = 3
        [dynamics]
        steps = 7
        """, "base.toml")
    path = write(tmp_path, """\
        scene = "sub/base.toml"
        [dynamics]
        t_end = 0.5
        [axes]
        "dynamics.beta" = [1.0, 2.0]
        """)
    sweep = load_sweep(path)
    unit = sweep.units[0]
    assert unit["scene"]["dynamics"]["steps"] == 50 and unit["scene"]["tokens"]["n"] == 5
    assert unit["record"]["steps"] == [50]                  # default: the end only
    bundled = Sweep.from_dict({"scene": "quickstart", "heads": {"kind": "scalar", "count": 2},
                               "axes": {"heads.count": [1, 2]}}, base_dir=tmp_path)
    assert [u["scene"]["heads"]["count"] for u in bundled.units] == [1, 2]


def test_errors_name_file_key_and_what_is_allowed(tmp_path):
    path = write(tmp_path, """\
        scene = "quickstrat"
        bacth = 3
        [axes]
        "dynamics.beeta" = [1, 2]
        "tokens.seed" = {count = 0}
        "log.every" = [1]
        "tokens.replicas" = [2]
        "dynamics.dt" = {from = 1, to = 2}
        "dynamics.beta" = [1.0, -2.0]
        [record]
        time = [1]
        clustering_time = {threshold = 5}
        """, "bad.toml")
    with pytest.raises(SweepError) as err:
        load_sweep(path)
    text = str(err.value)
    assert text.startswith(f"sweep file '{path}': 10 problems")
    for piece in ("unknown top-level key 'bacth'; did you mean 'batch'?",
                  "did you mean 'quickstart'?",
                  "[axes] \"dynamics.beeta\": unknown key 'beeta' in [dynamics]; did you mean 'beta'?",
                  "[axes] \"tokens.seed\": count must be an integer >= 1",
                  "[axes] \"log.every\": [log] does not change a sweep's results",
                  "[axes] \"tokens.replicas\": cannot be swept",
                  "exactly one of num or step",
                  "[axes] \"dynamics.beta\": expected values that are each a number > 0, got -2.0",
                  "unknown key 'time' in [record]; did you mean 'times'?",
                  "[record] clustering_time: threshold: expected a number in (0, 2]"):
        assert piece in text, piece
    # problems that only show on the expanded grid name the grid point
    with pytest.raises(SweepError) as err:
        Sweep.from_dict({"tokens": {"n": 8, "d": 3}, "dynamics": {"steps": 10, "dt": 0.1},
                         "heads": {"kind": "subspace"},
                         "axes": {"heads.count": [2, 4]},
                         "record": {"times": [0.5, 3.0], "observables": ["eps", "entropy_mean"]}})
    assert "at heads.count = 4: [heads] count: 4 subspace heads do not fit in d = 3" in str(err.value)
    with pytest.raises(SweepError, match=r"at heads.count = 2: \[record\] times: 3 is after the "
                                         r"end of the run \(t = 1 = steps \* dt = 10 \* 0.1\)"):
        Sweep.from_dict({"tokens": {"n": 8, "d": 3}, "dynamics": {"steps": 10, "dt": 0.1},
                         "axes": {"heads.count": [2, 1]}, "record": {"times": [0.5, 3.0]}})
    with pytest.raises(SweepError, match=r"'entropy_mean' is not a log column of any unit; did "
                                         r"you mean 'entropy_mean_h0'"):
        Sweep.from_dict({"tokens": {"n": 4, "d": 3}, "record": {"observables": ["entropy_mean"]}})
    with pytest.raises(SweepError, match="no sweep file 'nope' and no bundled sweep"):
        load_sweep("nope")


def test_bundled_sweeps_validate():
    for name, units, reps in (("phase_diagram_1head", 12, 2880), ("phase_diagram_multihead", 8, 1440)):
        sweep = load_sweep(name)
        assert sweep.n_replicas == reps and len(sweep.units) == units
        assert max(len(u["betas"]) for u in sweep.units) <= 256
        assert sweep.path.read_text().startswith(f"# {name}:")
        assert len(sweep.units[0]["record"]["steps"]) == 20
    multi = load_sweep("phase_diagram_multihead")
    kinds = {(m["head_kinds"][0], m["H"]) for m in multi.unit_meta.values()}
    assert kinds == {("scalar", 2), ("scalar", 4), ("subspace", 2), ("subspace", 4)}


# ----------------------------------------------------------------------------- the engine path

def test_ensemble_equals_each_replica_alone(reference_run):
    """One ensemble Simulation of 12 replicas gives, per replica, bitwise what a Simulation of
    that replica alone gives (observables, clusters, eps) -- and the unit's results say so."""
    path, _, _ = reference_run
    unit = load_sweep(path).units[0]
    res = run_unit(unit)
    scene, rec = unit["scene"], unit["record"]
    heads = build_heads(scene["heads"], 3)
    dyn = scene["dynamics"]
    for r, (tok, beta) in enumerate(zip(unit["tokens"], unit["betas"])):
        sim = Simulation(build_tokens(tok), heads, beta=beta, rule=dyn["rule"], dt=dyn["dt"],
                         dtype=dyn["dtype"])
        eps_first = np.nan
        for s in range(dyn["steps"] + 1):
            x = sim.native_tokens()[0].astype(np.float64)
            x = x / np.linalg.norm(x, axis=1, keepdims=True)
            g = (np.sum(x.sum(0) ** 2) - 8) / 56
            if np.isnan(eps_first) and 1 - g < rec["clustering_time"]:
                eps_first = s * dyn["dt"]
            if s in rec["steps"]:
                k = rec["steps"].index(s)
                sim.observe()
                row = sim.take_rows()[-1]
                np.testing.assert_array_equal(res["values"][r, k], [row[o] for o in rec["observables"]])
                assert res["clusters"][r, k] == pairwise_extremes(sim.native_tokens()[0], 0.9)[1]
            if s < dyn["steps"]:
                sim.advance(1)
        assert res["clustering_time"][r] == pytest.approx(eps_first, nan_ok=True)


def test_vectorised_cluster_count_equals_pairwise_extremes():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, 24, 3))
    x[:10] = x[:10, :1] + 0.05 * rng.standard_normal((10, 24, 3))   # tight clusters
    t = np.linspace(0, 3, 24)                                           # chains along circles
    x[10:20] = np.stack([np.cos(t), np.sin(t), 0 * t], axis=1) + 0.01 * rng.standard_normal((10, 24, 3))
    x[20, 3] = np.nan
    for thr in (0.99, 0.9, 0.0):
        mins, counts = cluster_stats(x, thr, max_elems=24 * 24 * 7)  # several chunks
        for b in range(40):
            if b == 20:
                assert np.isnan(mins[b]) and np.isnan(counts[b])
                continue
            mc, c = pairwise_extremes(x[b], thr)
            assert counts[b] == c and mins[b] == pytest.approx(mc, abs=1e-12)


def test_batch_size_does_not_change_results(reference_run, tmp_path):
    _, _, ref = reference_run
    path = write(tmp_path, SMALL.format(batch=5))
    assert len(load_sweep(path).units) == 3
    assert_same_table(table(run_sweep(path, tmp_path / "out")), ref)


# ----------------------------------------------------------------------------- kill and rerun

@pytest.mark.parametrize("moment", ["1", "2:rows"])
def test_killed_sweep_resumes_without_recomputing_or_duplicating(reference_run, tmp_path,
                                                                 monkeypatch, moment):
    """Abort after unit 1 is ledgered ("1"), or after unit 2's rows are written but before its
    ledger line ("2:rows"); the rerun skips ledgered units, drops the orphan rows, recomputes
    the rest, and gives exactly the reference table."""
    _, _, ref = reference_run
    path = write(tmp_path, SMALL.format(batch=4))
    out = tmp_path / "out"
    class Killed(BaseException):
        pass
    ledgered = []
    real_ledger = ResultStore._append_ledger

    def append_ledger(store, line):      # the fault: a kill around the ledger write
        if moment == "2:rows" and len(ledgered) == 1:
            raise Killed("after unit 2's rows, before its ledger line")
        real_ledger(store, line)
        ledgered.append(line)
        if moment == "1":
            raise Killed("after unit 1 is ledgered")
    with monkeypatch.context() as patch:
        patch.setattr(ResultStore, "_append_ledger", append_ledger)
        with pytest.raises(Killed):
            run_sweep(path, out)
    ledger = (out / LEDGER).read_text().splitlines()
    assert len(ledger) == 1 and ledger[0].startswith("u00000\t12\t1\t")
    rows_before = len((out / "results.csv").read_text().splitlines()) - 1
    assert rows_before == (12 if moment == "1" else 24)      # "2:rows": unit 2's rows orphaned
    with open(out / "results.csv", "a") as fh:               # and a line cut by the kill
        fh.write("u00002,9,8,3,2,1,6.0,0,0.0,0.99")
    run_sweep(path, out)
    ledger = [line.split("\t") for line in (out / LEDGER).read_text().splitlines()]
    assert [(u, int(a)) for u, _, a, _ in ledger] == [("u00000", 1), ("u00001", 2), ("u00002", 2)]
    assert_same_table(table(out / "results.csv"), ref)
    before = (out / "results.csv").read_bytes()
    run_sweep(path, out)                                     # all done: nothing runs, nothing moves
    assert (out / "results.csv").read_bytes() == before
    assert len((out / LEDGER).read_text().splitlines()) == 3


def test_other_sweep_in_same_folder_is_refused(reference_run, tmp_path):
    path, out, _ = reference_run
    other = write(tmp_path, SMALL.format(batch=256).replace("steps = 20", "steps = 21"))
    with pytest.raises(SweepError, match="holds results of a different sweep"):
        run_sweep(other, out.parent)


# the Ray executor's table against this one: tests/test_ray.py (one module, fewer Ray starts)


# ----------------------------------------------------------------------------- plots and CLI

def test_equiangular_time_matches_the_reference_ode():
    from particles.theory import beta_star, equiangular_time
    for rule, lam, beta in (("softmax", [1.0, 1.0], 2.0), ("exp", [0.5, 1.5], 1.0)):
        T = equiangular_time([beta], lam, 8, rule, 0.0, 0.99)[0]
        g = reference.solve_equiangular_gamma(0.0, lam, beta, 8, rule, t_end=T, dt=1e-3)
        assert g == pytest.approx(0.99, abs=1e-6)
    assert beta_star(2, 8) == pytest.approx(0.732349, abs=1e-6)


def test_plots_and_cli(reference_run, tmp_path, capsys):
    from particles.app.sweep.plots import plot_sweep
    path = write(tmp_path, """\
        [tokens]
        n = 4
        d = 3
        [dynamics]
        rule = "softmax"
        dt = 0.2
        steps = 60
        [axes]
        "tokens.n" = [4, 8]
        "dynamics.beta" = [0.5, 1.0]
        "tokens.seed" = {count = 2}
        [record]
        times = [0.0, 6.0, 12.0]
        clustering_time = {threshold = 0.1}
        """)
    args = argparse.Namespace(sweep_file=str(path), executor="local", address=None,
                              out=str(tmp_path / "out"), workers=None)
    assert cli_sweep(args) == 0
    printed = capsys.readouterr().out
    assert "sweep completed: 2/2 units, 8 replicas" in printed and "particles plot" in printed
    written = plot_sweep(tmp_path / "out")
    names = sorted(p.name for p in written)
    assert names == ["clustering_time_n.png", "clustering_time_n.svg", "phase_diagram.png",
                     "phase_diagram.svg"]
    assert all(p.stat().st_size > 1000 for p in written)
    _, out, _ = reference_run
    assert [p.name for p in plot_sweep(out.parent)] == ["phase_diagram.png", "phase_diagram.svg"]


def test_plots_never_write_through_a_planted_link(reference_run, tmp_path):
    import shutil
    from particles.app.sweep.plots import plot_sweep
    from particles.atomic import SymlinkRefused
    _, out, _ = reference_run
    copy = tmp_path / "sweep"
    shutil.copytree(out.parent, copy)
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    (copy / "phase_diagram.svg").unlink(missing_ok=True)
    (copy / "phase_diagram.svg").symlink_to(victim)
    with pytest.raises(SymlinkRefused, match="symbolic link"):
        plot_sweep(copy)
    assert victim.read_text() == "keep me"


def test_a_damaged_table_is_named_not_a_traceback(reference_run, tmp_path):
    """A cell the sweep writes as a number that holds text (a damaged or hand-edited table):
    `particles plot` names the file, the column and the value."""
    import shutil
    from particles.app.sweep.plots import plot_sweep
    from particles.errors import ParticlesUserError
    _, out, _ = reference_run
    copy = tmp_path / "sweep"
    shutil.copytree(out.parent, copy)
    lines = (copy / "results.csv").read_text().splitlines()
    header = lines[0].split(",")
    row = lines[3].split(",")
    row[header.index("time")] = "1.0e"
    lines[3] = ",".join(row)
    (copy / "results.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(ParticlesUserError, match=r"results.csv: column 'time' holds '1.0e' where the sweep writes a number"):
        plot_sweep(copy)


STOPPING = """\
name = "stopping"
batch = 1

[tokens]
n = 12
d = 3
seed = 0

[heads]
kind = "scalar"
count = 2
strengths = [1.0, 1.0]

[dynamics]
rule = "softmax"
dt = 0.05
steps = 600
dtype = "float64"
stop_kinetic = 1e-12
stop_window = 1.0

[log]
every = 5

[axes]
"dynamics.beta" = [0.5, 1.0]

[record]
times = [1.0, 5.0, 30.0]
observables = ["eps", "kinetic"]
clusters = true
"""


def test_stop_rules_end_each_unit_where_its_own_flow_stops(tmp_path, monkeypatch):
    """Two units (beta 0.5 and 1, batch 1) under the scene's stop_kinetic: each stops where the
    same scene run alone (`particles run`) stops, at different times; the table records each
    unit's stop time and reason, the record times before the stop as recorded, those after it
    the state where the unit stopped."""
    from particles import load_log
    from particles.app.run import run_scene
    from scenes import Scene
    path = write(tmp_path, STOPPING)
    sweep = load_sweep(path)
    assert len(sweep.units) == 2 and sweep.columns[-2:] == ["stop_time", "stop_reason"]
    cols = load_results(run_sweep(path, tmp_path / "out"))
    stops = {}
    for beta in (0.5, 1.0):
        mine = cols["dynamics.beta"] == beta
        raw = load_sweep(path).base_raw
        raw["dynamics"]["beta"] = beta
        run = run_scene(Scene.from_dict(raw, source="test", base_dir=tmp_path), tmp_path / f"run{beta}",
                        render=False, progress=False, echo=lambda *a: None)
        log = load_log(tmp_path / f"run{beta}")
        t_stop = float(log["time"][-1])
        assert run.steps_done < 600 and set(cols["stop_time"][mine]) == {t_stop}
        assert set(cols["stop_reason"][mine]) == {run.message.split(": ", 1)[1]}
        assert cols["stop_reason"][mine][0].startswith("stop rule: kinetic energy <= 1e-12")
        stops[beta] = t_stop
        for t, eps, kin in zip(cols["time"][mine], cols["eps"][mine], cols["kinetic"][mine]):
            at = log["time"][-1] if t > t_stop else t      # after the stop: the final state
            k = int(np.flatnonzero(np.isclose(log["time"], at))[0])
            assert eps == pytest.approx(log["eps"][k], rel=1e-12, abs=1e-15)
            assert kin == pytest.approx(log["kinetic"][k], rel=1e-9, abs=1e-20)
    assert 5.0 < stops[1.0] < 30.0 and stops[0.5] != stops[1.0]
    assert cols["clusters"][cols["time"] == 30.0].tolist() == [1.0, 1.0]

    # the phase diagram marks each unit's stop over its own beta cell
    from matplotlib.collections import LineCollection
    from particles.app.sweep import plots
    figures = []
    monkeypatch.setattr(plots, "save_png_svg", lambda fig, stem: figures.append(fig) or [])
    plots.plot_phase_diagram(tmp_path / "out" / "results.csv", tmp_path / "pd")
    (ax,) = [a for a in figures[0].axes if a.get_label() != "<colorbar>"]
    marks = sorted((float(seg[0][1]), float(seg[0][0]), float(seg[1][0]))
                   for c in ax.collections if isinstance(c, LineCollection) and c.get_linestyle()[0][1]
                   for seg in c.get_segments())
    edges = plots._edges(np.array([0.5, 1.0]), False)
    assert marks == sorted([(stops[0.5], edges[0], edges[1]), (stops[1.0], edges[1], edges[2])])
