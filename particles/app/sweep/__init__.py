"""Parameter sweeps: a scene plus axes, batched into ensemble work units, results streamed
to a resumable table.

    from particles.app.sweep import load_sweep, run_sweep
    table = run_sweep("phase_diagram_1head", "sweeps/pd1")       # -> sweeps/pd1/results.csv

One module per concept: ``format`` (the file format, its keys and errors), ``spec`` (reading and
validating a file into a ``Sweep``), ``grid`` (axes -> grid points -> work units), ``executors``
(running a unit through the drive loop; local and Ray executors), ``store`` (the results table,
its ledger and repair), ``runner`` (``run_sweep``), ``cli``, ``plots``.
"""
from .cli import cli_sweep, default_out_dir
from .format import LEDGER, META, RESULTS, SWEEP_LIBRARY, SweepError
from .runner import run_sweep
from .spec import Sweep, bundled_sweeps, load_sweep
from .store import ResultStore, is_sweep_dir, load_results, read_meta

__all__ = ["Sweep", "SweepError", "load_sweep", "run_sweep", "load_results", "read_meta",
           "is_sweep_dir", "bundled_sweeps", "cli_sweep", "default_out_dir", "ResultStore", "LEDGER",
           "META", "RESULTS", "SWEEP_LIBRARY"]
