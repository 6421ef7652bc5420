"""Input checks of the decoders: each bad input gets one line that names the fix (`MtplabError`)."""
from __future__ import annotations

import math
import numbers

import torch

from mtplab.errors import MtplabError


MIN_TEMPERATURE = 1e-4  # below this, logits / temperature overflow float32 and the softmax gives NaN


def check_k(k) -> int:
    """k, tokens per step, is an integer >= 1 (k = 1 is plain decoding: no drafts)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise MtplabError(f"k must be an integer >= 1 (got {k!r}); k is tokens per step: k-1 drafts plus one")
    return k


def check_drafts(k: int, drafter, *, tree: bool = False) -> None:
    """A step's k-1 drafts (a tree: k-1 depths) fit the most the drafter gives (`max_drafts`; None: no limit).
    The one check behind the loop, token trees, batches and `decode_with`."""
    limit = drafter.max_drafts
    if limit is None or k - 1 <= limit:
        return
    if tree:
        raise MtplabError(f"a tree {k - 1} deep needs {k - 1} depths of drafts but {drafter.name} gives at most "
                          f"{limit}; use at most {limit} widths")
    raise MtplabError(f"k={k} needs {k - 1} drafts a step but {drafter.name} gives at most {limit}; "
                      f"use k <= {limit + 1}")


def check_call(model, seed, draft_model=None, reference=None) -> None:
    """What `decode_with` is handed: loaded models, not names; a seed torch can take; a reference of token ids."""
    for what, m in (("model", model), ("draft_model", draft_model)):
        if m is None and what == "draft_model":
            continue
        if isinstance(m, (str, bytes)) or not hasattr(m, "config") or not callable(m):
            raise MtplabError(f"{what} must be a loaded model, not {type(m).__name__} {str(m)[:40]!r}; load it first "
                              "(mtplab.decoding.generate.load_for(METHOD, NAME) or mtplab.hf.target.load_target(PATH, HEADS))")
    if isinstance(seed, bool) or not isinstance(seed, int) or not -(2 ** 63) <= seed < 2 ** 64:
        raise MtplabError(f"seed must be an integer in [-2**63, 2**64) (got {seed!r})")
    if reference is not None and (isinstance(reference, (str, bytes)) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in reference)):
        raise MtplabError(f"reference must be a list of token ids (got {type(reference).__name__}); "
                          "leave it None to compute the target's greedy continuation")


def check_options(*, max_new_tokens: int, temperature: float, top_k: int | None, generator=None):
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise MtplabError(f"max_new_tokens must be an integer >= 1 (got {max_new_tokens!r})")
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not math.isfinite(temperature) \
            or temperature < 0:
        raise MtplabError(f"temperature must be >= 0 and finite (got {temperature!r}); 0 means greedy")
    if 0 < temperature < MIN_TEMPERATURE:
        raise MtplabError(f"temperature {temperature:g} is too small to sample at (the probabilities overflow); "
                          f"use 0 for greedy or at least {MIN_TEMPERATURE:g}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise MtplabError(f"top_k must be an integer >= 1 or None (got {top_k!r})")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise MtplabError(f"generator must be a torch.Generator or None (got {type(generator).__name__}); "
                          "pass torch.Generator().manual_seed(SEED)")


def fitted(model, positions: int) -> int:
    """The length of a cache for a decode that writes at most `positions` positions: that many and one spare, within
    the context window. A cache is zeroed when made, and one of the whole window is paid in every decode: SmolLM2's 2,048
    positions are 94 MB of keys and values for the target alone. Measured on a Xeon (one thread, three 128-token chat
    answers, the two sizes interleaved, medians of 3): AR 20.42 -> 19.95 s, DeepSeek-reuse k = 4 12.81 -> 12.43 s."""
    return min(model.config.block_size, positions + 1)


def check_prompt(model, prompt_ids, extra: int, room: int = 0) -> list[int]:
    """The prompt fits the context window with `extra` new tokens and `room` positions a step may verify."""
    if isinstance(prompt_ids, torch.Tensor):
        if prompt_ids.dim() != 1 or prompt_ids.is_floating_point():
            raise MtplabError(f"the prompt must be a 1-D tensor or a list of token ids (integers), not a "
                              f"{prompt_ids.dim()}-D {prompt_ids.dtype} tensor; encode text with mtplab.tokenizer.encode")
        prompt_ids = prompt_ids.tolist()
    if isinstance(prompt_ids, (str, bytes)) or prompt_ids is None or not hasattr(prompt_ids, "__iter__"):
        raise MtplabError(f"the prompt must be a list of token ids (integers), not {type(prompt_ids).__name__}; "
                          "encode text with mtplab.tokenizer.encode")
    prompt_ids = list(prompt_ids)
    bad = [t for t in prompt_ids if isinstance(t, bool) or not isinstance(t, numbers.Integral)]
    if bad:
        raise MtplabError(f"prompt ids must be integers (got {bad[0]!r}); encode text with mtplab.tokenizer.encode")
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise MtplabError("the prompt is empty; give at least one token (one character)")
    V = model.config.vocab_size
    if any(t < 0 or t >= V for t in prompt):
        raise MtplabError(f"prompt ids must lie in 0..{V - 1}")
    limit = model.config.block_size
    if room and room > limit - 2:  # a step verifies k positions after at least one prompt and one new token
        raise MtplabError(f"k={room} tokens per step cannot fit the context window of {limit}; use k <= {limit - 2}")
    step = f" plus k={room} tokens of one step" if room else ""
    if extra + room >= limit:  # not even a one-token prompt fits
        raise MtplabError(f"{extra} new tokens{step} leave no room for a prompt in the context window of {limit}; ask "
                          f"for at most {max(0, limit - 1 - room)} new tokens" + (" or a smaller k" if room else ""))
    if len(prompt) + extra + room > limit:
        raise MtplabError(
            f"prompt ({len(prompt)} tokens) plus {extra} new tokens{step} exceeds the context window of {limit}; "
            f"shorten the prompt to at most {limit - extra - room} tokens or ask for fewer new tokens "
            "(mtplab has no sliding window)")
    return prompt


def check_finite(logits: torch.Tensor) -> torch.Tensor:
    if not torch.isfinite(logits).all():
        raise MtplabError("the model produced NaN or infinite logits; the checkpoint is probably corrupt "
                          "(reload or retrain it)")
    return logits
