"""What a run's summary and the reproduce report say (issue 26): the words around the numbers."""
from __future__ import annotations

import json
import re
import math
from types import SimpleNamespace

import pytest

from particles.app.cli import _summary_lines
from particles.app.summary import Summary, energy_note


def _row(step, rho, power, energy=1.0, H=2):
    row = {"step": step, "time": step * 0.1, "energy": energy, "eps": 0.1}
    for h in range(H):
        row.update({f"energy_h{h}": energy, f"radial_dominance_h{h}": rho, f"tangent_power_h{h}": power})
    return row


def _collapse_rows():
    """rho 0.5 while the tokens move, then T_h -> 0 and rho explodes meaninglessly."""
    return [_row(0, 0.5, 1.0), _row(1, 0.6, 0.5), _row(2, 0.7, 1e-3),
            _row(3, 4e7, 1e-9), _row(4, 9e7, 1e-12)]


def test_condition8_is_judged_at_t0_and_before_the_tangent_floor():
    s = Summary(2, 1e-10)
    s.on_rows(_collapse_rows())
    d = s.as_dict()
    assert d["condition8_held"] is True
    c8 = d["condition8"]
    assert c8["rho_t0"] == [0.5, 0.5] and c8["first_exceed_time"] == [None, None]
    assert c8["held_fraction"] == [1.0, 1.0] and c8["floor_time"] == [0.30000000000000004] * 2
    text = "\n".join(_summary_lines(d))
    assert "rho at t = 0 0.5 (holds, below c*); never exceeds 1; held in 100% of judged states" in text
    assert "c*(2) = 0.618 is rho's value at beta*" in text
    assert "4e+07" not in text and "max rho" not in text


def test_condition8_first_exceedance_and_fraction():
    s = Summary(2, 1e-10)
    s.on_rows([_row(0, 0.5, 1.0), _row(1, 2.0, 1.0), _row(2, 0.8, 1.0), _row(3, 3.0, 1.0)])
    text = "\n".join(_summary_lines(s.as_dict()))
    assert "first exceeds 1 at t = 0.1; held in 50% of judged states" in text
    assert s.as_dict()["condition8_held"] is False


def test_condition8_places_rho_at_t0_against_c_star_of_h():
    """c*(H) is where rho_h(0) sits at beta* from orthonormal tokens: (H-1) c*^2/(1-c*^2) = c*."""
    from particles import theory
    for H in (2, 3, 8):
        cstar = theory.c_star(H)
        at_beta_star = theory.rho_orthonormal(H, 16, 1.0, theory.beta_star(H, 16))
        assert at_beta_star == pytest.approx(cstar, rel=1e-12)
    for rho, side in ((0.6, "below c*"), (0.64, "above c*")):
        s = Summary(2, 1e-10)
        s.on_rows([_row(0, rho, 1.0), _row(1, rho, 1.0)])
        assert f"rho at t = 0 {rho:.3g} (holds, {side})" in "\n".join(_summary_lines(s.as_dict()))


def test_condition8_is_not_applicable_with_one_head_or_in_flat_space():
    one = Summary(1, 1e-10)
    one.on_rows([_row(0, 0.0, 1.0, H=1)])
    assert "  Condition 8 (radial dominance rho_h <= 1): n/a (one head)" in _summary_lines(one.as_dict())
    assert one.as_dict()["condition8_held"] is None
    flat = Summary(2, 1e-10, geometry="flat")
    flat.on_rows([_row(0, 0.0, 1.0)])
    assert "  Condition 8 (radial dominance rho_h <= 1): n/a (flat space)" in _summary_lines(flat.as_dict())


def test_condition8_state_survives_a_checkpoint():
    rows = _collapse_rows()
    whole = Summary(2, 1e-10)
    whole.on_rows(rows)
    first = Summary(2, 1e-10)
    first.on_rows(rows[:2])
    resumed = Summary(2, 1e-10)
    resumed.restore(json.loads(json.dumps(first.state())))
    resumed.on_rows(rows[2:])
    assert resumed.as_dict()["condition8"] == whole.as_dict()["condition8"]
    old = first.state()
    del old["condition8"]                     # a checkpoint written before these figures
    Summary(2, 1e-10).restore(old)


def test_a_run_without_energy_prints_no_nan_and_no_second_note():
    s = Summary(2, 1e-10, energy_note="energy is NaN where no potential exists (...)")
    s.on_rows([_row(0, 0.5, 1.0, energy=math.nan), _row(1, 0.5, 1.0, energy=math.nan)])
    lines = _summary_lines(s.as_dict())
    text = "\n".join(lines)
    assert not re.search(r"\bnan\b", text.lower())
    assert "  energy: not logged (no potential; see the note printed at the start)" in lines
    assert "note:" not in text and "monotone" not in text


def _attention(mask=None, alibi=0.0, positional=False, potential=False, name="softmax", rotary=None):
    return SimpleNamespace(has_potential=potential, masked=mask is not None, mask=mask or "none",
                           alibi=alibi, rotary=rotary, rule=SimpleNamespace(positional=positional, name=name))


def _sim(attention, biased=()):
    heads = [SimpleNamespace(has_biases=h in biased) for h in range(len(attention))]
    return SimpleNamespace(scheduled=False, n_heads=len(attention), attention=attention, heads=heads)


def test_energy_note_names_each_reason_once():
    note = energy_note(_sim([_attention("causal")] * 4))
    assert "every head: a causal mask;" in note and note.count("causal") == 1
    note = energy_note(_sim([_attention("causal"), _attention(alibi=0.5), _attention("causal")]))
    assert "heads 0, 2: a causal mask" in note and "head 1: an ALiBi bias" in note
    # biases take a head's potential away (rotary positions have none), and the note says which
    note = energy_note(_sim([_attention(potential=True), _attention(rotary=object()),
                             _attention(potential=True)], biased=(0,)))
    assert "head 0: query/key/value biases" in note and "head 1: rotary positions" in note
    assert "head 2" not in note
    assert energy_note(_sim([_attention(potential=True)] * 2)) is None


# ----------------------------------------------------------------------------- the reproduce report
def _report(tmp_path, checks):
    from particles.app.reproduce.common import Result
    from particles.app.reproduce.report import write_markdown
    res = Result(key="e0", title="A result", theorem="Theorem 0", what="w", claim="c", closed_form="f",
                 measurement="m", agreement="a", params={}, numbers={}, checks=checks)
    meta = dict(mode="quick", generated="now", runtime_seconds=1.0, arch="cpu", dtype="float64",
                particles_version="0", errors={})
    return res, write_markdown(tmp_path / "report.md", [res], meta).read_text(encoding="utf-8")


def test_identities_and_information_are_counted_apart_from_experiments(tmp_path):
    from particles.app.reproduce import stats
    from particles.app.reproduce.common import Check
    from particles.app.reproduce.report import verdict_counts
    checks = [Check("an experiment", 0.1, "0", "<= 1", True),
              Check("c*(2) = 1/phi", 1.618, "phi", "exact", True, identity=True),
              Check("a broken identity", 1.0, "0", "exact", False, identity=True),
              Check("outside the regime", 2.0, "none", "none", True, verdict=stats.OUTSIDE)]
    assert [c.verdict for c in checks] == [stats.AGREES, stats.IDENTITY, stats.DISAGREES, stats.OUTSIDE]
    counts = verdict_counts(checks)
    assert counts[stats.AGREES] == 1 and counts[stats.IDENTITY] == 1 and counts[stats.OUTSIDE] == 1
    assert stats.OUTSIDE.startswith("information")
    res, text = _report(tmp_path, checks[:2] + checks[3:])
    assert "| agrees | disagrees | cannot decide | identities | information |" in text
    assert "| 1 | 0 | 0 | 1 | 1 |" in text
    assert "**identity holds**" in text and "never a passed check" in text
    assert res.passed                              # the information row is no check either way


def test_the_reproduce_modules_identity_checks_are_marked():
    """Rows that follow by construction carry identity=True in the source (issues 26 and 34): e2's
    Condition 8 implication, C_h = 0 on disjoint blocks and flat space's T_h >= 0; e3's golden ratio,
    kinetic/H, the paper's-form implication and the closed forms' beta_rho = beta* + gap; e4's break-even
    tending to lambda_c (given the engine's break-even = the closed form's); e7's overlap
    norm and its per-head rate at delta = 0 (starts kept because rho_h <= 1); e8's token 0 at rest."""
    import inspect
    from particles.app.reproduce import e2_radial, e3_critical, e4_heterogeneous, e7_near_orthogonal, e8_causal
    assert inspect.getsource(e2_radial).count("identity=True") == 3
    assert inspect.getsource(e4_heterogeneous).count("identity=True") == 1
    assert inspect.getsource(e3_critical).count("identity=True") == 4
    assert inspect.getsource(e7_near_orthogonal).count("identity=True") == 2
    assert inspect.getsource(e8_causal).count("identity=True") == 1


def _result_with(checks, agreement="a", table=""):
    from particles.app.reproduce.common import Result
    return Result(key="e0", title="A result", theorem="Theorem 0", what="w", claim="c", closed_form="f",
                  measurement="m", agreement=agreement, params={}, numbers={}, checks=checks, table=table)


def test_report_text_stating_another_verdict_than_the_rows_is_found():
    """Issue 34: e2's paragraph said '(agrees)' for a row whose verdict is 'identity holds'. Prose may
    state a verdict only as '(row k: <verdict>)', and it must be row k's own."""
    from particles.app.reproduce import stats
    from particles.app.reproduce.common import Check, cite
    from particles.app.reproduce.report import text_problems
    checks = [Check("an experiment", 0.1, "0", "<= 1", True),
              Check("Condition 8 implies a rise", 0.0, "0", "none", True, identity=True)]
    assert text_problems(_result_with(checks, f"it rose {cite(checks, checks[1])}; {cite(checks, checks[0])}")) == []
    assert cite(checks, checks[1]) == "(row 2: identity holds)"
    wrong = text_problems(_result_with(checks, "it rose (row 2: agrees)"))
    assert len(wrong) == 1 and "row 2" in wrong[0] and "identity holds" in wrong[0]
    assert text_problems(_result_with(checks, "(row 3: agrees)"))            # no such row
    bare = text_problems(_result_with(checks, "Condition 8 decides it (agrees)."))   # e2's old sentence
    assert len(bare) == 1 and "without its row" in bare[0]
    for v in stats.VERDICTS:                 # every verdict word, in any text of the section
        assert text_problems(_result_with(checks, table=f"| x | {v} |")), v
    note = [Check("x", 1.0, "0", "<= 1", True, note=f"the fit would be {stats.AGREES}")]
    assert text_problems(_result_with(note))


def test_a_median_must_say_which():
    """Issue 34: e8 printed the lower median of 20, 57, 105, 249 (57) as 'median'; the usual one is 81."""
    from particles.app.reproduce.common import Check
    from particles.app.reproduce.report import bare_medians, text_problems
    from particles.app.reproduce.stats import censored_median
    assert censored_median([20, 57, 105, 249]) == 57
    assert bare_medians("lower median 57, usual median 81, lower medians") == []
    assert bare_medians("Median collapse time") and bare_medians("the medians over n")
    checks = [Check("median move", 1.0, "0", "<= 1", True)]
    assert any("median" in p for p in text_problems(_result_with(checks)))
    assert text_problems(_result_with([Check("usual median move", 1.0, "0", "<= 1", True)])) == []


def test_the_report_lists_inconsistent_text_at_its_top(tmp_path):
    from particles.app.reproduce.report import write_markdown
    meta = dict(mode="quick", generated="now", runtime_seconds=1.0, arch="cpu", dtype="float64",
                particles_version="0", errors={}, text_problems=["e0 agreement: verdict 'agrees' stated without its row"])
    text = write_markdown(tmp_path / "report.md", [_result_with([])], meta).read_text(encoding="utf-8")
    assert "inconsistent" in text.split("## 1.")[0] and "stated without its row" in text


def _report_strings():
    """Every literal piece of text in the reproduce modules (plain strings and the literal parts of
    f-strings; not docstrings, not bare identifiers such as dictionary keys), with file and line."""
    import ast
    from pathlib import Path
    import particles.app.reproduce as pkg
    out = []
    for path in sorted(Path(pkg.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs \
                    and not re.fullmatch(r"\w*", node.value):
                out.append((f"{path.name}:{node.lineno}", node.value))
    return out


def test_no_report_text_of_the_experiments_prints_a_median_without_saying_which():
    """Every 'median' the reproduce modules can print (tables, figures, notes) says lower or usual."""
    from particles.app.reproduce.report import bare_medians
    bad = [f"{where}: {text[:70]!r}" for where, text in _report_strings()
           if bare_medians(text) and not where.startswith("report.py")]      # report.py: the checker's message
    assert not bad, bad


def test_no_report_text_of_the_experiments_states_a_verdict_word_outside_a_row_citation():
    """The experiments' literal text never spells a verdict; verdicts reach the prose only through
    ``cite`` (checked at run time by report.text_problems) and the table's verdict column."""
    from particles.app.reproduce import stats
    exempt = {"stats.py", "report.py"}          # the verdict names and the report's legend
    words = re.compile(r"\b(agrees|disagrees|identity holds|cannot decide)\b")
    bad = [f"{where}: {text[:70]!r}" for where, text in _report_strings()
           if where.split(":")[0] not in exempt and words.search(text)]
    assert not bad, bad
    assert stats.AGREES == "agrees"


def test_no_report_text_has_an_unformatted_placeholder():
    """A '{name...}' inside a plain (non-f) string of a reproduce module prints literally (E5 did)."""
    import ast
    import re
    from pathlib import Path
    import particles.app.reproduce as pkg
    bad = []
    for path in sorted(Path(pkg.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        in_f = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
        in_f |= {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}   # docstrings
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in in_f \
                    and re.search(r"\{[A-Za-z_][A-Za-z_0-9]*(\[[^\]]*\])*(:[^}]*)?\}", node.value):
                if ".format(" not in ast.get_source_segment(path.read_text(encoding="utf-8"), node) \
                        and "{}" not in node.value:
                    bad.append(f"{path.name}:{node.lineno}: {node.value[:60]!r}")
    assert not bad, bad


def test_e1_best_start_column_is_the_minimum():
    import inspect
    from particles.app.reproduce import e1_energy
    src = inspect.getsource(e1_energy)
    assert 'min(p["per_start"])' in src and 'max(p["per_start"])' not in src


def test_render_frames_that_cannot_be_honoured_are_said():
    from particles.app.summary import frame_note, frames_of
    assert frames_of(500, 5) == 101 and frames_of(500, 8) == 64
    note = frame_note(150, 500, 5, 5)
    assert note.startswith("note: [render] frames = 150 gives 101 frames here")
    assert "a multiple of [log] every = 5" in note and "a divisor of 100" in note


def test_a_run_says_when_its_frame_count_differs(tmp_path):
    from particles.app.run import run_scene
    from scenes import load_scene
    said = []
    scene = load_scene("quickstart", ["tokens.n=8", "dynamics.steps=20", "log.every=5", "render.frames=3",
                                      "render.width=320", "render.height=180"])
    run_scene(scene, tmp_path / "r", progress=False, echo=said.append)
    assert any(s.startswith("note: [render] frames = 3 gives 5 frames here") for s in said), said
