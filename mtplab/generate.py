"""Method -> (checkpoint, drafter, schedule): the glue behind `python -m mtplab generate` and the widgets."""
from __future__ import annotations

import time

import torch

from . import checkpoint as ckpt
from .decoding import autoregressive, speculative
from .device import describe, pick
from .drafters import for_method
from .errors import MtplabError
from .tokenizer import encode

METHODS = ("ar", "blockwise", "blockwise-overlap", "meta", "deepseek", "draft-model", "ngram", "oracle")
DEFAULT_CHECKPOINT = {"ar": "ntp", "blockwise": "stern-k4", "blockwise-overlap": "stern-k4", "meta": "meta-k4",
                      "deepseek": "deepseek-d1", "draft-model": "ntp", "ngram": "ntp", "oracle": "ntp"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def max_k(method: str, model) -> int | None:
    """The largest block size a method supports on this model (None: no limit)."""
    cfg = model.config
    if method in ("blockwise", "blockwise-overlap", "meta"):
        return cfg.k
    if method == "deepseek":
        return cfg.n_modules + 1
    return None


def load_for(method: str, checkpoint=None, *, device="auto", dtype="fp32"):
    if method not in METHODS:
        raise MtplabError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if dtype not in DTYPES:
        raise MtplabError(f"unknown dtype {dtype!r}; use fp32 or bf16")
    dev = pick(device)
    name = checkpoint or DEFAULT_CHECKPOINT[method]
    return ckpt.load(name, device=dev, dtype=DTYPES[dtype]), name, dev


def decode_with(method: str, model, prompt_ids, *, max_new_tokens: int, k: int | None = None,
                temperature: float = 0.0, top_k: int | None = None, seed: int = 0, alpha: float = 0.8,
                draft_model=None, reference: list[int] | None = None):
    """Run one method on an already loaded model and return its Trace.

    `reference` (oracle only): the target's greedy continuation, if already known; otherwise it is
    computed here, inside whatever the caller is timing."""
    g = torch.Generator().manual_seed(seed)
    if method == "ar":
        return autoregressive(model, prompt_ids, max_new_tokens=max_new_tokens, temperature=temperature,
                              top_k=top_k, generator=g)
    if k is not None and k < 1:
        raise MtplabError(f"k must be >= 1 (got {k})")
    if method == "oracle":
        if temperature != 0:
            raise MtplabError("the oracle drafter is greedy-only; use temperature 0")
        if reference is None:
            reference = autoregressive(model, prompt_ids, max_new_tokens=max_new_tokens).tokens
    # the drafter checks that the checkpoint has its head family
    drafter, schedule = for_method(method, model, draft_model=draft_model, reference=reference, alpha=alpha,
                                   seed=seed)
    limit = max_k(method, model)
    if k is None:
        k = limit or 4
    if limit is not None and k > limit:
        raise MtplabError(f"k={k} is larger than this checkpoint supports for {method} (at most {limit})")
    return speculative(model, drafter, prompt_ids, max_new_tokens=max_new_tokens, k=k, schedule=schedule,
                       temperature=temperature, top_k=top_k, generator=g, method=method)


def run_generate(*, method="ar", checkpoint=None, prompt: str, max_new_tokens=64, k=None, temperature=0.0,
                 top_k=None, seed=0, alpha=0.8, draft_checkpoint=None, device="auto", dtype="fp32") -> dict:
    if not prompt:
        raise MtplabError("the prompt is empty; give some text with --prompt")
    model, name, dev = load_for(method, checkpoint, device=device, dtype=dtype)
    draft = None
    if method == "draft-model":
        draft = ckpt.load(draft_checkpoint or "draft", device=dev, dtype=DTYPES[dtype])
        if draft.config.vocab_size != model.config.vocab_size:
            raise MtplabError("the draft model's vocabulary differs from the target's; both must share one tokenizer")
    ids = encode(prompt)
    t0 = time.perf_counter()
    trace = decode_with(method, model, ids, max_new_tokens=max_new_tokens, k=k, temperature=temperature,
                        top_k=top_k, seed=seed, alpha=alpha, draft_model=draft)
    res = trace.summary()
    res.update(checkpoint=name, device=describe(dev), wall_s=time.perf_counter() - t0)
    return res
