"""Checkpoints of a run directory: never a moment without one on disk.

checkpoint.npz holds the tokens in the simulation's dtype (exact) and a JSON state (step,
log rows written, next trajectory chunk, the summary so far). A new checkpoint is written
beside the old one, the old one becomes previous-checkpoint.npz, then the new one takes its
name; a run killed between the two renames resumes from the previous one.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from particles.drive import AT_END, Every, Writer
from particles.output import atomic_write_bytes

CHECKPOINT = "checkpoint.npz"
PREVIOUS_CHECKPOINT = "previous-checkpoint.npz"


def write_checkpoint(run_dir: Path, tokens: np.ndarray, state: dict) -> None:
    buf = io.BytesIO()
    np.savez(buf, tokens=tokens, state=np.array(json.dumps(state)))
    path, previous = Path(run_dir) / CHECKPOINT, Path(run_dir) / PREVIOUS_CHECKPOINT
    fresh = path.with_name(path.name + ".new")
    atomic_write_bytes(fresh, buf.getvalue())
    if path.exists():
        path.replace(previous)  # keep the last good one
    fresh.replace(path)


def read_checkpoint(run_dir: Path) -> tuple[np.ndarray, dict]:
    """(tokens, state) of the newest complete checkpoint in ``run_dir``."""
    run_dir = Path(run_dir)
    path = run_dir / CHECKPOINT
    if not path.is_file():  # killed between the two renames of write_checkpoint
        path = run_dir / PREVIOUS_CHECKPOINT
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint in {str(run_dir)!r} (expected {CHECKPOINT}; "
                                "run with --checkpoint-every N to write them)")
    with np.load(path) as data:
        return data["tokens"], json.loads(str(data["state"]))


class CheckpointWriter(Writer):
    """Every k steps after the start, and at the end (so `resume --steps` can extend a run).

    ``state_of()`` returns the JSON state to save; the drive loop hands out every row and
    flushes every writer before this one is served, so the state covers all of it.
    """

    flush_first = True

    def __init__(self, run_dir: Path, every: int, state_of):
        self.run_dir, self.every, self.state_of = Path(run_dir), int(every), state_of
        self.trigger = Every(self.every) | AT_END
        self.sim = None
        self.start_step = 0

    def start(self, sim, step, end):
        self.sim, self.start_step = sim, step

    def on_state(self, state):
        s = state.step
        if s == self.start_step and not (s == state.end and s % self.every):
            return  # the run starts from this state: nothing new to save
        self.save()

    def save(self) -> None:
        write_checkpoint(self.run_dir, self.sim.native_tokens(), self.state_of())
