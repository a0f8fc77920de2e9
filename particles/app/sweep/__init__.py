"""Parameter sweeps: a scene plus axes, batched into ensemble work units, results streamed
to a resumable table.

    from particles.app.sweep import load_sweep, run_sweep
    table = run_sweep("phase_diagram_1head", "sweeps/pd1")       # -> sweeps/pd1/results.csv
"""
from .spec import (ABORT_ENV, LEDGER, META, RESULTS, SWEEP_LIBRARY, Sweep, SweepAborted, SweepError,
                   bundled_sweeps, cli_sweep, is_sweep_dir, load_results, load_sweep, read_meta,
                   run_sweep)

__all__ = ["Sweep", "SweepError", "SweepAborted", "load_sweep", "run_sweep", "load_results",
           "read_meta", "is_sweep_dir", "bundled_sweeps", "cli_sweep", "ABORT_ENV", "LEDGER", "META",
           "RESULTS", "SWEEP_LIBRARY"]
