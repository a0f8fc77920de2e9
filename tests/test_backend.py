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
