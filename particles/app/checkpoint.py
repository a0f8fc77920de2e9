"""Checkpoints of a run directory: never a moment without one on disk, never one trusted blindly.

checkpoint.npz holds the tokens in the simulation's dtype (exact) and a JSON state: the step,
the log's rows and bytes in total (across resumes), the trajectory's frames and next chunk,
the summary's full state and a fingerprint of the scene. It is written only at a state the
drive loop has fully served (every row before it handed out, every writer flushed and the log
fsynced), so what it counts is on disk. A new checkpoint is written beside the old one, the
old one becomes previous-checkpoint.npz, then the new one takes its name.

On resume a checkpoint is validated (step range, shapes, dtype, finite tokens on the sphere,
the scene's fingerprint, the log and trajectory it counts); a bad one falls back to the
previous one with a message, and with neither the user gets a clear error.
"""
from __future__ import annotations

import copy
import hashlib
import io
import json
from pathlib import Path

import numpy as np

from particles.drive import AT_END, Every, Writer
from particles.output import (RunFileError, atomic_write_bytes, check_log_prefix, count_frames,
                              open_run_file)

from .run_dir import read_run_json

CHECKPOINT = "checkpoint.npz"
PREVIOUS_CHECKPOINT = "previous-checkpoint.npz"
UNUSABLE = "unusable-checkpoint.npz"
FORMAT = 2
_SUMMARY_KEYS = ("first_energy", "last_energy", "final_eps", "max_dominance", "monotone", "previous")
_COUNTS = ("step", "log_rows", "log_bytes", "trajectory_frames", "trajectory_chunk")


# Keys of a scene that do not change the computed trajectory or the files a checkpoint counts:
# editing them in a run's scene.toml does not block its resume. [render] makes only the video,
# and a resumed run's video goes to a file of its own.
HARMLESS_KEYS = ("name", "description", "render")


class SceneFingerprint(str):
    """A scene's hash (the string itself), with ``keys`` (a short hash per key, so that a
    refusal can name the keys that differ) and ``legacy`` (the hash of versions that counted
    every key, so that their checkpoints still resume)."""
    keys: dict
    legacy: str


def _hash(value) -> str:
    text = json.dumps(value, sort_keys=True, default=lambda o: np.asarray(o).tolist())
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _flat(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def scene_fingerprint(scene) -> SceneFingerprint:
    """A hash of the resolved scene, less its length (``resume --steps`` may change that),
    whether it ends with a checkpoint (a choice of files; older runs' scenes lack the key)
    and HARMLESS_KEYS."""
    data = copy.deepcopy(scene.data if hasattr(scene, "data") else scene)
    data.get("dynamics", {}).pop("steps", None)
    data.get("dynamics", {}).pop("t_end", None)
    data.get("output", {}).pop("final_checkpoint", None)
    legacy = _hash(data)
    for key in HARMLESS_KEYS:
        data.pop(key, None)
    fingerprint = SceneFingerprint(_hash(data))
    fingerprint.keys = {key: _hash(value)[:12] for key, value in _flat(data).items()}
    fingerprint.legacy = legacy
    return fingerprint


def _scene_differs(state: dict, fingerprint) -> str | None:
    """None when the checkpoint was written for this scene, else a reason naming the keys."""
    if state.get("scene") == fingerprint or state.get("scene") == getattr(fingerprint, "legacy", None):
        return None
    theirs, ours = state.get("scene_keys"), getattr(fingerprint, "keys", None)
    if not isinstance(theirs, dict) or not isinstance(ours, dict):
        return ("it was written for a different scene (scene.toml changed since; this checkpoint "
                "predates the record of which keys)")
    differ = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
    shown = ", ".join(differ[:8]) + (f" and {len(differ) - 8} more" if len(differ) > 8 else "")
    return (f"it was written for a different scene: scene.toml's {shown} "
            f"{'differs' if len(differ) == 1 else 'differ'} from the run's (keys that change the "
            "computed run; name, description and [render] may change). Restore "
            f"{'it' if len(differ) == 1 else 'them'}, or run the edited scene anew")


_PREFIX: dict = {}   # log path -> (bytes hashed, sha256 object): each checkpoint hashes only new bytes
_CHUNKS: dict = {}   # (chunk path, size, mtime) -> sha256 hex: a chunk is written once, atomically


def log_prefix_sha256(path: Path, size: int) -> str:
    """sha256 of the first ``size`` bytes of the log (incremental across checkpoints)."""
    key = str(Path(path).resolve())
    done, h = _PREFIX.get(key, (0, None))
    if h is None or size < done:
        done, h = 0, hashlib.sha256()
    with open(path, "rb") as fh:
        fh.seek(done)
        while done < size:
            block = fh.read(min(1 << 20, size - done))
            if not block:
                break
            h.update(block)
            done += len(block)
    _PREFIX[key] = (done, h)
    return h.copy().hexdigest()


def chunk_sha256(traj_dir: Path, count: int) -> list[str]:
    """sha256 of each of the first ``count`` trajectory chunks."""
    from particles.output import chunk_name
    out = []
    for index in range(count):
        path = Path(traj_dir) / chunk_name(index)
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        if key not in _CHUNKS:
            _CHUNKS[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        out.append(_CHUNKS[key])
    return out


def content_hashes(run_dir: Path, log_bytes: int, chunks: int) -> dict:
    """The hashes a checkpoint records of what it counts (the log prefix, each chunk)."""
    run_dir = Path(run_dir)
    out = {"log_sha256": log_prefix_sha256(run_dir / "log.csv", log_bytes)}
    if chunks:
        out["chunk_sha256"] = chunk_sha256(run_dir / "trajectory", chunks)
    return out


def _check_content(tokens, state: dict, run_dir: Path) -> None:
    """The counted log prefix and chunks hash as recorded, and the tokens equal the
    trajectory's frame of the same step where the last counted chunk holds one."""
    if "log_sha256" in state:
        _PREFIX.pop(str((run_dir / "log.csv").resolve()), None)   # read afresh, never trusted
        if log_prefix_sha256(run_dir / "log.csv", state["log_bytes"]) != state["log_sha256"]:
            raise RunFileError("the part of log.csv it counts was changed since it was written "
                               "(its hash differs)")
    recorded = state.get("chunk_sha256")
    if recorded is not None:
        if not isinstance(recorded, list) or len(recorded) != state["trajectory_chunk"]:
            raise RunFileError("its trajectory chunk hashes are malformed")
        _CHUNKS.clear()
        for index, (want, have) in enumerate(zip(recorded, chunk_sha256(run_dir / "trajectory",
                                                                         len(recorded)))):
            if want != have:
                raise RunFileError(f"trajectory chunk {index} was changed since it was written "
                                   "(its hash differs)")
    # the frame of the checkpoint's step is written just after it (checkpoints are served
    # first), so it lies in the last counted chunk or the next one, whole (chunks are atomic)
    from particles.output import chunk_name
    for index in (state["trajectory_chunk"] - 1, state["trajectory_chunk"]):
        path = run_dir / "trajectory" / chunk_name(index)
        if index < 0 or not path.is_file() or path.is_symlink():
            continue
        try:
            with np.load(path, allow_pickle=False) as chunk:
                steps, frames = chunk["steps"], chunk["tokens"]
        except Exception:  # noqa: BLE001 - a damaged chunk is named by count_frames or cut away
            continue
        hit = np.flatnonzero(steps == state["step"])
        if hit.size and frames[hit[-1]].size == tokens.size and frames.dtype == tokens.dtype \
                and not np.array_equal(frames[hit[-1]].reshape(tokens.shape), tokens):
            raise RunFileError(f"its tokens differ from the trajectory's frame of the same step "
                               f"{state['step']}")


def write_checkpoint(run_dir: Path, tokens: np.ndarray, state: dict) -> None:
    buf = io.BytesIO()
    np.savez(buf, tokens=tokens, state=np.array(json.dumps({"format": FORMAT, **state})))
    path, previous = Path(run_dir) / CHECKPOINT, Path(run_dir) / PREVIOUS_CHECKPOINT
    fresh = path.with_name(path.name + ".new")
    atomic_write_bytes(fresh, buf.getvalue())
    if path.exists() and not path.is_symlink():
        path.replace(previous)  # keep the last good one
    fresh.replace(path)


def _set_aside(path: Path) -> None:
    """Move an unusable newest checkpoint out of the rotation, so the next checkpoint does not
    push the good previous one out in its favour."""
    if path.is_symlink():
        path.unlink()
    elif path.exists():
        path.replace(path.with_name(UNUSABLE))


def read_checkpoint_file(path: Path) -> tuple[np.ndarray, dict]:
    """The tokens and state of one checkpoint file (RunFileError if it is a link or unreadable)."""
    if path.is_symlink():   # a planted link is an unusable checkpoint: fall back, never follow it
        raise RunFileError(f"{str(path)!r} is a symbolic link, not a checkpoint file")
    try:   # open_run_file: a FIFO or device is refused, not waited on (resume hung)
        with open_run_file(path) as fh, np.load(fh, allow_pickle=False) as data:
            tokens, state = data["tokens"], json.loads(str(data["state"]))
    except Exception as err:  # noqa: BLE001 - truncated zips, bad headers, bad JSON alike
        raise RunFileError(f"it cannot be read ({type(err).__name__}: {err})") from None
    if not isinstance(state, dict):
        raise RunFileError("its state is not a JSON object")
    return tokens, state


def validate(tokens, state: dict, *, run_dir: Path, sim, steps_total: int, fingerprint: str,
             columns: list[str], trajectory: bool) -> None:
    """RunFileError naming the first thing in this checkpoint that does not fit the run."""
    if state.get("format") != FORMAT:
        raise RunFileError(f"it has format {state.get('format')!r}, this version writes {FORMAT}")
    for key in _COUNTS:
        value = state.get(key)
        if type(value) is not int or value < 0:
            raise RunFileError(f"'{key}' is {value!r}, expected a whole number >= 0")
    if state["step"] > steps_total:
        raise RunFileError(f"it is at step {state['step']}, past the run's {steps_total} steps "
                           f"(extend the run with `particles resume --steps N`, N >= {state['step']})")
    differs = _scene_differs(state, fingerprint)
    if differs:
        raise RunFileError(differs)
    summary = state.get("summary")
    if not isinstance(summary, dict) or not all(k in summary for k in _SUMMARY_KEYS) or \
            not isinstance(summary["max_dominance"], list) or len(summary["max_dominance"]) != sim.n_heads \
            or not isinstance(summary["previous"], list) \
            or not all(isinstance(p, list) and len(p) == 3 for p in summary["previous"]):
        raise RunFileError("its summary state is missing or malformed")
    shape = (sim.n_replicas, sim.n, sim.d)
    if not isinstance(tokens, np.ndarray) or tokens.shape != shape:
        raise RunFileError(f"its tokens have shape {getattr(tokens, 'shape', None)}, the run has {shape}")
    if tokens.dtype != np.dtype(sim.dtype):
        raise RunFileError(f"its tokens are {tokens.dtype}, the run computes in {sim.dtype}")
    if not np.all(np.isfinite(tokens)):
        raise RunFileError("its tokens hold NaN or Inf")
    if sim.geometry == "sphere" and sim.normalisation not in ("pre", "peri"):   # there |x| is state
        err = float(np.max(np.abs(np.linalg.norm(tokens.astype(np.float64), axis=-1) - 1.0)))
        if err > (1e-4 if sim.dtype == "float32" else 1e-10):
            raise RunFileError(f"its tokens are not on the unit sphere (|x| - 1 up to {err:.3g})")
    check_log_prefix(Path(run_dir) / "log.csv", columns, state["log_rows"], state["log_bytes"])
    if trajectory:
        frames = count_frames(Path(run_dir) / "trajectory", state["trajectory_chunk"])
        if frames != state["trajectory_frames"]:
            raise RunFileError(f"it counts {state['trajectory_frames']} trajectory frames in "
                               f"{state['trajectory_chunk']} chunks, which hold {frames}")
    _check_content(tokens, state, Path(run_dir))
    if sim.stepper is not None:   # last: the controller's state is taken from the one that passes
        try:
            sim.stepper.restore(state.get("adaptive") or {})
        except ValueError as err:
            raise RunFileError(str(err)) from None


def read_checkpoint(run_dir: Path, echo=print, **context) -> tuple[np.ndarray, dict]:
    """(tokens, state) of the newest checkpoint in ``run_dir`` that passes ``validate``;
    RunFileError (with each one's reason) when none does."""
    run_dir = Path(run_dir)
    reasons = []
    for name in (CHECKPOINT, PREVIOUS_CHECKPOINT):
        path = run_dir / name
        if not path.exists() and not path.is_symlink():
            reasons.append(f"{name}: missing")
            continue
        try:
            tokens, state = read_checkpoint_file(path)
            validate(tokens, state, run_dir=run_dir, **context)
        except RunFileError as err:
            reasons.append(f"{name}: {err}")
            continue
        if reasons:
            _set_aside(run_dir / CHECKPOINT)
            if echo is not None:
                echo(f"warning: {reasons[-1]}; resuming from {name} (step {state['step']}) "
                     f"instead (the unusable one is kept as {UNUSABLE})")
        return tokens, state
    if all(r.endswith(": missing") for r in reasons):
        if read_run_json(run_dir).get("status") == "completed":
            raise RunFileError(
                f"{str(run_dir)!r} holds a completed run without a checkpoint: it is complete, "
                "and extending it with `particles resume --steps N` needs the final checkpoint a "
                "run writes at its end, which this one did not write (its scene says [output] "
                "final_checkpoint = false, or an older version made it). Run the scene again with "
                "more steps instead: particles run SCENE --steps N")
        raise RunFileError(f"no checkpoint in {str(run_dir)!r} (expected {CHECKPOINT}; run with "
                           "--checkpoint-every N to write them, or interrupt with Ctrl-C, which "
                           "writes one)")
    raise RunFileError(f"cannot resume {str(run_dir)!r}: no usable checkpoint. "
                       + "; ".join(reasons))


class CheckpointWriter(Writer):
    """Every k steps after the start (k = 0: never), and at the end (so `resume --steps` can
    extend a run).

    ``state_of()`` returns the JSON state to save; the drive loop hands out every row and
    flushes every writer before this one is served, so the state covers all of it.
    """

    flush_first = True

    def __init__(self, run_dir: Path, every: int, state_of):
        self.run_dir, self.every, self.state_of = Path(run_dir), int(every), state_of
        self.trigger = Every(self.every) | AT_END if self.every else AT_END
        self.sim = None
        self.start_step = 0

    def start(self, sim, step, end):
        self.sim, self.start_step = sim, step

    def on_state(self, state):
        s = state.step
        if s == self.start_step and not (s == state.end and self.every and s % self.every):
            return  # the run starts from this state: nothing new to save
        self.save()

    def save(self) -> None:
        write_checkpoint(self.run_dir, self.sim.native_tokens(), self.state_of())
