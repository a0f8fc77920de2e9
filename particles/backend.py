"""Taichi lifecycle: initialised once per process, on the arch the user asked for.

A second ``ti.init`` would destroy every field and kernel already built, so the
first request fixes the arch and later requests must agree with it. A GPU that
was asked for and is not there is an error, never a silent fallback to CPU.

``gpu`` probes CUDA, then Vulkan, then Metal (macOS only) and takes the first whose
device initialises and runs a test kernel (a software Vulkan device too, saying once on
stderr that it is one); ``auto`` does the same but passes over a software Vulkan device
(Mesa's llvmpipe, SwiftShader: slower than the CPU path; ``is_software_device``), and
takes the CPU when no GPU works. Vulkan and Metal compile through SPIR-V, whose code generator in
Taichi has no 64-bit exp/log (and Metal no float64 at all): there, float literals
default to float32, device reductions accumulate in float32, and dtype float64 is
refused (``check_dtype``).
"""

import contextlib
import io
import json
import os
import re
import sys
import tempfile
import threading
import time

import numpy as np
import taichi as ti

from . import affinity, machine
from .vocabulary import ARCHES as ARCH_CHOICES
SPIRV_ARCHES = ("vulkan", "metal", "opengl")
SOFTWARE_DEVICES = ("llvmpipe", "lavapipe", "SwiftShader")  # Vulkan on the CPU
SOFTWARE_ICDS = ("libvulkan_lvp", "libvk_swiftshader")       # their drivers' libraries
# where the Vulkan loader looks for driver manifests (after VK_DRIVER_FILES / VK_ICD_FILENAMES)
ICD_DIRS = ("/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d", "/usr/share/vulkan/icd.d")

_active: dict[str, object] = {}


from .errors import ArchError, ParticlesUserError  # noqa: E402  (the requested arch cannot run here: the one family)


def fingerprint() -> dict:
    """What decides a run's bits on the CPU: the CPU identity, Taichi's and LLVM's versions."""
    out = machine.cpu_identity()
    out["taichi"] = ".".join(map(str, ti.__version__))
    try:
        out["llvm"] = str(ti._lib.core.get_llvm_target_support())
    except Exception:  # a Taichi build without the query: the version alone still tells
        out["llvm"] = ""
    return out


def _arch_name(arch) -> str:
    return {ti.cpu: "cpu", ti.x64: "cpu", ti.arm64: "cpu", ti.cuda: "cuda",
            ti.vulkan: "vulkan", ti.metal: "metal", ti.opengl: "opengl"}.get(arch, str(arch))


def _gpu_candidates():
    """(Taichi arch, name) in probing order; Metal exists only on macOS."""
    candidates = [(ti.cuda, "cuda"), (ti.vulkan, "vulkan")]
    if sys.platform == "darwin":
        candidates.append((ti.metal, "metal"))
    return candidates


def _options(name: str) -> dict:
    # default_fp=f64 keeps Python float literals exact in float64 kernels (float32 kernels
    # cast their constants explicitly, see kernels.py); on SPIR-V a float64 literal would
    # drag float32 code (user rules included) into 64-bit operations it cannot compile.
    fp = ti.f32 if name in SPIRV_ARCHES else ti.f64
    options = dict(default_fp=fp, offline_cache=True, unrolling_limit=0)
    if "TI_LOG_LEVEL" not in os.environ:   # (set by `import particles`; an argument would override it, with a warning)
        options["log_level"] = ti.WARN
    return options


@ti.kernel
def _smoke(a: ti.types.ndarray(dtype=ti.f32, ndim=1)):
    for i in range(a.shape[0]):
        a[i] = ti.sqrt(ti.cast(i, ti.f32)) + ti.exp(ti.cast(0, ti.f32))


def _device_runs() -> bool:
    """A device can initialise and still fail at its first kernel: run one."""
    try:
        a = ti.ndarray(ti.f32, shape=(64,))
        _smoke(a)
        got = a.to_numpy()
    except Exception:  # noqa: BLE001 - any failure means this device is not usable
        return False
    return bool(np.allclose(got, np.sqrt(np.arange(64)) + 1, rtol=1e-6))


@contextlib.contextmanager
def _stderr_fd_captured(into: list):
    """Taichi's C++ log goes to file descriptor 2: catch it there (appended to `into`)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            into.append(tmp.read().decode(errors="replace"))


def _init_quietly(gpu, name: str) -> str:
    """ti.init on one GPU arch with its log captured; returns the Vulkan device's name, if any
    (Taichi reports it only in its trace log)."""
    log: list[str] = []
    level = ti.TRACE if name == "vulkan" else ti.ERROR  # ERROR: no "falling back" warning
    with _stderr_fd_captured(log):
        ti.init(arch=gpu, **{**_options(name), "log_level": level})
        ti.set_logging_level(ti.WARN)
    found = re.search(r'Vulkan Device "([^"]+)"', log[0])
    return found.group(1) if found else ""


def icd_libraries(dirs=ICD_DIRS) -> list[str]:
    """The driver libraries of the Vulkan manifests the loader would read (the files named by
    VK_DRIVER_FILES or VK_ICD_FILENAMES where set, else every *.json in ``dirs``)."""
    named = os.environ.get("VK_DRIVER_FILES") or os.environ.get("VK_ICD_FILENAMES")
    files = (named.split(os.pathsep) if named else
             sorted(os.path.join(d, f) for d in dirs if os.path.isdir(d) for f in os.listdir(d)
                    if f.endswith(".json")))
    libraries = []
    for path in files:
        try:
            with open(path, encoding="utf-8") as fh:
                libraries.append(str(json.load(fh)["ICD"]["library_path"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue   # an unreadable manifest: the loader skips it too
    return libraries


def is_software_device(arch: str, device: str, dirs=ICD_DIRS) -> bool:
    """Is this a software Vulkan device (Mesa's lavapipe/llvmpipe, SwiftShader), slower than the
    CPU path? By the device's name, which Taichi reports in its trace log; where it reports none,
    by the drivers: software if every Vulkan driver installed is a software one. CUDA and Metal
    devices are hardware."""
    if arch != "vulkan":
        return False
    if device:
        return any(soft.lower() in device.lower() for soft in SOFTWARE_DEVICES)
    libraries = icd_libraries(dirs)
    return bool(libraries) and all(any(soft in os.path.basename(lib) for soft in SOFTWARE_ICDS)
                                   for lib in libraries)


def _probe_gpu(skip_software: bool) -> tuple[str | None, str, list[str]]:
    """Initialise the first GPU that runs a kernel: (its arch or None, its device name, why
    the others were not taken)."""
    tried = []
    for gpu, name in _gpu_candidates():
        # ti.gpu (and enable_fallback=False) segfault inside Taichi 1.7 where no GPU driver
        # exists; ti.cuda / ti.vulkan fall back to CPU cleanly, and we check what was chosen.
        device = _init_quietly(gpu, name)
        running = _arch_name(ti.lang.impl.current_cfg().arch)
        if running == "cpu":
            tried.append(f"{name}: no usable device or driver")
        elif skip_software and is_software_device(running, device):
            tried.append(f"{name}: only the software device {device or '(a software driver)'!r}")
        elif _device_runs():
            return running, device, tried
        else:
            tried.append(f"{name}: the device initialised but could not run a test kernel")
    return None, "", tried


def cpu_pool_size() -> int:
    """Threads in Taichi's CPU pool (``cpu_max_num_threads``, which a sweep lowers for its
    workers); 1 before Taichi is initialised or where its config cannot be read."""
    try:
        return int(ti.lang.impl.current_cfg().cpu_max_num_threads)
    except Exception:  # noqa: BLE001 - not initialised, or a Taichi without this internal
        return 1


def pinned_threads() -> dict[int, int]:
    """{thread id: cpu} of Taichi's CPU pool threads pinned at init (empty: none pinned)."""
    return dict(_active.get("pinned_threads") or {})


def _init_cpu() -> None:
    """ti.init on the CPU, its pool threads pinned one per core where that applies (affinity)."""
    before = set(affinity.thread_ids())
    ti.init(arch=ti.cpu, **_options("cpu"))
    started = [tid for tid in affinity.thread_ids() if tid not in before]
    _active["pinned_threads"] = affinity.pin_pool(started, cpu_pool_size())


def init(arch: str = "cpu") -> str:
    """Initialise Taichi once; returns the arch that actually runs ('cpu', 'cuda', 'vulkan', ...)."""
    if arch not in ARCH_CHOICES:
        raise ParticlesUserError(f"arch must be one of {ARCH_CHOICES}, got {arch!r}")
    if _active:
        running = _active["arch"]
        if arch == "cpu" and running != "cpu" or arch == "gpu" and running == "cpu":
            raise ArchError(
                f"Taichi already runs on {running!r} in this process (requested first as "
                f"{_active['requested']!r}); a run asking for {arch!r} needs a new process")
        return running
    with contextlib.redirect_stdout(io.StringIO()):  # "[Taichi] Starting on arch=...": we report it
        device = ""
        if arch == "cpu":
            _init_cpu()
            running = "cpu"
        else:
            running, device, tried = _probe_gpu(skip_software=arch == "auto")
            if running is None:
                if arch == "gpu":
                    probed = "CUDA/Vulkan/Metal" if sys.platform == "darwin" else "CUDA/Vulkan"
                    raise ArchError(
                        f"arch 'gpu' was requested but no {probed} device is usable here "
                        f"({'; '.join(tried)}); use arch 'cpu' (or 'auto' to take a GPU only "
                        "when one works)")
                _init_cpu()
                running = "cpu"
            elif arch == "gpu" and is_software_device(running, device):
                print(software_device_note(device), file=sys.stderr)   # once: init runs once
    _active.update(arch=running, requested=arch, device=device)
    return running


def software_device_note(device: str) -> str:
    what = f"the software Vulkan device {device!r}" if device else "a software Vulkan driver"
    return (f"note: arch 'gpu' runs on {what}, which emulates a GPU on the CPU and is slower than "
            "arch 'cpu' (--arch cpu); arch 'auto' passes over it")


def active_arch() -> str | None:
    """The arch Taichi runs on in this process, or None before the first init."""
    return _active.get("arch")


def device_name() -> str:
    """The GPU's name where Taichi reports it (Vulkan), else ''."""
    return _active.get("device", "")


def is_gpu(arch: str | None = None) -> bool:
    """Whether kernels run on a GPU arch (the active one by default)."""
    arch = arch or active_arch()
    return arch is not None and arch != "cpu"


def supports_float64(arch: str | None = None) -> bool:
    """float64 kernels need 64-bit exp and log: CPU and CUDA have them, SPIR-V does not."""
    return (arch or active_arch()) not in SPIRV_ARCHES


def reduction_dtype(arch: str | None = None):
    """The accumulator type of the device reductions: float64 where the device has it."""
    return ti.f64 if supports_float64(arch) else ti.f32


def check_dtype(dtype: str, arch: str | None = None) -> None:
    """Refuse float64 where it cannot run, naming the arch and what to use instead."""
    arch = arch or active_arch()
    if dtype == "float64" and not supports_float64(arch):
        raise ArchError(
            f"dtype float64 is not available on arch {arch!r}: Taichi compiles {arch} kernels "
            "through SPIR-V, which has no 64-bit exp/log (and Metal has no float64 at all). "
            "Use dtype float32 (--dtype float32), or arch cpu (or a CUDA GPU) for float64")


# A kernel build longer than this says what it compiles (a cold kernel cache at a new size can
# take minutes: d = 384 heads), then a line at each stage and every BUILD_PROGRESS_S until it ends.
BUILD_NOTICE_S = 5.0
BUILD_PROGRESS_S = 15.0


class BuildNotice:
    """What a build is compiling, said on stderr once it has taken ``BUILD_NOTICE_S``; then a
    progress line (the stage, how many of ``stages``, the seconds so far) at each stage and
    every ``BUILD_PROGRESS_S``, and the total at ``finish()``. A shorter build says nothing.

    Taichi's compiler holds the GIL, so the watching thread speaks when it gets it (between
    kernels at the latest); ``stage`` speaks from the building thread. A build that raises
    calls ``abandon()`` (or leaves a ``with`` block), which silences the watcher without a total.
    The watcher reads nothing of the building thread: walking that thread's frames from here
    (``sys._current_frames``, ``f_back``) crashed CPython 3.11 once mid-build (a segfault in a
    test run), so the building thread says when it is done."""

    def __init__(self, what: str, stages: int):
        self.what, self.stages = what, stages
        self.label, self.done = "", 0
        self.announced = False
        self._start = self._last = time.perf_counter()
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="particles-build-notice", daemon=True)
        self._thread.start()

    def stage(self, label: str) -> None:
        """The build moves on to ``label`` (one of ``stages``)."""
        with self._lock:
            self.label, self.done = label, self.done + 1
        self._speak(new_stage=True)

    def finish(self) -> None:
        """The build is done: the watcher stops, and the total is said if the build was announced."""
        self.abandon()
        if self.announced:
            print(f"compiled in {time.perf_counter() - self._start:.0f} s", file=sys.stderr, flush=True)

    def abandon(self) -> None:
        """The build raised: the watcher stops and says nothing more."""
        self._finished.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> "BuildNotice":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.abandon()

    def _watch(self) -> None:
        while not self._finished.wait(0.1):
            self._speak(new_stage=False)

    def _speak(self, new_stage: bool) -> None:
        with self._lock:
            if self._finished.is_set():
                return
            now = time.perf_counter()
            elapsed = now - self._start
            if not self.announced:
                if elapsed < BUILD_NOTICE_S:
                    return
                self.announced = True
                print(f"compiling kernels for {self.what} (once: Taichi's kernel cache keeps them "
                      "for later builds at these sizes)", file=sys.stderr, flush=True)
            elif not new_stage and now - self._last < BUILD_PROGRESS_S:
                return
            self._last = now
            print(f"  compiling {self.label or 'kernels'} ({self.done}/{self.stages}), "
                  f"{elapsed:.0f} s so far", file=sys.stderr, flush=True)
