"""The acceptance lab's view: step through a speculative decode and watch which drafts the target keeps.

Three modules, read in this order:

* `mtplab.widget_state`: the pure state (`LabState`) and the functions that advance it, tested without a browser;
* `mtplab.viz_tokens`: the token-kind colour map (colour-blind safe, shared with notebook 02) and the figures;
* this module: HTML text views of a state, and `AcceptanceLab`, which renders a state with ipywidgets and calls
  the pure functions on clicks. ipywidgets is imported only inside `AcceptanceLab`, lazily: importing mtplab
  never imports it.

Projector mode (`AcceptanceLab(projector=True)` or its toggle) draws larger chips and larger, sharper charts.
"""
from __future__ import annotations

from mtplab.decoding.drafters import METHODS
from mtplab.errors import MtplabError
import html
from dataclasses import replace
from mtplab.model import checkpoint as ckpt
from mtplab.viz.kinds import COLORS, KINDS, LEGEND, STRUCK, TEXT_COLORS
from mtplab.viz.decode import acceptance_figure, speed_figure
from mtplab.viz.style import png
from mtplab.teaching.acceptance_lab.state import (DEFAULT_CHECKPOINT, LabState, ModelCache, back, configure, reset,
                                                  run_all, step)
from mtplab.viz.kinds import StepRecord, TokenView
from mtplab.measuring.acceptance import KINDS as CONVENTIONS, convert
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


# ---------------------------------------------------------------------------------- text views
def _chip(t: TokenView, projector: bool) -> str:
    size = "24px" if projector else "13px"
    extra = "text-decoration:line-through;" if t.kind in STRUCK else ""
    title = f"{t.kind}: byte {t.token}"
    if t.draw is not None:
        p, q, u = t.draw
        title += f"; p(d)={p:.3f}, q(d)={q:.3f}, u={u:.3f}"
    return (f"<span class='mtplab-tok mtplab-{t.kind}' title='{html.escape(title)}' style='background:{COLORS[t.kind]};"
            f"color:{TEXT_COLORS[t.kind]};padding:1px 4px;margin:1px;border-radius:3px;font-family:monospace;"
            f"font-size:{size};display:inline-block;min-width:1.1em;text-align:center;{extra}'>"
            f"{html.escape(t.label)}</span>")


def draws_text(r: StepRecord) -> str:
    """Sampled steps: why each examined draft was kept or not, 'u < p/q' in numbers."""
    parts = []
    for t in r.tokens:
        if t.draw is None:
            continue
        p, q, u = t.draw
        ratio = p / q if q > 0 else float("inf")
        verdict = "kept" if u < min(1.0, ratio) else "rejected"
        parts.append(f"{t.label}: p(d)={p:.3f} q(d)={q:.3f} u={u:.3f} → {verdict}")
    return "; ".join(parts)


def tokens_html(state: LabState, last: int = 12, *, projector: bool = False) -> str:
    """The revealed steps as rows of coloured token chips (the last `last` steps), plus the text so far."""
    if state.trace is None:
        return "<div class='mtplab-empty'>Press <b>Step</b> to decode.</div>"
    rows = []
    for r in state.records[-last:]:
        chips = "".join(_chip(t, projector) for t in r.tokens)
        what = "prefill" if r.index == 0 else (f"kept {r.accepted}/{len(r.drafted)} drafts" if r.drafted
                                               else "no drafts")
        head = f"step {r.index} · {r.forwards} fwd · {what}"
        why = draws_text(r)
        why_html = f"<div class='mtplab-draws' style='color:#555;margin-left:19em'>{html.escape(why)}</div>" if why else ""
        rows.append(f"<div class='mtplab-step-row' data-step='{r.index}'><span style='display:inline-block;"
                    f"width:19em;white-space:nowrap;color:#555'>{head}</span>{chips}{why_html}</div>")
    hidden = max(0, len(state.records) - last)
    more = f"<div style='color:#777'>… {hidden} earlier steps</div>" if hidden else ""
    text = html.escape(state.prompt) + "<b>" + html.escape(state.detok(state.trace_so_far.tokens)) + "</b>"
    legend = " ".join(f"<span style='background:{COLORS[k]};color:{TEXT_COLORS[k]};padding:1px 4px;border-radius:3px;"
                      f"{'text-decoration:line-through;' if k in STRUCK else ''}'>{LEGEND[k]}</span>" for k in KINDS)
    font = "150%" if projector else "90%"
    return (f"<div style='font-size:{font}'>{legend}</div><div style='font-size:{font}'>{more}{''.join(rows)}</div>"
            f"<pre class='mtplab-text' style='white-space:pre-wrap;border:1px solid #ddd;padding:4px;"
            f"font-size:{font}'>{text}</pre>")


def status_text(state: LabState) -> str:
    if state.error:
        return f"⚠ {state.error}"
    if state.trace is None:
        return f"{state.method}, k={state.k}: not decoded yet"
    t = state.trace_so_far
    limit = "no limit" if state.model_k is None else f"k ≤ {state.model_k}"
    return (f"{state.method} on {state.checkpoint_name} ({limit}), device {state.device_name}: "
            f"step {state.shown}/{state.total_steps}, {len(t.tokens)} tokens in {t.forwards} target forwards, "
            f"{t.num_accepted_tokens}/{t.num_draft_tokens} drafts accepted")


# ---------------------------------------------------------------------------------- the view
class AcceptanceLab:
    """The ipywidgets front end. `lab.widget` is the box to display; `lab.state` the current LabState."""

    def __init__(self, state: LabState | None = None, *, models: ModelCache | None = None, projector: bool = False,
                 **settings):
        import ipywidgets as w  # lazy: only the lab needs ipywidgets

        try:
            self.state = configure(state or LabState(), **settings)
        except MtplabError as e:  # an unknown setting: keep the defaults and show the message
            self.state = replace(state or LabState(), error=str(e))
        self.models = models or ModelCache()
        self.projector = projector
        self.controls = _controls(w, self.state)
        for name, c in self.controls.items():
            c.style.description_width = "90px"
            c.add_class(f"mtplab-{name.replace('_', '-')}")
            c.observe(lambda ch, name=name: self._set(name, ch["new"]), names="value")
        self.buttons = {
            # no icons: Font Awesome would be one more thing for the offline report to serve
            "back": w.Button(description="◂ Back", tooltip="hide the last step"),
            "step": w.Button(description="Step ▸", tooltip="reveal one decoding step", button_style="primary"),
            "run": w.Button(description="Run all ▸▸", tooltip="reveal every step"),
            "reset": w.Button(description="Reset", tooltip="back to step 0, decode afresh"),
        }
        for name, b in self.buttons.items():
            b.add_class(f"mtplab-{name}")
        self.buttons["back"].on_click(lambda _: self._do(back))
        self.buttons["step"].on_click(lambda _: self._do(lambda st: step(st, self.models)))
        self.buttons["run"].on_click(lambda _: self._do(lambda st: run_all(st, self.models)))
        self.buttons["reset"].on_click(lambda _: self._do(reset))
        self.projector_toggle = w.ToggleButton(value=projector, description="projector").add_class("mtplab-projector")
        self.projector_toggle.observe(lambda ch: self.set_projector(ch["new"]), names="value")
        self.status = w.HTML().add_class("mtplab-status")
        self.tokens = w.HTML().add_class("mtplab-tokens")
        self.accept_chart = w.Image(format="png").add_class("mtplab-acceptance")
        self.speed_chart = w.Image(format="png").add_class("mtplab-speed")
        c = self.controls
        self.widget = w.VBox([
            w.HBox([c["method"], c["checkpoint"], c["device"]]),
            w.HBox([c["k"], c["temperature"], c["max_new_tokens"]]),
            c["prompt"],
            w.HBox([*self.buttons.values(), self.projector_toggle]),
            self.status, self.tokens, self.accept_chart, self.speed_chart,
        ]).add_class("mtplab-lab")
        self._speed_for = None
        self.render()

    # each handler replaces the state with a pure function of it, then redraws
    def _set(self, name, value):
        self._do(lambda st: configure(st, **{name: value}))

    def _do(self, fn):
        try:
            self.state = fn(self.state)
        except Exception as e:  # the pure functions turn bad input into state.error; this is a last guard
            self.state = replace(self.state, error=f"{type(e).__name__}: {e}")
        self.render()

    def step(self, n: int = 1) -> AcceptanceLab:
        self._do(lambda st: step(st, self.models, n))
        return self

    def run_all(self) -> AcceptanceLab:
        self._do(lambda st: run_all(st, self.models))
        return self

    def back(self, n: int = 1) -> AcceptanceLab:
        self._do(lambda st: back(st, n))
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
        """Change settings from code; the controls follow (and their observers re-apply the same values)."""
        self._do(lambda st: configure(st, **settings))
        for name, value in settings.items():
            if name in self.controls:
                try:
                    self.controls[name].value = value
                except Exception:  # noqa: BLE001 - a value the control cannot hold: the state keeps the message
                    pass
        return self

    def render(self):
        s = self.state
        color = "#b30000" if s.error else "#333"
        self.status.value = f"<div style='color:{color}'>{html.escape(status_text(s))}</div>"
        self.tokens.value = tokens_html(s, projector=self.projector)
        scale, dpi = (1.5, 110) if self.projector else (1.0, 80)
        limit = (s.model_k - 1) if s.model_k else (max(1, s.k - 1) if isinstance(s.k, int) else 1)
        self.accept_chart.value = png(acceptance_figure(s.trace_so_far, max_drafts=limit, scale=scale), dpi=dpi)
        drawn = self._speed_for
        if drawn is None or drawn[0] is not s.trace or drawn[1] is not s.baseline:
            self._speed_for = (s.trace, s.baseline)  # the speed chart covers the whole decode: redraw on change
            self.speed_chart.value = png(speed_figure(s.trace, s.baseline, device_name=s.device_name, scale=scale),
                                         dpi=dpi)

    def _ipython_display_(self):
        from IPython.display import display
        display(self.widget)


def _controls(w, s: LabState) -> dict:
    """One ipywidgets control per setting. A control shows only values it can hold; a bad setting stays in the
    state, whose message the status line shows."""
    names = sorted(p.stem for p in ckpt.CHECKPOINT_DIR.glob("*.safetensors"))
    checkpoints = list(dict.fromkeys([DEFAULT_CHECKPOINT, *names, str(s.checkpoint)]))
    return {
        "method": w.Dropdown(options=list(METHODS), description="method",
                             value=_fits(s.method, list(METHODS), LabState.method)),
        "checkpoint": w.Dropdown(options=checkpoints, value=str(s.checkpoint), description="checkpoint"),
        "k": w.IntText(value=_fits(s.k, int, LabState.k), description="k"),
        "temperature": w.FloatText(value=_fits(s.temperature, float, LabState.temperature), description="temperature"),
        "device": w.Dropdown(options=list(dict.fromkeys([str(s.device), *DEVICES])), value=str(s.device),
                             description="device"),
        "max_new_tokens": w.IntText(value=_fits(s.max_new_tokens, int, LabState.max_new_tokens),
                                    description="new tokens"),
        "prompt": w.Textarea(value=str(s.prompt), description="prompt", continuous_update=False,
                             layout=w.Layout(width="60%")),
    }


def _fits(value, kind, default):
    """`value` when a control of this kind can hold it, else `default` (the state keeps the bad value)."""
    if isinstance(kind, list):
        return value if value in kind else default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    if kind is int and (not isinstance(value, int)):
        return default
    return value if value == value else default  # NaN

