"""Screenshots of the acceptance lab at a projector's size, for docs/screenshots/ (issue 31: the projector mode
checked in JupyterLab and Chromium).

    python scripts/widget_screenshots.py                 # the three pictures into docs/screenshots/
    python scripts/widget_screenshots.py --out build/shots

* `jupyterlab_projector.png`: notebook 05 (a copy with SMOKE = True and PROJECTOR = True) run in a real JupyterLab
  under headless Chromium (the browser test's server, tests/notebooks/test_browser.py), the lab after four steps;
* `jupyterlab_projector_sampled.png`: the same lab switched to the draft model at T = 1, five steps on, scrolled
  to its last sampled correction: p(d), q(d), u and the residual norm(max(0, p - q)) the correction was drawn from;
* `offline_lab.png`: the offline page (`tools.report`, no kernel) after its first four steps.

The window is 1280 x 800, a common projector resolution. A picture over 300 KB is stored with a 256-colour
palette. Needs what the browser test needs (`bash scripts/install_browser.sh`); takes about two minutes.
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

VIEWPORT = {"width": 1280, "height": 800}  # a projector's 720p/WXGA
MAX_BYTES = 300_000


def save(page, path: Path) -> Path:
    """A viewport screenshot, palette-quantized when it is larger than MAX_BYTES."""
    page.screenshot(path=str(path), full_page=False)
    if path.stat().st_size > MAX_BYTES:
        from PIL import Image
        Image.open(path).convert("RGB").quantize(colors=256).save(path, optimize=True)
    print(f"{path} ({path.stat().st_size // 1024} KB)")
    return path


def projector_notebook(src: Path, dst: Path) -> Path:
    """Notebook 05 with SMOKE and PROJECTOR set in its parameters cell (the committed notebook is not touched)."""
    import nbformat
    nb = nbformat.read(src, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    for name in ("SMOKE", "PROJECTOR"):
        cell.source, n = re.subn(rf"^{name} = False", f"{name} = True", cell.source, flags=re.M)
        if n != 1:
            raise SystemExit(f"{src.name}: no '{name} = False' line in the parameters cell")
    nbformat.write(nb, dst)
    return dst


def live(out: Path, tmp: Path) -> list[Path]:
    from tests.notebooks.test_browser import NOTEBOOK, jupyter_lab, run_notebook
    from tests.notebooks.test_report import chromium_page

    notebook = projector_notebook(NOTEBOOK, tmp / NOTEBOOK.name)
    shots = []
    with jupyter_lab(tmp / "server", notebook) as (base, token, _log):
        local = (base, base.replace("http", "ws"), "data:", "blob:")
        with chromium_page(allow=local) as (page, _blocked):
            page.set_viewport_size(VIEWPORT)
            page.set_default_timeout(180_000)
            status = run_notebook(page, base, token)
            lab = page.locator(".mtplab-lab")

            def status_shows(text):
                try:
                    page.wait_for_function("(t) => (document.querySelector('.mtplab-lab .mtplab-status') || {})"
                                           ".innerText.includes(t)", arg=text, timeout=60_000)
                except Exception:
                    page.screenshot(path=str(tmp.parent / "widget_screenshots_failed.png"))
                    shown = lab.locator(".mtplab-status").all_inner_texts() if lab.count() else "no lab on the page"
                    raise SystemExit(f"the lab's status never said {text!r}: {shown} (screenshot: "
                                     f"{tmp.parent / 'widget_screenshots_failed.png'})") from None

            def show_lab():
                status.get_by_text("Idle").wait_for()
                lab.evaluate("e => e.scrollIntoView({block: 'start'})")
                page.mouse.move(0, 0)  # no hover title over the chips

            lab.scroll_into_view_if_needed()  # JupyterLab draws a widget's view only once it is on screen
            status_shows("step 4/")
            show_lab()
            shots.append(save(page, out / "jupyterlab_projector.png"))
            lab.locator(".mtplab-method select").select_option("draft-model")
            temperature = lab.locator(".mtplab-temperature input")
            temperature.fill("1")
            temperature.press("Enter")
            status_shows("not decoded")
            lab.locator(".mtplab-step").click()
            status_shows("step 1/")
            for n in range(2, 6):
                lab.locator(".mtplab-step").click()
                status_shows(f"step {n}/")
            show_lab()
            rows = lab.locator(".mtplab-step-row")
            corrected = lab.locator(".mtplab-step-row:has(.mtplab-residual)")
            (corrected if corrected.count() else rows).last.evaluate("e => e.scrollIntoView({block: 'start'})")
            shots.append(save(page, out / "jupyterlab_projector_sampled.png"))
    return shots


def offline(out: Path, tmp: Path) -> Path:
    from tests.notebooks.test_report import chromium_page
    from tools import report

    path = tmp / "acceptance_lab.html"
    report.write_offline_page(path, report.offline_lab_html(report.offline_decodes(device="cpu")))
    with chromium_page() as (page, _blocked):
        page.set_viewport_size(VIEWPORT)
        page.goto(path.as_uri())
        page.locator("#mtplab-offline-lab").scroll_into_view_if_needed()
        return save(page, out / "offline_lab.png")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        shots = [offline(a.out, tmp), *live(a.out, tmp)]
    too_big = [p for p in shots if p.stat().st_size > MAX_BYTES]
    if too_big:
        print(f"over {MAX_BYTES // 1000} KB even with a palette: {', '.join(map(str, too_big))}")
    return 1 if too_big else 0


if __name__ == "__main__":
    raise SystemExit(main())
