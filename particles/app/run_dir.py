"""Where a run's files go: the run directory, and trimming a log back to a checkpoint."""
from __future__ import annotations

import time
from pathlib import Path

from particles.output import atomic_write_text


def new_run_dir(scene, out: str | Path | None) -> Path:
    """``out``, else the scene's output.run_dir, else <output.dir>/<name>-<time>; created."""
    output = scene.output
    if out is not None:
        run_dir = Path(out)
    elif output.run_dir:
        run_dir = Path(output.run_dir)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = Path(output.dir) / f"{scene.name}-{stamp}"
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def truncate_log(log_path: Path, rows: int) -> None:
    """Drop log rows written after the checkpoint (they will be recomputed identically)."""
    log_path = Path(log_path)
    if not log_path.exists():
        return
    lines = log_path.read_text().splitlines(keepends=True)
    keep = lines[:1 + rows]
    if len(keep) != len(lines):
        atomic_write_text(log_path, "".join(keep))
