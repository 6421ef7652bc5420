"""Decoding: autoregressive, and one speculative loop that every drafter plugs into.

B batch (always 1 here), V vocabulary, n drafts in a step, k tokens per step (at most k tokens are
committed a step: n <= k-1 drafts plus one token from the target).

Layers, from the bottom: `distribution` (logits -> probabilities), `accept` (the rule that decides how
many drafts survive), then the phases of a step, named as Stern et al. 2018 (sec. 3) name them:
`prefill`, `predict`, `propose`, `verify`, `accept`, `commit`. `iter_steps` runs them and yields one
`Step` at a time; `speculative` collects the steps into a `Trace`; `autoregressive` is the baseline.
A drafter only proposes tokens and hears back what was committed (`mtplab.drafters`); the loop owns
the target's KV cache.

Two schedules (Stern et al. 2018, sec. 3-4):
* "plain": predict (one forward at the last token commits the target's own next token) -> propose ->
  verify (one forward over the last token and all drafts but the last) -> accept. 2m/k forwards at best.
* "overlap": one forward verifies this step's drafts and, at the last accepted position, gives the
  bonus token and the hidden state the next step's drafts come from. 1 + m/k forwards at best.

Exactness: greedy output equals `autoregressive` greedy output token for token in float32 (tested); in
bf16 a verify forward over q tokens and a one-token forward round differently, so near-ties can flip.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING
import torch
from mtplab.decoding.checks import check_finite, check_k, check_options, check_prompt
from mtplab.errors import MtplabError
from mtplab.model.layers import KVCache
from mtplab.decoding.trace import Step, Trace
from mtplab.decoding.accept import accept
from mtplab.decoding.accept import distribution
from mtplab.decoding.accept import pick_token
if TYPE_CHECKING:  # typing only: drafters import this module
    from mtplab.decoding.drafters import Drafter
    from mtplab.model.gpt import GPT


def _ids(tokens: list[int], device) -> torch.Tensor:
    return torch.tensor([tokens], dtype=torch.long, device=device)


# ---------------------------------------------------------------------------------- decoders
@torch.inference_mode()
def autoregressive(model, prompt_ids, *, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
                   generator: torch.Generator | None = None, use_cache: bool = True) -> Trace:
    """m new tokens in m forward passes: the baseline every speculative decoder must reproduce."""
    check_options(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k)
    prompt = check_prompt(model, prompt_ids, max_new_tokens)
    dev = model.wte.weight.device
    trace = Trace(method="ar", prompt=prompt, k=1, schedule="ar")
    cache = model.new_cache() if use_cache else None
    tokens = list(prompt)
    fed = tokens  # the first forward reads the whole prompt
    while len(tokens) - len(prompt) < max_new_tokens:
        t0 = time.perf_counter()
        out = model(_ids(fed, dev), cache) if use_cache else model(_ids(tokens, dev))
        t1 = time.perf_counter()
        tok = pick_token(out.logits[0, -1], temperature, top_k, generator)
        tokens.append(tok)
        fed = tokens[-1:]
        trace.steps.append(Step(drafted=[], accepted=0, emitted=[tok], bonus=tok, bonus_source="target", forwards=1,
                                wall_s=time.perf_counter() - t0, target_s=t1 - t0))
    return trace


@dataclass
class Decode:
    """What one speculative decode carries from step to step. Invariant between steps: the target's
    cache holds tokens[:-1] (the last committed token is fed by the next forward)."""
    model: GPT
    drafter: Drafter
    cache: KVCache
    tokens: list[int]
    prompt_len: int
    max_new_tokens: int
    k: int
    schedule: str
    temperature: float
    top_k: int | None
    generator: torch.Generator | None
    predicted_once: bool = False  # plain schedule: the prefill served as the first predict

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - (len(self.tokens) - self.prompt_len)

    def forward(self, ids: list[int]):
        return self.model(_ids(ids, self.model.wte.weight.device), self.cache)

    def pick(self, logits_row: torch.Tensor) -> int:
        return pick_token(logits_row, self.temperature, self.top_k, self.generator)


def prefill(run: Decode) -> Step:
    """The prompt in one forward: its last row gives the first new token (in the plain schedule this is
    also the first predict). The drafter starts from the same forward."""
    t0 = time.perf_counter()
    out = run.forward(run.tokens)
    t1 = time.perf_counter()
    tok = run.pick(out.logits[0, -1])
    run.tokens.append(tok)
    # cache: the prompt; tokens: prompt + tok
    t2 = time.perf_counter()
    run.drafter.begin(run.model, run.tokens, out, run.prompt_len, max_new_tokens=run.max_new_tokens,
                      generator=run.generator, temperature=run.temperature, top_k=run.top_k)
    t3 = time.perf_counter()
    return Step(drafted=[], accepted=0, emitted=[tok], bonus=tok, bonus_source="target", forwards=1,
                wall_s=t3 - t0, target_s=t1 - t0, draft_s=t3 - t2)


def predict(run: Decode):
    """Plain schedule: one forward at the last committed token commits the target's own next token.
    Returns the forward (the drafter hears of its one kept row)."""
    out = run.forward(run.tokens[-1:])
    run.tokens.append(run.pick(out.logits[0, -1]))
    # cache: tokens[:-1] again
    return out


def verify(run: Decode, drafts: list[int]) -> tuple[object, torch.Tensor]:
    """One forward over the last committed token and the drafts (plain: all but the last draft, whose
    successor the plain schedule does not need). Row i predicts the token after fed[i]: drafts[i], then
    the bonus. Returns the forward and p: raw logits (greedy compares argmaxes) or distributions."""
    fed = [run.tokens[-1]] + (drafts if run.schedule == "overlap" else drafts[:-1])
    out = run.forward(fed)
    # cache: now also holds fed, some of which may be rejected drafts (commit crops them)
    logits = out.logits[0]  # (len(fed), V)
    p = check_finite(logits) if run.greedy else distribution(logits, run.temperature, run.top_k)
    return out, p


def commit(run: Decode, new: list[int], out, base: int) -> None:
    """Append the accepted drafts and the bonus, crop the cache to the committed tokens, tell the drafter."""
    run.tokens.extend(new)
    run.cache.crop(len(run.tokens) - 1)
    # cache: tokens[:-1] exactly; rows base..len-2 of this forward are kept positions
    run.drafter.feedback(out, len(run.tokens) - 1 - base, run.tokens)


def iter_steps(model, drafter, prompt_ids, *, max_new_tokens: int, k: int, schedule: str = "overlap",
               temperature: float = 0.0, top_k: int | None = None, generator: torch.Generator | None = None,
               cache=None) -> Iterator[Step]:
    """Speculative decoding one step at a time: yields the prefill, then one `Step` per decoding step.

    Greedy output equals `autoregressive` greedy output; sampled output has the target's distribution.
    `cache` (optional) is the target's KV cache to use, so that a caller can look at it between steps.
    Wrap the iteration in `torch.inference_mode()` (as `speculative` does) when no gradients are wanted.
    """
    check_options(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k)
    check_k(k)
    if schedule not in ("plain", "overlap"):
        raise MtplabError(f"unknown schedule {schedule!r}; use 'plain' or 'overlap'")
    limit = drafter.max_drafts
    if limit is not None and k - 1 > limit:
        raise MtplabError(f"k={k} needs {k - 1} drafts a step but {drafter.name} gives at most {limit}; "
                          f"use k <= {limit + 1}")
    if temperature != 0 and not drafter.supports_sampling:
        raise MtplabError(f"the {drafter.name} drafter is greedy-only; use temperature=0")
    prompt = check_prompt(model, prompt_ids, max_new_tokens, k)
    run = Decode(model, drafter, cache if cache is not None else model.new_cache(), list(prompt), len(prompt),
                 max_new_tokens, k, schedule, temperature, top_k, generator)
    yield prefill(run)
    while run.remaining > 0:
        step = _step(run)
        if step.emitted:  # plain schedule, first step with k=1: nothing to verify and no predict yet
            yield step


def _step(run: Decode) -> Step:
    t0 = time.perf_counter()
    target_s = draft_s = 0.0
    emitted: list[int] = []
    predict_token = None
    forwards = 0
    if run.schedule == "plain" and run.predicted_once:
        t = time.perf_counter()
        out = predict(run)
        t1 = time.perf_counter()
        run.drafter.feedback(out, 1, run.tokens)
        target_s += t1 - t
        draft_s += time.perf_counter() - t1
        predict_token = run.tokens[-1]
        emitted.append(predict_token)
        forwards += 1
    run.predicted_once = True
    base = run.cache.length  # == len(tokens) - 1
    # propose: overlap keeps one place free for the bonus token; plain commits no bonus after all drafts
    n = min(run.k - 1, run.remaining - 1 if run.schedule == "overlap" else run.remaining)
    t = time.perf_counter()
    draft = run.drafter.propose(n) if n > 0 else None
    draft_s += time.perf_counter() - t
    drafts = draft.tokens if draft is not None else []
    calls = draft.calls if draft is not None else 0
    if run.schedule == "plain" and not drafts:  # nothing to verify: the predict token was the whole step
        return Step(drafted=[], accepted=0, emitted=emitted, bonus=None, bonus_source="none", forwards=forwards,
                    draft_forwards=calls, wall_s=time.perf_counter() - t0, target_s=target_s, draft_s=draft_s,
                    predict_token=predict_token)
    t = time.perf_counter()
    out, p = verify(run, drafts)
    target_s += time.perf_counter() - t
    forwards += 1
    draws: list[tuple[float, float, float]] = []
    n_ok, nxt, source = accept(drafts, p, draft.q if draft is not None else None, greedy=run.greedy,
                               generator=run.generator, draws=draws)
    new = drafts[:n_ok] + ([nxt] if nxt >= 0 else [])
    t = time.perf_counter()
    commit(run, new, out, base)
    draft_s += time.perf_counter() - t  # commit's own work is a crop; the rest is the drafter's feedback
    return Step(drafted=drafts, accepted=n_ok, emitted=emitted + new, bonus=nxt if nxt >= 0 else None,
                bonus_source=source, forwards=forwards, draft_forwards=calls, wall_s=time.perf_counter() - t0,
                target_s=target_s, draft_s=draft_s, predict_token=predict_token, draws=draws)


@torch.inference_mode()
def speculative(model, drafter, prompt_ids, *, max_new_tokens: int, k: int, schedule: str = "overlap",
                temperature: float = 0.0, top_k: int | None = None, generator: torch.Generator | None = None,
                method: str | None = None) -> Trace:
    """Speculative decoding of `model` with any drafter; at most k tokens per step (k-1 drafts + 1).

    Greedy output equals `autoregressive` greedy output; sampled output has the target's distribution
    (accept with min(1, p/q), resample rejections from norm(max(0, p - q))).
    """
    steps = iter_steps(model, drafter, prompt_ids, max_new_tokens=max_new_tokens, k=k, schedule=schedule,
                       temperature=temperature, top_k=top_k, generator=generator)
    first = next(steps)  # checks the input before the Trace is made
    trace = Trace(method=method or drafter.name, prompt=[int(t) for t in prompt_ids], k=k, schedule=schedule,
                  steps=[first])
    trace.steps.extend(steps)
    return trace
