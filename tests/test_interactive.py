"""The view you can turn (issue 32): one self-contained offline HTML file, tested as a page in
a real headless browser (Debian's chromium) where one is installed: the tokens drawn in
their colours, the slider's last frame reached, no error in the console, nothing fetched."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from render.colors import TokenColorizer
from render.config import RenderConfig, RunInfo

BROWSER = next((shutil.which(b) for b in ("chromium", "chromium-browser") if shutil.which(b)), None)
needs_browser = pytest.mark.skipif(BROWSER is None, reason="no chromium installed (apt-get install chromium)")
URL = re.compile(r"(?:https?:)?//[A-Za-z0-9.-]+\.[a-z]{2,}[^\s\"'<>)]*")


def _collapsing(n=24, d=3, frames=12, seed=0):
    """Tokens moving from random points towards two poles: clusters that form."""
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal((n, d))
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    target = np.where((np.arange(n) % 2 == 0)[:, None], np.eye(d)[0], -np.eye(d)[0])
    out = []
    for s in np.linspace(0.0, 1.0, frames):
        x = (1 - s) * x0 + s * target + 1e-9
        out.append(x / np.linalg.norm(x, axis=1, keepdims=True))
    return np.linspace(0.0, 5.0, frames), np.stack(out)


def _labels(x, threshold=0.99):
    """Components of cos > threshold (a tiny independent labeller for the test)."""
    n = len(x)
    g = x @ x.T > threshold
    labels = -np.ones(n, int)
    for i in range(n):
        if labels[i] < 0:
            stack, labels[i] = [i], i
            while stack:
                j = stack.pop()
                for k in np.flatnonzero(g[j] & (labels < 0)):
                    labels[k] = i
                    stack.append(k)
    return labels


def _page(tmp_path, d=3, color_by="cluster"):
    from render.interactive import interactive_html
    times, x = _collapsing(d=d)
    info = RunInfo("probe", 2.0, "softmax", 2, x.shape[1], d)
    cfg = RenderConfig(color_by=color_by)
    values = [{"cluster": _labels(f)} for f in x] if color_by == "cluster" else None
    page = interactive_html(times, x, info, cfg, token_values=values)
    path = tmp_path / "view.html"
    path.write_text(page, encoding="utf-8")
    colorizer = TokenColorizer(cfg, info)
    colorizer.prepare(x[0], values[0] if values else None)
    return path, page, colorizer.colors(x[0], values[0] if values else None), x


def _plotly_library() -> str:
    import plotly
    return (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_text(encoding="utf-8")


def test_the_page_is_one_file_that_fetches_nothing(tmp_path):
    """plotly's script is inlined whole; no element loads anything (no src, href or CSS url);
    outside the library there is no address at all, and every address string inside it is
    plotly.js's own (XML namespaces, map tiles and docs links this figure never uses)."""
    path, page, _, x = _page(tmp_path)
    library = _plotly_library()
    assert library in page                                       # the library, inlined, unchanged
    rest = page.replace(library, "")
    assert not URL.search(rest), URL.search(rest)
    assert not re.search(r"\b(?:src|href)\s*=|url\(|@import", rest, flags=re.I)
    assert set(URL.findall(page)) <= set(URL.findall(library))
    assert rest.count('"name":"') >= len(x)                       # one frame per state


@pytest.mark.parametrize("d", [2, 5])
def test_circle_and_pca_pages(tmp_path, d):
    path, page, _, _ = _page(tmp_path, d=d, color_by="index")
    rest = page.replace(_plotly_library(), "")
    assert ('"type":"scatter3d"' in rest) == (d > 2) and ("PC 1" in rest) == (d > 3)


def _chromium(url, *extra) -> subprocess.Popen:
    """The headless browser started on url (its output piped, as text); _finish waits for it."""
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run",
             "--enable-unsafe-swiftshader",                            # WebGL in software, no GPU
             "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9",   # no network
             "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000"]
    return subprocess.Popen([BROWSER, *flags, *extra, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _finish(browser: subprocess.Popen, timeout=120) -> subprocess.CompletedProcess:
    out, err = browser.communicate(timeout=timeout)
    return subprocess.CompletedProcess(browser.args, browser.returncode, out, err)


def _console(stderr: str) -> list[str]:
    """The page's console lines that say something went wrong (uncaught exceptions, console
    errors, failed loads); the browser's own GL driver chatter is not the page's."""
    lines = [ln for ln in stderr.splitlines() if "CONSOLE" in ln and "GL Driver Message" not in ln
             and "willReadFrequently" not in ln]
    return [ln for ln in lines if re.search(r"Uncaught|Error|Failed to load|net::ERR|WebGL is not supported", ln)]


PROBE = """<script>
window.__errors = [];
(function () {
  const error = console.error;
  console.error = function (...a) { window.__errors.push(a.join(" ")); error.apply(console, a); };
  window.addEventListener("error", e => window.__errors.push(String(e.message)));
  window.addEventListener("unhandledrejection", e => window.__errors.push(String(e.reason)));
  window.addEventListener("load", () => setTimeout(() => {
    const gd = document.querySelector(".js-plotly-plot");
    const frames = gd && gd._transitionData ? gd._transitionData._frames.length : -1;
    const last = frames > 0 ? gd._transitionData._frames[frames - 1].name : null;
    const report = (how) => { document.title = "PROBE " + JSON.stringify({errors: window.__errors, frames: frames,
        animated: how, canvases: document.querySelectorAll("canvas").length}); };
    report("not yet");
    const want = gd._transitionData._frames[frames - 1].data[0].x;
    const shown = () => gd.data[gd.data.length - 1].x;
    Plotly.animate(gd, [last], {mode: "immediate", frame: {duration: 0, redraw: true}, transition: {duration: 0}})
      .catch((e) => window.__errors.push(String(e)));
    setTimeout(() => report(JSON.stringify(Array.from(shown())) === JSON.stringify(Array.from(want))
                            ? "last frame" : "not moved"), 1500);
  }, 1500));
})();
</script>"""


def _token_pixels(png: Path, colors: np.ndarray, tol: float = 10.0) -> list[int]:
    import matplotlib.image as mpimg
    img = mpimg.imread(png)[..., :3] * 255.0
    out = []
    for c in np.unique(np.round(np.asarray(colors)[:, :3] * 255.0), axis=0):
        out.append(int((np.abs(img - c).max(axis=-1) <= tol).sum()))
    return out


@needs_browser
def test_a_headless_browser_draws_the_tokens_without_console_errors(tmp_path):
    path, page, colors, x = _page(tmp_path)
    shot = tmp_path / "shot.png"
    # the page with a probe: console errors caught in the page, the slider's last frame reached;
    # both browsers at once (each mostly waits: ~16 s one after the other)
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("<head>", "<head>" + PROBE, 1), encoding="utf-8")
    browsers = [_chromium(path.as_uri(), f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                          "--window-size=1000,800"),
                _chromium(probe.as_uri(), f"--user-data-dir={tmp_path / 'profile2'}", "--dump-dom")]
    try:
        proc, probed = _finish(browsers[0]), _finish(browsers[1])
    finally:
        for browser in browsers:
            if browser.poll() is None:
                browser.kill()
                browser.communicate()
    assert shot.is_file(), proc.stderr[-2000:]
    assert _console(proc.stderr) == []
    counts = _token_pixels(shot, colors)
    assert len(counts) >= 2 and min(counts) >= 15, counts     # every colour of the first frame drawn
    proc = probed
    title = re.search(r"<title>PROBE (.*?)</title>", proc.stdout)
    assert title, proc.stderr[-2000:]
    import json
    import html
    report = json.loads(html.unescape(title.group(1)))
    assert report == {"errors": [], "frames": len(x), "animated": "last frame", "canvases": report["canvases"]}
    assert report["canvases"] >= 1
    assert _console(proc.stderr) == []


def test_particles_render_html_writes_the_view_of_a_run(tmp_path):
    from cli_runner import particles_cli
    run = tmp_path / "run"
    proc = particles_cli("run", "quickstart", "--out", run, "--steps", 20, "--no-render", "--quiet")
    assert proc.returncode == 0, proc.stderr
    proc = particles_cli("render", run, "--html")
    assert proc.returncode == 0, proc.stderr
    page = (run / "view.html").read_text(encoding="utf-8")
    rest = page.replace(_plotly_library(), "")
    assert "quickstart" in rest and "clusters of 2 or more tokens" in rest and not URL.search(rest)
    proc = particles_cli("render", run, "--html", "--out", tmp_path / "view.mp4")
    assert proc.returncode == 2 and "an .html file" in proc.stderr
