"""Acceptance without decoding: one teacher-forced forward over the greedy text counts what the live loop counts; and
two models compared position by position on the same text, so one early disagreement cannot spoil the rest.

The same forward also gives the verdicts the live loop never sees: whether draft j would have matched
even after an earlier draft was rejected (`verdict_rows`). That is what it takes to test whether the
verdicts of one step are independent (the i.i.d. alpha model of Leviathan et al. 2023, eq. 1) or
positively correlated (easy stretches: every draft right; hard ones: every draft wrong): shuffle each
position's verdicts across steps (`shuffled_across_steps`) and the within-step correlation is gone while
each position's marginal rate stays the same (`within_step_rates` before and after).
"""
from __future__ import annotations

import torch
import contextlib
from mtplab.decoding.loop import autoregressive
from mtplab.decoding.checks import check_prompt
from mtplab.errors import MtplabError
from mtplab.decoding.trace import pooled
from mtplab.decoding.drafters import FAMILIES, default_for_family, pairs
from mtplab.decoding.generate import run_prompts
from mtplab.model.layers import CausalSelfAttention
from mtplab.measuring.acceptance import Acceptance, from_trace
from mtplab.tokenizer import encode


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
    prompts = [x[:prompt_len] for x in windows.tolist()]
    return torch.tensor([p + autoregressive(model, p, max_new_tokens=n_new).tokens for p in prompts], dtype=torch.long)


@contextlib.contextmanager
def no_causal_mask(model):
    """Within the block every attention layer of `model` (trunk and heads) sees all keys: the control
    that must fail. Restores the layers afterwards."""
    layers = [m for m in model.modules() if isinstance(m, CausalSelfAttention)]

    def open_mask(attn):
        forward = attn.forward

        def unmasked(x, rot, cache=None, layer=0, mask=None):
            past = cache.length if cache is not None else 0
            full = torch.ones(x.shape[1], past + x.shape[1], dtype=torch.bool, device=x.device)  # (T, P+T)
            return forward(x, rot, cache, layer, full)
        return unmasked

    for attn in layers:
        attn.forward = open_mask(attn)
    try:
        yield model
    finally:
        for attn in layers:
            del attn.forward  # back to the class's method


def _family(model) -> str:
    fam = model.config.heads
    if fam not in FAMILIES:
        raise MtplabError(f"estimate_acceptance needs a checkpoint with {', '.join(FAMILIES)} heads (this one has "
                          f"{fam!r}); use " + ", ".join(dict.fromkeys(p.checkpoint for p in pairs() if p.family)))
    return fam


def _prompt_ids(model, prompt, m: int, k: int) -> list[int]:
    ids = encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    room = model.config.block_size - m - k
    return check_prompt(model, ids[-room:] if room > 0 else ids, m + k)


def _starts(guess, ids, prompt_len, m, n, shift, positions):
    """(position i, drafts that step) for every drafting step: every position ('all'), or the positions
    where the live overlapped loop starts a step ('steps'): after the prefill, n = min(k-1, left-1)
    drafts; a step commits its accepted prefix plus one token."""
    T = len(ids)
    if positions == "all":
        for i in range(prompt_len - 1, T - 2 - shift):
            yield i, min(n, T - 2 - shift - i)
        return
    done = 1  # the prefill committed the first new token
    while done < m:
        i = prompt_len + done - 2  # the position whose logits gave the last committed token
        drafts = min(n, m - done - 1)
        if drafts <= 0:
            return  # a step with no draft: not a drafting step
        yield i, drafts
        a = 0
        while a < drafts and guess[i][a] == ids[i + a + 2]:  # the live loop's accepted prefix
            a += 1
        done += a + 1


@torch.inference_mode()
def match_counts(model, ids: list[int], prompt_len: int, n: int, *, shift: int = 0, causal: bool = True,
                 positions: str = "steps") -> dict:
    """Teacher-forced counts over one sequence: prompt + the target's greedy continuation.

    ONE forward gives guess[i][j], the draft j (depth j+2) at position i. At each drafting position
    (`_starts`): reached[j] steps that reached draft j (it existed, drafts 0..j-1 matched), accepted[j]
    those where it matched t_{i+j+2+shift} too; steps = drafting steps.
    """
    dev = model.wte.weight.device
    idx = torch.tensor([ids], device=dev)
    with no_causal_mask(model) if not causal else contextlib.nullcontext():
        logits = model.depth_logits(idx)  # (1, T, K, V)
    guess = logits[0, :, 1:n + 1].argmax(-1).tolist()  # (T, n): draft j at position i, depth j+2
    reached, accepted, steps = [0] * n, [0] * n, 0
    for i, drafts in _starts(guess, ids, prompt_len, len(ids) - prompt_len, n, shift, positions):
        steps += 1
        for j in range(drafts):
            reached[j] += 1
            if guess[i][j] != ids[i + j + 2 + shift]:
                break
            accepted[j] += 1
    return {"reached": reached, "accepted": accepted, "steps": steps}


@torch.inference_mode()
def verdict_rows(model, paths, k: int | None = None) -> list[list[bool]]:
    """One row per live drafting step (overlapped greedy loop, counted as `match_counts` with
    positions='steps'), k-1 verdicts a row: rows[s][j] is True when draft j (depth j+2) at that step's
    start equals the target's greedy token there, whether or not an earlier draft was rejected.
    Only steps that drafted all k-1 tokens are kept (the last steps of a text draft fewer)."""
    _family(model)
    k = model.config.n_depths if k is None else k
    n = k - 1
    dev = model.wte.weight.device
    rows = []
    for ids, prompt_len in paths:
        logits = model.depth_logits(torch.tensor([ids], device=dev))  # (1, T, K, V)
        guess = logits[0, :, 1:n + 1].argmax(-1).tolist()  # (T, n)
        for i, drafts in _starts(guess, ids, prompt_len, len(ids) - prompt_len, n, 0, "steps"):
            if drafts == n:
                rows.append([guess[i][j] == ids[i + j + 2] for j in range(n)])
    return rows


def within_step_rates(rows: list[list[bool]]) -> dict:
    """Counts per draft position j from full verdict rows: accepted[j] (drafts 0..j all matched; the
    live loop's accepted count), reached[j] (drafts 0..j-1 all matched), marginal[j] (draft j matched,
    whatever came before); conditional = accepted / reached, unconditional = accepted / steps. With
    independent verdicts conditional[j] = marginal[j]; a conditional rate above the marginal one is
    the positive correlation."""
    n = len(rows[0]) if rows else 0
    reached, accepted, marginal = [0] * n, [0] * n, [0] * n
    for r in rows:
        ok = True
        for j in range(n):
            marginal[j] += r[j]
            if ok:
                reached[j] += 1
                ok = r[j]
                accepted[j] += ok
    steps = len(rows)
    return {"steps": steps, "reached": reached, "accepted": accepted, "marginal": marginal,
            "conditional": [a / b if b else float("nan") for a, b in zip(accepted, reached)],
            "unconditional": [a / steps if steps else float("nan") for a in accepted],
            "marginal_rate": [m / steps if steps else float("nan") for m in marginal]}


def shuffled_across_steps(rows: list[list[bool]], seed: int = 0) -> list[list[bool]]:
    """The control: each position's verdicts permuted across steps on its own, so that a step's verdicts
    no longer come from one stretch of text. Marginal rates are unchanged; any within-step correlation
    is destroyed."""
    g = torch.Generator().manual_seed(seed)
    n = len(rows[0]) if rows else 0
    cols = [[rows[p][j] for p in torch.randperm(len(rows), generator=g).tolist()] for j in range(n)]
    return [[cols[j][s] for j in range(n)] for s in range(len(rows))]


def kept_given_previous(rows: list[list[bool]], j: int = 1) -> dict:
    """P(draft j matches | draft j-1 matched) against P(draft j matches | draft j-1 did not), with counts:
    the correlation in one pair of numbers (the second is invisible to the live loop)."""
    after_ok = [r[j] for r in rows if r[j - 1]]
    after_bad = [r[j] for r in rows if not r[j - 1]]
    return {"after_kept": (sum(after_ok), len(after_ok)), "after_rejected": (sum(after_bad), len(after_bad))}


def greedy_paths(model, prompts, *, max_new_tokens: int = 64, k: int | None = None) -> list[tuple[list[int], int]]:
    """(prompt + the target's greedy continuation, prompt length) per prompt: one `autoregressive` decode each."""
    k = model.config.n_depths if k is None else k
    ids = [_prompt_ids(model, p, max_new_tokens, k) for p in prompts]
    return [(p + autoregressive(model, p, max_new_tokens=max_new_tokens).tokens, len(p)) for p in ids]


def estimate_acceptance(model, prompts, *, max_new_tokens: int = 64, k: int | None = None, shift: int = 0,
                        causal: bool = True, positions: str = "steps", paths=None) -> Acceptance:
    """Greedy acceptance per draft position from one teacher-forced forward per prompt.

    The target decodes each prompt greedily once (`greedy_paths`; pass `paths` to reuse them), then
    `match_counts` reads every depth's draft at every position of prompt + continuation. k (tokens per
    step) defaults to the checkpoint's K. positions='steps' counts at the positions where the live loop
    starts its steps (the live loop's own counting); 'all' counts at every position (the usual
    teacher-forced estimate, which weighs easy stretches more: the live loop crosses them in fewer
    steps). shift=1 and causal=False are the two controls that must fail.
    """
    _family(model)
    K = model.config.n_depths
    k = K if k is None else k
    if isinstance(k, bool) or not isinstance(k, int) or not 2 <= k <= K:
        raise MtplabError(f"k must be an integer in 2..{K} for this checkpoint (got {k!r})")
    if positions not in ("steps", "all"):
        raise MtplabError(f"positions must be 'steps' or 'all' (got {positions!r})")
    if shift not in (0, 1):
        raise MtplabError(f"shift must be 0 (the estimate) or 1 (the control) (got {shift!r})")
    if paths is None:
        paths = greedy_paths(model, prompts, max_new_tokens=max_new_tokens, k=k)
    n = k - 1
    reached, accepted, steps = [0] * n, [0] * n, 0
    for seq, prompt_len in paths:
        c = match_counts(model, seq, prompt_len, n, shift=shift, causal=causal, positions=positions)
        reached = [a + b for a, b in zip(reached, c["reached"])]
        accepted = [a + b for a, b in zip(accepted, c["accepted"])]
        steps += c["steps"]
    if steps == 0:
        raise MtplabError("no position to score; give at least one prompt and max_new_tokens >= 2")
    return Acceptance(unconditional=[a / steps for a in accepted],
                      conditional=[a / r if r else float("nan") for a, r in zip(accepted, reached)])


def live_trace(model, prompts, *, max_new_tokens: int = 64, k: int | None = None):
    """The live greedy verify loop (overlapped schedule) of the checkpoint's own drafter on every prompt,
    pooled into one `Trace`."""
    fam = _family(model)
    name = default_for_family(fam).name
    k = model.config.n_depths if k is None else k
    ids = [_prompt_ids(model, p, max_new_tokens, k) for p in prompts]
    return pooled(run_prompts(name, model, ids, max_new_tokens=max_new_tokens, k=k))


def live_acceptance(model, prompts, *, max_new_tokens: int = 64, k: int | None = None) -> Acceptance:
    """The same rates counted by the live greedy verify loop on the same prompts."""
    return from_trace(live_trace(model, prompts, max_new_tokens=max_new_tokens, k=k))


def compare(model, prompts, *, max_new_tokens: int = 64, k: int | None = None) -> dict[str, Acceptance]:
    """The live loop, the estimate (at the live loop's step starts and at every position) and the two
    controls, on the same prompts; the target decodes each prompt once for all four estimates."""
    paths = greedy_paths(model, prompts, max_new_tokens=max_new_tokens, k=k)
    kw = {"max_new_tokens": max_new_tokens, "k": k, "paths": paths}
    return {"live loop": live_acceptance(model, prompts, max_new_tokens=max_new_tokens, k=k),
            "teacher-forced": estimate_acceptance(model, prompts, **kw),
            "teacher-forced, every position": estimate_acceptance(model, prompts, positions="all", **kw),
            "control: target shifted by one": estimate_acceptance(model, prompts, shift=1, **kw),
            "control: no causal mask": estimate_acceptance(model, prompts, causal=False, **kw)}


def largest_gap(a: Acceptance, b: Acceptance) -> float:
    """The largest absolute difference of unconditional rates over the draft positions (in rate units)."""
    return max(abs(x - y) for x, y in zip(a.unconditional, b.unconditional))


__all__ = ["compare", "estimate_acceptance", "greedy_paths", "kept_given_previous", "largest_gap", "live_acceptance",
           "live_trace", "match_counts", "no_causal_mask", "shuffled_across_steps", "verdict_rows", "within_step_rates"]
