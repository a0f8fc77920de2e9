"""benchmarks/step.py's tables from saved records: the torch-with-observables columns, and "-"
where a run had no torch (no timing here: the records are made up), and the sampler's counts."""
import pytest

import benchmark_scripts


@pytest.fixture(scope="module")
def step():
    return benchmark_scripts.load("step")


META = {"date": "2026-12-02 15:00:00", "cpu_model": "AMD EPYC", "cpus": 2, "vector_width_bits": 512,
        "sgemm_gflops": 400.0, "exp_g_per_s": 5.0, "torch_version": "2.14.1", "torch_threads": 2,
        "load_average_start": (0.5, 0.5, 0.5), "load_average_end": (0.7, 0.6, 0.5)}
BASE = {"n": 1024, "d": 64, "H": 8, "structure": "full", "r": 64, "rv": 64, "engine_ms": 10.0,
        "engine_obs_ms": 11.0, "obs_over_bare": 1.1, "bound_ms": 5.0, "engine_over_bound": 2.0,
        "engine_spread": 1.2, "engine_obs_spread": 1.3}
TORCH = {"torch_ms": 16.0, "torch_obs_ms": 22.0, "engine_over_torch": 0.625,
         "engine_obs_over_torch_obs": 0.5, "torch_spread": 1.4, "torch_obs_spread": 1.5,
         "torch_obs_max_rel_diff_vs_engine": 2e-6, "torch_sdpa": "flash"}


def test_markdown_has_the_observed_torch_columns(step):
    lines = step.markdown({"meta": META, "results": [{**BASE, **TORCH}, dict(BASE)]}).splitlines()
    header = next(line for line in lines if "torch with observables ms" in line)
    with_torch, without = lines[lines.index(header) + 2:lines.index(header) + 4]
    cells = [c.strip() for c in with_torch.strip("|").split("|")]
    assert len(cells) == header.count("|") - 1
    names = [c.strip() for c in header.strip("|").split("|")]
    row = dict(zip(names, cells))
    assert row["torch with observables ms"] == "22.0" and row["observed engine / torch"] == "0.50"
    assert row["spread engine / observed / torch / torch observed"] == "1.20 / 1.30 / 1.40 / 1.50"
    row = dict(zip(names, [c.strip() for c in without.strip("|").split("|")]))
    assert row["torch with observables ms"] == "-" and row["observed engine / torch"] == "-"
    assert row["spread engine / observed / torch / torch observed"] == "1.20 / 1.30 / - / -"


def test_console_table_prints_observed_ratio_and_four_spreads(step, capsys):
    step.print_table([{**BASE, **TORCH}, dict(BASE)])
    out = capsys.readouterr().out.strip().splitlines()
    assert "torch+obs" in out[1] and "e+o/t+o" in out[1]
    assert "22.0" in out[2] and " 0.50 " in out[2] and "1.20/1.30/1.40/1.50" in out[2]
    assert "1.20/1.30/-/-" in out[3]


@pytest.mark.parametrize("samples, probe_s, taken", [(None, 0.0, 5), (None, 1.5, 3), (4, 1.5, 4)])
def test_interleaved_takes_the_samples_asked_or_its_default(step, monkeypatch, samples, probe_s, taken):
    # the sampler sizes its blocks from a probe call; without --samples it had divided by None
    monkeypatch.setattr(step, "SETTLE_S", 0.0)
    clock = iter(float(t) * probe_s for t in range(10_000))
    monkeypatch.setattr(step.time, "perf_counter", lambda: next(clock))
    calls = {"a": 0, "b": 0}
    timed = {name: (lambda name=name: calls.__setitem__(name, calls[name] + 1), lambda: None) for name in calls}
    result = step.interleaved(timed, min_time=0.0, samples=samples)
    assert set(result) == {"a", "b"}
    assert calls == {"a": 1 + taken, "b": 1 + taken}   # the probe, then one call per sample
