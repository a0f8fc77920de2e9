"""The machine a run's numbers were computed on.

Taichi 1.7's JIT compiles the kernels for the host CPU, and LLVM picks a different
vectorisation (and so a different order of floating-point additions) for each vector width
and CPU model. A run is therefore bitwise reproducible on the same CPU model with the same
Taichi and LLVM, and only to the dtype's round-off elsewhere. `run.json` and the golden
recordings store this fingerprint (``backend.fingerprint``: this CPU's identity with Taichi's and
LLVM's versions) so that a difference can be explained.
"""
from __future__ import annotations

import platform
from pathlib import Path

_CPUINFO = Path("/proc/cpuinfo")


def _cpuinfo_fields() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    fields: dict[str, str] = {}
    try:
        text = _CPUINFO.read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def vector_width_bits(flags: set[str]) -> int | None:
    """The widest SIMD the CPU reports (x86 flags; 128 for NEON); None when unknown."""
    if "avx512f" in flags:
        return 512
    if "avx2" in flags or "avx" in flags:
        return 256
    return 128 if flags else None


def cpu_identity() -> dict:
    """Model string, vendor/family/model numbers and vector width of the host CPU."""
    fields = _cpuinfo_fields()
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return {
        "model": fields.get("model name") or platform.processor() or platform.machine(),
        "vendor": fields.get("vendor_id", ""),
        "family": fields.get("cpu family", ""),
        "model_number": fields.get("model", ""),
        "machine": platform.machine(),
        "vector_width_bits": vector_width_bits(flags),
    }


def describe(fp: dict) -> str:
    """One line for people: 'AMD EPYC (AuthenticAMD 26/2, 512-bit), taichi 1.7.4, llvm 15.0.4'."""
    return (f"{fp.get('model', '?')} ({fp.get('vendor', '?')} {fp.get('family', '?')}/"
            f"{fp.get('model_number', '?')}, {fp.get('vector_width_bits', '?')}-bit), "
            f"taichi {fp.get('taichi', '?')}, llvm {fp.get('llvm', '?')}")
