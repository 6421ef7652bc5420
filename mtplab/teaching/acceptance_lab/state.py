"""The acceptance lab's state: what the widget shows, as a frozen dataclass and pure functions on it.

No ipywidgets here (the view is `mtplab.widgets`), no figures (`mtplab.viz_tokens`): everything in this
module is tested without a browser (tests/test_widgets.py).

`LabState` holds the settings, the decoded `Trace`, how many of its steps are shown and the last error
message. `configure`, `decode`, `step`, `back`, `run_all` and `reset` return a new state. The whole decode
runs once (`generate.decode_with`) and its steps are revealed one at a time, forward or back: the record
of a step is then the same whichever way the reader reached it. The autoregressive (AR) decode of the same
model, prompt and settings runs beside it, for the wall-clock comparison. Every method is warmed up once
per model and device before its first timed decode.

A step's tokens, in the order they were committed (the words are defined in docs/glossary.md):
    predict           plain schedule only: the target's own next token, from the predict forward
    accepted          a draft the target kept (the kept drafts are always a prefix)
    rejected          the first draft the target did not keep
    discarded         drafts after the rejected one: thrown away unchecked
    bonus-target      all drafts kept: the target's next token after them, free from the verify forward
    bonus-correction  a draft was rejected: the target's token in its place (greedy: its argmax;
                      sampling: a draw from norm(max(0, p - q)))
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from mtplab.model import checkpoint as ckpt
from mtplab.decoding import generate
from mtplab.decoding.checks import check_k
from mtplab.device import describe, pick
from mtplab.decoding.drafters import METHODS
from mtplab.errors import MtplabError
from mtplab.tokenizer import decode as decode_bytes, encode, token_repr
from mtplab.decoding.trace import Trace
from mtplab.viz.kinds import StepRecord
from mtplab.viz.kinds import step_record

DEFAULT_CHECKPOINT = "default"  # the checkpoint the METHODS table names for the method
DEFAULT_PROMPT = "import os\nimport sys\n\ndef main("  # the first steps are words, not indentation
SETTINGS = ("method", "k", "prompt", "temperature", "device", "max_new_tokens", "checkpoint", "seed", "heads")


@dataclass(frozen=True)
class LabState:
    """Everything the lab shows. Settings first; then what the last decode produced."""
    method: str = "meta"
    k: int = 4                       # tokens per step: at most k-1 drafts + 1 token from the target
    prompt: str = DEFAULT_PROMPT
    temperature: float = 0.0
    device: str = "auto"
    max_new_tokens: int = 48
    checkpoint: str = DEFAULT_CHECKPOINT  # a shipped name, a .safetensors path, or a Hugging Face model folder
    seed: int = 0
    heads: str = ""                  # with a Hugging Face folder: its heads checkpoint (mtplab train --hf)
    trace: Trace | None = None       # the whole decode with these settings (None: not run yet)
    baseline: Trace | None = None    # AR decode of the same model, for the wall-clock comparison
    shown: int = 0                   # steps of `trace` revealed so far
    error: str = ""                  # the last bad-input message ('' when fine)
    device_name: str = ""            # mtplab.device.describe() of the device the decode ran on
    checkpoint_name: str = ""        # the checkpoint actually loaded
    model_k: int | None = None       # generate.max_k for the loaded checkpoint (None: no limit)
    label: Callable[[int], str] = token_repr  # prints one token of the loaded model's vocabulary
    detok: Callable[[list[int]], str] = decode_bytes  # token ids -> text, with the loaded model's tokenizer

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
        return [step_record(i, s, self.label) for i, s in enumerate(self.trace.steps[:self.shown])]

    @property
    def trace_so_far(self) -> Trace | None:
        """The trace cut at the revealed steps: its counters are what the charts show."""
        if self.trace is None:
            return None
        t = self.trace
        return Trace(method=t.method, prompt=t.prompt, steps=t.steps[:self.shown], k=t.k, schedule=t.schedule)


def configure(state: LabState, **settings) -> LabState:
    """Change settings. Any change drops the decoded trace: the next step decodes afresh."""
    unknown = set(settings) - set(SETTINGS)
    if unknown:
        raise MtplabError(f"unknown lab settings {sorted(unknown)}; use {', '.join(SETTINGS)}")
    if all(getattr(state, n) == v and type(getattr(state, n)) is type(v) for n, v in settings.items()):
        return state
    return replace(state, trace=None, baseline=None, shown=0, error="", **settings)


@dataclass
class ModelCache:
    """Loaded checkpoints keyed by (name, device), so stepping through settings does not reload;
    `warm` runs each method once per model, so the first timed decode pays no one-off set-up."""
    models: dict = field(default_factory=dict)
    warmed: set = field(default_factory=set)

    def get(self, name: str, device, heads: str = ""):
        key = (name, str(device)) if not heads else (name, heads, str(device))
        if key not in self.models:
            if is_hf_folder(name):  # your own model (pip install -e ".[hf]"), with its heads if given
                from mtplab.hf.target import load_target
                self.models[key] = load_target(name, heads or None, device=device)
            elif heads:
                raise MtplabError("heads= goes with a Hugging Face model folder as the checkpoint; the lab's own "
                                  "head checkpoints are chosen by name (e.g. stern-k4)")
            else:
                self.models[key] = ckpt.load(name, device=device)
        return self.models[key]

    def warm(self, method: str, model, *, k: int, draft_model=None) -> None:
        key = (method, id(model), k)
        if key not in self.warmed:
            generate.decode_with(method, model, text_ids(model, "def f(x):\n"), max_new_tokens=8, k=k,
                                 draft_model=draft_model)
            self.warmed.add(key)


def is_hf_folder(name: str) -> bool:
    """A local Hugging Face model: a folder with a config.json (and weights, and a tokenizer)."""
    return Path(name).is_dir() and (Path(name) / "config.json").is_file()


def text_ids(model, text: str) -> list[int]:
    """The prompt in the model's own tokens: bytes for the lab's models, the model's tokenizer for HF ones."""
    return model.encode(text) if hasattr(model, "encode") else encode(text)


def validate(state: LabState) -> None:
    """The checks the core would also make, done first so that the message names the widget's control."""
    if state.method not in METHODS:
        raise MtplabError(f"unknown method {state.method!r}; choose one of {', '.join(METHODS)}")
    if not isinstance(state.prompt, str) or not state.prompt:
        raise MtplabError("the prompt is empty; type at least one character")
    check_k(state.k)
    t = state.temperature
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not (t >= 0):  # also catches NaN
        raise MtplabError(f"temperature must be >= 0 (got {t!r}); 0 means greedy")
    if not isinstance(state.checkpoint, str) or not state.checkpoint:
        raise MtplabError(f"checkpoint must be a name or a path (got {state.checkpoint!r}); use 'default'")


def decode(state: LabState, models: ModelCache) -> LabState:
    """Run the whole decode (and its AR baseline) for the current settings; bad input -> state.error."""
    try:
        validate(state)
        dev = pick(state.device)
        name = (METHODS[state.method].checkpoint if state.checkpoint == DEFAULT_CHECKPOINT
                else str(state.checkpoint))
        model = models.get(name, dev, state.heads)
        draft = models.get("draft", dev) if state.method == "draft-model" else None
        ids = text_ids(model, state.prompt)
        opts = dict(max_new_tokens=state.max_new_tokens, temperature=float(state.temperature), seed=state.seed)
        limit = generate.max_k(state.method, model)
        models.warm(state.method, model, k=min(state.k, limit or state.k), draft_model=draft)
        models.warm("ar", model, k=1)
        trace = generate.decode_with(state.method, model, ids, k=state.k, draft_model=draft, **opts)
        baseline = trace if state.method == "ar" else generate.decode_with("ar", model, ids, **opts)
    except MtplabError as e:
        return replace(state, trace=None, baseline=None, shown=0, error=str(e))
    return replace(state, trace=trace, baseline=baseline, shown=0, error="", device_name=describe(dev),
                   checkpoint_name=name, model_k=limit, label=getattr(model, "token_repr", token_repr),
                   detok=getattr(model, "decode", decode_bytes))


def step(state: LabState, models: ModelCache, n: int = 1) -> LabState:
    """Reveal the next n steps, decoding first if needed."""
    if state.trace is None:
        state = decode(state, models)
        if state.trace is None:
            return state
    return replace(state, shown=min(state.total_steps, state.shown + n))


def back(state: LabState, n: int = 1) -> LabState:
    """Hide the last n revealed steps (never below none shown); the decode is kept."""
    return replace(state, shown=max(0, state.shown - n))


def run_all(state: LabState, models: ModelCache) -> LabState:
    """Reveal every step, decoding first if needed."""
    state = step(state, models, 0)
    return replace(state, shown=state.total_steps) if state.trace is not None else state


def reset(state: LabState) -> LabState:
    """Back to no steps shown; the settings stay, and the decode runs again at the next step."""
    return replace(state, trace=None, baseline=None, shown=0, error="")
