"""Choosing the device: a software Vulkan device is recognised, and `gpu` says once that it took one."""
from __future__ import annotations

import json

import pytest

from particles import backend


def _manifests(folder, *libraries):
    folder.mkdir()
    for k, lib in enumerate(libraries):
        (folder / f"icd{k}.json").write_text(json.dumps({"ICD": {"library_path": lib}}))
    return (str(folder),)


@pytest.mark.parametrize("device, software", [("llvmpipe (LLVM 15.0.6, 256 bits)", True),
                                              ("SwiftShader Device (Subzero)", True),
                                              ("NVIDIA H200", False), ("AMD Radeon RX 7900 XTX (RADV NAVI31)", False)])
def test_a_vulkan_device_is_software_by_its_name(device, software):
    assert backend.is_software_device("vulkan", device) is software


def test_without_a_device_name_the_installed_drivers_decide(tmp_path, monkeypatch):
    monkeypatch.delenv("VK_DRIVER_FILES", raising=False)
    monkeypatch.delenv("VK_ICD_FILENAMES", raising=False)
    only_lvp = _manifests(tmp_path / "a", "/usr/lib/x86_64-linux-gnu/libvulkan_lvp.so")
    with_hw = _manifests(tmp_path / "b", "/usr/lib/x86_64-linux-gnu/libvulkan_lvp.so",
                         "/usr/lib/x86_64-linux-gnu/libvulkan_radeon.so")
    assert backend.is_software_device("vulkan", "", only_lvp)
    assert not backend.is_software_device("vulkan", "", with_hw)          # may be hardware: no claim
    assert not backend.is_software_device("vulkan", "", (str(tmp_path / "none"),))
    assert not backend.is_software_device("cuda", "", only_lvp)            # CUDA is never software
    monkeypatch.setenv("VK_ICD_FILENAMES", str(tmp_path / "a" / "icd0.json"))   # the loader's override
    assert backend.is_software_device("vulkan", "", with_hw)


def test_gpu_on_a_software_device_says_so_once_on_stderr(monkeypatch, capsys):
    monkeypatch.setattr(backend, "_active", {})      # this process's real Taichi state is left alone
    monkeypatch.setattr(backend, "_probe_gpu", lambda skip_software: ("vulkan", "llvmpipe (LLVM 15.0.6, 256 bits)", []))
    assert backend.init("gpu") == "vulkan"
    assert backend.init("gpu") == "vulkan"
    err = capsys.readouterr().err
    assert err.count("note: arch 'gpu' runs on the software Vulkan device 'llvmpipe (LLVM 15.0.6, 256 bits)'") == 1
    assert "slower than arch 'cpu' (--arch cpu)" in err


def test_gpu_on_a_hardware_device_says_nothing(monkeypatch, capsys):
    monkeypatch.setattr(backend, "_active", {})
    monkeypatch.setattr(backend, "_probe_gpu", lambda skip_software: ("cuda", "", []))
    assert backend.init("gpu") == "cuda"
    assert capsys.readouterr().err == ""


# test_engine's fast-tier cases on these paths (their kernels are cached once for both files)
CASES = {"fused": dict(H=1, dtype="float64", geometry="sphere", integrator="euler"),
         "tiled": dict(H=3, dtype="float32", geometry="flat", integrator="rk4")}


def _build(path):
    from particles import Simulation
    from conftest import general_heads, random_tokens
    case = CASES[path]
    return Simulation(random_tokens(13, 5, seed=case["H"]), general_heads(case["H"], 5, seed=7), beta=1.3,
                      rule="exp", geometry=case["geometry"], dt=0.05, integrator=case["integrator"],
                      dtype=case["dtype"], path=path)


@pytest.mark.parametrize("path, stages", [("fused", 2), ("tiled", 4)])
def test_a_long_build_says_what_it_compiles_for_which_sizes(monkeypatch, capsys, path, stages):
    """Every build counts as long (threshold 0): the notice names the sizes, the rule, the
    implementation, then a progress line per stage and the total."""
    monkeypatch.setattr(backend, "BUILD_NOTICE_S", 0.0)
    sim = _build(path)
    err = capsys.readouterr().err
    case = CASES[path]
    head = (f"compiling kernels for n=13, d=5, H={case['H']}, rank r=5 (values 5), rule exp, {case['dtype']}, "
            f"{case['integrator']}, implementation {sim.plan.implementation} on cpu")
    assert err.count(head) == 1, err
    assert f"({stages}/{stages}), " in err and "s so far" in err
    assert err.rstrip().splitlines()[-1].startswith("compiled in ")


def test_a_short_build_says_nothing(monkeypatch, capsys):
    monkeypatch.setattr(backend, "BUILD_NOTICE_S", 3600.0)
    _build("fused")
    assert "compil" not in capsys.readouterr().err


def test_a_simulation_whose_build_raises_leaves_no_notice_speaking(monkeypatch, capsys):
    """The notice made midway through Simulation.__init__ is silenced when the rest raises,
    without reading the building thread's frames from the watcher."""
    import threading
    import time
    from particles import Simulation
    monkeypatch.setattr(backend, "BUILD_NOTICE_S", 0.0)
    monkeypatch.setattr(backend, "BUILD_PROGRESS_S", 0.05)

    def failing_warm_up(self):
        time.sleep(0.3)   # the watcher speaks meanwhile
        raise RuntimeError("the build failed")
    monkeypatch.setattr(Simulation, "_warm_up", failing_warm_up)
    with pytest.raises(RuntimeError, match="the build failed"):
        _build("tiled")
    assert "compiling" in capsys.readouterr().err
    time.sleep(0.3)
    assert capsys.readouterr().err == ""
    assert not any(t.name == "particles-build-notice" for t in threading.enumerate())


def test_the_notice_falls_silent_when_the_build_raises(monkeypatch, capsys):
    """A build that raised leaves no watcher speaking after the error."""
    import time
    monkeypatch.setattr(backend, "BUILD_NOTICE_S", 0.05)

    def failing_build():
        with backend.BuildNotice("n=1", 2):
            raise RuntimeError("the build failed")

    with pytest.raises(RuntimeError):
        failing_build()
    time.sleep(0.3)
    assert capsys.readouterr().err == ""
