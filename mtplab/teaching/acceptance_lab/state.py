"""The acceptance lab's state: what the widget shows, as a frozen dataclass and pure functions on it.

No ipywidgets here (the view is `view.py`), no figures (`mtplab.viz.decode`), no models, files or clocks (those
are `session.py`): everything in this module is tested without a browser (tests/teaching/test_acceptance_lab.py).

`LabState` holds the settings, the decoded `Trace` (None until `session.decode` ran), how many of its steps are
shown, a one-line note and the last error message. `configure`, `step`, `back`, `jump`, `run_all`, `reset` and
`new_sample` return a new state and never decode: the whole decode runs once (`session.decode`, which the view
calls when `state.trace is None`) and its steps are revealed one at a time, forward or back, so that the record
of a step is the same whichever way the reader reached it. Any change of a setting drops the decode and takes the
reader back to step 0 of the new settings: the next Step decodes them and shows their step 1.

The decode is run with `probe=True` (`mtplab.decoding.loop.iter_steps`): each step keeps what its accept rule saw
(`Step.verify_row`, the verify forward's logits at the decisive row, and `Step.q`, the drafter's q), so that
`inside` can show the target's top-2 at a rejected greedy draft, or p, q and the residual norm(max(0, p - q)) at
a sampled correction.

A step's tokens, in the order they were committed (the words are defined in docs/glossary.md):
    prefill           step 0 only: the target's first token, from the prompt's one forward
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
from dataclasses import dataclass, replace

import torch

from mtplab.decoding.accept import distribution
from mtplab.decoding.checks import check_k
from mtplab.decoding.drafters import METHODS
from mtplab.decoding.trace import Trace
from mtplab.errors import MtplabError
from mtplab.tokenizer import decode as decode_bytes, token_repr
from mtplab.viz.kinds import StepRecord, step_record

DEFAULT_CHECKPOINT = "default"  # the checkpoint the METHODS table names for the method
DEFAULT_PROMPT = "import os\nimport sys\n\ndef main("  # the first steps are words, not indentation
AUTO = "auto"                   # method="auto": the benchmark's fastest method on this kind of device
# the lab's one demo (the widget's default, notebook 05, the offline page, teaching.md): on the default prompt its
# first four steps show accepted, rejected, discarded and bonus tokens (tests/teaching/test_acceptance_lab.py checks it)
DEMO = {"method": "blockwise-overlap", "k": 4, "checkpoint": DEFAULT_CHECKPOINT}
SETTINGS = ("method", "k", "prompt", "temperature", "device", "max_new_tokens", "checkpoint", "seed", "heads",
            "repeats")
MAX_PROMPT_CHARS = 1 << 16  # as the CLI's prompt files: more than the lab's models' context windows hold
MAX_REPEATS = 50


@dataclass(frozen=True)
class LabState:
    """Everything the lab shows. Settings first; then what the last decode produced."""
    method: str = DEMO["method"]
    k: int = 4                       # tokens per step: at most k-1 drafts + 1 token from the target
    prompt: str = DEFAULT_PROMPT
    temperature: float = 0.0
    device: str = "auto"
    max_new_tokens: int = 48
    checkpoint: str = DEFAULT_CHECKPOINT  # a shipped name, a .safetensors path, or a Hugging Face model folder
    seed: int = 0
    heads: str = ""                  # with a Hugging Face folder: its heads checkpoint (mtplab train --hf)
    repeats: int = 1                 # timed (AR, method) pairs, interleaved; the charts show median and range
    trace: Trace | None = None       # the whole decode with these settings (None: not run yet)
    baseline: Trace | None = None    # AR decode of the same model, for the wall-clock comparison
    shown: int = 0                   # steps of `trace` revealed so far
    error: str = ""                  # the last bad-input message ('' when fine)
    note: str = ""                   # one line on what the lab chose for you (a clamped k, the default demo)
    device_name: str = ""            # mtplab.device.describe() of the device the decode ran on
    checkpoint_name: str = ""        # the checkpoint actually loaded
    model_k: int | None = None       # the heads' limit on k for the method (generate.max_k; None: no limit)
    walls: dict | None = None        # {"ar": [s, ...], method: [s, ...]}: one synced wall time per repeat
    splits: dict | None = None       # {"ar": decode_split, method: decode_split} of the shown decodes
    busy: str | None = None          # the race's busy-machine verdict: why its timings are not valid here
    label: Callable[[int], str] = token_repr  # prints one token of the loaded model's vocabulary
    detok: Callable[[list[int]], str] = decode_bytes  # token ids -> text, with the loaded model's tokenizer

    @property
    def total_steps(self) -> int:
        return len(self.trace.steps) if self.trace is not None else 0

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


_DROP = dict(trace=None, baseline=None, shown=0, error="", walls=None, splits=None, busy=None)


def configure(state: LabState, **settings) -> LabState:
    """Change settings. Any change drops the decoded trace and the reader is back at step 0: the next step
    decodes afresh."""
    unknown = set(settings) - set(SETTINGS)
    if unknown:
        raise MtplabError(f"unknown lab settings {sorted(unknown)}; use {', '.join(SETTINGS)}")
    if all(getattr(state, n) == v and type(getattr(state, n)) is type(v) for n, v in settings.items()):
        return state
    return replace(state, **{**_DROP, "note": ""}, **settings)


def failed(state: LabState, message: str) -> LabState:
    """The settings kept, the decode dropped, the message shown."""
    return replace(state, **{**_DROP, "error": message})


def validate(state: LabState) -> None:
    """The checks the core would also make, done first so that the message names the widget's control."""
    if state.method == AUTO:
        raise MtplabError("method 'auto' is chosen from the shipped benchmark first: decode with session.decoded")
    if state.method not in METHODS:
        raise MtplabError(f"unknown method {state.method!r}; choose one of {', '.join(METHODS)}")
    p = state.prompt
    if not isinstance(p, str) or not p:
        raise MtplabError("the prompt is empty; type at least one character")
    if len(p) > MAX_PROMPT_CHARS:
        raise MtplabError(f"the prompt has {len(p)} characters, more than the lab takes ({MAX_PROMPT_CHARS}); "
                          "shorten it")
    try:
        p.encode("utf-8")
    except UnicodeEncodeError as e:
        raise MtplabError(f"the prompt holds a character that is not text (at position {e.start}); "
                          "retype the prompt") from None
    check_k(state.k)
    t = state.temperature
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not (0 <= t < float("inf")):  # also NaN
        raise MtplabError(f"temperature must be >= 0 and finite (got {t!r}); 0 means greedy")
    if not isinstance(state.checkpoint, str) or not state.checkpoint:
        raise MtplabError(f"checkpoint must be a name or a path (got {state.checkpoint!r}); use 'default'")
    s = state.seed
    if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < 2 ** 63:
        raise MtplabError(f"seed must be an integer from 0 to 2**63 - 1 (got {s!r})")
    r = state.repeats
    if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= MAX_REPEATS:
        raise MtplabError(f"repeats must be an integer from 1 to {MAX_REPEATS} (got {r!r})")


def fit_k(state: LabState, limit: int, checkpoint: str, *, clamp: bool = False) -> LabState:
    """The lab's one check of k against the most the checkpoint supports for the method (`session.k_limit`), made
    before anything is drawn or allocated: an absurd k (10**9) is a message, not a 24 GB chart. A k above the
    limit is refused with a message that names it; with clamp=True (the method or the checkpoint changed, so k
    is a setting to adjust) it is set to the limit, with a one-line note."""
    k = state.k
    if isinstance(k, bool) or not isinstance(k, int) or k <= limit:
        return state
    if clamp:
        return replace(state, k=limit, note=f"k={k} is more than {checkpoint} supports for {state.method}: k set "
                                            f"to {limit}")
    return failed(state, f"k={k} is larger than {checkpoint} supports for {state.method} (at most {limit})")


# ---------------------------------------------------------------------------------- revealing a decode
def step(state: LabState, n: int = 1) -> LabState:
    """Reveal the next n steps of the decode (nothing to reveal before it ran)."""
    return replace(state, shown=min(state.total_steps, state.shown + n))


def back(state: LabState, n: int = 1) -> LabState:
    """Hide the last n revealed steps (never below none shown); the decode is kept."""
    return replace(state, shown=max(0, state.shown - n))


def jump(state: LabState, n: int) -> LabState:
    """Show exactly the first n steps (clamped to the decode)."""
    return replace(state, shown=max(0, min(state.total_steps, int(n))))


def run_all(state: LabState) -> LabState:
    """Reveal every step."""
    return replace(state, shown=state.total_steps)


def reset(state: LabState) -> LabState:
    """Back to no steps shown; the settings (the seed too) stay, and the same decode runs again at the next step."""
    return replace(state, **_DROP)


def new_sample(state: LabState) -> LabState:
    """The next seed (the decode dropped): at a temperature above 0 a new sample, at 0 the same greedy tokens.
    The view decodes it and shows as many steps as before (at least one)."""
    seed = state.seed + 1 if isinstance(state.seed, int) and not isinstance(state.seed, bool) else 0
    return configure(state, seed=seed)


# ---------------------------------------------------------------------------------- inside a step
@dataclass(frozen=True)
class Inside:
    """What decided a step that rejected a draft, at the rejected position. Greedy: the target's top-2 there and
    their logit gap. Sampled: the rows of p (target), q (drafter) and the residual norm(max(0, p - q)) from which
    the correction is drawn, for the tokens that matter (the draft, the correction, the largest of each)."""
    step: int
    position: int                    # 0-based index of the decisive draft in step.drafted
    draft: int
    committed: int | None            # the token the target committed there (the correction or the bonus)
    greedy: bool
    top2: tuple[tuple[int, float], tuple[int, float]] | None = None  # greedy: ((token, logit), (token, logit))
    gap: float = 0.0                 # greedy: logit of the top-1 minus the top-2
    draft_rank: int = 0              # greedy: the draft's rank among the target's logits (1 = its argmax)
    rows: tuple[tuple[int, float, float, float], ...] = ()  # sampled: (token, p, q, residual)
    residual: bool = False           # sampled: a correction was drawn from the residual


def inside(state: LabState, i: int, *, n_tokens: int = 5) -> Inside | None:
    """What the accept rule saw at step i's rejected draft (None: no drafts, nothing recorded, or all kept)."""
    if state.trace is None or not 0 <= i < state.total_steps or state.trace.steps[i].verify_row is None:
        return None
    s = state.trace.steps[i]
    pos = s.accepted
    if pos >= len(s.drafted):
        return None  # every draft kept: the row decided only the bonus
    logits = s.verify_row.detach().float().cpu()
    draft, committed = s.drafted[pos], s.bonus
    if float(state.temperature) == 0:  # greedy
        vals, idx = torch.topk(logits, 2)
        rank = int((logits > logits[draft]).sum()) + 1
        return Inside(i, pos, draft, committed, True, top2=((int(idx[0]), float(vals[0])), (int(idx[1]), float(vals[1]))),
                      gap=float(vals[0] - vals[1]), draft_rank=rank)
    p = distribution(logits[None], float(state.temperature), None)[0]
    if s.q is not None and pos < s.q.shape[0]:
        q = s.q[pos].detach().float().cpu()
    else:
        q = torch.nn.functional.one_hot(torch.tensor(draft), p.shape[0]).float()
    diff = torch.clamp(p - q, min=0)
    res = diff / diff.sum() if float(diff.sum()) > 0 else p
    picks = [draft] + ([committed] if committed is not None else [])
    for t in (res, p, q):
        picks += torch.topk(t, min(n_tokens, t.shape[0])).indices.tolist()
    must = {draft, committed}
    tokens = [t for t in dict.fromkeys(int(t) for t in picks)
              if t in must or max(float(p[t]), float(q[t]), float(res[t])) >= 5e-4][:n_tokens + 2]
    rows = tuple((t, float(p[t]), float(q[t]), float(res[t])) for t in tokens)
    return Inside(i, pos, draft, committed, False, rows=rows, residual=s.bonus_source == "correction")
