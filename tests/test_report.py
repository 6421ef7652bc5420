"""The offline report: papermill runs, HTML export with live widgets, an index; checked in headless Chromium
with every request that is not a local file aborted."""
import contextlib
import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from mtplab.model import checkpoint as ckpt
from tools import report

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
INSTALL = "run: bash scripts/install_browser.sh"

needs_js = pytest.mark.skipif(not (report.HTML_MANAGER / "embed-amd.js").exists() or not report.REQUIRE_JS.exists(),
                              reason=f"widget manager JavaScript not in vendor/node_modules; {INSTALL}")


def browser_missing() -> str:
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} is missing; {INSTALL}"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return f"the playwright Python package is missing; {INSTALL}"
    return ""


@contextlib.contextmanager
def chromium_page(allow=("file:", "data:", "blob:")):
    """A headless Debian Chromium page whose requests to anything but `allow` prefixes are aborted.
    Yields (page, blocked): blocked lists the URLs it tried to fetch and did not get."""
    from playwright.sync_api import sync_playwright

    blocked = []

    def route(r):
        if r.request.url.startswith(allow):
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1400})
            page.route("**/*", route)
            yield page, blocked
        finally:
            browser.close()


def tiny_notebook(path: Path, *, fail: bool = False) -> Path:
    cells = [
        new_markdown_cell("# A tiny notebook\nA slider and a plot."),
        new_code_cell("SMOKE = False\nN = 3", metadata={"tags": ["parameters"]}),
        new_code_cell("import ipywidgets as w\nslider = w.IntSlider(value=N + 4, description='n').add_class('tiny')\n"
                      "slider"),
        new_code_cell("%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, N])\nplt.show()"),
        new_code_cell("print('SMOKE is', SMOKE)" + ("\nraise RuntimeError('boom in the tiny notebook')" * fail)),
    ]
    nb = new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                            "language": "python"}})
    nbformat.write(nb, str(path))
    return path


def test_external_references_finds_cdn_loads():
    page = ('<script src="static/require.js"></script><script src="https://cdn.example/x.js"></script>'
            '<link rel="stylesheet" href="//fonts.example/css"><a href="https://arxiv.org/abs/1811.03115">paper</a>'
            '<img src="data:image/png;base64,AAAA">')
    assert report.external_references(page) == ["https://cdn.example/x.js", "//fonts.example/css"]


@needs_js
def test_report_runs_exports_and_indexes(tmp_path):
    ok = tiny_notebook(tmp_path / "a_tiny.ipynb")
    bad = tiny_notebook(tmp_path / "b_broken.ipynb", fail=True)
    out = tmp_path / "build"
    assert report.main([str(ok), str(bad), "--out", str(out), "--smoke", "-p", "N=5"]) == 1  # one failed
    page = (out / "a_tiny.html").read_text()
    assert report.external_references(page) == []
    assert 'src="static/require.js"' in page and "static/embed-amd.js" in page
    assert "application/vnd.jupyter.widget-state+json" in page and "data:image/png;base64," in page
    executed = nbformat.read(str(out / "executed" / "a_tiny.ipynb"), as_version=4)
    state = executed.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    sliders = [m for m in state.values() if m["model_name"] == "IntSliderModel"]
    assert [m["state"]["value"] for m in sliders] == [9]  # N=5 was injected, and the widget state was saved
    assert "SMOKE is True" in "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    index = (out / "index.html").read_text()
    assert "href='a_tiny.html'" in index and "href='b_broken.html'" in index
    assert "boom in the tiny notebook" in index and "<tr class='failed'>" in index and "1 of 2 notebooks ran" in index
    assert (out / "static" / "embed-amd.js").stat().st_size > 1_000_000


@needs_js
@pytest.mark.skipif(bool(browser_missing()), reason=browser_missing() or "ok")
def test_report_widgets_render_offline_in_chromium(tmp_path):
    out = tmp_path / "build"
    [r] = report.build([tiny_notebook(tmp_path / "tiny.ipynb")], out=out)
    assert r.status == "ok" and r.widgets >= 1
    shutil.rmtree(out / "executed")  # the pages must not need anything but static/
    with chromium_page() as (page, blocked):
        page.goto((out / "index.html").as_uri())
        page.click("text=tiny")
        slider = page.wait_for_selector(".jupyter-widgets.tiny.widget-slider", timeout=30_000)
        assert slider.query_selector(".widget-readout").inner_text().strip() == "7"
        assert page.locator("img[src^='data:image/png']").count() >= 1
        page.screenshot(path=str(out / "tiny.png"))
        assert blocked == []  # it tried to fetch nothing from the network


@needs_js
@pytest.mark.slow
@pytest.mark.skipif(bool(browser_missing()), reason=browser_missing() or "ok")
def test_acceptance_lab_renders_offline(tmp_path):
    ckpt.resolve("meta-k4")  # fail fast with the checkpoint message, not after a long wait for the notebook
    out = tmp_path / "build"
    [r] = report.build([report.NOTEBOOKS / "05_acceptance_lab.ipynb"], out=out, parameters={"SMOKE": True})
    assert r.status == "ok", r.message
    with chromium_page() as (page, blocked):
        page.goto((out / "05_acceptance_lab.html").as_uri())
        lab = page.wait_for_selector(".mtplab-lab", timeout=30_000)
        assert lab.query_selector(".mtplab-method select") is not None
        assert len(lab.query_selector_all(".mtplab-tokens .mtplab-step-row")) == 4  # FIRST_STEPS
        assert "step 4/" in lab.query_selector(".mtplab-status").inner_text()
        assert lab.query_selector(".mtplab-acceptance img, img.mtplab-acceptance") is not None
        assert blocked == []
