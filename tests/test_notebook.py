"""The README's notebook example executed in a Jupyter kernel (nbclient, when installed): the
Simulation, Result and Trajectory display as HTML tables, Result.plot as one PNG, the animation
inline. Slow (a kernel start and a compile); skipped where nbclient or ipykernel is missing."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")

# the cells after the README's "From Python" block: what its notebook paragraph names
CELLS = ["sim", "res", 'res.plot("eps", "energy")',
         "res = sim.run(200, every=10, trajectory_every=5)\nres.trajectory",
         "res.trajectory.animate()"]


def readme_notebook():
    """A notebook of the README's "From Python" block, then one cell per display it speaks of."""
    import nbformat
    block = next(b for b in re.findall(r"```python\n(.*?)```", README, flags=re.S) if "sim.run(" in b)
    cells = [nbformat.v4.new_code_cell(block.strip())] + [nbformat.v4.new_code_cell(c) for c in CELLS]
    return nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3",
                                                                          "display_name": "Python 3"}})


def execute(nb, cwd):
    """Run every cell in a fresh kernel as a Jupyter user has it (matplotlib's inline backend:
    no MPLBACKEND from the test environment)."""
    from nbclient import NotebookClient
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute(env=env)
    return nb


def outputs(cell, kind):
    return [o["data"][kind] for o in cell.outputs if "data" in o and kind in o["data"]]


@pytest.mark.slow
def test_readme_notebook_cells_display_what_they_are(tmp_path):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = execute(readme_notebook(), tmp_path)
    first, sim, res, plot, traj, anim = nb.cells
    assert "eps" in "".join(o.get("text", "") for o in first.outputs)        # the block's print
    assert not any(o["output_type"] == "error" for c in nb.cells for o in c.outputs)
    sim_html, = outputs(sim, "text/html")
    assert "Simulation" in sim_html and "softmax" in sim_html and "<table" in sim_html
    res_html, = outputs(res, "text/html")
    assert "Result" in res_html and "<table" in res_html
    assert len(outputs(plot, "image/png")) == 1                                 # drawn once, not twice
    traj_html, = outputs(traj, "text/html")
    assert "Trajectory" in traj_html
    anim_html, = outputs(anim, "text/html")
    assert "<script" in anim_html and "animation" in anim_html.lower()
