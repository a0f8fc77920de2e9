"""Taichi lifecycle: initialised once per process, on the arch the user asked for.

A second ``ti.init`` would destroy every field and kernel already built, so the
first request fixes the arch and later requests must agree with it. A GPU that
was asked for and is not there is an error, never a silent fallback to CPU.
"""
from __future__ import annotations

import contextlib
import io

import taichi as ti

ARCH_CHOICES = ("cpu", "gpu", "auto")

_active: dict[str, str] = {}


class ArchError(RuntimeError):
    """The requested arch cannot run here, or conflicts with the one already running."""


def _arch_name(arch) -> str:
    return {ti.cpu: "cpu", ti.x64: "cpu", ti.arm64: "cpu", ti.cuda: "cuda",
            ti.vulkan: "vulkan", ti.metal: "metal", ti.opengl: "opengl"}.get(arch, str(arch))


def init(arch: str = "cpu") -> str:
    """Initialise Taichi once; returns the arch that actually runs ('cpu', 'cuda', 'vulkan', ...)."""
    if arch not in ARCH_CHOICES:
        raise ValueError(f"arch must be one of {ARCH_CHOICES}, got {arch!r}")
    if _active:
        running = _active["arch"]
        if arch == "cpu" and running != "cpu" or arch == "gpu" and running == "cpu":
            raise ArchError(
                f"Taichi already runs on {running!r} in this process (requested first as "
                f"{_active['requested']!r}); a run asking for {arch!r} needs a new process")
        return running
    # default_fp=f64 keeps Python float literals exact in float64 kernels; float32
    # kernels cast their constants explicitly (see kernels.py).
    options = dict(default_fp=ti.f64, offline_cache=True, log_level=ti.WARN, unrolling_limit=0)
    with contextlib.redirect_stdout(io.StringIO()):  # "[Taichi] Starting on arch=...": we report it
        if arch == "cpu":
            ti.init(arch=ti.cpu, **options)
        else:
            # ti.gpu (and enable_fallback=False) segfault inside Taichi 1.7 where no GPU driver
            # exists; CUDA then Vulkan fall back to CPU cleanly, and we check what was chosen.
            for gpu in (ti.cuda, ti.vulkan):
                ti.init(arch=gpu, **options)
                if _arch_name(ti.lang.impl.current_cfg().arch) != "cpu":
                    break
    running = _arch_name(ti.lang.impl.current_cfg().arch)
    if arch == "gpu" and running == "cpu":
        raise ArchError("arch 'gpu' was requested but no CUDA/Vulkan/Metal device is usable "
                        "here; use arch 'cpu' (or 'auto' to take a GPU only when one exists)")
    _active.update(arch=running, requested=arch)
    return running


def active_arch() -> str | None:
    """The arch Taichi runs on in this process, or None before the first init."""
    return _active.get("arch")
