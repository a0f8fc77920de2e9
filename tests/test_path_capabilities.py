"""Generated from the chooser's table (particles.paths.SPECS): for every path and every
capability it declares, a small run against the float64 reference; for every capability it
does not declare, ``auto`` routes around it and an explicit request is refused, naming it.
Every integrator (a user's Heun tableau included) on every path, at its order."""
from pathlib import Path

import numpy as np
import pytest

import particles
import reference as ref
from conftest import RTOL, general_heads, random_tokens, rel_err
from particles import Attention, ExplicitRK, Layer, Schedule, paths

ROOT = Path(__file__).resolve().parents[1]
N, D, H, BETA, DT = 11, 3, 2, 1.2, 0.04
HEUN = ExplicitRK("heun", reach=(1.0,), weights=(1, 1), denominator=2, order=2)


def _recency():
    particles.load_rule_file(ROOT / "examples" / "recency_rule.py")
    return ref.PositionalRule(lambda z, i, j, n: 1.0 / (1.0 + np.exp(-z)) / (1.0 + np.abs(i - j)), "softmax")


def _spec_case(rule, ref_rule, attention=None, mask="none"):
    """Simulation kwargs and (velocity, one Euler step) of the per-head-spec reference."""
    specs = [ref.HeadSpec(ref_rule, mask=mask)] * H

    def check(sim, x, heads, dtype):
        assert rel_err(sim.velocity(), ref.spec_velocity(x, heads, BETA, specs)) < RTOL[dtype]
        sim.advance(1)
        want = ref.spec_step(x, heads, BETA, specs, "sphere", DT, "euler")
        assert rel_err(sim.tokens, want) < 2 * RTOL[dtype]
    return dict(rule=rule, attention=attention), check


def _layers_case():
    other = general_heads(H, D, seed=11)

    def make(heads):
        return Schedule((Layer(heads), Layer(other)), (0, 1))

    def check(sim, x, heads, dtype):
        sim.advance(2)
        want = ref.step_euler(ref.step_euler(x, heads, BETA, "softmax", "sphere", DT), other, BETA,
                              "softmax", "sphere", DT)
        assert rel_err(sim.tokens, want) < 2 * RTOL[dtype]
    return dict(rule="softmax", schedule=make), check


def _entropy_rate_case():
    def check(sim, x, heads, dtype):
        sim.observe()
        (row,) = sim.take_rows()
        want = ref.observables(x, heads, BETA, "softmax", "sphere", entropy_rate=True)
        rates = [k for k in want if "rate" in k and not k.startswith("energy")]
        assert rates
        for key in rates:
            assert row[key] == pytest.approx(want[key], rel=1e-6 if dtype == "float64" else 1e-3, abs=1e-9), key
    return dict(rule="softmax", entropy_rate=True), check


def _cases():
    """capability -> (what Needs it sets, a builder of (kwargs, check))."""
    return {
        "exp/softmax rules": (dict(rules=frozenset({"exponential"})),
                              lambda: _spec_case("softmax", "softmax")),
        "k(z) rules": (dict(rules=frozenset({"kernel"})), lambda: _spec_case("relu", "relu")),
        "Sinkhorn rules": (dict(rules=frozenset({"sinkhorn"})), lambda: _spec_case("sinkhorn", "sinkhorn")),
        "k(z, i, j, n) rules": (dict(rules=frozenset({"positional"})),
                                lambda: _spec_case("sigmoid_recency", _recency())),
        "masks": (dict(rules=frozenset({"exponential"}), positions=True),
                  lambda: _spec_case("softmax", "softmax", [Attention(mask="causal")] * H, "causal")),
        "layers": (dict(rules=frozenset({"exponential"}), layers=True), _layers_case),
        "entropy rate": (dict(rules=frozenset({"exponential"}), entropy_rate=True), _entropy_rate_case),
    }


CASES = _cases()
BASE = dict(rules=frozenset({"exponential"}), positions=False, layers=False, entropy_rate=False,
            arch="cpu", n=N, d=D, H=H, r=D, rv=D, dtype="float64")
TABLE = [(spec.name, cap, not spec.missing(paths.Needs(**{**BASE, **needs})))
         for spec in paths.SPECS for cap, (needs, _) in CASES.items()]


def _simulation(kwargs, path, dtype):
    x = random_tokens(N, D, seed=4)
    heads = general_heads(H, D, seed=6)
    kw = dict(kwargs)
    schedule = kw.pop("schedule", None)
    sim = particles.Simulation(x, schedule(heads) if schedule else heads, beta=BETA, dt=DT,
                               integrator="euler", dtype=dtype, path=path, **kw)
    return sim, x, heads


@pytest.mark.parametrize("path, capability, declared", TABLE,
                         ids=[f"{p}-{c.replace(' ', '_')}" for p, c, _ in TABLE])
def test_every_declared_capability_runs_and_every_other_is_refused(path, capability, declared):
    kwargs, check = CASES[capability][1]()
    if declared:
        for dtype in ("float64", "float32"):
            sim, x, heads = _simulation(kwargs, path, dtype)
            assert sim.path == path
            check(sim, x, heads, dtype)
        return
    with pytest.raises(ValueError, match=f"path '{path}' cannot serve this simulation, which uses"):
        _simulation(kwargs, path, "float64")
    sim, x, heads = _simulation(kwargs, "auto", "float64")
    assert sim.path != path
    check(sim, x, heads, "float64")


def test_the_table_covers_what_the_issue_named():
    """The fused path declares no position-aware rule, mask, layer or entropy rate; tiled all."""
    declared = {(p, c) for p, c, ok in TABLE if ok}
    assert ("fused", "k(z, i, j, n) rules") not in declared
    assert all(("tiled", c) in declared for c in CASES)


def _ref_rk_step(x, heads, tableau, dt, beta=BETA):
    """Float64 NumPy step of an explicit tableau: its Butcher matrix A (dense, from the rows
    of ``tableau.a``), b = weights / denominator, every stage kept."""
    S = tableau.stages
    A = np.zeros((S, S))
    for s, row in enumerate(tableau.a, start=1):
        A[s, :s] = row
    b = np.array(tableau.weights) / tableau.denominator
    f = lambda y: ref.velocity(y, heads, beta, "softmax", "sphere")  # noqa: E731
    k = []
    for s in range(S):
        k.append(f(x + dt * sum(A[s, j] * k[j] for j in range(s))))
    y = x + dt * sum(b[s] * k[s] for s in range(S))
    return y / np.linalg.norm(y, axis=1, keepdims=True)


FULL_TABLEAUX = [particles.integrators.KUTTA_38, particles.integrators.RALSTON_4]


@pytest.mark.parametrize("path", ["fused", "tiled", "plain"])
@pytest.mark.parametrize("integrator", ["euler", "rk4", HEUN] + FULL_TABLEAUX,
                         ids=["euler", "rk4", "heun", "kutta38", "ralston4"])
def test_every_integrator_on_every_path_matches_the_reference(path, integrator):
    x = random_tokens(N, D, seed=2)
    heads = general_heads(H, D, seed=3)
    method = particles.integrators.get_integrator(integrator)
    sim = particles.Simulation(x, heads, beta=BETA, rule="softmax", dt=DT, integrator=integrator,
                               dtype="float64", path=path)
    assert sim.path == path
    sim.advance(3)
    want = x
    for _ in range(3):
        want = _ref_rk_step(want, heads, method, DT)
    assert rel_err(sim.tokens, want) < 1e-10


def test_a_user_tableau_runs_at_its_order_on_the_fused_path():
    """Heun through the public tableau: global error falls 4x when dt halves."""
    x = random_tokens(9, 3, seed=1)
    heads = general_heads(2, 3, seed=1)
    t_end = 0.8
    exact = particles.Simulation(x, heads, beta=1.0, rule="softmax", dt=t_end / 400, integrator="rk4",
                                 dtype="float64", path="fused")
    exact.advance(400)
    errors = []
    for steps in (20, 40):
        sim = particles.Simulation(x, heads, beta=1.0, rule="softmax", dt=t_end / steps, integrator=HEUN,
                                   dtype="float64", path="fused")
        assert sim.path == "fused"
        sim.advance(steps)
        errors.append(np.max(np.abs(sim.tokens - exact.tokens)))
    assert 3.3 < errors[0] / errors[1] < 4.7, errors


@pytest.mark.parametrize("path", ["fused", "tiled", "plain"])
def test_full_tableaux_run_at_order_four_on_every_path(path):
    """Kutta's 3/8 rule and Ralston's fourth-order tableau (every stage reads every earlier
    slope: three slope buffers) in float64: the global error at t = 0.6 falls ~16x when dt
    halves, against a NumPy RK4 run at dt / 32."""
    x = random_tokens(9, 3, seed=1)
    heads = general_heads(2, 3, seed=1)
    t_end, beta = 0.6, 2.0
    exact = x
    for _ in range(12 * 32):
        exact = ref.step_rk4(exact, heads, beta, "softmax", "sphere", t_end / (12 * 32))
    for tableau in FULL_TABLEAUX:
        assert tableau.slope_buffers == 3
        errors = []
        for steps in (6, 12):
            sim = particles.Simulation(x, heads, beta=beta, rule="softmax", dt=t_end / steps,
                                       integrator=tableau, dtype="float64", path=path)
            assert sim.path == path
            sim.advance(steps)
            errors.append(np.max(np.abs(sim.tokens - exact)))
        assert 13 < errors[0] / errors[1] < 19, (tableau.name, errors)


def test_tableau_slope_buffers_and_order_conditions():
    """One buffer where each stage reads only the previous slope, one per still-read slope
    otherwise; the built-in tableaux satisfy their order conditions (b.c^k = 1/(k+1), and
    b.A c = 1/6, b.A c^2 = 1/12, b.c A c = 1/8, b.A A c = 1/24 at order 4)."""
    I = particles.integrators
    assert I.RK4.slope_slots == (0, 0, 0, 0) and I.EULER.slope_slots == (0,)
    assert I.KUTTA_38.slope_slots == (0, 1, 2, 0)
    assert I.BOGACKI_SHAMPINE.slope_slots == (0, 1, 2, 0)
    for tableau in (I.RK4, I.KUTTA_38, I.RALSTON_4, I.BOGACKI_SHAMPINE):
        S = tableau.stages
        A = np.zeros((S, S))
        for s, row in enumerate(tableau.a, start=1):
            A[s, :s] = row
        b, c = np.array(tableau.weights) / tableau.denominator, A.sum(axis=1)
        conditions = [b.sum() - 1, b @ c - 1 / 2, b @ c ** 2 - 1 / 3, b @ A @ c - 1 / 6]
        if tableau.order >= 4:
            conditions += [b @ c ** 3 - 1 / 4, b @ (c * (A @ c)) - 1 / 8, b @ A @ c ** 2 - 1 / 12,
                           b @ A @ A @ c - 1 / 24]
        assert np.max(np.abs(conditions)) < 1e-12, tableau.name
    bs = I.BOGACKI_SHAMPINE
    b_hat = np.array(bs.b_hat) / bs.denominator
    assert abs(b_hat.sum() - 1) < 1e-12 and np.max(np.abs(np.array(bs.weights) - bs.b_hat)) > 0.1


def test_the_tableau_program_reads_each_slope_from_the_buffer_that_still_holds_it():
    """ExplicitRK.program (what ExplicitRK.step and the fused kernel's rows_advance both run),
    played with stage numbers for slopes: every point term finds in its buffer the slope of
    the stage whose a[s][j] it carries, and the weights are the tableau's."""
    I = particles.integrators
    for tableau in (I.EULER, I.HEUN, I.RK4, I.KUTTA_38, I.RALSTON_4, I.BOGACKI_SHAMPINE, I.DOPRI5):
        held = {}   # slope buffer -> the stage whose slope it holds
        for s, stage in enumerate(tableau.program):
            a_row = tableau.a[s - 1] if s else ()
            read = {held[slot]: coefficient for coefficient, slot in stage.point}
            assert read == {j: v for j, v in enumerate(a_row) if v != 0}, (tableau.name, s)
            assert stage.weight == tableau.weights[s]
            held[stage.slot] = s
        assert len(held) == tableau.slope_buffers


def test_bad_tableaux_are_refused():
    with pytest.raises(ValueError, match="sum to the denominator"):
        ExplicitRK("bad", reach=(1.0,), weights=(1, 2), denominator=2, order=2)
    with pytest.raises(ValueError, match="stage reaches"):
        ExplicitRK("bad", reach=(), weights=(1, 1), denominator=2, order=2)
    with pytest.raises(ValueError, match="strictly lower-triangular"):
        ExplicitRK("bad", a=((0.5, 0.5),), weights=(1, 1), denominator=2, order=2)
    with pytest.raises(ValueError, match="not both"):
        ExplicitRK("bad", reach=(1.0,), a=((1.0,),), weights=(1, 1), denominator=2, order=2)
    with pytest.raises(ValueError, match="integrator must be one of"):
        particles.Simulation(random_tokens(4, 3), general_heads(1, 3), integrator="leapfrog")


def test_recency_example_runs_from_a_scene_on_the_default_path(tmp_path):
    from particles.app.run import run_scene
    from scenes import load_scene
    scene_file = tmp_path / "recency.toml"
    scene_file.write_text(f"""
[tokens]
n = 16
d = 3
[heads]
kind = "scalar"
count = 1
[dynamics]
rule = "sigmoid_recency"
rule_file = "{(ROOT / 'examples' / 'recency_rule.py').as_posix()}"
steps = 5
[render]
enabled = false
""")
    result = run_scene(load_scene(scene_file), tmp_path / "run", render=False, progress=False,
                       echo=lambda *_: None)
    assert result.status == "completed" and result.steps_done == 5
    log = particles.load_log(tmp_path / "run")
    assert len(log["kinetic"]) >= 2 and np.all(np.isfinite(log["kinetic"]))


def test_a_user_tableau_in_a_launch_shared_by_threads(monkeypatch):
    """Six stages (more than RK4's four, which once sized the phase counters) with two threads
    sharing each fused launch: bitwise the numbers of one thread."""
    from particles import kernels_fused
    six = ExplicitRK("six", reach=(0.2, 0.4, 0.5, 0.8, 1.0), weights=(1, 1, 1, 1, 1, 1), denominator=6, order=1)
    x = np.stack([random_tokens(40, 3, seed=s) for s in range(2)])
    heads = general_heads(2, 3, seed=5)
    out = []
    for workers in (1, 2):
        monkeypatch.setattr(kernels_fused, "PARALLEL_MIN_WORK", float("inf") if workers == 1 else 0.0)
        monkeypatch.setattr(kernels_fused, "available_threads", lambda: workers)
        sim = particles.Simulation(x, heads, rule="softmax", dt=0.02, integrator=six, path="fused")
        assert sim._fused.workers == workers
        sim.advance(300, observe_every=50)   # more than one launch's MAX_SHARED_STEPS
        out.append(sim.native_tokens())
    assert np.array_equal(out[0], out[1])


# -- every (path, implementation) pair of the table, against the reference --------------------
# Scenarios that reach each implementation: its rule kind, masks, mixed rules and n; the plan
# must pick the implementation for it (asserted), so a row added to the table without a
# scenario that reaches it fails test_every_cpu_implementation_is_reached.
_SCENARIOS = (
    ("softmax", None, N),
    ("relu", None, N),
    ("sinkhorn", None, N),
    ("softmax", None, paths.WIDE_MIN_N + 3),
    ("softmax", [Attention(mask="causal"), Attention(alibi=0.5, beta=2.0)], N),
    ("softmax", [Attention(rule="relu"), Attention(mask="window", window=2)], N),
)


def _scenario_needs(rule, attention, n):
    attention = attention or [Attention()] * H
    rules = [a.rule.name if a.rule is not None else rule for a in attention]
    kind = {"softmax": "exponential", "relu": "kernel", "sinkhorn": "sinkhorn"}
    positions = any(a.masked or a.alibi > 0 or a.beta is not None for a in attention)
    mixed = len(set(rules)) > 1
    passes = tuple(paths.PassNeeds(kind[r], positions, mixed, False, "cpu", n) for r in dict.fromkeys(rules))
    return paths.Needs(rules=frozenset(kind[r] for r in rules), positions=positions or mixed,
                       layers=False, entropy_rate=False, arch="cpu", n=n, d=D, H=H, r=D, rv=D,
                       dtype="float64", passes=passes)


def _implementation_table():
    out = []
    for spec in paths.SPECS:
        for impl in spec.implementations:
            if impl.arch == "gpu":
                continue  # on a GPU arch only: tests/test_gpu.py
            for scenario in _SCENARIOS:
                needs = _scenario_needs(*scenario)
                if not spec.missing(needs) and impl in paths.choose(spec.name, needs).implementations:
                    out.append((spec.name, impl.name, scenario))
                    break
            else:
                out.append((spec.name, impl.name, None))
    return out


IMPLEMENTATION_TABLE = _implementation_table()


def test_every_cpu_implementation_is_reached():
    assert [(p, i) for p, i, s in IMPLEMENTATION_TABLE if s is None] == []
    assert {(p, i) for p, i, _ in IMPLEMENTATION_TABLE} >= {("fused", "fused"), ("tiled", "wide"),
                                                            ("tiled", "fast"), ("tiled", "plain"),
                                                            ("plain", "plain")}


@pytest.mark.parametrize("path, implementation, scenario", IMPLEMENTATION_TABLE,
                         ids=[f"{p}-{i}" for p, i, _ in IMPLEMENTATION_TABLE])
def test_every_path_and_implementation_matches_the_reference(path, implementation, scenario):
    """The velocity and one RK4 step of the scenario that reaches this implementation, in
    float64, against the per-head-spec reference."""
    rule, attention, n = scenario
    x = random_tokens(n, D, seed=21)
    heads = general_heads(H, D, seed=22)
    sim = particles.Simulation(x, heads, beta=BETA, rule=rule, dt=DT, integrator="rk4",
                               dtype="float64", path=path, attention=attention)
    assert (sim.path, sim.implementation.split("+")[0]) == (path, implementation)
    atts = attention or [Attention()] * H
    specs = [ref.HeadSpec(a.rule.name if a.rule is not None else rule, beta=a.beta, mask=a.mask,
                          window=a.window, alibi=a.alibi) for a in atts]
    assert rel_err(sim.velocity(), ref.spec_velocity(x, heads, BETA, specs)) < RTOL["float64"]
    sim.advance(1)
    assert rel_err(sim.tokens, ref.spec_step(x, heads, BETA, specs, "sphere", DT, "rk4")) < RTOL["float64"]


# A toy normalisation and a toy observable through kernel_math reach every (path, implementation)
# of IMPLEMENTATION_TABLE: test_kernel_wing.py::test_a_toy_observable_and_normalisation_in_the_...
