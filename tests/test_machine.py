"""The machine fingerprint: what decides a run's bits, recorded in every run.json."""
import json

from particles import backend, machine
from particles.app.run import run_scene
from scenes import load_scene


def test_fingerprint_names_the_cpu_vector_width_and_compilers():
    fp = backend.fingerprint()
    assert fp["model"] and fp["taichi"].count(".") == 2 and fp["llvm"]
    assert fp["vector_width_bits"] in (128, 256, 512, None)
    line = machine.describe(fp)
    assert fp["model"] in line and f"taichi {fp['taichi']}" in line


def test_vector_width_from_flags():
    assert machine.vector_width_bits({"avx512f", "avx2"}) == 512
    assert machine.vector_width_bits({"avx2", "fma"}) == 256
    assert machine.vector_width_bits({"neon"}) == 128
    assert machine.vector_width_bits(set()) is None


def test_run_json_records_the_machine(tmp_path):
    scene = load_scene("quickstart", overrides=["dynamics.steps=2", "tokens.n=8"])
    run_scene(scene, tmp_path / "run", render=False, progress=False, echo=lambda *_: None)
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["machine"] == backend.fingerprint()
