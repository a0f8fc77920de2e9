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

BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def readme_notebook():
    """A notebook of the README's "From Python" block, then one cell per line of its notebook
    block ("In a notebook, one cell per line")."""
    import nbformat
    block = next(b for b in BLOCKS if "sim.run(" in b)
    lines = [ln for ln in next(b for b in BLOCKS if "res.animate()" in b).splitlines() if ln.strip()]
    cells = [nbformat.v4.new_code_cell(block.strip())] + [nbformat.v4.new_code_cell(c) for c in lines]
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


def _cell(nb, code):
    """The cell whose code (its comment left out) is ``code``, or starts with it (``code`` ending in '(')."""
    def match(source):
        text = source.split("  #")[0].strip()
        return text == code or (code.endswith("(") and text.startswith(code))
    return next(c for c in nb.cells if match(c.source))


@pytest.mark.slow
def test_readme_notebook_cells_display_what_they_are(tmp_path):
    """Every cell of the README's notebook block runs in a kernel and shows what its comment
    says; the figures are saved beside the notebook (figure_*.png) to be looked at."""
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    import base64
    nb = execute(readme_notebook(), tmp_path)
    assert not any(o["output_type"] == "error" for c in nb.cells for o in c.outputs), \
        [o for c in nb.cells for o in c.outputs if o["output_type"] == "error"]
    assert "eps" in "".join(o.get("text", "") for o in nb.cells[0].outputs)        # the block's print
    sim_html, = outputs(_cell(nb, "sim"), "text/html")
    assert "Simulation" in sim_html and "softmax" in sim_html and "<table" in sim_html
    progress = "".join(o.get("text", "") for o in _cell(nb, "res = sim.run(").outputs)
    assert "300/300" in progress                                                  # the bar
    res_html, = outputs(_cell(nb, "res"), "text/html")
    assert "Result" in res_html and "<table" in res_html and "trajectory" in res_html
    for k, code in enumerate(("res.summary()", "ens.plot(", "rr.result.summary()")):
        png, = outputs(_cell(nb, code), "image/png")                           # drawn once, not twice
        (tmp_path / f"figure_{k}.png").write_bytes(base64.b64decode(png))
    video, = outputs(_cell(nb, "res.animate()"), "text/html")
    assert video.startswith("<video") and "data:video/mp4;base64," in video
    (tmp_path / "film.mp4").write_bytes(base64.b64decode(video.split("base64,")[1].split('"')[0]))
    page = (tmp_path / "view.html").read_text(encoding="utf-8")
    assert "<script src=" not in page and "plotly" in page
    rr_html, = outputs(_cell(nb, "rr"), "text/html")
    assert "RunResult" in rr_html and "completed" in rr_html and "<table" in rr_html
