"""The offline report: papermill runs, HTML export with live widgets, an index; checked in headless Chromium
with every request that is not a local file aborted."""
import contextlib
import json
import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from mtplab.model import checkpoint as ckpt
from mtplab.paths import DECODE_JSON
from tests.conftest import random_model
from tools import report

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "build" / "screenshots"
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
    SHOTS.mkdir(parents=True, exist_ok=True)
    with chromium_page() as (page, blocked):
        page.goto((out / "05_acceptance_lab.html").as_uri())
        lab = page.wait_for_selector(".mtplab-lab", timeout=30_000)
        assert lab.query_selector(".mtplab-method select") is not None
        assert len(lab.query_selector_all(".mtplab-tokens .mtplab-step-row")) == 4  # FIRST_STEPS
        assert "step 4/" in lab.query_selector(".mtplab-status").inner_text()
        assert lab.query_selector(".mtplab-acceptance img, img.mtplab-acceptance") is not None
        assert page.locator(".mtplab-needs-kernel").count() >= 1  # the saved widget says it needs a kernel
        # the offline lab in the built page steps forward and back with no kernel
        off = page.locator("#mtplab-offline-lab")
        readout = off.locator(".mtplab-offline-readout")
        rows = off.locator(".mtplab-offline-decode:visible .mtplab-step-row:visible")
        assert readout.inner_text().startswith("step 4/") and rows.count() == 4
        off.locator(".mtplab-offline-slider").fill("9")
        assert readout.inner_text().startswith("step 9/") and rows.count() == 9
        off.locator(".mtplab-back").click()
        assert readout.inner_text().startswith("step 8/") and rows.count() == 8
        off.locator(".mtplab-step").click()
        page.keyboard.press("ArrowRight")
        assert readout.inner_text().startswith("step 10/")
        off.scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / "report_05_offline_lab.png"))
        assert blocked == []
    index = (out / "index.html").read_text()
    assert "href='acceptance_lab.html'" in index and (out / "acceptance_lab.html").exists()


# ---------------------------------------------------------------------------------- issue 20: the front page
def test_the_front_page_tells_the_story(tmp_path):
    out = tmp_path / "build"
    [r] = report.build([tiny_notebook(tmp_path / "a_tiny.ipynb")], out=out)
    assert r.status == "ok" and r.teaches == "A tiny notebook" and r.thumb == "thumbs/a_tiny.png"
    assert (out / r.thumb).stat().st_size > 100
    index = (out / "index.html").read_text()
    assert "<img class='thumb' src='thumbs/a_tiny.png'" in index and "A tiny notebook" in index
    assert "make lab" in index and "needs a kernel" in index and "Everything here reads offline" not in index
    record = json.loads(DECODE_JSON.read_text())
    for row in record["rows"]:  # the headline table: every method's tokens per forward and wall clock vs AR
        assert f"<td>{row['method']}</td>" in index and f"{row['speedup_wall']:.2f}x" in index
        assert f"{row['tokens_per_forward']:.2f}" in index
    assert report.bench_machine(record) in index
    page = (out / "a_tiny.html").read_text()
    label = page.index("mtplab-needs-kernel")
    assert label < page.index('<script type="application/vnd.jupyter.widget-view+json">')
    assert "acceptance_lab.html" not in index  # no notebook 05 here: no offline lab


def test_the_headline_names_its_machine(tmp_path):
    rec = {"device": "cpu", "threads": 1, "rows": [{"method": "meta", "k": 4, "tokens_per_forward": 2.4,
                                                    "speedup_wall": 0.85, "speedup_predicted": 1.1}]}
    path = tmp_path / "decode.json"
    path.write_text(json.dumps(rec))
    assert "device cpu, 1 thread" in report.headline_table(path)
    rec["machine"] = {"cpu": "AMD EPYC 9654", "cores": 2, "threads": 1, "device": "cpu", "torch": "2.13.0"}
    path.write_text(json.dumps(rec))
    table = report.headline_table(path)
    assert "AMD EPYC 9654, cpu, 1 of 2 cores, torch 2.13.0" in table and "0.85x" in table and "2.40" in table
    assert "could not be read" in report.headline_table(tmp_path / "missing.json")


def test_key_figure_prefers_a_tagged_cell():
    import base64

    def cell(png, tags=()):
        c = new_code_cell("", metadata={"tags": list(tags)})
        c.outputs = [nbformat.v4.new_output("display_data", data={"image/png": base64.b64encode(png).decode()})]
        return c
    nb = new_notebook(cells=[cell(b"big" * 100), cell(b"small", ["key-figure"])])
    assert report.key_figure(nb) == b"small"
    nb.cells[1].metadata["tags"] = []
    assert report.key_figure(nb) == b"big" * 100


@pytest.fixture(scope="module")
def offline_models():
    from mtplab.teaching.acceptance_lab.session import ModelCache
    return ModelCache(models={("stern-k4", "cpu"): random_model("stern", 4, seed=4, noise=2.0),
                              ("ntp", "cpu"): random_model(seed=0), ("draft", "cpu"): random_model(seed=5)})


def offline_page(tmp_path, offline_models):
    items = [("blockwise-overlap k=4", dict(method="blockwise-overlap", k=4, prompt="def add(a, b):\n")),
             ("draft-model, T = 1", dict(method="draft-model", k=4, temperature=1.0, prompt="def add(a, b):\n")),
             ("broken", dict(method="meta", k=4, checkpoint="no-such-checkpoint"))]  # its message is listed
    decodes = report.offline_decodes(items=items, models=offline_models, max_new_tokens=24)
    section = report.offline_lab_html(decodes)
    path = tmp_path / "acceptance_lab.html"
    report.write_offline_page(path, section)
    return decodes, path


def test_the_offline_lab_is_pre_rendered_per_method(tmp_path, offline_models):
    decodes, path = offline_page(tmp_path, offline_models)
    ok = [d for d in decodes if "error" not in d]
    assert len(ok) == 2 and "error" in decodes[2]
    for d in ok:
        assert len(d["status"]) == len(d["text"]) == d["steps"] + 1
        assert d["rows"].count("mtplab-step-row") == d["steps"] and "step 0/" in d["status"][0]
    page = path.read_text()
    assert report.external_references(page) == [] and "Needs a kernel" in page and "make lab" in page
    assert page.count("class='mtplab-offline-decode'") == 2 and "mtplab-residual" in page  # the sampled one


@pytest.mark.skipif(bool(browser_missing()), reason=browser_missing() or "ok")
def test_the_offline_lab_steps_in_chromium_without_a_kernel(tmp_path, offline_models):
    _, path = offline_page(tmp_path, offline_models)
    SHOTS.mkdir(parents=True, exist_ok=True)
    with chromium_page() as (page, blocked):
        page.goto(path.as_uri())
        lab = page.locator("#mtplab-offline-lab")
        readout = lab.locator(".mtplab-offline-readout")
        rows = lab.locator(".mtplab-offline-decode:visible .mtplab-step-row:visible")
        assert readout.inner_text().startswith("step 4/") and rows.count() == 4
        lab.locator(".mtplab-step").click()
        assert readout.inner_text().startswith("step 5/") and rows.count() == 5
        lab.locator(".mtplab-back").click()
        lab.locator(".mtplab-back").click()
        assert readout.inner_text().startswith("step 3/") and rows.count() == 3
        lab.locator(".mtplab-offline-slider").fill("7")
        assert readout.inner_text().startswith("step 7/") and rows.count() == 7 and "step 7/" in lab.locator(
            ".mtplab-status").inner_text()
        lab.locator(".mtplab-step").focus()
        page.keyboard.press("ArrowRight")
        assert readout.inner_text().startswith("step 8/")
        page.keyboard.press("Home")
        assert readout.inner_text().startswith("step 0/") and rows.count() == 0
        page.keyboard.press("End")
        n = int(readout.inner_text().split("/")[1])
        assert rows.count() == n
        lab.locator(".mtplab-offline-method").select_option(index=1)  # the sampled decode: p, q, u and the residual
        assert "draft-model" in lab.locator(".mtplab-status").inner_text()
        assert readout.inner_text().startswith("step 4/") and rows.count() == 4  # a new method opens at its start
        assert lab.locator(".mtplab-offline-decode:visible .mtplab-draws").count() >= 1
        lab.locator(".mtplab-offline-projector").check()  # projector mode: the same rows in 24 px chips
        assert rows.count() == 4 and "24px" in lab.locator(".mtplab-offline-decode:visible .mtplab-size-projector"
                                                             ).inner_html()
        page.screenshot(path=str(SHOTS / "offline_lab_tiny.png"))
        assert blocked == []


def test_the_headline_carries_the_real_models_best_exact_row(tmp_path):
    """build/index.html's headline names SmolLM2's best exact row from docs/bench/real.json, read, not written in."""
    import json
    from mtplab.teaching import real
    shipped = real.REAL_JSON
    if not shipped.is_file():
        pytest.skip("no bench real record")
    rec = json.loads(shipped.read_text())
    best = real.best_row(rec)
    html_ = report.real_headline(shipped)
    assert best["label"] in html_ and f"{best['speedup']:.2f}x" in html_ and "1 of 2 cores" in html_
    # another record, another row: the headline follows the record
    other = next(r for r in real.exact_rows(rec) if r["label"] != best["label"])
    for r in rec["rows"]:
        if r["label"] == other["label"]:
            r["speedup"] = 9.99
    (tmp_path / "real.json").write_text(json.dumps(rec))
    assert f"{other['label']}</td>" in report.real_headline(tmp_path / "real.json")
    assert "could not be read" in report.real_headline(tmp_path / "missing.json")
    # rows of other heads than the shipped ones: the headline says so and how to measure the shipped ones
    for r in rec["rows"]:
        r["heads_sha256"] = "0" * 64 if r.get("family") else r.get("heads_sha256")
    (tmp_path / "real.json").write_text(json.dumps(rec))
    assert "measured with other heads" in report.real_headline(tmp_path / "real.json")
    assert real.RERUN in report.real_headline(tmp_path / "real.json")
