"""Compare two models position by position, teacher-forced: both read the same text, so one early
disagreement cannot make every later position disagree (as it does when each decodes its own text)."""
from __future__ import annotations

import torch


@torch.inference_mode()
def teacher_forced_agreement(a, b, ids: list[int], *, start: int = 1) -> tuple[int, int]:
    """(positions where a and b pick the same greedy next token, positions compared).

    ids: one text both models read in full; positions start-1 .. len(ids)-2 predict tokens start .. len(ids)-1
    (start = len(prompt) compares only the generated part)."""
    x = torch.tensor([ids], dtype=torch.long)
    pa = a(x.to(a.wte.weight.device)).logits[0, start - 1:-1].argmax(-1).cpu()  # (T - start,)
    pb = b(x.to(b.wte.weight.device)).logits[0, start - 1:-1].argmax(-1).cpu()
    return int((pa == pb).sum()), int(pa.numel())


@torch.inference_mode()
def greedy_windows(model, windows: torch.Tensor, prompt_len: int, n_new: int) -> torch.Tensor:
    """Each window cut at prompt_len and continued by the target's own greedy tokens (n_new of them):
    the text a speculative decode must reproduce, rather than the text the corpus happens to hold."""
    from .decoding import autoregressive

    out = []
    for x in windows.tolist():
        prompt = x[:prompt_len]
        out.append(prompt + autoregressive(model, prompt, max_new_tokens=n_new).tokens)
    return torch.tensor(out, dtype=torch.long)


def forced_and_free_greedy(model, windows: torch.Tensor, prompt_lens, *, progress: bool = False) -> dict:
    """`lab.forced_and_free`, scored against the target's own greedy path instead of the true text.

    Returns {"teacher-forced": [(correct, n) per depth 2..D+1], "free-running": [...], "n": positions}."""
    from .lab import forced_and_free

    D = model.config.n_modules
    sums = {"teacher-forced": [0.0] * D, "free-running": [0.0] * D}
    n = 0
    for P in prompt_lens:
        if P + D + 1 > model.config.block_size:
            continue
        ff = forced_and_free(model, greedy_windows(model, windows, P, D + 1), [P], progress=progress)
        for key in sums:
            sums[key] = [s + a * ff["n"] for s, a in zip(sums[key], ff[key])]
        n += ff["n"]
    return {key: [(round(s), n) for s in vals] for key, vals in sums.items()} | {"n": n}


@torch.inference_mode()
def cache_lengths(model, method: str, prompt_ids: list[int], *, k: int, max_new_tokens: int) -> list[dict]:
    """Step through a greedy speculative decode on a KV cache the caller can see, and record per step the cache
    length before it, after its verify forward (drafts written) and after `KVCache.crop` (rejected ones gone)."""
    from .decoding import iter_steps
    from .drafters import method as get_method

    m = get_method(method)
    cache = model.new_cache()
    out, before = [], 0
    steps = iter_steps(model, m.make(model), prompt_ids, max_new_tokens=max_new_tokens, k=k, schedule=m.schedule,
                       cache=cache)
    for i, step in enumerate(steps):
        # written this step: the predict forward's token (plain), the last committed token, the drafts fed
        drafts_fed = max(0, len(step.drafted) - (m.schedule == "plain"))
        fed = 0 if i == 0 else 1 + drafts_fed + (step.predict_token is not None)
        out.append({"step": step, "before": before, "after_verify": before + fed if i else cache.length,
                    "after_crop": cache.length, "drafts_fed": drafts_fed if i else 0})
        before = cache.length
    return out
