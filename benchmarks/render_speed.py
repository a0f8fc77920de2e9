"""Rendering speed: frames/s at n=512 for d=3 (sphere) and d=8 (pca), MP4, 1280x720.

    python benchmarks/render_speed.py [--frames 60] [--n 512] [--profile]

Fabricated tokens (random points slowly collapsing toward one point) and a fake log with
three heads; the engine is not used. One warm-up frame (figure construction, ffmpeg start)
is excluded; the timing includes drawing, encoding and closing the file.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from render import Animation, RenderConfig, RunInfo


def fake_frames(n: int, d: int, frames: int, t_end: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal((n, d))
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    target = np.zeros(d)
    target[0] = 1.0
    for t in np.linspace(0.0, t_end, frames):
        s = 1.0 - np.exp(-t / t_end)
        x = (1 - s) * x0 + s * target
        yield t, x / np.linalg.norm(x, axis=1, keepdims=True)


def fake_log(times: np.ndarray, heads: int, n: int) -> dict[str, np.ndarray]:
    log = {"step": np.arange(times.size), "time": times, "energy": 1 + np.tanh(times)}
    for h in range(heads):
        log[f"energy_h{h}"] = (1 + np.tanh(times)) / heads
        log[f"radial_dominance_h{h}"] = 0.3 * np.exp(0.5 * times) * (1 + 0.2 * h)
        log[f"entropy_mean_h{h}"] = np.log(n) * (1 - 0.5 * np.exp(-times * (1 + h)))
    return log


def measure(d: int, n: int, frames: int, out: Path, **cfg) -> tuple[float, float, float]:
    """(wall frames/s, render-process CPU s/frame, ffmpeg CPU s/frame)."""
    heads, t_end = 3, 10.0
    info = RunInfo("benchmark", 1.0, "exp", heads, n, d, "sphere")
    data = list(fake_frames(n, d, frames + 1, t_end))
    times = np.array([t for t, _ in data])
    log = fake_log(times, heads, n)
    with Animation(out, RenderConfig(**cfg), info, t_end=t_end) as anim:
        t, x = data[0]
        anim.add_frame(x, t, {k: v[:1] for k, v in log.items()})           # warm-up
        start = time.perf_counter()
        cpu0 = time.process_time()
        child0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        for i, (t, x) in enumerate(data[1:], start=2):
            anim.add_frame(x, t, {k: v[:i] for k, v in log.items()})
    elapsed = time.perf_counter() - start                                  # incl. closing
    cpu = time.process_time() - cpu0
    child1 = resource.getrusage(resource.RUSAGE_CHILDREN)                  # ffmpeg, reaped at close
    ffmpeg = (child1.ru_utime + child1.ru_stime) - (child0.ru_utime + child0.ru_stime)
    return frames / elapsed, cpu / frames, ffmpeg / frames


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--profile", action="store_true", help="print a cProfile of the d=3 case")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cases = [("d=3 sphere", 3, {}), ("d=3 sphere, rotate + trails=8", 3, {"rotate": True, "trails": 8}),
                 ("d=8 pca", 8, {})]
        if args.profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            measure(3, args.n, args.frames, Path(tmp) / "p.mp4")
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
            return
        print(f"mp4 1280x720, {args.frames} frames after 1 warm-up; wall-clock frames/s depend on what else "
              "runs;\nCPU ms/frame: this process (drawing) and ffmpeg (encoding, in parallel)")
        for label, d, cfg in cases:
            fps, cpu, ff = measure(d, args.n, args.frames, Path(tmp) / f"d{d}.mp4", **cfg)
            print(f"{label:32s} n={args.n}: {fps:6.1f} frames/s   CPU/frame: draw {1e3 * cpu:5.1f} ms, "
                  f"ffmpeg {1e3 * ff:5.1f} ms")


if __name__ == "__main__":
    main()
