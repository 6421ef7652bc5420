"""The report: run every notebook, export each to HTML with its plots and live widgets, link them from an index.
A build tool, not part of the library (hence tools/, not mtplab/).

    python -m tools.report                 # every notebooks/*.ipynb with its own defaults, into build/
    python -m tools.report --smoke         # the same with SMOKE=True (short runs, for CI)
    python -m tools.report -p DEVICE=cpu notebooks/05_acceptance_lab.ipynb

Layout of the output folder (build/ by default, git-ignored):
    index.html               the front page: one line per notebook on what it teaches, a thumbnail of its key
                             figure, status and run time; the headline table from docs/bench/decode.json with its
                             machine; how to open the lab live (`make lab`)
    NAME.html                the executed notebook, plots embedded, widgets as saved (each labelled: it needs a
                             kernel to respond); 05's page also holds the offline acceptance lab
    acceptance_lab.html      the offline acceptance lab alone: one pre-rendered decode per method, stepped
                             forward and back by a slider, buttons and keys in the browser, with no kernel
    thumbs/NAME.png          the thumbnails
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
import base64
import html
import io
import json
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
    teaches: str = ""         # one line on what the notebook teaches
    thumb: str = ""           # thumbs/NAME.png, its key figure ('' if it has no figure)


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


# one line per notebook on what it teaches (a notebook's metadata "mtplab": {"teaches": ...} overrides it)
TEACHES = {
    "01": "Why decoding is slow: m tokens need m forwards; the KV cache, INT8, the cost curve t(q)/t(1) and the "
          "roofline, and what cutting forwards by 4 buys in seconds.",
    "02": "Stern et al.'s blockwise parallel decoding: heads draft, one forward verifies, the output stays exactly "
          "greedy; forwards 2m/k (plain) and 1 + m/k (overlapped).",
    "03": "Meta's multi-token prediction as a training objective: K heads on one trunk, the loss's shift, the three "
          "head families side by side, and self-speculative decoding.",
    "04": "DeepSeek-V3's sequential MTP modules: eq. 21-23 in code, eq. 24's label layout checked against the model, "
          "teacher forcing against free running.",
    "05": "The acceptance lab: step through a decode, see which drafts the target keeps and why, acceptance by "
          "position with intervals, and where the wall-clock speedup goes.",
    "06": "Speculative sampling that keeps the target's distribution: accept with min(1, p/q), resample from the "
          "residual, and check it with chi-square tests over seeds.",
    "07": "Batches and token trees: ragged batched speculation, where speedup goes as the batch grows, and one "
          "tree-verify step, each checked exact.",
    "08": "Checking a speculative decoder: find the planted bug among eight accept rules, read acceptance "
          "conventions right, estimate acceptance without decoding.",
}
KEY_FIGURE_TAG = "key-figure"  # a cell tagged so gives the notebook's thumbnail; else its largest figure
THUMB_WIDTH = 320
NEEDS_KERNEL = ("<div class='mtplab-needs-kernel' style='background:#fff3cd;border:1px solid #e0c060;padding:2px 6px;"
                "margin:4px 0;font-size:90%'>Needs a kernel: this widget shows the state saved when the report was "
                "built, and its controls do nothing in this page. Open it live with <code>make lab</code>.{extra}</div>")
_VIEW = '<script type="application/vnd.jupyter.widget-view+json">'


def export(executed: Path, page: Path, *, offline: str = "") -> tuple[int, list[str]]:
    """Write the HTML of an executed notebook; returns (widget models saved, external URLs left). Every saved
    widget gets a label saying it needs a kernel; `offline` (05's offline lab) goes before the first one."""
    import nbformat

    nb = nbformat.read(str(executed), as_version=4)
    body, _ = exporter().from_notebook_node(nb)
    body = label_widgets(body, offline)
    page.write_text(body, encoding="utf-8")
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    return len(state.get("state", {})), external_references(body)


def label_widgets(body: str, offline: str = "") -> str:
    """Put the needs-a-kernel label before every saved widget view, and `offline` before the first one."""
    extra = " The acceptance lab steps offline in the section above." if offline else ""
    parts = body.split(_VIEW)
    out = parts[0]
    for i, rest in enumerate(parts[1:]):
        out += (offline if i == 0 else "") + NEEDS_KERNEL.format(extra=extra) + _VIEW + rest
    if offline and len(parts) == 1:  # no widget saved: the offline lab goes at the top of the page
        out = out.replace("<main>", "<main>" + offline, 1) if "<main>" in out else out.replace(
            "</body>", offline + "</body>", 1)
    return out


# ---------------------------------------------------------------------------------- the front page
def teaches(nb, stem: str) -> str:
    """One line on what a notebook teaches: its metadata, else TEACHES, else its title."""
    meta = nb.metadata.get("mtplab")
    if isinstance(meta, dict) and meta.get("teaches"):
        return str(meta["teaches"])
    if stem[:2] in TEACHES:
        return TEACHES[stem[:2]]
    for c in nb.cells:
        if c.cell_type == "markdown":
            for ln in c.source.splitlines():
                if ln.startswith("# "):
                    return ln[2:].split("·", 1)[-1].strip()
    return ""


def key_figure(nb) -> bytes | None:
    """The PNG of the notebook's key figure: the first image of a cell tagged `key-figure`, else the largest."""
    best: tuple[int, bytes] | None = None
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        tagged = KEY_FIGURE_TAG in c.metadata.get("tags", [])
        for o in c.get("outputs", []):
            data = o.get("data", {}).get("image/png") if isinstance(o.get("data"), dict) else None
            if not data:
                continue
            raw = base64.b64decode(data if isinstance(data, str) else "".join(data))
            if tagged:
                return raw
            if best is None or len(raw) > best[0]:
                best = (len(raw), raw)
    return best[1] if best else None


def thumbnail(png: bytes, path: Path, width: int = THUMB_WIDTH) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        from PIL import Image

        im = Image.open(io.BytesIO(png))
        if im.width > width:
            im = im.resize((width, max(1, round(im.height * width / im.width))))
        im.save(path, format="PNG", optimize=True)
    except Exception:  # noqa: BLE001 - no Pillow, or an odd PNG: the full image is still a thumbnail
        path.write_bytes(png)


def bench_machine(record: dict) -> str:
    """The machine a benchmark record names: its 'machine' field once re-measured, else device and threads."""
    m = record.get("machine")
    if isinstance(m, dict):
        bits = [str(m[k]) for k in ("cpu", "device") if m.get(k)]
        if m.get("threads"):
            bits.append(f"{m['threads']} of {m['cores']} cores" if m.get("cores") else f"{m['threads']} threads")
        if m.get("torch"):
            bits.append(f"torch {m['torch']}")
        return ", ".join(bits)
    if isinstance(m, str) and m:
        return m
    threads = record.get("threads", "?")
    return f"device {record.get('device', '?')}, {threads} thread{'' if threads == 1 else 's'}"


def headline_table(path: Path | None = None) -> str:
    """Each method's tokens per forward and wall clock against AR, from the shipped decode benchmark."""
    from mtplab.paths import DECODE_JSON

    path = Path(path or DECODE_JSON)
    try:
        record = json.loads(path.read_text())
        rows = list(record["rows"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return (f"<p class='warn'>No headline table: {html.escape(str(path))} could not be read "
                f"({html.escape(str(e))}).</p>")

    def num(v, fmt):
        return fmt.format(v) if isinstance(v, (int, float)) else "-"

    body = ["<tr><td>ar</td><td>1</td><td>1.00</td><td>1.00x</td><td>1.00x</td></tr>"]
    for r in rows:
        body.append(f"<tr><td>{html.escape(str(r.get('method')))}</td><td>{r.get('k', '-')}</td>"
                    f"<td>{num(r.get('tokens_per_forward'), '{:.2f}')}</td>"
                    f"<td><b>{num(r.get('speedup_wall'), '{:.2f}x')}</b></td>"
                    f"<td>{num(r.get('speedup_predicted'), '{:.2f}x')}</td></tr>")
    what = (f"{record.get('prompts', '?')} held-out prompts, {record.get('max_new_tokens', '?')} new tokens, median of "
            f"{record.get('repeats', '?')} interleaved repeats, {record.get('dtype', '?')}")
    return (f"<table class='headline'><thead><tr><th>method</th><th>k</th><th>tokens per forward</th>"
            f"<th>wall clock against AR</th><th>predicted</th></tr></thead><tbody>{''.join(body)}</tbody></table>"
            f"<p class='small'>From <code>docs/bench/decode.json</code> (<code>python -m mtplab bench decode</code>): "
            f"{html.escape(what)}; measured on <b class='machine'>{html.escape(bench_machine(record))}</b>. The "
            "oracle knows the answer (its acceptance is set, α = 0.8): it checks the theory, it is not a method.</p>")


def real_headline(path: Path | None = None) -> str:
    """The real model's line of the headline: the best exact row of the shipped `bench real` record (SmolLM2 with
    the heads the lab trained on it), beside AR of the same model, read from the record so new heads change it."""
    from mtplab.errors import MtplabError
    from mtplab.teaching import real

    path = Path(path or real.REAL_JSON)
    try:
        record = json.loads(path.read_text())
        best = real.best_row(record)
        ar_ms = record["threads"]["1"]["ar_ms_per_token"]
    except (OSError, ValueError, KeyError, TypeError, MtplabError) as e:
        return (f"<p class='warn'>No real-model row: {html.escape(str(path))} could not be read "
                f"({html.escape(str(e))}).</p>")
    acc = best.get("acceptance", {}).get("pooled", {})
    first = (f"{acc['rate'][0]:.2f}" if acc.get("rate") else "-")
    return (f"<table class='headline'><thead><tr><th>real model</th><th>exact row, highest median</th><th>tokens per forward</th>"
            f"<th>first draft accepted</th><th>wall clock against AR (range)</th><th>= AR</th></tr></thead><tbody>"
            f"<tr><td>SmolLM2-135M-Instruct</td><td>{html.escape(best['label'])}</td>"
            f"<td>{best.get('tokens_per_forward', 0):.2f}</td><td>{first}</td>"
            f"<td><b>{best['speedup']:.2f}x</b> ({best['speedup_min']:.2f}-{best['speedup_max']:.2f})</td>"
            f"<td>{best['identical_to_ar']}/{best['prompts']}</td></tr></tbody></table>"
            f"<p class='small'>{html.escape(real.best_words(record))}. From <code>docs/bench/real.json</code> "
            f"(<code>{html.escape(real.RERUN)}</code>): "
            f"{best['prompts']} held-out chat prompts, at most m = {record.get('m', '?')} new tokens each, 1 thread, "
            f"against AR of the same weights and kernels ({ar_ms:.0f} ms a token); measured on <b class='machine'>"
            f"{html.escape(bench_machine(record['threads']['1']))}</b>. Notebook 01 §6 takes this speedup apart into "
            "acceptance and cost.</p>")


def write_index(path: Path, results: list[Result], parameters: dict, live: bool, *, offline: bool = False) -> None:
    rows = []
    for r in results:
        link = f"<a href='{html.escape(r.html)}'>{html.escape(r.name)}</a>" if r.html else html.escape(r.name)
        thumb = (f"<a href='{html.escape(r.html or r.thumb)}'><img class='thumb' src='{html.escape(r.thumb)}' "
                 f"alt='key figure of {html.escape(r.name)}'></a>" if r.thumb else "")
        rows.append(f"<tr class='{r.status}'><td>{thumb}</td><td>{link}<div class='teaches'>{html.escape(r.teaches)}"
                    f"</div></td><td>{r.status}</td><td>{r.seconds:.1f} s</td><td>{r.widgets}</td>"
                    f"<td>{html.escape(r.message)}</td></tr>")
    params = ", ".join(f"{k}={v!r}" for k, v in parameters.items()) or "each notebook's defaults"
    note = ("" if live else "<p class='warn'>The widget JavaScript is not installed, so widgets do not render: "
            "run <code>bash scripts/install_browser.sh</code> and build again.</p>")
    n_ok = sum(r.status == "ok" for r in results)
    lab_link = ("<a href='acceptance_lab.html'>The acceptance lab, offline</a>: one pre-rendered decode per method, "
                "stepped forward and back by a slider, buttons or keys, with no kernel." if offline else "")
    path.write_text(f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>mtplab report</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 70em; margin: 2em auto; }}
table {{ border-collapse: collapse; width: 100%; }}
td, th {{ border-bottom: 1px solid #ddd; padding: .3em .6em; text-align: left; vertical-align: top; }}
tr.failed td {{ background: #fde0dd; }} .warn {{ color: #b30000; }} .small {{ font-size: 90%; color: #444; }}
img.thumb {{ width: 200px; border: 1px solid #ddd; }} .teaches {{ color: #333; margin-top: .3em; }}
table.headline {{ width: auto; }}
</style></head><body>
<h1>mtplab report</h1>
<p>{n_ok} of {len(results)} notebooks ran. Built {time.strftime("%Y-%m-%d %H:%M:%S")} with {html.escape(params)}.
The pages read offline: figures are embedded and the widget JavaScript is served from <code>static/</code>. A saved
widget shows the state it had when the report was built and is labelled <i>needs a kernel</i>: its controls
respond only in a live notebook. {lab_link}</p>{note}
<h2>Open it live</h2>
<p><code>make lab</code> opens JupyterLab on <code>notebooks/</code> (it needs only python3 and make; the first run
installs the virtualenv). Open a notebook and run all cells: every widget then responds. <code>make run</code>
rebuilds this report (it also needs npm, for the widget JavaScript).</p>
<h2>Headline: tokens per forward and wall clock against AR</h2>
{headline_table()}
{real_headline()}
<h2>The notebooks</h2>
<table class='notebooks'><thead><tr><th>key figure</th><th>notebook: what it teaches</th><th>status</th><th>run time</th>
<th>widgets</th><th>message</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody></table>
</body></html>
""", encoding="utf-8")


# ---------------------------------------------------------------------------------- the offline lab
# (label, LabState settings): one pre-rendered decode each, after the default demo (docs/bench/decode.json's pick)
OFFLINE_DECODES = [
    ("blockwise k=4 (plain schedule)", dict(method="blockwise", k=4)),
    ("meta k=4", dict(method="meta", k=4)),
    ("deepseek D=3, k=4", dict(method="deepseek", k=4, checkpoint="deepseek-d3")),
    ("draft-model k=4, sampled at T = 1", dict(method="draft-model", k=4, temperature=1.0)),
    ("ngram k=4", dict(method="ngram", k=4)),
]
OFFLINE_FIRST = 4  # steps shown when the page opens

_OFFLINE_JS = r"""
(function(){
  var lab = document.getElementById('mtplab-offline-lab');
  if (!lab || lab.dataset.ready) return; lab.dataset.ready = '1';
  var data = JSON.parse(document.getElementById('mtplab-offline-data').textContent);
  var pick = lab.querySelector('.mtplab-offline-method'), slider = lab.querySelector('.mtplab-offline-slider');
  var readout = lab.querySelector('.mtplab-offline-readout'), status = lab.querySelector('.mtplab-status');
  var boxes = lab.querySelectorAll('.mtplab-offline-decode');
  function cur(){ return data[pick.selectedIndex]; }
  function show(n){
    var d = cur(); n = Math.max(0, Math.min(d.steps, n)); slider.max = d.steps; slider.value = n;
    boxes.forEach(function(el, i){ el.style.display = i == pick.selectedIndex ? '' : 'none'; });
    var box = boxes[pick.selectedIndex];
    box.querySelectorAll('.mtplab-step-row').forEach(function(r){ r.style.display = (+r.dataset.step < n) ? '' : 'none'; });
    var text = box.querySelector('.mtplab-text'); if (text) text.innerHTML = d.text[n];
    status.textContent = d.status[n]; readout.textContent = 'step ' + n + '/' + d.steps; lab.dataset.shown = n;
  }
  // a new method opens where the page opened: its first steps, as the live lab restarts a new decode
  pick.addEventListener('change', function(){ show(Math.min(+lab.dataset.first, cur().steps)); });
  lab.querySelector('.mtplab-offline-projector').addEventListener('change', function(e){
    lab.querySelectorAll('.mtplab-size-normal').forEach(function(el){ el.style.display = e.target.checked ? 'none' : ''; });
    lab.querySelectorAll('.mtplab-size-projector').forEach(function(el){ el.style.display = e.target.checked ? '' : 'none'; });
  });
  slider.addEventListener('input', function(){ show(+slider.value); });
  lab.querySelector('.mtplab-step').addEventListener('click', function(){ show(+slider.value + 1); });
  lab.querySelector('.mtplab-back').addEventListener('click', function(){ show(+slider.value - 1); });
  lab.querySelector('.mtplab-reset').addEventListener('click', function(){ show(0); });
  lab.querySelector('.mtplab-run').addEventListener('click', function(){ show(cur().steps); });
  show(+slider.value);
})();
"""


def offline_decodes(*, device: str = "cpu", max_new_tokens: int = 48, items=None, models=None) -> list[dict]:
    """Decode the default demo and every OFFLINE_DECODES entry once, and pre-render each for the browser: the
    rows of every step (hidden and shown by the slider), the text and the status line after each step, and
    the speed chart (tokens per forward, wall clock, time split) of the whole decode."""
    from dataclasses import replace

    from mtplab.teaching.acceptance_lab import session as lab_session, state as lab_state, view as lab_view
    from mtplab.viz.decode import speed_figure
    from mtplab.viz.style import png

    models = models or lab_session.ModelCache()
    if items is None:
        demo = lab_state.DEMO
        items = [(f"the demo: {demo['method']} k={demo['k']}",
                  dict(method=demo["method"], k=demo["k"], checkpoint=demo["checkpoint"]))] + OFFLINE_DECODES
    out = []
    for label, settings in items:
        st = lab_state.run_all(lab_session.decoded(lab_state.LabState(device=device, max_new_tokens=max_new_tokens,
                                                                      repeats=3, **settings), models))
        if st.error:
            out.append({"label": label, "error": st.error})
            continue
        if label.startswith("the demo"):
            st = replace(st, note="the lab's demo: its first four steps show accepted, rejected, discarded and "
                                  "bonus tokens")
        if st.busy:  # the race's own verdict: the chart's timings are not valid on the machine that built the page
            st = replace(st, note="; ".join(filter(None, [st.note, f"timings not valid here: {st.busy}"])))
        frames = [replace(st, shown=n) for n in range(st.total_steps + 1)]
        chart = png(speed_figure(st.trace, st.baseline, device_name=st.device_name, walls=st.walls,
                                 splits=st.splits), dpi=70)
        out.append({"label": label, "steps": st.total_steps, "rows": lab_view.tokens_html(st),
                    "rows_projector": lab_view.tokens_html(st, projector=True), "note": st.note,
                    "status": [lab_view.status_text(f) for f in frames],
                    "text": [html.escape(f.prompt) + "<b>" + html.escape(f.detok(f.trace_so_far.tokens)) + "</b>"
                             for f in frames],
                    "chart": base64.b64encode(chart).decode()})
    return out


def offline_lab_html(decodes: list[dict], *, first: int = OFFLINE_FIRST) -> str:
    """The offline lab as one section: a method menu, Back / Step / Reset / Run all, a step slider and keys,
    each decode's rows; a small script (no kernel) shows the first n rows. Anything else needs a kernel."""
    from mtplab.teaching.acceptance_lab.view import KEYS_JS

    ok = [d for d in decodes if "error" not in d]
    if not ok:
        why = "; ".join(f"{d['label']}: {d['error']}" for d in decodes) or "nothing decoded"
        return (f"<section id='mtplab-offline-lab' class='warn'>The offline acceptance lab could not be built "
                f"({html.escape(why)}).</section>")
    options = "".join(f"<option>{html.escape(d['label'])}</option>" for d in ok)
    boxes = "".join(
        f"<div class='mtplab-offline-decode' data-method='{html.escape(d['label'])}'>"
        + (f"<div class='mtplab-note' style='color:#555'>note: {html.escape(d['note'])}</div>" if d.get("note") else "")
        + f"<div class='mtplab-size-normal'>{d['rows']}</div>"
        + f"<div class='mtplab-size-projector' style='display:none'>{d.get('rows_projector', d['rows'])}</div>"
        + f"<img class='mtplab-speed' alt='speed chart' src='data:image/png;base64,{d['chart']}'></div>"
        for d in ok)
    data = json.dumps([{"steps": d["steps"], "status": d["status"], "text": d["text"]} for d in ok])
    data = data.replace("</", "<\\/")  # no '</script>' inside the JSON
    failed = "".join(f"<li>{html.escape(d['label'])}: {html.escape(d['error'])}</li>" for d in decodes if "error" in d)
    first = min(first, ok[0]["steps"])
    return f"""<section id="mtplab-offline-lab" class="mtplab-offline" tabindex="0" data-first="{first}"
 style="border:2px solid #0072B2;padding:8px;margin:8px 0;font-family:system-ui,sans-serif">
<h2 style="margin-top:0">The acceptance lab, offline (no kernel)</h2>
<p>One decode per method, decoded when the report was built (CPU, the default prompt, seed 0) and pre-rendered:
step forward and back with the buttons, the slider or the keys (click here first: → step, ← back, Home reset,
End run all). <b>Needs a kernel:</b> changing k, the prompt, the temperature or the seed, a new sample, and the
acceptance chart step by step; open the lab live with <code>make lab</code>.</p>
<select class="mtplab-offline-method">{options}</select>
<button class="mtplab-back">◂ Back</button> <button class="mtplab-step">Step ▸</button>
<button class="mtplab-run">Run all ▸▸</button> <button class="mtplab-reset">Reset</button>
<input type="range" class="mtplab-offline-slider" min="0" max="{ok[0]['steps']}" value="{first}" style="width:40%">
<span class="mtplab-offline-readout"></span>
<label><input type="checkbox" class="mtplab-offline-projector"> projector (24 px chips)</label>
<div class="mtplab-status" style="margin:4px 0"></div>
{boxes}
{f"<ul class='warn'>{failed}</ul>" if failed else ""}
<script type="application/json" id="mtplab-offline-data">{data}</script>
<script>{KEYS_JS}{_OFFLINE_JS}</script>
</section>"""


def write_offline_page(path: Path, section: str) -> None:
    path.write_text(f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>mtplab: the acceptance lab, offline</title></head>
<body style="max-width:80em;margin:1em auto"><p><a href="index.html">← the report</a></p>
{section}
</body></html>
""", encoding="utf-8")


def build(notebooks: list[Path] | None = None, *, out: Path = BUILD, parameters: dict | None = None,
          timeout: float | None = None, offline: bool | None = None) -> list[Result]:
    """Execute and export every notebook into `out`, write out/index.html, return one Result each. `offline`
    (default: when notebook 05 is among them) pre-renders the acceptance lab for stepping without a kernel."""
    notebooks = sorted(NOTEBOOKS.glob("*.ipynb")) if notebooks is None else [Path(p) for p in notebooks]
    out = Path(out)
    (out / "executed").mkdir(parents=True, exist_ok=True)
    live = copy_static(out)
    if offline is None:
        offline = any(Path(p).stem.startswith("05") for p in notebooks)
    section = ""
    if offline:
        try:
            section = offline_lab_html(offline_decodes())
        except Exception as e:  # noqa: BLE001 - the rest of the report still builds
            section = f"<section id='mtplab-offline-lab' class='warn'>The offline lab failed: {html.escape(repr(e))}</section>"
        write_offline_page(out / "acceptance_lab.html", section)
    results = []
    for src in notebooks:
        r = Result(name=src.stem)
        dst = out / "executed" / src.name
        t0 = time.perf_counter()
        r.status, r.message = execute(src, dst, parameters or {}, timeout)
        r.seconds = time.perf_counter() - t0
        if dst.exists():
            try:
                r.widgets, r.external = export(dst, out / f"{src.stem}.html",
                                               offline=section if src.stem.startswith("05") else "")
                r.html = f"{src.stem}.html"
                r.teaches, r.thumb = describe_notebook(dst, out)
            except Exception as e:  # an export error must not hide the other notebooks
                r.status, r.message = "failed", f"HTML export: {type(e).__name__}: {e}"
        if r.external:
            r.status, r.message = "failed", "the HTML loads from another host: " + ", ".join(r.external[:3])
        results.append(r)
    write_index(out / "index.html", results, parameters or {}, live, offline=bool(section))
    return results


def describe_notebook(executed: Path, out: Path) -> tuple[str, str]:
    """(one line on what it teaches, its thumbnail's path relative to `out`, or '')."""
    import nbformat

    nb = nbformat.read(str(executed), as_version=4)
    png = key_figure(nb)
    thumb = ""
    if png:
        thumb = f"thumbs/{executed.stem}.png"
        thumbnail(png, out / thumb)
    return teaches(nb, executed.stem), thumb


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
