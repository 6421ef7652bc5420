"""The acceptance lab: step through a speculative decode and watch which drafts the target keeps.

Two layers, read top to bottom:

* the state: `LabState`, a frozen dataclass holding the settings, the decoded `Trace`, how many of its
  steps are shown and the last error message; pure functions `configure`, `decode`, `step`, `run_all`,
  `reset` advance it. `step_record` turns one `Step` into labelled, coloured tokens. All of this is
  tested without a browser (tests/test_widgets.py).
* the view: `AcceptanceLab` renders a state with ipywidgets and calls the pure functions on clicks.
  ipywidgets is imported only there, lazily: importing mtplab never imports it.

Stepping is exact and simple: the whole decode runs once (`generate.decode_with`) and the steps of
its Trace are revealed one at a time. The autoregressive (AR) decode of the same model, prompt and
settings runs beside it, for the wall-clock comparison.

A step's tokens, in the order they were committed:
    predict           plain schedule only: the target's own next token, from the predict forward
    accepted          a draft the target kept (the kept drafts are always a prefix)
    rejected          the first draft the target did not keep
    discarded         drafts after the rejected one: thrown away unchecked
    bonus-target      all drafts kept: the target's next token after them, free from the verify forward
    bonus-correction  a draft was rejected: the target's token in its place (greedy: its argmax;
                      sampling: a draw from norm(max(0, p - q)))
"""
from __future__ import annotations

import html
import io
import math
from dataclasses import dataclass, field, replace

from . import checkpoint as ckpt
from . import generate
from .decoding import autoregressive
from .trace import Trace
from .device import describe, pick
from .errors import MtplabError
from .tokenizer import encode, token_repr

KINDS = ("predict", "accepted", "rejected", "discarded", "bonus-target", "bonus-correction")
COLORS = {  # background colours of the token chips (colour-blind safe: blue / orange / grey)
    "predict": "#c6dbef",
    "accepted": "#74c476",
    "rejected": "#fd8d3c",
    "discarded": "#d9d9d9",
    "bonus-target": "#6baed6",
    "bonus-correction": "#9e9ac8",
}
LEGEND = {
    "predict": "predict token (plain schedule)",
    "accepted": "draft accepted",
    "rejected": "draft rejected",
    "discarded": "draft discarded (after a rejection)",
    "bonus-target": "bonus from the target (all drafts kept)",
    "bonus-correction": "bonus correction (replaces the rejected draft)",
}
DEVICES = ("auto", "cpu", "cuda", "mps")
DEFAULT_CHECKPOINT = "default"  # the checkpoint generate.DEFAULT_CHECKPOINT names for the method


# ---------------------------------------------------------------------------------- the records
@dataclass(frozen=True)
class TokenView:
    token: int
    label: str   # printable byte label (tokenizer.token_repr)
    kind: str    # one of KINDS


@dataclass(frozen=True)
class StepRecord:
    """One decoding step as the lab shows it."""
    index: int                    # position in trace.steps (step 0 is the prefill)
    drafted: tuple[int, ...]
    accepted: int                 # a prefix of `drafted`
    rejected: int                 # len(drafted) - accepted: the rejected draft plus the discarded ones
    bonus: int | None
    bonus_source: str             # 'target', 'correction' or 'none'
    predict_token: int | None
    emitted: tuple[int, ...]
    forwards: int
    tokens: tuple[TokenView, ...]  # predict token, drafts, bonus, in that order

    @property
    def kinds(self) -> list[str]:
        return [t.kind for t in self.tokens]


def step_record(index: int, step) -> StepRecord:
    """Label every token of a `decoding.Step`: predict / accepted / rejected / discarded / bonus."""
    views = []
    if step.predict_token is not None:
        views.append(TokenView(step.predict_token, token_repr(step.predict_token), "predict"))
    for i, d in enumerate(step.drafted):
        kind = "accepted" if i < step.accepted else ("rejected" if i == step.accepted else "discarded")
        views.append(TokenView(d, token_repr(d), kind))
    if step.bonus is not None:
        kind = "bonus-correction" if step.bonus_source == "correction" else "bonus-target"
        views.append(TokenView(step.bonus, token_repr(step.bonus), kind))
    return StepRecord(index, tuple(step.drafted), step.accepted, len(step.drafted) - step.accepted, step.bonus,
                      step.bonus_source, step.predict_token, tuple(step.emitted), step.forwards, tuple(views))


# ---------------------------------------------------------------------------------- the state
@dataclass(frozen=True)
class LabState:
    """Everything the lab shows. Settings first; then what the last decode produced."""
    method: str = "blockwise"
    k: int = 4
    prompt: str = "def "
    temperature: float = 0.0
    device: str = "auto"
    max_new_tokens: int = 48
    checkpoint: str = DEFAULT_CHECKPOINT
    seed: int = 0
    trace: Trace | None = None       # the whole decode with these settings (None: not run yet)
    baseline: Trace | None = None    # AR decode of the same model, for the wall-clock comparison
    shown: int = 0                   # steps of `trace` revealed so far
    error: str = ""                  # the last bad-input message ('' when fine)
    device_name: str = ""            # mtplab.device.describe() of the device the decode ran on
    checkpoint_name: str = ""        # the checkpoint actually loaded
    model_k: int | None = None       # generate.max_k for the loaded checkpoint (None: no limit)

    @property
    def total_steps(self) -> int:
        return len(self.trace.steps) if self.trace is not None else 0

    @property
    def done(self) -> bool:
        return self.trace is not None and self.shown >= self.total_steps

    @property
    def records(self) -> list[StepRecord]:
        """One record per revealed step."""
        if self.trace is None:
            return []
        return [step_record(i, s) for i, s in enumerate(self.trace.steps[:self.shown])]

    @property
    def trace_so_far(self) -> Trace | None:
        """The trace cut at the revealed steps: its counters are what the charts show."""
        if self.trace is None:
            return None
        t = self.trace
        return Trace(method=t.method, prompt=t.prompt, steps=t.steps[:self.shown], k=t.k, schedule=t.schedule)


SETTINGS = ("method", "k", "prompt", "temperature", "device", "max_new_tokens", "checkpoint", "seed")


def configure(state: LabState, **settings) -> LabState:
    """Change settings. Any change drops the decoded trace: the next step decodes afresh."""
    unknown = set(settings) - set(SETTINGS)
    if unknown:
        raise TypeError(f"unknown lab settings {sorted(unknown)}; use {', '.join(SETTINGS)}")
    if all(getattr(state, n) == v for n, v in settings.items()):
        return state
    return replace(state, trace=None, baseline=None, shown=0, error="", **settings)


@dataclass
class ModelCache:
    """Loaded checkpoints keyed by (name, device), so stepping through settings does not reload."""
    models: dict = field(default_factory=dict)

    def get(self, name: str, device):
        key = (name, str(device))
        if key not in self.models:
            model = ckpt.load(name, device=device)
            # warm up once, so the first timed decode does not pay for lazy initialisation
            autoregressive(model, [32], max_new_tokens=2)
            self.models[key] = model
        return self.models[key]


def _validate(state: LabState):
    """Checks the core would also make, done first so the message names the widget's control."""
    if state.method not in generate.METHODS:
        raise MtplabError(f"unknown method {state.method!r}; choose one of {', '.join(generate.METHODS)}")
    if not state.prompt:
        raise MtplabError("the prompt is empty; type at least one character")
    if not isinstance(state.k, int) or state.k < 1:
        raise MtplabError(f"k must be an integer >= 1 (got {state.k!r})")
    t = state.temperature
    if t is None or not (t >= 0):  # also catches NaN
        raise MtplabError(f"temperature must be >= 0 (got {t}); 0 means greedy")


def decode(state: LabState, models: ModelCache) -> LabState:
    """Run the whole decode (and its AR baseline) for the current settings; bad input -> state.error."""
    try:
        _validate(state)
        dev = pick(state.device)
        name = (generate.METHODS[state.method].checkpoint if state.checkpoint == DEFAULT_CHECKPOINT
                else state.checkpoint)
        model = models.get(name, dev)
        draft = models.get("draft", dev) if state.method == "draft-model" else None
        ids = encode(state.prompt)
        opts = dict(max_new_tokens=state.max_new_tokens, temperature=float(state.temperature), seed=state.seed)
        trace = generate.decode_with(state.method, model, ids, k=state.k, draft_model=draft, **opts)
        baseline = trace if state.method == "ar" else generate.decode_with("ar", model, ids, **opts)
    except MtplabError as e:
        return replace(state, trace=None, baseline=None, shown=0, error=str(e))
    return replace(state, trace=trace, baseline=baseline, shown=0, error="", device_name=describe(dev),
                   checkpoint_name=name, model_k=generate.max_k(state.method, model))


def step(state: LabState, models: ModelCache, n: int = 1) -> LabState:
    """Reveal the next n steps, decoding first if needed."""
    if state.trace is None:
        state = decode(state, models)
        if state.trace is None:
            return state
    return replace(state, shown=min(state.total_steps, state.shown + n))


def run_all(state: LabState, models: ModelCache) -> LabState:
    """Reveal every step, decoding first if needed."""
    state = step(state, models, 0)
    return replace(state, shown=state.total_steps) if state.trace is not None else state


def reset(state: LabState) -> LabState:
    """Back to no steps shown; the settings stay, and the decode runs again at the next step."""
    return replace(state, trace=None, baseline=None, shown=0, error="")


# ---------------------------------------------------------------------------------- text views
def tokens_html(state: LabState, last: int = 12) -> str:
    """The revealed steps as rows of coloured token chips (the last `last` steps), plus the text so far."""
    if state.trace is None:
        return "<div class='mtplab-empty'>Press <b>Step</b> to decode.</div>"
    chip = ("<span class='mtplab-tok mtplab-{kind}' title='{title}' style='background:{bg};padding:1px 4px;"
            "margin:1px;border-radius:3px;font-family:monospace;font-size:13px;display:inline-block;"
            "min-width:1.1em;text-align:center;{extra}'>{label}</span>")
    rows = []
    for r in state.records[-last:]:
        chips = "".join(chip.format(kind=t.kind, title=f"{t.kind}: byte {t.token}", bg=COLORS[t.kind],
                                    label=html.escape(t.label),
                                    extra="text-decoration:line-through;" if t.kind in ("rejected", "discarded")
                                    else "")
                        for t in r.tokens)
        what = "prefill" if r.index == 0 else (f"kept {r.accepted}/{len(r.drafted)} drafts" if r.drafted
                                               else "no drafts")
        head = f"step {r.index} · {r.forwards} fwd · {what}"
        rows.append(f"<div class='mtplab-step-row' data-step='{r.index}'><span style='display:inline-block;"
                    f"width:19em;white-space:nowrap;color:#555'>{head}</span>{chips}</div>")
    hidden = max(0, len(state.records) - last)
    more = f"<div style='color:#777'>… {hidden} earlier steps</div>" if hidden else ""
    so_far = state.trace_so_far
    text = html.escape(state.prompt) + "<b>" + html.escape(so_far.text) + "</b>"
    legend = " ".join(f"<span style='background:{COLORS[k]};padding:1px 4px;border-radius:3px'>{LEGEND[k]}</span>"
                      for k in KINDS)
    return (f"<div style='font-size:90%'>{legend}</div>{more}{''.join(rows)}"
            f"<pre class='mtplab-text' style='white-space:pre-wrap;border:1px solid #ddd;padding:4px'>{text}</pre>")


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


# ---------------------------------------------------------------------------------- figures
def _figure(w: float, h: float, ncols: int = 1):
    from matplotlib.figure import Figure  # no pyplot: figures are not kept in a global registry
    fig = Figure(figsize=(w, h))
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.18, top=0.84, wspace=0.28)  # fixed: layout engines are slow
    return fig, fig.subplots(1, ncols, squeeze=False)[0]


def acceptance_figure(trace: Trace | None, *, title: str | None = None, max_drafts: int | None = None):
    """Left: drafts proposed and accepted at every step. Right: per-position conditional acceptance,
    P(draft i accepted | drafts 0..i-1 accepted) (`Trace.conditional_acceptance`)."""
    fig, (ax1, ax2) = _figure(9, 2.8, 2)
    steps = trace.steps if trace is not None else []
    x = list(range(len(steps)))
    ax1.bar(x, [len(s.drafted) for s in steps], color=COLORS["discarded"], label="drafted")
    ax1.bar(x, [s.accepted for s in steps], color=COLORS["accepted"], label="accepted")
    ax1.set(xlabel="step", ylabel="drafts", title="acceptance per step")
    n_pos = max(max_drafts or 0, max((len(s.drafted) for s in steps), default=0), 1)
    ax1.set_ylim(0, n_pos + 0.5)
    ax1.set_xlim(-0.6, max(len(steps), 8) - 0.4)
    from matplotlib.patches import Patch  # explicit handles: an empty bar container has no colour to show
    ax1.legend(handles=[Patch(color=COLORS["discarded"], label="drafted"),
                        Patch(color=COLORS["accepted"], label="accepted")], loc="upper right", fontsize=8)
    cond = trace.conditional_acceptance if trace is not None else []
    pos = list(range(1, n_pos + 1))
    vals = [cond[i] if i < len(cond) and not math.isnan(cond[i]) else 0.0 for i in range(n_pos)]
    ax2.bar(pos, vals, color=COLORS["accepted"])
    for p, i in zip(pos, range(n_pos)):
        unseen = i >= len(cond) or math.isnan(cond[i])
        ax2.text(p, vals[i] + 0.03, "n/a" if unseen else f"{vals[i]:.2f}", ha="center", fontsize=8)
    ax2.set(xlabel="draft position", ylabel="P(accept | earlier accepted)", title="conditional acceptance",
            ylim=(0, 1.15), xticks=pos)
    if title:
        fig.suptitle(title)
    return fig


def speed_figure(trace: Trace | None, baseline: Trace | None, *, device_name: str = ""):
    """Tokens per target forward and wall clock: this method against AR on the same model."""
    fig, (ax1, ax2) = _figure(9, 2.6, 2)
    if trace is None or baseline is None:
        for ax in (ax1, ax2):
            ax.text(0.5, 0.5, "not decoded yet", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
        return fig
    names = ["ar", trace.method] if trace.method != "ar" else ["ar"]
    traces = [baseline, trace] if trace.method != "ar" else [baseline]
    colors = [COLORS["discarded"], COLORS["accepted"]][:len(names)]
    tpf = [t.tokens_per_forward for t in traces]
    ax1.bar(names, tpf, color=colors)
    ax1.set(title="tokens per target forward", ylim=(0, max(tpf) * 1.25))
    for i, v in enumerate(tpf):
        ax1.text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    ms = [1000 * t.wall_s for t in traces]
    ax2.bar(names, ms, color=colors)
    ax2.set(title=f"wall clock, ms ({device_name or 'device'})", ylim=(0, max(ms) * 1.25))
    for i, v in enumerate(ms):
        ax2.text(i, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
    return fig


def compare_figure(traces: dict):
    """Per-position conditional acceptance for several decodes side by side ({label: Trace})."""
    fig, (ax,) = _figure(10, 3)
    fig.subplots_adjust(right=0.6)  # the legend sits to the right of the bars
    n = max((len(t.conditional_acceptance) for t in traces.values()), default=0)
    width = 0.8 / max(1, len(traces))
    for j, (label, t) in enumerate(traces.items()):
        cond = t.conditional_acceptance
        xs = [i + 1 + (j - (len(traces) - 1) / 2) * width for i in range(len(cond))]
        ax.bar(xs, [0.0 if math.isnan(c) else c for c in cond], width=width,
               label=f"{label} (mean accepted length {t.mean_accepted_length:.2f})")
    ax.set(xlabel="draft position", ylabel="P(accept | earlier accepted)", ylim=(0, 1.1),
           xticks=list(range(1, n + 1)), title="conditional acceptance by draft position")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return fig


def png(fig, dpi: int = 80) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


# ---------------------------------------------------------------------------------- the view
class AcceptanceLab:
    """The ipywidgets front end. `lab.widget` is the box to display; `lab.state` the current LabState."""

    def __init__(self, state: LabState | None = None, *, models: ModelCache | None = None, **settings):
        import ipywidgets as w  # lazy: only the lab needs ipywidgets

        self.state = configure(state or LabState(), **settings)
        self.models = models or ModelCache()
        names = sorted(p.stem for p in ckpt.CHECKPOINT_DIR.glob("*.safetensors"))
        s = self.state
        self.controls = {
            "method": w.Dropdown(options=list(generate.METHODS), value=s.method, description="method"),
            "checkpoint": w.Dropdown(options=[DEFAULT_CHECKPOINT] + [n for n in names if n != DEFAULT_CHECKPOINT],
                                     value=s.checkpoint, description="checkpoint"),
            "k": w.IntText(value=s.k, description="k"),
            "temperature": w.FloatText(value=s.temperature, description="temperature"),
            "device": w.Dropdown(options=list(dict.fromkeys([s.device, *DEVICES])), value=s.device,
                                 description="device"),
            "max_new_tokens": w.IntText(value=s.max_new_tokens, description="new tokens"),
            "prompt": w.Textarea(value=s.prompt, description="prompt", continuous_update=False,
                                 layout=w.Layout(width="60%")),
        }
        for name, c in self.controls.items():
            c.style.description_width = "90px"
            c.add_class(f"mtplab-{name.replace('_', '-')}")
            c.observe(lambda ch, name=name: self._set(name, ch["new"]), names="value")
        self.buttons = {
            # no icons: Font Awesome would be one more thing for the offline report to serve
            "step": w.Button(description="Step ▸", tooltip="reveal one decoding step", button_style="primary"),
            "run": w.Button(description="Run all ▸▸", tooltip="reveal every step"),
            "reset": w.Button(description="Reset", tooltip="back to step 0"),
        }
        for name, b in self.buttons.items():
            b.add_class(f"mtplab-{name}")
        self.buttons["step"].on_click(lambda _: self._do(lambda st: step(st, self.models)))
        self.buttons["run"].on_click(lambda _: self._do(lambda st: run_all(st, self.models)))
        self.buttons["reset"].on_click(lambda _: self._do(reset))
        self.status = w.HTML().add_class("mtplab-status")
        self.tokens = w.HTML().add_class("mtplab-tokens")
        self.accept_chart = w.Image(format="png").add_class("mtplab-acceptance")
        self.speed_chart = w.Image(format="png").add_class("mtplab-speed")
        c = self.controls
        self.widget = w.VBox([
            w.HBox([c["method"], c["checkpoint"], c["device"]]),
            w.HBox([c["k"], c["temperature"], c["max_new_tokens"]]),
            c["prompt"],
            w.HBox(list(self.buttons.values())),
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

    def step(self, n: int = 1) -> "AcceptanceLab":
        self._do(lambda st: step(st, self.models, n))
        return self

    def run_all(self) -> "AcceptanceLab":
        self._do(lambda st: run_all(st, self.models))
        return self

    def reset(self) -> "AcceptanceLab":
        self._do(reset)
        return self

    def set(self, **settings) -> "AcceptanceLab":
        """Change settings from code; the controls follow (and their observers re-apply the same values)."""
        self._do(lambda st: configure(st, **settings))
        for name, value in settings.items():
            self.controls[name].value = value
        return self

    def render(self):
        s = self.state
        color = "#b30000" if s.error else "#333"
        self.status.value = f"<div style='color:{color}'>{html.escape(status_text(s))}</div>"
        self.tokens.value = tokens_html(s)
        limit = (s.model_k - 1) if s.model_k else max(1, s.k - 1)
        self.accept_chart.value = png(acceptance_figure(s.trace_so_far, max_drafts=limit))
        drawn = self._speed_for
        if drawn is None or drawn[0] is not s.trace or drawn[1] is not s.baseline:
            self._speed_for = (s.trace, s.baseline)  # the speed chart covers the whole decode: redraw on change
            self.speed_chart.value = png(speed_figure(s.trace, s.baseline, device_name=s.device_name))

    def _ipython_display_(self):
        from IPython.display import display
        display(self.widget)


def lab(**settings) -> AcceptanceLab:
    """The acceptance lab with these settings (see `LabState` for the names)."""
    return AcceptanceLab(**settings)


__all__ = ["AcceptanceLab", "COLORS", "KINDS", "LabState", "ModelCache", "StepRecord", "TokenView", "acceptance_figure",
           "compare_figure", "configure", "decode", "lab", "reset", "run_all", "speed_figure", "step", "step_record"]
