"""Damage inside what a checkpoint counts is caught (issue 27): the checkpoint records a hash of
the log prefix and of each trajectory chunk it counts, and its tokens are cross-checked with
the trajectory's frame of the same step; a mismatch falls back or refuses, with a message."""
import io
import json
import shutil

import numpy as np
import pytest

from particles.app.cli import main


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    out = tmp_path_factory.mktemp("hashes") / "run"
    assert main(["run", "quickstart", "--set", "tokens.n=8", "--set", "log.every=1",
                 "--set", "log.trajectory_every=5", "--steps", "40", "--checkpoint-every", "10",
                 "--no-render", "--quiet", "--out", str(out)]) == 0
    return out


def garble_log(run):
    data = bytearray((run / "log.csv").read_bytes())
    i = data.index(b"\n", data.index(b"\n") + 1) + 3       # inside the first row
    data[i] = ord("7") if data[i] != ord("7") else ord("8")
    (run / "log.csv").write_bytes(bytes(data))


def nan_chunk(run):
    path = sorted((run / "trajectory").glob("chunk_*.npz"))[0]
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["tokens"] = np.full_like(arrays["tokens"], np.nan)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    path.write_bytes(buf.getvalue())


def other_step_tokens(run):
    for name in ("checkpoint.npz", "previous-checkpoint.npz"):
        with np.load(run / name) as z:
            tokens, state = z["tokens"], z["state"]
        other = np.roll(tokens, 1, axis=-2)
        buf = io.BytesIO()
        np.savez(buf, tokens=other, state=state)
        (run / name).write_bytes(buf.getvalue())


@pytest.mark.parametrize("damage", [garble_log, nan_chunk, other_step_tokens])
def test_damage_inside_the_counted_part_is_refused(base, tmp_path, capsys, damage):
    run = tmp_path / "run"
    shutil.copytree(base, run)
    info = json.loads((run / "run.json").read_text())
    info.update(status="interrupted")
    (run / "run.json").write_text(json.dumps(info))
    damage(run)
    capsys.readouterr()
    code = main(["resume", str(run), "--steps", "50", "--no-render", "--quiet"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and ("hash differs" in err or "differ from the trajectory" in err), (code, err)
