"""The acceptance lab's session: what the lab does to the world, each call a `LabState` in and a new one out.

It loads models (`ModelCache`), reads the shipped decode benchmark for the default demo, and decodes: one
`generate.decode_with(..., probe=True)` of the method, raced against AR of the same model, prompt and settings
through the lab's one race (`mtplab.measuring.race`: `repeats` interleaved rounds, every clock read after a device
sync, a warm-up once per model, method and k, and the busy-machine verdict). The state and its pure transitions
are `state.py`; this module imports it, never the other way round.

`method="auto"` takes the method, k and checkpoint from the shipped decode benchmark (`default_demo`): the
fastest method against AR where the record was measured on this kind of device.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from mtplab.decoding import generate
from mtplab.decoding.drafters import METHODS, method as get_method
from mtplab.device import describe, pick
from mtplab.errors import MtplabError
from mtplab.hf.real import REAL_MODELS, chat_ids, end_of_turn, shipped_heads
from mtplab.measuring.choice import choose_k
from mtplab.measuring.race import race
from mtplab.measuring.record import Record
from mtplab.model import checkpoint as ckpt
from mtplab.paths import DECODE_JSON
from mtplab.teaching.real import k_words
from mtplab.teaching.acceptance_lab.state import (AUTO, DEFAULT_CHECKPOINT, DEMO, LabState, configure, failed,
                                                  fit_k, validate)
from mtplab.tokenizer import decode as decode_bytes, encode, token_repr
from mtplab.viz.decode import decode_split


# ---------------------------------------------------------------------------------- the default demo
def choose_demo(record: Record, device_name: str) -> dict:
    """The default demo from a decode benchmark record: the method with the best measured wall-clock speedup
    over AR when the record was measured on this kind of device ('cpu', 'cuda (...)'), else the best tokens per
    forward. Returns method, k, checkpoint and a one-line note that says why."""
    same = record.device().split(" ")[0] == device_name.split(" ")[0]
    key = "speedup_wall" if same else "tokens_per_forward"
    rows = [r for r in record.rows if r.get("method") in METHODS and r["method"] not in ("ar", "oracle")
            and r.get("checkpoint") and isinstance(r.get(key), (int, float))]  # the oracle knows the answer
    if not rows:
        raise MtplabError(f"{record.path} has no row of a lab method with its {key}")
    best = max(rows, key=lambda r: r[key])
    k, label = int(best.get("k") or 4), best.get("label") or best["method"]
    if same:
        note = (f"default demo: {label} k={k}, the fastest against AR in the shipped benchmark ({best[key]:.2f}x "
                f"wall clock, {best.get('tokens_per_forward', float('nan')):.2f} tokens per forward; "
                f"{record.machine_text()})")
    else:
        note = (f"default demo: {label} k={k}, the most tokens per forward in the shipped benchmark "
                f"({best[key]:.2f}); it was {record.machine_text()}, not on {device_name}, so its wall clock says "
                "nothing here")
    return {"method": best["method"], "k": k, "checkpoint": str(best["checkpoint"]), "note": note}


def default_demo(device: str = "auto", path=DECODE_JSON) -> dict:
    """`choose_demo` on the shipped benchmark (read at start-up: it is re-measured when checkpoints change);
    the lab's one demo (`state.DEMO`) with a note when the record cannot be read."""
    try:
        return choose_demo(Record.load(path), describe(pick(device)))
    except MtplabError as e:
        return {**DEMO, "note": f"default demo: {DEMO['method']} k={DEMO['k']} ({e})"}


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
    """Loaded checkpoints keyed by (name, device), so stepping through settings does not reload; `warm` runs
    each (method, model, k) once, untimed, so the first timed decode pays no one-off set-up."""
    models: dict = field(default_factory=dict)
    warmed: set = field(default_factory=set)

    def get(self, name: str, device, heads: str = ""):
        key = (name, str(device)) if not heads else (name, heads, str(device))
        if key not in self.models:
            if is_hf_folder(name):  # your own model (pip install -e ".[hf]"), with its heads if given
                self.models[key] = _load_hf(name, heads, device)
            elif heads:
                raise MtplabError("heads= goes with a Hugging Face model folder as the checkpoint; the lab's own "
                                  "head checkpoints are chosen by name (e.g. stern-k4)")
            else:
                self.models[key] = ckpt.load(name, device=device)
        return self.models[key]

    def warmup(self, prompt_ids: list[int], model, k: int):
        """The race's warm-up (`race(..., warmup=...)`): each contender runs once on these prompt ids, untimed, the
        first time it is raced on this model with this k."""
        def warm(name: str, run) -> None:
            key = (name, id(model), None if name == "ar" else k)
            if key not in self.warmed:
                run(prompt_ids)
                self.warmed.add(key)
        return warm


def _load_hf(name: str, heads: str, device):
    """A Hugging Face folder with its heads. The loader answers what it knows in one line; anything else a crafted
    folder makes transformers raise becomes one line here too, so that no traceback reaches the widget."""
    from mtplab.hf.target import load_target
    try:
        return load_target(name, heads or None, device=device)
    except MtplabError:
        raise
    except Exception as e:  # noqa: BLE001 - a crafted config.json can raise anything inside transformers
        first = (str(e).splitlines() or [""])[0][:200]
        raise MtplabError(f"{name} could not be loaded as a Hugging Face model ({type(e).__name__}: {first}); "
                          "restore the folder that transformers saved") from None


def is_hf_folder(name: str) -> bool:
    """A local Hugging Face model: a folder with a config.json (and weights, and a tokenizer), or the bare name of
    a real model the lab installs from a package (smollm2)."""
    return name in REAL_MODELS or (Path(name).is_dir() and (Path(name) / "config.json").is_file())


def heads_for(state: LabState) -> str:
    """The heads checkpoint to load with the model: the one given, or for a real model named bare (smollm2) the
    heads the lab ships for the method's family."""
    if state.heads or state.checkpoint not in REAL_MODELS or state.method not in METHODS:
        return state.heads
    family = METHODS[state.method].family
    if family is None:
        return ""
    found = shipped_heads(state.checkpoint, family)
    if found is None:
        raise MtplabError(f"the lab ships no {family} heads for {state.checkpoint}; choose deepseek, "
                          "deepseek-reuse, blockwise-overlap, ngram or ar")
    return str(found)


def no_draft_model(name: str) -> str:
    """Why the widget cannot race method='draft-model' on a Hugging Face model: its one draft model is the lab's
    own, which reads bytes, not that model's tokens."""
    return (f"the lab has no draft model for {name} (its draft model reads bytes, not {name}'s tokens); choose "
            f"another method, or race a draft of your own: python -m mtplab generate --hf {name} --method "
            "draft-model --draft-hf DRAFT")


def text_ids(model, text: str) -> list[int]:
    """The prompt in the model's own tokens: bytes for the lab's models, the model's tokenizer for HF ones, and for
    a chat model the lab installs (smollm2) one user turn of its chat template."""
    if getattr(model, "chat", False):
        return chat_ids(model, text)
    return model.encode(text) if hasattr(model, "encode") else encode(text)


def turn_end(model) -> int | None:
    """A chat model's end of turn (its decode stops there: what follows is a turn the model invents); None for
    the lab's models and HF folders without a chat template, which decode max_new_tokens."""
    return end_of_turn(model) if getattr(model, "chat", False) else None


def checkpoint_name(state: LabState) -> str:
    if state.checkpoint == DEFAULT_CHECKPOINT and state.method in METHODS:
        return METHODS[state.method].checkpoint
    return str(state.checkpoint)


# ---------------------------------------------------------------------------------- k
def check_k_fits(state: LabState, models: ModelCache, *, clamp: bool = False) -> LabState:
    """`state.fit_k` on the checkpoint the settings name (loaded, or taken from the cache), before anything is
    drawn or allocated; clamp=True when the method or the checkpoint changed."""
    try:
        state = resolve_auto(state)
        if state.method not in METHODS:
            return state  # the decode names the control
        model = models.get(checkpoint_name(state), pick(state.device), heads_for(state))
    except MtplabError:
        return state  # a bad checkpoint or device: the decode names the control
    return fit_k(state, generate.k_limit(state.method, model), checkpoint_name(state), clamp=clamp)


def record_k(state: LabState, models: ModelCache) -> LabState:
    """For a real model named bare (smollm2) and a speculative method: k from `bench real`'s record, the exact row of
    the heads loaded with the highest median among those that draft k-1 tokens every step, as the lab shows them
    (`measuring.choice.choose_k`; without such a row, its documented default), and a note that says which and whether
    the record's ranges make it the fastest (`teaching.real.k_words`). Anything else is left as it is."""
    if state.checkpoint not in REAL_MODELS or state.method not in METHODS or not METHODS[state.method].speculative:
        return state
    try:
        heads = heads_for(state)
        model = models.get(state.checkpoint, pick(state.device), heads)
    except MtplabError:
        return state  # the decode names the control
    vocab = "reduced" if getattr(model, "draft_vocab", None) is not None else "full"
    c = choose_k(state.checkpoint, state.method, heads=heads or None, draft_vocab=vocab,
                 kernel=getattr(model, "kernel", "exact"), limit=generate.k_limit(state.method, model),
                 fixed=True)  # the lab shows k-1 drafts at every step: rows with a confidence stop are not its to take
    return replace(state, k=c.k, note=f"{state.method} on {state.checkpoint}: {k_words(c)}")


def change(state: LabState, models: ModelCache, **settings) -> LabState:
    """`configure`, then, when the method or the checkpoint changed: on a real model, k from the record unless k was
    set in the same call (`record_k`); then clamp k to what the checkpoint supports for the method (a k the new
    checkpoint cannot take is a setting, not an error)."""
    new = configure(state, **settings)
    if new is state or not ({"method", "checkpoint", "heads"} & set(settings)):
        return new
    if "k" not in settings:
        new = record_k(new, models)
    return check_k_fits(new, models, clamp=True)


# ---------------------------------------------------------------------------------- decoding
def decode(state: LabState, models: ModelCache) -> LabState:
    """Decode the whole trace for the current settings (method 'auto' resolved: `decoded`), with what each step's
    accept rule saw (probe=True), and race it against AR of the same model (`repeats` interleaved rounds);
    bad input -> state.error."""
    try:
        validate(state)
        dev = pick(state.device)
        name = checkpoint_name(state)
        method = get_method(state.method)
        if method.needs_draft_model and is_hf_folder(name):
            raise MtplabError(no_draft_model(name))
        model = models.get(name, dev, heads_for(state))
        draft = models.get("draft", dev) if method.needs_draft_model else None
        ids = text_ids(model, state.prompt)
        warmup = models.warmup(ids, model, state.k)
        state = fit_k(state, generate.k_limit(state.method, model), name)
        if state.error:
            return state
        opts = dict(max_new_tokens=state.max_new_tokens, temperature=float(state.temperature), seed=state.seed,
                    stop=turn_end(model))
        contenders = {"ar": lambda p: generate.decode_with("ar", model, p, **opts)}
        if method.speculative:  # the same decode the CLI runs, keeping what each step's accept rule saw
            contenders[state.method] = lambda p: generate.decode_with(state.method, model, p, k=state.k,
                                                                      draft_model=draft, probe=True, **opts)
        res = race(contenders, [ids], baseline="ar", rounds=state.repeats, device=dev, warmup=warmup)
    except MtplabError as e:
        return failed(state, str(e))
    baseline = res.outputs["ar"][0]
    trace = res.outputs[state.method][0] if state.method in contenders else baseline
    return replace(state, trace=trace, baseline=baseline, shown=0, error="", checkpoint_name=name,
                   model_k=generate.max_k(state.method, model), device_name=describe(dev),
                   label=getattr(model, "token_repr", token_repr), detok=getattr(model, "decode", decode_bytes),
                   walls={who: [r[0] for r in res.seconds[who]] for who in contenders},
                   splits={who: decode_split(res.outputs[who][0]) for who in contenders}, busy=res.busy)


def decoded(state: LabState, models: ModelCache) -> LabState:
    """The state with its decode: `decode` (after `resolve_auto`) when it has none yet; the view calls this before
    it reveals steps."""
    return state if state.trace is not None else decode(resolve_auto(state), models)
