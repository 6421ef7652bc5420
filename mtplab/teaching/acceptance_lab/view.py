"""The acceptance lab's view: step through a speculative decode and watch which drafts the target keeps.

Read in this order:

* `state`: the pure state (`LabState`) and the functions that advance it, tested without a browser;
* `session`: what touches the world: the model cache, the default demo, and `decode` (the decode and its race
  against AR), which this view calls when a state has no decode yet;
* `mtplab.viz.kinds` and `mtplab.viz.decode`: the token-kind colour map (colour-blind safe, shared with notebook
  02) and the figures;
* this module: HTML text views of a state (also used by the offline report, tools/report.py), and
  `AcceptanceLab`, which renders a state with ipywidgets and calls the pure functions on clicks. ipywidgets is
  imported only inside `AcceptanceLab`, lazily: importing mtplab never imports it.

For a lecture hall: a seed control and a **New sample** button (Reset replays the same sample); a step slider
(its number can be typed: jump to step n); keys (click the lab first) → step, ← back, Home reset, End run all;
every row reachable by scrolling; p(d), q(d) and u printed large under each sampled step, with the residual
norm(max(0, p - q)) drawn at a correction, and the target's top-2 and their logit gap at a rejected greedy
draft; per-step wall time (target, drafter) in each row, and the decode's time split, median of `repeats`
interleaved runs with its range, in the speed chart. Projector mode (`projector=True` or its toggle) draws
larger chips and larger, sharper charts.
"""
from __future__ import annotations

import html
from dataclasses import replace

from mtplab.decoding.drafters import METHODS
from mtplab.errors import MtplabError
from mtplab.measuring.acceptance import KINDS as CONVENTIONS, convert
from mtplab.model import checkpoint as ckpt
from mtplab.teaching.acceptance_lab.session import ModelCache, change, check_k_fits, decoded, resolve_auto
from mtplab.teaching.acceptance_lab.state import (DEFAULT_CHECKPOINT, SETTINGS, Inside, LabState, back, configure,
                                                  inside, jump, new_sample, reset, run_all, step)
from mtplab.viz.decode import acceptance_figure, speed_figure
from mtplab.viz.kinds import COLORS, KINDS, LEGEND, STRUCK, TEXT_COLORS, StepRecord, TokenView
from mtplab.viz.style import png
from mtplab.viz.text import table


def converter_widget(rates=(0.8, 0.6, 0.45), kind: str = "unconditional"):
    """A small widget: type rates, choose their convention, read every other one (ipywidgets, lazily)."""
    import ipywidgets as w

    box = w.Text(value=", ".join(f"{r:g}" for r in rates), description="rates")
    which = w.ToggleButtons(options=list(CONVENTIONS), value=kind, description="they are")
    out = w.HTML()

    def show(_=None):
        try:
            acc = convert([float(s) for s in box.value.replace(";", ",").split(",") if s.strip()], which.value)
            out.value = f"<pre>{table(acc)}</pre>"
        except (MtplabError, ValueError) as e:
            out.value = f"<pre>error: {e}</pre>"

    box.observe(show, "value")
    which.observe(show, "value")
    show()
    return w.VBox([box, which, out])


DEVICES = ("auto", "cpu", "cuda", "mps")
KEYS = {"ArrowRight": "step", "ArrowLeft": "back", "Home": "reset", "End": "run"}  # key -> button class suffix
# One window-level listener (capture phase: before JupyterLab's own shortcuts) clicks the lab's buttons when
# the focus is inside a lab and not in a text box. An HTML widget cannot hold a <script>, but its innerHTML
# runs an image's onerror: that is how it gets into JupyterLab and into the offline report alike.
KEYS_JS = ("if(!window.mtplabKeys){window.mtplabKeys=1;window.addEventListener('keydown',function(e){"
           "var t=e.target;if(!t||!t.closest)return;var lab=t.closest('.mtplab-lab,.mtplab-offline');"
           "if(!lab||/^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName))return;"
           "var m={" + ",".join(f"{k}:'.mtplab-{v}'" for k, v in KEYS.items()) + "}[e.key];if(!m)return;"
           "var b=lab.querySelector(m);if(b){b.click();e.preventDefault();e.stopPropagation();}},true);}")
KEYS_HTML = (f"<img src='' alt='' style='display:none' onerror=\"{KEYS_JS}\">"
             "<span style='color:#555'>keys (click the lab first): → step · ← back · Home reset · End run all</span>")


# ---------------------------------------------------------------------------------- text views
def _chip(t: TokenView, projector: bool) -> str:
    size = "24px" if projector else "13px"
    # a struck-through chip of one character cannot be read: an outline says "not kept" there instead
    extra = ("" if t.kind not in STRUCK else "text-decoration:line-through;" if len(t.label) > 1 else
             "outline:2px dashed #000;outline-offset:-3px;")
    title = f"{t.kind}: token {t.token}"
    if t.draw is not None:
        p, q, u = t.draw
        title += f"; p(d)={p:.3f}, q(d)={q:.3f}, u={u:.3f}"
    return (f"<span class='mtplab-tok mtplab-{t.kind}' title='{html.escape(title)}' style='background:{COLORS[t.kind]};"
            f"color:{TEXT_COLORS[t.kind]};padding:1px 4px;margin:1px;border-radius:3px;font-family:monospace;"
            f"font-size:{size};display:inline-block;min-width:1.1em;text-align:center;{extra}'>"
            f"{html.escape(t.label)}</span>")


def _draws(r: StepRecord):
    """(token, p, q, u, min(1, p/q), kept) for each draft the accept rule examined in a sampled step."""
    for t in r.tokens:
        if t.draw is not None:
            p, q, u = t.draw
            bound = min(1.0, p / q if q > 0 else float("inf"))
            yield t, p, q, u, bound, u < bound  # the rule: keep d when u < min(1, p(d)/q(d))


def draws_text(r: StepRecord) -> str:
    """Sampled steps: why each examined draft was kept or not, 'u < p/q' in numbers."""
    return "; ".join(f"{t.label}: p(d)={p:.3f} q(d)={q:.3f} u={u:.3f} → {'kept' if kept else 'rejected'}"
                     for t, p, q, u, _, kept in _draws(r))


def _ms(s: float) -> str:
    return f"{1000 * s:.1f}"


def step_time_text(r: StepRecord) -> str:
    """A step's wall time and its parts, as measured (ms)."""
    return f"{_ms(r.wall_s)} ms (target {_ms(r.target_s)}, drafter {_ms(r.draft_s)})"


def draws_html(r: StepRecord, projector: bool) -> str:
    """p(d), q(d) and u of every examined draft, large and dark (no hovering), with the rule's verdict."""
    size = "22px" if projector else "15px"
    items = [f"<span class='mtplab-draw' style='margin-right:1.2em'><b>{html.escape(t.label)}</b>: "
             f"p(d)=<b>{p:.3f}</b> q(d)=<b>{q:.3f}</b> u=<b>{u:.3f}</b> {'&lt;' if kept else '≥'} min(1, p/q)={bound:.3f} "
             f"→ <b style='color:{COLORS['accepted' if kept else 'rejected']}'>{'kept' if kept else 'rejected'}</b></span>"
             for t, p, q, u, bound, kept in _draws(r)]
    if not items:
        return ""
    return f"<div class='mtplab-draws' style='font-size:{size};color:#111;margin:2px 0 2px 1em'>{''.join(items)}</div>"


def inside_html(ins: Inside | None, label, projector: bool) -> str:
    """Greedy: the target's top-2 and their logit gap at the rejected draft. Sampled: p, q and the residual
    norm(max(0, p - q)) drawn as bars, for the tokens that matter; the correction was drawn from the residual."""
    if ins is None:
        return ""
    size = "20px" if projector else "14px"
    if ins.greedy:
        (t1, l1), (t2, l2) = ins.top2
        return (f"<div class='mtplab-top2' style='font-size:{size};color:#111;margin:2px 0 2px 1em'>at draft "
                f"{ins.position + 1} the target's top-2: <b>{html.escape(label(t1))}</b> {l1:.2f} · "
                f"<b>{html.escape(label(t2))}</b> {l2:.2f}, logit gap <b>{ins.gap:.2f}</b>; the draft "
                f"<b>{html.escape(label(ins.draft))}</b> was its #{ins.draft_rank}</div>")
    width = 160 if projector else 110

    def bar(v, color):
        return (f"<span style='display:inline-block;width:{width}px;background:#eee;vertical-align:middle'>"
                f"<span style='display:block;height:0.9em;width:{max(0.0, min(1.0, v)) * 100:.1f}%;background:{color}'>"
                f"</span></span> {v:.3f}")

    head = ("residual norm(max(0, p − q)) at the rejected draft: the correction is drawn from it"
            if ins.residual else "p and q at the rejected draft")
    rows = []
    for t, p, q, r in ins.rows:
        mark = " ← draft" if t == ins.draft else (" ← correction" if t == ins.committed else "")
        rows.append(f"<tr><td style='font-family:monospace'><b>{html.escape(label(t))}</b>{mark}</td>"
                    f"<td>{bar(p, COLORS['bonus-target'])}</td><td>{bar(q, COLORS['discarded'])}</td>"
                    f"<td>{bar(r, COLORS['bonus-correction'])}</td></tr>")
    return (f"<div class='mtplab-residual' style='font-size:{size};margin:2px 0 4px 1em'>{head}<table>"
            "<tr><th></th><th>p (target)</th><th>q (drafter)</th><th>residual</th></tr>" + "".join(rows) + "</table></div>")


def legend_html(projector: bool = False) -> str:
    font = "150%" if projector else "90%"
    return f"<div style='font-size:{font}'>" + " ".join(
        f"<span style='background:{COLORS[k]};color:{TEXT_COLORS[k]};padding:1px 4px;border-radius:3px;"
        f"{'text-decoration:line-through;' if k in STRUCK else ''}'>{LEGEND[k]}</span>" for k in KINDS) + "</div>"


def tokens_html(state: LabState, *, projector: bool = False, height: str = "26em") -> str:
    """The revealed steps as rows of coloured token chips, every one reachable by scrolling (the box starts at
    the newest row), with each step's time, its draws and what decided a rejection; then the text so far."""
    if state.trace is None:
        return "<div class='mtplab-empty'>Press <b>Step</b> to decode.</div>"
    rows = []
    for r in state.records:
        chips = "".join(_chip(t, projector) for t in r.tokens)
        what = "prefill" if r.index == 0 else (f"kept {r.accepted}/{len(r.drafted)} drafts" if r.drafted
                                               else "no drafts")
        head = f"step {r.index} · {r.forwards} fwd · {what} · {step_time_text(r)}"
        below = draws_html(r, projector) + inside_html(inside(state, r.index), state.label, projector)
        rows.append(f"<div class='mtplab-step-row' data-step='{r.index}' style='border-bottom:1px solid #eee'>"
                    f"<span class='mtplab-step-head' style='display:inline-block;min-width:26em;white-space:nowrap;"
                    f"color:#333'>{html.escape(head)}</span>{chips}{below}</div>")
    text = html.escape(state.prompt) + "<b>" + html.escape(state.detok(state.trace_so_far.tokens)) + "</b>"
    font = "150%" if projector else "90%"
    # column-reverse around one inner box: the scroll position starts at the bottom, the rows keep their order
    return (legend_html(projector) + f"<div class='mtplab-rows' tabindex='0' style='font-size:{font};max-height:{height};"
            f"overflow-y:auto;display:flex;flex-direction:column-reverse;border:1px solid #ddd'><div>{''.join(rows)}"
            f"</div></div><pre class='mtplab-text' style='white-space:pre-wrap;border:1px solid #ddd;padding:4px;"
            f"font-size:{font}'>{text}</pre>")


def status_text(state: LabState) -> str:
    if state.error:
        return f"⚠ {state.error}"
    if state.trace is None:
        return f"{state.method}, k={state.k}, seed {state.seed}: not decoded yet"
    t = state.trace_so_far
    limit = "no limit" if state.model_k is None else f"k ≤ {state.model_k}"
    return (f"{state.method} k={state.k} on {state.checkpoint_name} ({limit}), device {state.device_name}, "
            f"seed {state.seed}: step {state.shown}/{state.total_steps}, {len(t.tokens)} tokens in {t.forwards} "
            f"target forwards, {t.num_accepted_tokens}/{t.num_draft_tokens} drafts accepted")


# ---------------------------------------------------------------------------------- the view
class AcceptanceLab:
    """The ipywidgets front end. `lab.widget` is the box to display; `lab.state` the current LabState.
    `method='auto'` (the default) takes method, k and checkpoint from the shipped decode benchmark."""

    def __init__(self, state: LabState | None = None, *, models: ModelCache | None = None, projector: bool = False,
                 **settings):
        import ipywidgets as w  # lazy: only the lab needs ipywidgets

        self.models = models or ModelCache()
        base = state or LabState(repeats=5)  # the widget times 5 interleaved (AR, method) pairs
        unknown = sorted(set(settings) - set(SETTINGS))  # the others still apply; a note names these
        self.state = configure(base, **{n: v for n, v in settings.items() if n in SETTINGS})
        try:  # before anything is drawn
            self.state = check_k_fits(resolve_auto(self.state), self.models)
        except Exception as e:  # noqa: BLE001 - a last guard, as in _do: a message, never a traceback
            self.state = replace(self.state, error=f"{type(e).__name__}: {e}")
        if unknown:
            self.state = replace(self.state, note=f"unknown lab settings {unknown} ignored; use {', '.join(SETTINGS)}")
        self.projector = projector
        self._syncing = False
        self.controls = _controls(w, self.state)
        for name, c in self.controls.items():
            c.style.description_width = "90px"
            c.add_class(f"mtplab-{name.replace('_', '-')}")
            c.observe(lambda ch, name=name: self._set(name, ch["new"]), names="value")
        self.buttons = {
            # no icons: Font Awesome would be one more thing for the offline report to serve
            "back": w.Button(description="◂ Back", tooltip="hide the last step (key ←)"),
            "step": w.Button(description="Step ▸", tooltip="reveal one decoding step (key →)", button_style="primary"),
            "run": w.Button(description="Run all ▸▸", tooltip="reveal every step (key End)"),
            "reset": w.Button(description="Reset", tooltip="back to step 0; the same seed decodes again (key Home)"),
            "new_sample": w.Button(description="New sample", tooltip="the next seed: a new sample at temperature > 0"),
        }
        actions = {"back": self.back, "step": self.step, "run": self.run_all, "reset": self.reset,
                   "new_sample": self.new_sample}
        for name, b in self.buttons.items():
            b.add_class(f"mtplab-{name.replace('_', '-')}")
            b.on_click(lambda _, act=actions[name]: act())
        self.slider = w.IntSlider(value=0, min=0, max=1, description="step", continuous_update=False,
                                  layout=w.Layout(width="60%")).add_class("mtplab-slider")
        self.slider.observe(self._slid, names="value")
        self.keys = w.HTML(KEYS_HTML).add_class("mtplab-keys")
        self.projector_toggle = w.ToggleButton(value=projector, description="projector").add_class("mtplab-projector")
        self.projector_toggle.observe(lambda ch: self.set_projector(ch["new"]), names="value")
        self.status = w.HTML().add_class("mtplab-status")
        self.note = w.HTML().add_class("mtplab-note")
        self.tokens = w.HTML().add_class("mtplab-tokens")
        self.accept_chart = w.Image(format="png").add_class("mtplab-acceptance")
        self.speed_chart = w.Image(format="png").add_class("mtplab-speed")
        c = self.controls
        self.widget = w.VBox([
            w.HBox([c["method"], c["checkpoint"], c["device"]]),
            w.HBox([c["k"], c["temperature"], c["max_new_tokens"]]),
            w.HBox([c["seed"], c["repeats"]]),
            c["prompt"],
            w.HBox([*self.buttons.values(), self.projector_toggle]),
            w.HBox([self.slider, self.keys]),
            self.status, self.note, self.tokens, self.accept_chart, self.speed_chart,
        ]).add_class("mtplab-lab")
        self._speed_for = None
        self.render()

    # each handler replaces the state with a pure function of it (after the decode, when it has none), then redraws
    def _decoded(self, state: LabState) -> LabState:
        return decoded(state, self.models)

    def _set(self, name, value):
        if not self._syncing:
            self._do(lambda st: change(st, self.models, **{name: value}))

    def _slid(self, ch):
        if not self._syncing:
            self.jump(ch["new"])

    def _do(self, fn):
        try:
            self.state = fn(self.state)
        except Exception as e:  # the pure functions turn bad input into state.error; this is a last guard
            self.state = replace(self.state, error=f"{type(e).__name__}: {e}")
        self.render()

    def step(self, n: int = 1) -> AcceptanceLab:
        self._do(lambda st: step(self._decoded(st), n))
        return self

    def run_all(self) -> AcceptanceLab:
        self._do(lambda st: run_all(self._decoded(st)))
        return self

    def back(self, n: int = 1) -> AcceptanceLab:
        self._do(lambda st: back(st, n))
        return self

    def jump(self, n: int) -> AcceptanceLab:
        self._do(lambda st: jump(self._decoded(st), n))
        return self

    def new_sample(self) -> AcceptanceLab:
        """The next seed, decoded at once, with as many steps shown as before (at least one)."""
        self._do(lambda st: jump(self._decoded(new_sample(st)), max(1, st.shown)))
        return self

    def set_projector(self, on: bool = True) -> AcceptanceLab:
        """Larger chips and larger, sharper charts, for a classroom projector."""
        self.projector = bool(on)
        self._speed_for = None
        self.render()
        return self

    def reset(self) -> AcceptanceLab:
        self._do(reset)
        return self

    def set(self, **settings) -> AcceptanceLab:
        """Change settings from code; the controls follow."""
        self._do(lambda st: change(st, self.models, **settings))
        return self

    def _sync_controls(self):
        """The controls and the slider show the state (a clamped k, the default demo, the steps shown)."""
        s = self.state
        self._syncing = True
        try:
            for name, c in self.controls.items():
                value = getattr(s, name)
                if name == "method" and value not in c.options:
                    continue
                if name == "checkpoint" and str(value) not in c.options:
                    c.options = [*c.options, str(value)]
                if c.value != value and _holds(c, value):
                    try:
                        c.value = value
                    except Exception:  # noqa: BLE001 - a value the control cannot hold: the state keeps it
                        pass
            top = max(1, s.total_steps)
            if top >= self.slider.max:
                self.slider.max, self.slider.value = top, s.shown
            else:
                self.slider.value, self.slider.max = s.shown, top
        finally:
            self._syncing = False

    def render(self):
        s = self.state
        self._sync_controls()
        notes = [n for n in (s.note, f"timings not valid here: the machine was busy ({s.busy}); close other work and "
                                     "press Reset, or read the shipped record" if s.busy else "") if n]
        self.note.value = "".join(f"<div style='color:#555'>note: {html.escape(n)}</div>" for n in notes)
        self.tokens.value = tokens_html(s, projector=self.projector)
        scale, dpi = (1.5, 110) if self.projector else (1.0, 80)
        k = s.k if isinstance(s.k, int) and not isinstance(s.k, bool) else 2
        limit = (s.model_k - 1) if s.model_k else max(1, min(k - 1, 16))
        self.accept_chart.value = png(acceptance_figure(s.trace_so_far, max_drafts=limit, scale=scale), dpi=dpi)
        drawn = self._speed_for
        if drawn is None or drawn[0] is not s.trace or drawn[1] is not s.baseline:
            self._speed_for = (s.trace, s.baseline)  # the speed chart covers the whole decode: redraw on change
            self.speed_chart.value = png(speed_figure(s.trace, s.baseline, device_name=s.device_name, scale=scale,
                                                      walls=s.walls, splits=s.splits), dpi=dpi)
        color = "#b30000" if s.error else "#333"  # the status line last: when it changes, the rest has arrived
        self.status.value = f"<div style='color:{color}'>{html.escape(status_text(s))}</div>"

    def _ipython_display_(self):
        from IPython.display import display
        display(self.widget)


def _holds(control, value) -> bool:
    """Whether a control of this kind can show `value` (a bad setting stays in the state, with its message)."""
    kind = type(control).__name__
    if kind == "IntText":
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2 ** 53
    if kind == "FloatText":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    if kind in ("Text", "Textarea"):
        return isinstance(value, str)
    return True


def _controls(w, s: LabState) -> dict:
    """One ipywidgets control per setting, made at the default settings (the dropdowns also offer the state's
    checkpoint and device); the first render's `_sync_controls` shows the state's own values, each where its control
    can hold it (`_holds`): a bad setting stays in the state, whose message the status line shows."""
    names = sorted(p.stem for p in ckpt.CHECKPOINT_DIR.glob("*.safetensors"))
    checkpoints = list(dict.fromkeys([DEFAULT_CHECKPOINT, *names, str(s.checkpoint)]))
    return {
        "method": w.Dropdown(options=list(METHODS), value=LabState.method, description="method"),
        "checkpoint": w.Dropdown(options=checkpoints, value=str(s.checkpoint), description="checkpoint"),
        "k": w.IntText(value=LabState.k, description="k"),
        "temperature": w.FloatText(value=LabState.temperature, description="temperature"),
        "device": w.Dropdown(options=list(dict.fromkeys([str(s.device), *DEVICES])), value=str(s.device),
                             description="device"),
        "max_new_tokens": w.IntText(value=LabState.max_new_tokens, description="new tokens"),
        "seed": w.IntText(value=LabState.seed, description="seed"),
        "repeats": w.IntText(value=5, description="timed runs"),
        "prompt": w.Textarea(value=str(s.prompt), description="prompt", continuous_update=False,
                             layout=w.Layout(width="60%")),
    }

