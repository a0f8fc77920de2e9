"""Time to the first logged step of every bundled scene, with a cold kernel cache.

    python benchmarks/first_step.py [SCENE ...] [--json out.json]

Each scene runs as a user runs it, `particles run SCENE --steps 1 --no-render --quiet`, in a
fresh process whose Taichi kernel cache (TI_OFFLINE_CACHE_FILE_PATH) is a new, empty folder,
so everything it needs is compiled: the wall time is what a user waits for before the first
logged step (interpreter start, imports, model files, build, warm-up, one step, summary).
The CPU time (user + system of the child) is printed beside it, since on a shared machine the
wall time also counts other work; so is the load average before and after each scene.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from step import cpu_model  # noqa: E402


def first_step(scene: str) -> dict:
    """One cold run of `scene`: wall and CPU seconds, exit code, load before and after."""
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "TI_OFFLINE_CACHE_FILE_PATH": cache, "PARTICLES_TUNING": "off"}
        load_before = os.getloadavg()[0]
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "particles", "run", scene, "--steps", "1",
                               "--no-render", "--quiet", "--out", str(Path(out) / "run")],
                              env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    return {"scene": scene, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "exit": proc.returncode,
            "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
            "error": proc.stderr.strip().splitlines()[-1] if proc.returncode else ""}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scenes", nargs="*", help="bundled scene names (default: every bundled scene)")
    p.add_argument("--json", type=Path, help="also write the records here")
    args = p.parse_args(argv)
    from scenes import bundled_scenes
    names = args.scenes or sorted(bundled_scenes())
    print(f"# {cpu_model()}, {os.cpu_count()} cores; cold kernel cache per scene", flush=True)
    print("| scene | wall s | CPU s | load before / after |", flush=True)
    print("|---|---|---|---|", flush=True)
    records = []
    for name in names:
        r = first_step(name)
        records.append(r)
        note = f" (exit {r['exit']}: {r['error']})" if r["exit"] else ""
        print(f"| `{name}` | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['load_before']:.1f} / {r['load_after']:.1f} |{note}",
              flush=True)
    if records:
        worst = max(records, key=lambda r: r["wall_s"])
        print(f"\nslowest: {worst['scene']} {worst['wall_s']:.1f} s wall, {worst['cpu_s']:.1f} s CPU; "
              f"{sum(r['wall_s'] <= 60 for r in records)} of {len(records)} within 60 s")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_model(), "cores": os.cpu_count(), "records": records}, indent=1))
    return 1 if any(r["exit"] for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
