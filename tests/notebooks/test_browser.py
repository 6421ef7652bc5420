"""Notebook 05 in a real JupyterLab, driven by headless Debian Chromium through Playwright.

The server binds 127.0.0.1 with a token and serves a copy of the notebook (JupyterLab autosaves, and the
committed notebook must stay without outputs). The page may reach that server only; everything else is aborted.
"""
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from mtplab.model import checkpoint as ckpt
from tests.notebooks.test_report import browser_missing, chromium_page

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "05_acceptance_lab.ipynb"
SHOT = ROOT / "build" / "browser_05_acceptance_lab.png"
SHOTS = ROOT / "build" / "screenshots"  # one per checked behaviour (issue 20)

pytestmark = [pytest.mark.browser, pytest.mark.skipif(bool(browser_missing()), reason=browser_missing() or "ok")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_server(url: str, proc: subprocess.Popen, log: Path, timeout: float = 90) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"jupyter lab did not answer within {timeout} s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server by its pid (it shuts its kernels down), SIGKILL if it hangs."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@contextlib.contextmanager
def jupyter_lab(tmp_path: Path, notebook: Path = NOTEBOOK):
    """A JupyterLab server on 127.0.0.1 with a token, serving a copy of `notebook` from tmp_path/notebooks.
    Yields (base URL, token, log path); stops the server (by its pid) on the way out."""
    ckpt.resolve("meta-k4")  # fail fast with the checkpoint message, not after a long wait for the notebook
    root = tmp_path / "notebooks"
    root.mkdir(parents=True)
    shutil.copy2(notebook, root / NOTEBOOK.name)
    # no "would you like news?" toast over the notebook
    news = tmp_path / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text('{"fetchNews": "false"}')
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces")}
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--LabApp.extension_manager=readonly"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = tmp_path / "jupyter.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=root)
    try:
        wait_for_server(f"http://127.0.0.1:{port}/api/status?token={token}", proc, log)
        yield f"http://127.0.0.1:{port}", token, log
    finally:
        stop(proc)


def run_notebook(page, base: str, token: str):
    """Open the served notebook, run every cell, and wait until its last cell's summary is drawn and the kernel
    is idle. Returns the status bar."""
    page.goto(f"{base}/lab/tree/{NOTEBOOK.name}?token={token}")
    status = page.locator("#jp-main-statusbar")
    status.get_by_text("Idle").wait_for()  # the kernel is up
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.locator("li[data-command='runmenu:run-all']").click()
    # the last cell renders the summary: every cell above it has run
    page.locator(".jp-OutputArea-output h2", has_text="What we learnt").wait_for()
    status.get_by_text("Idle").wait_for()
    return status


@pytest.fixture
def lab_server(tmp_path):
    with jupyter_lab(tmp_path) as server:
        yield server


def pixels(img) -> str:
    """The image as the page drew it (a PNG data URL of its pixels)."""
    return img.evaluate("(im) => { const c = document.createElement('canvas'); c.width = im.naturalWidth; "
                        "c.height = im.naturalHeight; c.getContext('2d').drawImage(im, 0, 0); return c.toDataURL(); }")


def test_acceptance_lab_in_jupyterlab(lab_server):
    base, token, log = lab_server
    local = (base, base.replace("http", "ws"), "data:", "blob:")
    with chromium_page(allow=local) as (page, blocked):
        page.set_default_timeout(120_000)
        status = run_notebook(page, base, token)

        lab = page.locator(".mtplab-lab")
        lab.scroll_into_view_if_needed()
        state = lab.locator(".mtplab-status")
        rows = lab.locator(".mtplab-tokens .mtplab-step-row")
        chart = lab.locator("img.mtplab-acceptance")
        # widget views fill in after the kernel goes idle: wait for the state to arrive, then check it
        page.wait_for_function("() => (document.querySelector('.mtplab-lab .mtplab-status') || {}).innerText"
                               " && document.querySelector('.mtplab-lab .mtplab-status').innerText.includes('step ')")
        assert "step 4/" in state.inner_text() and rows.count() == 4, state.inner_text()  # FIRST_STEPS revealed
        chart_before, tokens_before = pixels(chart), lab.locator(".mtplab-tokens").inner_html()

        k_box = lab.locator(".mtplab-k input")
        cells = page.locator(".jp-Notebook .jp-Cell").count()
        step = lab.locator(".mtplab-step")

        def status_shows(text):
            page.wait_for_function("(t) => document.querySelector('.mtplab-status').innerText.includes(t)", arg=text)

        # bad input: a k the checkpoint cannot draft shows a message, not a traceback
        k_box.fill("9")
        k_box.press("Enter")
        step.click()
        status_shows("at most")
        assert "⚠" in state.inner_text() and rows.count() == 0
        assert page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").count() == 0

        # change k, then step twice: the token view and the acceptance chart follow
        k_box.fill("2")
        k_box.press("Enter")
        status_shows("not decoded")
        step.click()
        status_shows("step 1/")
        step.click()
        status_shows("step 2/")
        assert "⚠" not in state.inner_text() and rows.count() == 2
        assert lab.locator(".mtplab-tokens").inner_html() != tokens_before
        for i in range(2):  # k=2: at most one draft a step
            assert rows.nth(i).locator(".mtplab-accepted, .mtplab-rejected, .mtplab-discarded").count() <= 1
        assert rows.nth(1).locator(".mtplab-tok").count() >= 1
        status.get_by_text("Idle").wait_for()  # iopub is ordered: every widget update of the clicks came before
        assert pixels(chart) != chart_before  # the picture itself changed, not only its blob URL
        SHOT.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(SHOT), full_page=False)
        assert SHOT.stat().st_size > 10_000
        SHOTS.mkdir(parents=True, exist_ok=True)

        def shot(name):
            status.get_by_text("Idle").wait_for()
            lab.scroll_into_view_if_needed()
            path = SHOTS / f"jupyterlab_{name}.png"
            page.screenshot(path=str(path), full_page=False)
            assert path.stat().st_size > 10_000

        def rows_are(n):  # the status line is drawn last, but each widget's view updates on its own
            page.wait_for_function("(n) => document.querySelectorAll('.mtplab-lab .mtplab-tokens .mtplab-step-row')"
                                   ".length == n", arg=n)
            return True

        # step forward and back: the rows follow, the same decode
        step.click()
        status_shows("step 3/")
        assert rows_are(3)
        row_html = rows.nth(2).inner_html()
        lab.locator(".mtplab-back").click()
        status_shows("step 2/")
        assert rows_are(2)
        step.click()
        status_shows("step 3/")
        assert rows_are(3) and rows.nth(2).inner_html() == row_html
        assert "ms (target" in rows.nth(2).inner_text()  # the step's own wall time, target and drafter
        shot("step_forward_back")

        # the slider: type a step into its readout (jump to step n)
        readout = lab.locator(".mtplab-slider .widget-readout")
        readout.click()
        page.keyboard.press("Control+A")
        page.keyboard.type("6")
        page.keyboard.press("Enter")
        status_shows("step 6/")
        assert rows_are(6)
        shot("slider_jump")

        # a keyboard shortcut: with the focus in the lab, ArrowLeft is Back and ArrowRight is Step
        lab.locator(".mtplab-step").focus()
        page.keyboard.press("ArrowLeft")
        status_shows("step 5/")
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowRight")
        status_shows("step 7/")
        assert rows_are(7)
        assert page.locator(".jp-Notebook .jp-Cell").count() == cells  # JupyterLab's own shortcuts did not fire
        shot("keyboard")

        # every row is reachable by scrolling: the box starts at the newest row, step 0 is up the scroll
        box = lab.locator(".mtplab-tokens .mtplab-rows")
        assert box.evaluate("b => getComputedStyle(b).overflowY") == "auto"
        rows.nth(0).scroll_into_view_if_needed()
        assert rows.nth(0).is_visible() and "prefill" in rows.nth(0).inner_text()
        assert rows.nth(0).locator(".mtplab-prefill").count() == 1  # the prefill's token in its own colour

        # the k clamp: deepseek's default checkpoint takes k <= 2; k=4 is clamped, with a one-line note
        k_box.fill("4")
        k_box.press("Enter")
        status_shows("k=4")
        lab.locator(".mtplab-method select").select_option("deepseek")
        page.wait_for_function("() => document.querySelector('.mtplab-note').innerText.includes('k set to 2')")
        assert k_box.input_value() == "2" and "⚠" not in state.inner_text()
        # a new method starts at its step 0 (not at step 7 of a decode the reader has not seen); Step shows step 1
        status_shows("not decoded")
        assert rows_are(0)
        page.wait_for_function("() => document.querySelector('.mtplab-lab .mtplab-slider .widget-readout')"
                               ".innerText.trim() == '0'")  # the slider is back at step 0 too
        step.click()
        status_shows("step 1/")
        assert rows_are(1)
        assert "deepseek k=2" in state.inner_text()
        shot("k_clamp")

        # a new seed changes a sampled decode (Reset replays it)
        lab.locator(".mtplab-method select").select_option("draft-model")
        temp = lab.locator(".mtplab-temperature input")
        temp.fill("1")
        temp.press("Enter")
        status_shows("not decoded")
        for _ in range(5):
            step.click()
        status_shows("step 5/")
        before = lab.locator(".mtplab-tokens .mtplab-text").inner_text()
        assert lab.locator(".mtplab-tokens .mtplab-draws").count() >= 1  # p(d), q(d), u printed under the rows
        lab.locator(".mtplab-new-sample").click()
        status_shows("seed 1: step 5/")
        assert lab.locator(".mtplab-seed input").input_value() == "1"
        assert lab.locator(".mtplab-tokens .mtplab-text").inner_text() != before
        shot("new_sample")
    print(f"blocked requests: {blocked}")
