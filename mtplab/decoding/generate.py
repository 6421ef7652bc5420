"""Method name -> loaded checkpoint -> a decode: the glue behind `python -m mtplab generate` and the widgets.
The methods themselves are one table, `mtplab.decoding.drafters.METHODS`."""
from __future__ import annotations

import torch
from mtplab.decoding import adaptive
from mtplab.model import checkpoint as ckpt
from mtplab.decoding.loop import autoregressive, speculative
from mtplab.device import now
from mtplab.decoding.checks import check_call, check_k
from mtplab.device import describe, pick
from mtplab.decoding.drafters import check_same_vocabulary, method as get_method
from mtplab.errors import MtplabError
from mtplab.tokenizer import encode
from mtplab.decoding.trace import Trace

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def max_k(method: str, model) -> int | None:
    """The most tokens per step a method supports on this model (None: no limit)."""
    limit = get_method(method).max_k
    return limit(model.config) if limit is not None else None


def k_limit(method: str, model) -> int:
    """The most tokens per step a method can take on this model: its heads' limit (`max_k`), and in any case what
    fits the context window (a verify forward over k positions after one prompt token and one new token)."""
    window = model.config.block_size - 2
    limit = max_k(method, model)
    return min(limit, window) if limit is not None else window


def load_for(method: str, checkpoint=None, *, device="auto", dtype="fp32"):
    m = get_method(method)
    if dtype not in DTYPES:
        raise MtplabError(f"unknown dtype {dtype!r}; use fp32 or bf16")
    dev = pick(device)
    name = checkpoint or m.checkpoint
    return ckpt.load(name, device=dev, dtype=DTYPES[dtype]), name, dev


def decode_with(method: str, model, prompt_ids, *, max_new_tokens: int, k: int | None = None,
                temperature: float = 0.0, top_k: int | None = None, seed: int = 0, alpha: float = 0.8,
                draft_model=None, reference: list[int] | None = None, adapt: str | None = None,
                threshold: float = 0.4, rule: str = "exact", probe: bool = False, stop: int | None = None):
    """Run one method on an already loaded model and return its Trace.

    adapt: None (k-1 drafts every step), 'schedule' (HF's +2/-1) or 'confidence' (stop below `threshold`);
    rule: 'exact' (lossless), or 'typical' (Medusa's typical acceptance, Cai et al. 2024 §2.3.1, LOSSY when sampling);
    probe: keep in each step what the accept rule saw (`loop.iter_steps`; the acceptance lab shows it);
    stop: a chat model's end-of-turn token (`mtplab.hf.real.end_of_turn`): the decode ends with it.

    `reference` (oracle only): the target's greedy continuation, if already known; otherwise it is
    computed here, inside whatever the caller is timing."""
    m = get_method(method)
    check_call(model, seed, draft_model, reference)
    g = torch.Generator().manual_seed(seed)
    if m.make is None:
        return autoregressive(model, prompt_ids, max_new_tokens=max_new_tokens, temperature=temperature,
                              top_k=top_k, generator=g, stop=stop)
    if k is not None:
        check_k(k)
    if m.needs_reference and reference is None and temperature == 0:  # sampling: the loop refuses the oracle
        reference = autoregressive(model, prompt_ids, max_new_tokens=max_new_tokens).tokens
    # the drafter checks that the checkpoint has its head family
    drafter = m.make(model, draft_model=draft_model, reference=reference, alpha=alpha, seed=seed)
    limit = max_k(method, model)
    if k is None:
        k = limit or 4
    pol = adaptive.policy(adapt, **({"threshold": threshold} if adapt == "confidence" else {}))
    name = method + (f"+{adapt}" if adapt else "") + ("+typical (lossy)" if rule == "typical" else "")
    return speculative(model, drafter, prompt_ids, max_new_tokens=max_new_tokens, k=k, schedule=m.schedule,
                       temperature=temperature, top_k=top_k, generator=g, method=name, adapt=pol, rule=rule,
                       probe=probe, stop=stop)


def _check_draft_window(draft, model, n_prompt: int, max_new_tokens: int, k: int) -> None:
    """A draft model with a smaller context window than the target's must hold the whole decode too."""
    have, target = draft.config.block_size, model.config.block_size
    if have < target and n_prompt + max_new_tokens + k > have:
        raise MtplabError(f"the draft model's context window ({have}) is smaller than the target's ({target}): the "
                          f"prompt ({n_prompt} tokens) plus {max_new_tokens} new tokens plus k={k} do not fit it; "
                          "shorten the prompt, ask for fewer new tokens, or use a draft model with a longer window")


def run_generate(*, method="ar", checkpoint=None, prompt: str, max_new_tokens=64, k=None, temperature=0.0,
                 top_k=None, seed=0, alpha=0.8, draft_checkpoint=None, device="auto", dtype="fp32",
                 confidence: float | None = None) -> dict:
    """`generate` on the lab's own models; `confidence`: a confidence stop (`adaptive.ConfidenceStop`), None for
    k-1 drafts every step."""
    if not prompt:
        raise MtplabError("the prompt is empty; give some text with --prompt")
    model, name, dev = load_for(method, checkpoint, device=device, dtype=dtype)
    draft = None
    ids = encode(prompt)
    if get_method(method).needs_draft_model:
        draft = ckpt.load(draft_checkpoint or "draft", device=dev, dtype=DTYPES[dtype])
        check_same_vocabulary(draft, model)
        _check_draft_window(draft, model, len(ids), max_new_tokens, k or 4)
    t0 = now(dev)
    trace = decode_with(method, model, ids, max_new_tokens=max_new_tokens, k=k, temperature=temperature,
                        top_k=top_k, seed=seed, alpha=alpha, draft_model=draft,
                        **adaptive.stop_at(confidence))
    res = trace.summary()
    res.update(checkpoint=name, device=describe(dev), wall_s=now(dev) - t0, confidence_stop=confidence)
    return res


def run_prompts(method: str, model, prompts, *, max_new_tokens: int, k: int | None = None, progress: bool = False,
                **kw) -> list[Trace]:
    """`generate.decode_with` over a list of prompts (str or token lists); prompts are cut to fit the window."""

    it = prompts
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(prompts, desc=method if k is None else f"{method} k={k}", unit="prompt", leave=False)
    room = model.config.block_size - max_new_tokens - (k or 8)
    out = []
    for p in it:
        ids = encode(p) if isinstance(p, str) else list(p)
        out.append(decode_with(method, model, ids[-room:], max_new_tokens=max_new_tokens, k=k, **kw))
    return out
