"""The acceptance lab's state: what the widget shows, as a frozen dataclass and pure functions on it.

No ipywidgets here (the view is `view.py`), no figures (`mtplab.viz.decode`): everything in this module is
tested without a browser (tests/test_widgets.py).

`LabState` holds the settings, the decoded `Trace`, how many of its steps are shown, a one-line note and the
last error message. `configure`, `change`, `decode`, `step`, `back`, `jump`, `run_all`, `reset` and
`new_sample` return a new state. The whole decode runs once and its steps are revealed one at a time, forward
or back: the record of a step is then the same whichever way the reader reached it. While it runs, the lab
keeps what each step's accept rule saw (`Probe`: the drafter's q and the verify forward's logits at the
decisive row), so that `inside` can show the target's top-2 at a rejected greedy draft, or p, q and the
residual norm(max(0, p - q)) at a sampled correction. The autoregressive (AR) decode of the same model, prompt
and settings runs beside it; with `repeats` > 1 the pair runs that many times, interleaved, and the charts
show the median and the range. Every clock is read after syncing the device (`mtplab.device.sync`). Every
method is warmed up once per model and device before its first timed decode.

`method="auto"` takes the method, k and checkpoint from the shipped decode benchmark (`default_demo`): the
fastest method against AR where the record was measured on this kind of device.

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

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from mtplab.decoding import generate
from mtplab.decoding.accept import distribution
from mtplab.decoding.checks import check_k
from mtplab.decoding.drafters import METHODS, method as get_method
from mtplab.decoding.loop import autoregressive, speculative
from mtplab.decoding.trace import Trace
from mtplab.device import describe, pick
from mtplab.errors import MtplabError
from mtplab.hf.real import chat_ids, shipped_heads
from mtplab.measuring.race import race
from mtplab.measuring.speedup import read_decode_bench
from mtplab.model import checkpoint as ckpt
from mtplab.paths import DECODE_JSON, REAL_NAMES
from mtplab.tokenizer import decode as decode_bytes, encode, token_repr
from mtplab.viz.decode import decode_split
from mtplab.viz.kinds import StepRecord, step_record

DEFAULT_CHECKPOINT = "default"  # the checkpoint the METHODS table names for the method
DEFAULT_PROMPT = "import os\nimport sys\n\ndef main("  # the first steps are words, not indentation
AUTO = "auto"                   # method="auto": the benchmark's fastest method on this kind of device
# the lab's one demo (the widget's default, notebook 05, the offline page, teaching.md): on the default prompt its
# first four steps show accepted, rejected, discarded and bonus tokens (tests/test_widgets.py checks it)
DEMO = {"method": "blockwise-overlap", "k": 4, "checkpoint": DEFAULT_CHECKPOINT}
SETTINGS = ("method", "k", "prompt", "temperature", "device", "max_new_tokens", "checkpoint", "seed", "heads",
            "repeats")


@dataclass(frozen=True)
class Probe:
    """What the accept rule saw at one step, kept while the decode ran: the verify forward's logits at the
    decisive row (the row that predicts the rejected draft, or the bonus when all were kept) and the drafter's
    q for its drafts (None: a greedy drafter, one-hot on its drafts)."""
    logits: torch.Tensor             # (V,)
    q: torch.Tensor | None           # (n, V)


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
    model_k: int | None = None       # generate.max_k for the loaded checkpoint (None: no limit)
    walls: dict | None = None        # {"ar": [s, ...], method: [s, ...]}: one synced wall time per repeat
    splits: dict | None = None       # {"ar": decode_split, method: decode_split}: medians over the repeats
    busy: str | None = None          # the race's busy-machine verdict: why its timings are not valid here
    probes: tuple = ()               # one Probe (or None) per step of `trace`
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


_DROP = dict(trace=None, baseline=None, shown=0, error="", walls=None, splits=None, probes=(), busy=None)


def configure(state: LabState, **settings) -> LabState:
    """Change settings. Any change drops the decoded trace: the next step decodes afresh."""
    unknown = set(settings) - set(SETTINGS)
    if unknown:
        raise MtplabError(f"unknown lab settings {sorted(unknown)}; use {', '.join(SETTINGS)}")
    if all(getattr(state, n) == v and type(getattr(state, n)) is type(v) for n, v in settings.items()):
        return state
    return replace(state, **{**_DROP, "note": ""}, **settings)


def change(state: LabState, models: ModelCache, **settings) -> LabState:
    """`configure`, then, when the method or the checkpoint changed, clamp k to what the checkpoint supports
    for the method, with a one-line note (a k the new checkpoint cannot take is a setting, not an error)."""
    new = configure(state, **settings)
    if new is state or not ({"method", "checkpoint", "heads"} & set(settings)):
        return new
    try:
        new = resolve_auto(new)
        limit = k_limit(new, models)
    except MtplabError:
        return new  # the decode reports it, naming the control
    if isinstance(new.k, int) and new.k > limit:
        name = _checkpoint_name(new)
        return replace(new, k=limit, note=f"k={new.k} is more than {name} supports for {new.method}: k set to {limit}")
    return new


# ---------------------------------------------------------------------------------- the default demo
def _row_choice(row: dict) -> tuple[str, str] | None:
    """A benchmark row's label -> (method, checkpoint): 'deepseek D=3' is deepseek on deepseek-d3."""
    label = str(row.get("method", ""))
    name, _, rest = label.partition(" ")
    if name not in METHODS or name in ("ar", "oracle"):  # the oracle knows the answer: it is no demo
        return None
    if row.get("checkpoint"):
        return name, str(row["checkpoint"])
    if rest.startswith("D="):
        return name, f"deepseek-d{rest[2:]}"
    return name, DEFAULT_CHECKPOINT


def record_machine(record: dict) -> str:
    """The machine a benchmark record was measured on: its 'machine' field, else its device and threads."""
    m = record.get("machine")
    if isinstance(m, dict):
        return ", ".join(str(m[k]) for k in ("cpu", "device") if m.get(k)) + (
            f", {m['threads']} threads" if m.get("threads") else "")
    if isinstance(m, str) and m:
        return m
    threads = record.get("threads", "?")
    return f"{record.get('device', 'unknown device')}, {threads} thread{'' if threads == 1 else 's'}"


def _record_device(record: dict) -> str:
    m = record.get("machine")
    dev = m.get("device") if isinstance(m, dict) else None
    return str(dev or record.get("device", ""))


def choose_demo(record: dict, device_name: str) -> dict:
    """The default demo from a decode benchmark record: the method with the best measured wall-clock speedup
    over AR when the record was measured on this kind of device ('cpu', 'cuda (...)'), else the best tokens per
    forward. Returns method, k, checkpoint and a one-line note that says why."""
    rows = [(r, c) for r in record.get("rows", []) if isinstance(r, dict) and (c := _row_choice(r))]
    if not rows:
        raise MtplabError("the benchmark record has no rows with a lab method")
    rec_dev = _record_device(record)
    same = rec_dev.split(" ")[0] == device_name.split(" ")[0]
    key = "speedup_wall" if same else "tokens_per_forward"
    rows = [(r, c) for r, c in rows if isinstance(r.get(key), (int, float))]
    if not rows:
        raise MtplabError(f"the benchmark record has no {key}")
    best, (method, name) = max(rows, key=lambda rc: rc[0][key])
    k = int(best.get("k") or 4)
    where = record_machine(record)
    if same:
        note = (f"default demo: {best['method']} k={k}, the fastest against AR in the shipped benchmark "
                f"({best[key]:.2f}x wall clock, {best.get('tokens_per_forward', float('nan')):.2f} tokens per forward; "
                f"{where})")
    else:
        note = (f"default demo: {best['method']} k={k}, the most tokens per forward in the shipped benchmark "
                f"({best[key]:.2f}); it was measured on {where}, not on {device_name}, so its wall clock says "
                "nothing here")
    return {"method": method, "k": k, "checkpoint": name, "note": note}


def default_demo(device: str = "auto", path=DECODE_JSON) -> dict:
    """`choose_demo` on the shipped benchmark (read at start-up: it is re-measured when checkpoints change);
    blockwise-overlap k=4 with a note when the record cannot be read."""
    try:
        return choose_demo(read_decode_bench(path), describe(pick(device)))
    except MtplabError as e:
        return {"method": "blockwise-overlap", "k": 4, "checkpoint": DEFAULT_CHECKPOINT,
                "note": f"default demo: blockwise-overlap k=4 ({e})"}


def resolve_auto(state: LabState) -> LabState:
    """method='auto' -> the default demo's method, k and checkpoint (a checkpoint you chose is kept)."""
    if state.method != AUTO:
        return state
    demo = default_demo(state.device if isinstance(state.device, str) else "auto")
    checkpoint = demo["checkpoint"] if state.checkpoint == DEFAULT_CHECKPOINT else state.checkpoint
    return replace(state, method=demo["method"], k=demo["k"], checkpoint=checkpoint, note=demo["note"])


# ---------------------------------------------------------------------------------- models
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
    """A local Hugging Face model: a folder with a config.json (and weights, and a tokenizer), or the bare name of
    a real model the lab installs from a package (smollm2)."""
    return name in REAL_NAMES or (Path(name).is_dir() and (Path(name) / "config.json").is_file())


def heads_for(state: "LabState") -> str:
    """The heads checkpoint to load with the model: the one given, or for a real model named bare (smollm2) the
    heads the lab ships for the method's family."""
    if state.heads or state.checkpoint not in REAL_NAMES or state.method not in METHODS:
        return state.heads
    family = METHODS[state.method].family
    if family is None:
        return ""
    found = shipped_heads(state.checkpoint, family)
    if found is None:
        raise MtplabError(f"the lab ships no {family} heads for {state.checkpoint}; choose deepseek, "
                          "deepseek-reuse, blockwise-overlap, ngram or ar")
    return str(found)


def text_ids(model, text: str) -> list[int]:
    """The prompt in the model's own tokens: bytes for the lab's models, the model's tokenizer for HF ones, and for
    a chat model the lab installs (smollm2) one user turn of its chat template."""
    if getattr(model, "chat", False):
        return chat_ids(model, text)
    return model.encode(text) if hasattr(model, "encode") else encode(text)


def _checkpoint_name(state: LabState) -> str:
    if state.checkpoint == DEFAULT_CHECKPOINT and state.method in METHODS:
        return METHODS[state.method].checkpoint
    return str(state.checkpoint)


def k_limit(state: LabState, models: ModelCache) -> int:
    """The largest k this method can take on this checkpoint: the heads' limit, and in any case what fits the
    context window (a verify forward over k positions after one prompt and one new token)."""
    if state.method not in METHODS:
        raise MtplabError(f"unknown method {state.method!r}; choose one of {', '.join(METHODS)}")
    model = models.get(_checkpoint_name(state), pick(state.device), heads_for(state))
    window = model.config.block_size - 2
    limit = generate.max_k(state.method, model)
    return min(limit, window) if limit is not None else window


def check_k_fits(state: LabState, models: ModelCache) -> LabState:
    """An absurd k (10**9) is a message before anything is drawn or allocated, not a 24 GB chart."""
    try:
        state = resolve_auto(state)
        limit = k_limit(state, models)
    except MtplabError:
        return state  # a bad method, checkpoint or device: the decode names the control
    if isinstance(state.k, int) and not isinstance(state.k, bool) and state.k > limit:
        return replace(state, **{**_DROP, "error": f"k={state.k} is larger than {_checkpoint_name(state)} supports "
                                                   f"for {state.method} (at most {limit})"})
    return state


# ---------------------------------------------------------------------------------- decoding
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
    if isinstance(state.seed, bool) or not isinstance(state.seed, int):
        raise MtplabError(f"seed must be an integer (got {state.seed!r})")
    r = state.repeats
    if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= 50:
        raise MtplabError(f"repeats must be an integer from 1 to 50 (got {r!r})")


class _Recorder:
    """A drafter that passes everything through to `inner` and keeps, per proposal, its drafts, their q and
    the verify forward's logits at the decisive row (references only: no copy, no device sync)."""

    def __init__(self, inner):
        self.inner = inner
        self.seen: list[tuple[list[int], torch.Tensor | None, torch.Tensor | None]] = []
        self._pending = None

    def __getattr__(self, name):  # name, max_drafts, supports_sampling, ...
        return getattr(self.inner, name)

    def begin(self, *args, **kw):
        return self.inner.begin(*args, **kw)

    def propose(self, n):
        d = self.inner.propose(n)
        self._pending = (list(d.tokens), d.q)
        return d

    def feedback(self, out, n_keep, tokens):
        if self._pending is not None:  # the verify forward after a proposal (plain's predict comes before it)
            drafts, q = self._pending
            self.seen.append((drafts, q, out.logits[0, max(0, n_keep - 1)]))
            self._pending = None
        return self.inner.feedback(out, n_keep, tokens)


def probes_for(trace: Trace, seen: list) -> tuple:
    """Line the recorded proposals up with the trace's steps (a step without drafts gets None)."""
    out, j = [], 0
    for i, s in enumerate(trace.steps):
        probe = None
        if i > 0 and s.drafted:
            while j < len(seen) and seen[j][0] != s.drafted:
                j += 1
            if j < len(seen):
                probe = Probe(logits=seen[j][2], q=seen[j][1])
                j += 1
        out.append(probe)
    return tuple(out)


def recorded_decode(method: str, model, ids: list[int], *, k: int, max_new_tokens: int, temperature: float = 0.0,
                    seed: int = 0, draft_model=None, alpha: float = 0.8) -> tuple[Trace, tuple]:
    """`generate.decode_with`, with the accept rule's inputs kept (`Probe` per step): the same decode, token for
    token and draw for draw (the same seeded generator, the same drafter)."""
    m = get_method(method)
    if m.make is None:
        tr = generate.decode_with(method, model, ids, max_new_tokens=max_new_tokens, temperature=temperature,
                                  seed=seed)
        return tr, tuple(None for _ in tr.steps)
    check_k(k)
    reference = (autoregressive(model, ids, max_new_tokens=max_new_tokens).tokens
                 if m.needs_reference and temperature == 0 else None)
    rec = _Recorder(m.make(model, draft_model=draft_model, reference=reference, alpha=alpha, seed=seed))
    limit = generate.max_k(method, model)
    if limit is not None and k > limit:
        raise MtplabError(f"k={k} is larger than this checkpoint supports for {method} (at most {limit})")
    g = torch.Generator().manual_seed(seed)
    trace = speculative(model, rec, ids, max_new_tokens=max_new_tokens, k=k, schedule=m.schedule,
                        temperature=temperature, generator=g, method=method)
    return trace, probes_for(trace, rec.seen)


def _median_split(traces: list[Trace]) -> dict[str, float]:
    parts = [decode_split(t) for t in traces]
    return {k: statistics.median(p[k] for p in parts) for k in parts[0]}


def decode(state: LabState, models: ModelCache) -> LabState:
    """Run the whole decode (and its AR baseline, `repeats` times interleaved) for the current settings;
    bad input -> state.error."""
    try:
        state = resolve_auto(state)
        validate(state)
        dev = pick(state.device)
        name = _checkpoint_name(state)
        model = models.get(name, dev, heads_for(state))
        draft = models.get("draft", dev) if get_method(state.method).needs_draft_model else None
        ids = text_ids(model, state.prompt)
        opts = dict(max_new_tokens=state.max_new_tokens, temperature=float(state.temperature), seed=state.seed)
        limit = generate.max_k(state.method, model)
        if limit is not None and state.k > limit:
            raise MtplabError(f"k={state.k} is larger than this checkpoint supports for {state.method} "
                              f"(at most {limit})")
        models.warm(state.method, model, k=state.k, draft_model=draft)
        models.warm("ar", model, k=1)
        first: list = []

        def method_run(_):
            if not first:  # round 0 keeps the accept rule's inputs for the step view
                tr, pr = recorded_decode(state.method, model, ids, k=state.k, draft_model=draft, **opts)
                first.append(pr)
                return tr
            return generate.decode_with(state.method, model, ids, k=state.k, draft_model=draft, **opts)
        contenders = {"ar": lambda _: generate.decode_with("ar", model, ids, **opts)}
        if get_method(state.method).speculative:
            contenders[state.method] = method_run
        res = race(contenders, [ids], baseline="ar", rounds=state.repeats, device=dev, warmup=lambda *_: None)
        walls = {who: [r[0] for r in res.seconds[who]] for who in contenders}
        runs = {who: [res.outputs[who][0]] for who in contenders}
        baseline = res.outputs["ar"][0]
        trace = res.outputs[state.method][0] if state.method in contenders else baseline
        probes = first[0] if first else tuple(None for _ in trace.steps)
        busy = res.busy
    except MtplabError as e:
        return replace(state, **{**_DROP, "error": str(e)})
    return replace(state, trace=trace, baseline=baseline, shown=0, error="", device_name=describe(dev),
                   checkpoint_name=name, model_k=limit, label=getattr(model, "token_repr", token_repr),
                   detok=getattr(model, "decode", decode_bytes), walls=walls,
                   splits={who: _median_split(ts) for who, ts in runs.items()}, probes=probes, busy=busy)


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


def jump(state: LabState, models: ModelCache, n: int) -> LabState:
    """Show exactly the first n steps (clamped to the decode), decoding first if needed."""
    state = step(state, models, 0)
    return replace(state, shown=max(0, min(state.total_steps, int(n)))) if state.trace is not None else state


def run_all(state: LabState, models: ModelCache) -> LabState:
    """Reveal every step, decoding first if needed."""
    state = step(state, models, 0)
    return replace(state, shown=state.total_steps) if state.trace is not None else state


def reset(state: LabState) -> LabState:
    """Back to no steps shown; the settings (the seed too) stay, and the same decode runs again at the next step."""
    return replace(state, **_DROP)


def new_sample(state: LabState, models: ModelCache) -> LabState:
    """The next seed, decoded at once, with as many steps shown as before (at least one): at a temperature
    above 0 a new sample; at 0 the same greedy tokens."""
    shown = max(1, state.shown)
    seed = state.seed + 1 if isinstance(state.seed, int) and not isinstance(state.seed, bool) else 0
    return jump(configure(state, seed=seed), models, shown)


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
    if state.trace is None or not 0 <= i < len(state.probes) or state.probes[i] is None:
        return None
    s, probe = state.trace.steps[i], state.probes[i]
    pos = s.accepted
    rejected = pos < len(s.drafted)
    greedy = float(state.temperature) == 0
    if not rejected:
        return None  # every draft kept: the row decided only the bonus
    logits = probe.logits.detach().float().cpu()
    draft, committed = s.drafted[pos], s.bonus
    if greedy:
        vals, idx = torch.topk(logits, 2)
        rank = int((logits > logits[draft]).sum()) + 1
        return Inside(i, pos, draft, committed, True, top2=((int(idx[0]), float(vals[0])), (int(idx[1]), float(vals[1]))),
                      gap=float(vals[0] - vals[1]), draft_rank=rank)
    p = distribution(logits[None], float(state.temperature), None)[0]
    if probe.q is not None and pos < probe.q.shape[0]:
        q = probe.q[pos].detach().float().cpu()
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
