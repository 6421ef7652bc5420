"""The report: run every notebook, export each to HTML with its plots and live widgets, link them from an index.
A build tool, not part of the library (hence tools/, not mtplab/).

    python -m tools.report                 # every notebooks/*.ipynb with its own defaults, into build/
    python -m tools.report --smoke         # the same with SMOKE=True (short runs, for CI)
    python -m tools.report -p DEVICE=cpu notebooks/05_acceptance_lab.ipynb

Layout of the output folder (build/ by default, git-ignored):
    index.html               one row per notebook: link, status, run time
    NAME.html                the executed notebook, plots embedded, widgets live
    executed/NAME.ipynb      the executed notebook, widget state saved in its metadata
    static/                  require.js and the jupyter-widgets HTML manager, copied from vendor/node_modules

Everything the pages load comes from static/: nbconvert's template points at a CDN for require.js, MathJax,
mermaid and the widget manager; we point the widget manager and require.js at local copies and the rest
at nothing (TeX in markdown shows as typed), so the report reads offline. The JavaScript comes from npm:
`scripts/install_browser.sh` installs it into vendor/node_modules.
Widget state is saved by nbclient (`store_widget_state`, on by default) while papermill executes.
"""
from __future__ import annotations

import argparse
import ast
import html
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
BUILD = ROOT / "build"
NODE_MODULES = ROOT / "vendor" / "node_modules"
HTML_MANAGER = NODE_MODULES / "@jupyter-widgets" / "html-manager" / "dist"
REQUIRE_JS = NODE_MODULES / "requirejs" / "require.js"
STATIC = "static"

# a page may load nothing from another host: these attributes are where it would
_EXTERNAL = re.compile(r"""<(script|link|img|iframe)\b[^>]*?\b(src|href)\s*=\s*["']((?:https?:)?//[^"']+)["']""",
                       re.IGNORECASE)


@dataclass
class Result:
    """What happened to one notebook."""
    name: str
    status: str = "ok"        # 'ok' or 'failed'
    seconds: float = 0.0      # papermill execution, kernel start included
    message: str = ""         # the error, when failed
    html: str = ""            # NAME.html, relative to the output folder ('' if no HTML was written)
    widgets: int = 0          # widget models saved in the executed notebook
    external: list[str] = field(default_factory=list)  # URLs the HTML would fetch from another host (must be [])


def external_references(page: str) -> list[str]:
    """URLs of scripts, stylesheets, images and frames that a page would fetch from another host."""
    return [m.group(3) for m in _EXTERNAL.finditer(page)]


def copy_static(out: Path) -> bool:
    """Copy require.js and the widget manager into out/static; False if they are not installed."""
    if not (HTML_MANAGER / "embed-amd.js").exists() or not REQUIRE_JS.exists():
        return False
    static = out / STATIC
    static.mkdir(parents=True, exist_ok=True)
    shutil.copy2(REQUIRE_JS, static / "require.js")
    # embed-amd.js is the whole manager with the core widgets. Its Font Awesome files (widget icons) are
    # looked up beside the page, not beside the script, so we leave them out: mtplab's widgets use no icons.
    shutil.copy2(HTML_MANAGER / "embed-amd.js", static / "embed-amd.js")
    license_file = HTML_MANAGER.parent / "LICENSE"
    if license_file.exists():
        shutil.copy2(license_file, static / "LICENSE.jupyter-widgets.txt")
    return True


def exporter():
    """nbconvert's lab HTML exporter, with every CDN URL pointing at out/static (or at nothing)."""
    from nbconvert import HTMLExporter

    exp = HTMLExporter(template_name="lab")
    exp.embed_images = True                                    # markdown images as data: URIs
    exp.require_js_url = f"{STATIC}/require.js"
    exp.widget_renderer_url = f"{STATIC}/embed-amd.js"
    exp.jupyter_widgets_base_url = f"{STATIC}/"                # unused once widget_renderer_url is set
    exp.mathjax_url = ""                                       # no MathJax offline: TeX shows as typed
    exp.mermaid_js_url = ""                                    # loaded only for mermaid diagrams; we have none
    exp.mermaid_layout_elk_js_url = ""
    exp.jquery_url = ""
    return exp


def execute(src: Path, dst: Path, parameters: dict, timeout: float | None) -> tuple[str, str]:
    """Run one notebook with papermill; returns (status, message). A failing notebook is still saved."""
    import papermill as pm

    try:
        pm.execute_notebook(str(src), str(dst), parameters=parameters or None, cwd=str(src.parent),
                            progress_bar=False, log_output=False, execution_timeout=timeout)
    except pm.PapermillExecutionError as e:
        return "failed", f"cell {e.exec_count}: {e.ename}: {e.evalue}"
    except Exception as e:  # kernel died, timeout, unreadable notebook: report it, keep building the rest
        return "failed", f"{type(e).__name__}: {e}"
    return "ok", ""


def export(executed: Path, page: Path) -> tuple[int, list[str]]:
    """Write the HTML of an executed notebook; returns (widget models saved, external URLs left)."""
    import nbformat

    nb = nbformat.read(str(executed), as_version=4)
    body, _ = exporter().from_notebook_node(nb)
    page.write_text(body, encoding="utf-8")
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    return len(state.get("state", {})), external_references(body)


def build(notebooks: list[Path] | None = None, *, out: Path = BUILD, parameters: dict | None = None,
          timeout: float | None = None) -> list[Result]:
    """Execute and export every notebook into `out`, write out/index.html, return one Result each."""
    notebooks = sorted(NOTEBOOKS.glob("*.ipynb")) if notebooks is None else [Path(p) for p in notebooks]
    out = Path(out)
    (out / "executed").mkdir(parents=True, exist_ok=True)
    live = copy_static(out)
    results = []
    for src in notebooks:
        r = Result(name=src.stem)
        dst = out / "executed" / src.name
        t0 = time.perf_counter()
        r.status, r.message = execute(src, dst, parameters or {}, timeout)
        r.seconds = time.perf_counter() - t0
        if dst.exists():
            try:
                r.widgets, r.external = export(dst, out / f"{src.stem}.html")
                r.html = f"{src.stem}.html"
            except Exception as e:  # an export error must not hide the other notebooks
                r.status, r.message = "failed", f"HTML export: {type(e).__name__}: {e}"
        if r.external:
            r.status, r.message = "failed", "the HTML loads from another host: " + ", ".join(r.external[:3])
        results.append(r)
    write_index(out / "index.html", results, parameters or {}, live)
    return results


def write_index(path: Path, results: list[Result], parameters: dict, live: bool) -> None:
    rows = []
    for r in results:
        link = f"<a href='{html.escape(r.html)}'>{html.escape(r.name)}</a>" if r.html else html.escape(r.name)
        rows.append(f"<tr class='{r.status}'><td>{link}</td><td>{r.status}</td><td>{r.seconds:.1f} s</td>"
                    f"<td>{r.widgets}</td><td>{html.escape(r.message)}</td></tr>")
    params = ", ".join(f"{k}={v!r}" for k, v in parameters.items()) or "each notebook's defaults"
    note = ("" if live else "<p class='warn'>The widget JavaScript is not installed, so widgets do not render: "
            "run <code>bash scripts/install_browser.sh</code> and build again.</p>")
    n_ok = sum(r.status == "ok" for r in results)
    path.write_text(f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>mtplab report</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 60em; margin: 2em auto; }}
table {{ border-collapse: collapse; width: 100%; }}
td, th {{ border-bottom: 1px solid #ddd; padding: .3em .6em; text-align: left; }}
tr.failed td {{ background: #fde0dd; }} .warn {{ color: #b30000; }}
</style></head><body>
<h1>mtplab report</h1>
<p>{n_ok} of {len(results)} notebooks ran. Built {time.strftime("%Y-%m-%d %H:%M:%S")} with {html.escape(params)}.
Everything here reads offline.</p>{note}
<table><thead><tr><th>notebook</th><th>status</th><th>run time</th><th>widgets</th><th>message</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody></table>
</body></html>
""", encoding="utf-8")


def _parameter(text: str) -> tuple[str, object]:
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name, value  # a bare word is a string: -p DEVICE=cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.report", description=__doc__.split("\n")[0])
    ap.add_argument("notebooks", nargs="*", type=Path, help="notebooks to run (default: notebooks/*.ipynb)")
    ap.add_argument("--out", type=Path, default=BUILD, help="output folder (default: build/)")
    ap.add_argument("--smoke", action="store_true", help="run every notebook with SMOKE=True")
    ap.add_argument("-p", "--parameter", action="append", type=_parameter, default=[], metavar="NAME=VALUE",
                    help="set a notebook parameter (repeatable), e.g. -p DEVICE=cpu")
    ap.add_argument("--timeout", type=float, default=None, help="seconds one cell may run (default: no limit)")
    args = ap.parse_args(argv)
    parameters = dict(args.parameter)
    if args.smoke:
        parameters["SMOKE"] = True
    for nb in args.notebooks:
        if not nb.exists():
            ap.error(f"{nb} does not exist")
    results = build(args.notebooks or None, out=args.out, parameters=parameters, timeout=args.timeout)
    if not results:
        print(f"no notebooks found in {NOTEBOOKS}", file=sys.stderr)
        return 1
    for r in results:
        print(f"{r.status:6s} {r.seconds:6.1f} s  {r.name}" + (f"  ({r.message})" if r.message else ""))
    print(f"report: {(args.out / 'index.html').resolve()}")
    if not (args.out / STATIC / "embed-amd.js").exists():
        print("warning: widget JavaScript missing, widgets will not render; run bash scripts/install_browser.sh",
              file=sys.stderr)
    return 0 if all(r.status == "ok" for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
