"""The GPU code path (arch = "gpu"): engine, observables, a scene with its video, and CPU
agreement. Each check runs in its own process (tests/gpu_checks.py), since Taichi runs on
one arch per process. Without a usable GPU or Vulkan device (e.g. Mesa's software driver:
apt-get install mesa-vulkan-drivers libvulkan1) these tests skip, saying why; with
PARTICLES_REQUIRE_GPU_TESTS=1 (set by .ci/run where it installed the driver) they fail."""
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKS = Path(__file__).resolve().parent / "gpu_checks.py"

pytestmark = pytest.mark.gpu


def _env(**extra):
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, MPLBACKEND="Agg", **extra)


def _run(*args, timeout=300, **env):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout, env=_env(**env))


@functools.lru_cache(maxsize=None)
def _probe() -> tuple[str | None, str]:
    """(the GPU arch that runs here, or None; its device name, or why there is none)."""
    proc = _run("-c", "from particles import backend; print(backend.init('gpu')); print(backend.device_name())",
                timeout=120)
    if proc.returncode == 0:
        arch, device = proc.stdout.splitlines()[-2:]  # the device line may be empty
        return arch.strip(), device.strip()
    return None, (proc.stderr.strip().splitlines() or ["no output"])[-1]


@pytest.fixture(scope="module")
def gpu_arch():
    arch, why = _probe()
    if arch is None:
        if os.environ.get("PARTICLES_REQUIRE_GPU_TESTS") == "1":
            pytest.fail(f"PARTICLES_REQUIRE_GPU_TESTS=1 but no GPU arch is usable: {why}")
        pytest.skip(f"no CUDA/Vulkan/Metal device usable here ({why}); install Mesa's software "
                    "Vulkan driver (mesa-vulkan-drivers, libvulkan1) to run these")
    return arch


def check(*args, **env):
    proc = _run(CHECKS, *args, **env)
    assert proc.returncode == 0, f"{' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc.stdout


@pytest.mark.parametrize("rule, d", [("exp", 5), pytest.param("softmax", 5, marks=pytest.mark.slow),
                                     pytest.param("relu", 5, marks=pytest.mark.slow), ("user", 5),
                                     pytest.param("softmax", 40, marks=pytest.mark.slow)])
def test_engine_and_observables_match_reference_on_gpu(gpu_arch, rule, d):
    """Velocity, Euler and RK4 steps, every observable, sphere and flat, float32 tolerance,
    over several row blocks and key tiles of the tiled pair pass (d = 40: one row per thread)."""
    assert f"ok on {gpu_arch}" in check("engine", rule, 300, d)


@pytest.mark.slow
def test_masks_biases_and_positional_rules_match_reference_on_gpu(gpu_arch):
    """Causal and window masks (band-limited key tiles), ALiBi, per-head rules and betas and a
    position-aware user rule, with four rows per thread (n = 600, d = 5) and one (n = 300,
    d = 40), in one process; the causal first token bit for bit."""
    out = check("positions", "600x5", "300x40")
    for n, d in ((600, 5), (300, 40)):
        assert f"positions n={n} d={d}: ok on {gpu_arch}" in out, out
    assert f"causal first token n=600: ok on {gpu_arch}" in out, out


@pytest.mark.slow
def test_ensemble_matches_reference_on_gpu(gpu_arch):
    assert f"ok on {gpu_arch}" in check("ensemble")


@pytest.mark.slow
def test_runs_on_gpu_are_bitwise_reproducible(gpu_arch):
    assert f"ok on {gpu_arch}" in check("reproducible")


def test_blow_up_is_found_on_gpu(gpu_arch):
    assert f"ok on {gpu_arch}" in check("blow_up")


def test_auto_takes_a_hardware_gpu_and_passes_over_a_software_one(gpu_arch, tmp_path):
    device = _probe()[1]
    software = any(name.lower() in device.lower() for name in ("llvmpipe", "lavapipe", "SwiftShader"))
    proc = _run("-m", "particles", "run", "quickstart", "--arch", "auto", "--steps", 2, "--no-render",
                "--out", tmp_path / "auto")
    assert proc.returncode == 0, proc.stderr
    want = "cpu" if software else gpu_arch  # Vulkan on the CPU is slower than the CPU path
    assert f"on arch {want}" in proc.stdout
    meta = json.loads((tmp_path / "auto" / "run.json").read_text())
    assert meta["arch"] == want and meta["arch_requested"] == "auto"


def test_gpu_says_once_on_stderr_when_it_takes_a_software_device(gpu_arch, tmp_path):
    from particles.backend import is_software_device
    device = _probe()[1]
    proc = _run("-m", "particles", "run", "quickstart", "--arch", "gpu", "--steps", 2, "--no-render",
                "--out", tmp_path / "gpu")
    assert proc.returncode == 0, proc.stderr
    notes = proc.stderr.count("note: arch 'gpu' runs on the software Vulkan device")
    assert notes == (1 if is_software_device(gpu_arch, device) else 0), proc.stderr
    assert "note: arch 'gpu'" not in proc.stdout


@pytest.mark.slow
def test_100_steps_on_gpu_agree_with_cpu(gpu_arch, tmp_path):
    for arch in ("cpu", "gpu"):
        check("trajectory", tmp_path / f"{arch}.npz", arch)
    cpu, gpu = np.load(tmp_path / "cpu.npz"), np.load(tmp_path / "gpu.npz")
    assert str(cpu["arch"]) == "cpu" and str(gpu["arch"]) == gpu_arch
    assert list(cpu["keys"]) == list(gpu["keys"]) and cpu["log"].shape == gpu["log"].shape == (20, len(cpu["keys"]))
    x_cpu, x_gpu = cpu["tokens"].astype(np.float64), gpu["tokens"].astype(np.float64)
    # two float32 runs of a contracting flow: rounding differences stay at float32 level
    assert np.max(np.abs(x_cpu - x_gpu)) < 1e-4
    np.testing.assert_allclose(gpu["log"], cpu["log"], rtol=1e-3, atol=1e-4)


@pytest.mark.slow
def test_scene_runs_end_to_end_on_gpu_with_video(gpu_arch, tmp_path):
    out = tmp_path / "qs"
    proc = _run("-m", "particles", "run", "quickstart", "--arch", "gpu", "--steps", 20, "--out", out,
                "--set", "render.width=320", "--set", "render.height=240")
    assert proc.returncode == 0, proc.stderr
    assert f"on arch {gpu_arch}" in proc.stdout
    meta = json.loads((out / "run.json").read_text())
    assert meta["arch"] == gpu_arch and meta["arch_requested"] == "gpu"
    video = out / meta["files"]["video"]
    assert video.is_file() and video.stat().st_size > 1000


def test_float64_on_a_spirv_gpu_is_a_clear_error(gpu_arch, tmp_path):
    proc = _run("-m", "particles", "run", "quickstart", "--arch", "gpu", "--dtype", "float64",
                "--steps", 2, "--no-render", "--out", tmp_path / "f64")
    if gpu_arch == "cuda":  # CUDA has 64-bit exp/log: float64 runs there
        assert proc.returncode == 0, proc.stderr
    else:
        assert proc.returncode == 2, proc.stderr
        assert f"float64 is not available on arch '{gpu_arch}'" in proc.stderr
        assert "float32" in proc.stderr and "cpu" in proc.stderr and "Traceback" not in proc.stderr


def test_user_rule_that_does_not_compile_on_gpu_names_the_rule_and_function(gpu_arch, tmp_path):
    rule_file = tmp_path / "numpy_rule.py"
    rule_file.write_text("import numpy as np\nimport particles\n\n\ndef numpy_sigmoid(z):\n"
                         "    return 1 / (1 + np.exp(-z))\n\n\n"
                         "particles.register_rule('numpy_sigmoid', kernel=numpy_sigmoid)\n")
    proc = _run("-m", "particles", "run", "quickstart", "--arch", "gpu", "--set", f"dynamics.rule_file={rule_file}",
                "--set", "dynamics.rule=numpy_sigmoid", "--steps", 2, "--no-render", "--out", tmp_path / "r")
    assert proc.returncode == 2, proc.stderr
    message = " ".join(proc.stderr.split())
    assert "rule 'numpy_sigmoid'" in message and "kernel function 'numpy_sigmoid'" in message
    # the rule probe (a child process, before any kernel is built for the GPU) finds it: it
    # fails on every arch, so the message names the rule's file rather than the arch
    assert "numpy_rule.py" in message and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_gpu_benchmark_runs_at_small_size(gpu_arch):
    """benchmarks/gpu.py --small on this device: one table, a finite rate per case."""
    proc = _run(ROOT / "benchmarks" / "gpu.py", "--small", "--min-time", "0.2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith(f"arch {gpu_arch}")
    header = lines[1].split()
    rows = [line.split() for line in lines[2:]]
    assert header[:3] == ["n", "d", "H"] and len(rows) == 2
    for row in rows:
        shift = 1 if row[3] == "rank" else 0  # "rank 4" is two words under "heads"
        assert float(row[header.index("steps/s") + shift]) > 0
