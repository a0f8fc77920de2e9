"""`particles sweep`: run a sweep file and print where its results went."""
from __future__ import annotations

import time
from pathlib import Path



from .format import LEDGER
from .runner import run_sweep
from .spec import Sweep, load_sweep
from .store import read_meta


def default_out_dir(sweep: Sweep) -> Path:
    """sweeps/<name> under the current folder: fixed, so rerunning the command resumes."""
    return Path("sweeps") / sweep.name


def cli_sweep(args) -> int:
    """`particles sweep SWEEP_FILE [--executor local|ray] [--address ADDR] [--out DIR]
    [--workers N]`: args has sweep_file, executor, address, out, workers. Prints progress and a
    summary; returns 0 when every unit is done, 130 on Ctrl-C. User mistakes raise SweepError
    (a SceneError); Ray missing raises SweepError too."""
    sweep = load_sweep(args.sweep_file)
    out = Path(args.out) if getattr(args, "out", None) else default_out_dir(sweep)
    executor = getattr(args, "executor", None) or "local"
    t0 = time.perf_counter()
    try:
        table = run_sweep(sweep, out, executor=executor, address=getattr(args, "address", None),
                          workers=getattr(args, "workers", None), echo=print,
                          verbose=bool(getattr(args, "verbose", False)))
    except KeyboardInterrupt:
        print(f"interrupted; finished units are saved in {out}. Run the same command again to "
              "continue (finished units are skipped).")
        return 130
    meta = read_meta(out)
    last = meta.get("last_run", {})
    wall = time.perf_counter() - t0
    rate = last.get("replicas_per_second")
    lines = [f"sweep {meta['status']}: {meta['units_done']}/{meta['units']} units, "
             f"{meta['replicas']} replicas ({last.get('replicas_run', 0)} run now in {wall:.1f} s"
             + (f", {rate:.1f} replicas/s" if rate else "") + ")",
             f"  results: {table}",
             f"  ledger:  {out / LEDGER}",
             f"  plot:    particles plot {out}"]
    print("\n".join(lines))
    return 0 if meta["status"] == "completed" else 1
