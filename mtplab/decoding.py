"""Decoding: autoregressive, and one speculative loop that every drafter plugs into.

B batch (always 1 here), V vocabulary, n drafts in a step, k block size (at most k tokens a step,
so n <= k-1).

Layers, from the bottom: `distribution` (logits -> probabilities), `accept` (the rule that decides how
many drafts survive), `prefill`, then `autoregressive` and `speculative`. A drafter only proposes
tokens and hears back what was committed (`mtplab.drafters`); the loop owns the target model's cache.

Two schedules (Stern et al. 2018, sec. 3-4):
* "plain": predict (one forward at the last token: the target's own next token plus drafts) ->
  verify (one forward over the drafts) -> accept. 2m/k forwards at best.
* "overlap": one forward verifies this step's drafts and, at the last accepted position, yields both
  the bonus token and the next step's drafts. 1 + m/k forwards at best.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .errors import MtplabError
from .tokenizer import decode


# ---------------------------------------------------------------------------------- the record
@dataclass
class Step:
    """One decoding step. `emitted` is what the step committed, in order."""
    drafted: list[int]             # tokens the drafter proposed
    accepted: int                  # how many of them the target kept (a prefix)
    emitted: list[int]             # committed tokens: [predict token] + accepted drafts + [bonus]
    bonus: int | None              # token taken from the target after the accepted prefix (None if none)
    bonus_source: str              # 'target' (all drafts kept), 'correction' (a draft was rejected), 'none'
    forwards: int                  # target-model forward passes in this step
    draft_forwards: int = 0        # drafter forward passes (draft model, DeepSeek modules)
    wall_s: float = 0.0
    predict_token: int | None = None  # plain schedule: the token the predict forward committed


@dataclass
class Trace:
    """What a decoder did, step by step, with the counters vLLM's spec-decode metrics use."""
    method: str
    prompt: list[int]
    steps: list[Step] = field(default_factory=list)
    k: int = 1
    schedule: str = "ar"

    @property
    def tokens(self) -> list[int]:
        return [t for s in self.steps for t in s.emitted]

    @property
    def text(self) -> str:
        return decode(self.tokens)

    @property
    def forwards(self) -> int:
        return sum(s.forwards for s in self.steps)

    @property
    def draft_forwards(self) -> int:
        return sum(s.draft_forwards for s in self.steps)

    @property
    def wall_s(self) -> float:
        return sum(s.wall_s for s in self.steps)  # step 0 is the prefill

    @property
    def tokens_per_forward(self) -> float:
        return len(self.tokens) / max(1, self.forwards)

    # vLLM-style counters: a 'draft' is one step that proposed at least one token
    @property
    def num_drafts(self) -> int:
        return sum(1 for s in self.steps if s.drafted)

    @property
    def num_draft_tokens(self) -> int:
        return sum(len(s.drafted) for s in self.steps)

    @property
    def num_accepted_tokens(self) -> int:
        return sum(s.accepted for s in self.steps)

    @property
    def accepted_per_position(self) -> list[int]:
        """accepted_per_position[i]: steps whose draft i (0-based) was accepted."""
        n = max((len(s.drafted) for s in self.steps), default=0)
        return [sum(1 for s in self.steps if s.accepted > i) for i in range(n)]

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        """Unconditional (vLLM style): accepted at position i / number of drafts."""
        d = max(1, self.num_drafts)
        return [a / d for a in self.accepted_per_position]

    @property
    def conditional_acceptance(self) -> list[float]:
        """P(draft i accepted | drafts 0..i-1 accepted and draft i existed)."""
        n = max((len(s.drafted) for s in self.steps), default=0)
        out = []
        for i in range(n):
            reached = sum(1 for s in self.steps if len(s.drafted) > i and s.accepted >= i)
            out.append(sum(1 for s in self.steps if s.accepted > i) / reached if reached else float("nan"))
        return out

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per drafting step counting the bonus token, as vLLM reports it:
        1 + num_accepted_tokens / num_drafts."""
        return 1.0 + self.num_accepted_tokens / max(1, self.num_drafts)

    def summary(self) -> dict:
        return {
            "method": self.method, "k": self.k, "schedule": self.schedule,
            "text": self.text, "tokens": self.tokens, "forwards": self.forwards,
            "draft_forwards": self.draft_forwards, "tokens_per_forward": self.tokens_per_forward,
            "num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "accepted_per_position": self.accepted_per_position,
            "acceptance_rate_per_position": self.acceptance_rate_per_position,
            "conditional_acceptance": self.conditional_acceptance,
            "mean_accepted_length": self.mean_accepted_length, "wall_s": self.wall_s,
        }


# ---------------------------------------------------------------------------------- the rules
def check_options(*, max_new_tokens: int, temperature: float, top_k: int | None):
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise MtplabError(f"max_new_tokens must be an integer >= 1 (got {max_new_tokens!r})")
    if temperature is None or not (0 <= temperature < float("inf")):  # also catches NaN
        raise MtplabError(f"temperature must be >= 0 and finite (got {temperature}); 0 means greedy")
    if top_k is not None and top_k < 1:
        raise MtplabError(f"top_k must be >= 1 or None (got {top_k})")


def check_prompt(model, prompt_ids, extra: int) -> list[int]:
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise MtplabError("the prompt is empty; give at least one token (one character)")
    V = model.config.vocab_size
    if any(t < 0 or t >= V for t in prompt):
        raise MtplabError(f"prompt ids must lie in 0..{V - 1}")
    limit = model.config.block_size
    if len(prompt) + extra > limit:
        raise MtplabError(
            f"prompt ({len(prompt)} tokens) plus {extra} more exceeds the context window of {limit}; "
            f"shorten the prompt to at most {max(0, limit - extra)} tokens or ask for fewer new tokens "
            "(mtplab has no sliding window)")
    return prompt


def check_finite(logits: torch.Tensor) -> torch.Tensor:
    if not torch.isfinite(logits).all():
        raise MtplabError("the model produced NaN or infinite logits; the checkpoint is probably corrupt "
                          "(reload or retrain it)")
    return logits


def distribution(logits: torch.Tensor, temperature: float, top_k: int | None) -> torch.Tensor:
    """(n, V) logits -> (n, V) float32 probabilities; temperature 0 gives one-hot argmax rows."""
    logits = check_finite(logits.float())
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.softmax(logits, dim=-1)


def sample(p: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(p, 1, generator=generator))


def accept(drafts: list[int], p: torch.Tensor, q: torch.Tensor | None, *, greedy: bool,
           generator: torch.Generator | None) -> tuple[int, int, str]:
    """Decide how many drafts survive and which token follows them.

    p: (n+1, V) target distributions at the rows that predict drafts[0..n-1] and then the bonus
    (p may have only n rows in the plain schedule, when the last draft's successor was not computed).
    q: (n, V) draft distributions, or None for one-hot drafts (self-speculative heads, n-gram, oracle).
    Returns (n_accepted, next_token or -1, source).
    """
    n = len(drafts)
    if greedy:
        # greedy: keep the longest prefix of the drafts that the target would also have chosen
        top = p.argmax(-1).tolist()  # p may be one-hot rows or raw logits: the argmax is the same
        i = 0
        while i < n and top[i] == drafts[i]:
            i += 1
        if i < n:
            return i, top[i], "correction"
        return n, (top[n] if len(top) > n else -1), ("target" if len(top) > n else "none")
    for i, d in enumerate(drafts):
        pi = p[i]
        qd = 1.0 if q is None else float(q[i, d])
        # sampling: keep draft d with probability min(1, p(d) / q(d)) ...
        if float(torch.rand(1, generator=generator)) < min(1.0, float(pi[d]) / qd):
            continue
        # ... and on rejection draw from the residual norm(max(0, p - q)), which makes the output exact
        qi = torch.nn.functional.one_hot(torch.tensor(d), pi.shape[0]).float() if q is None else q[i].float()
        resid = torch.clamp(pi - qi, min=0)
        total = float(resid.sum())
        return i, sample(resid / total if total > 0 else pi, generator), "correction"
    if p.shape[0] > n:
        return n, sample(p[n], generator), "target"
    return n, -1, "none"


def pick_token(logits_row: torch.Tensor, temperature: float, top_k: int | None, generator) -> int:
    if temperature == 0:
        return int(check_finite(logits_row).argmax())
    return sample(distribution(logits_row.unsqueeze(0), temperature, top_k)[0], generator)


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
    t0 = time.perf_counter()
    out = model(_ids(tokens, dev), cache)
    tok = pick_token(out.logits[0, -1], temperature, top_k, generator)
    tokens.append(tok)
    trace.steps.append(Step([], 0, [tok], tok, "target", 1, wall_s=time.perf_counter() - t0))
    while len(tokens) - len(prompt) < max_new_tokens:
        t0 = time.perf_counter()
        out = model(_ids(tokens[-1:], dev), cache) if use_cache else model(_ids(tokens, dev))
        tok = pick_token(out.logits[0, -1], temperature, top_k, generator)
        tokens.append(tok)
        trace.steps.append(Step([], 0, [tok], tok, "target", 1, wall_s=time.perf_counter() - t0))
    return trace


@torch.inference_mode()
def speculative(model, drafter, prompt_ids, *, max_new_tokens: int, k: int, schedule: str = "overlap",
                temperature: float = 0.0, top_k: int | None = None, generator: torch.Generator | None = None,
                method: str | None = None, on_step=None) -> Trace:
    """Speculative decoding of `model` with any drafter; at most k tokens per step (k-1 drafts).

    `on_step(cache, drafter, tokens)`, if given, is called after every step (tests check the caches
    against a full recompute there).

    Greedy output equals `autoregressive` greedy output; sampled output has the target's
    distribution (accept with min(1, p/q), resample rejections from norm(max(0, p - q))).
    """
    check_options(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k)
    if not isinstance(k, int) or k < 1:
        raise MtplabError(f"k must be an integer >= 1 (got {k!r})")
    if schedule not in ("plain", "overlap"):
        raise MtplabError(f"unknown schedule {schedule!r}; use 'plain' or 'overlap'")
    limit = drafter.max_drafts
    if limit is not None and k - 1 > limit:
        raise MtplabError(f"k={k} needs {k - 1} drafts a step but {drafter.name} gives at most {limit}; "
                          f"use k <= {limit + 1}")
    greedy = temperature == 0
    if not greedy and not drafter.supports_sampling:
        raise MtplabError(f"the {drafter.name} drafter is greedy-only; use temperature=0")
    prompt = check_prompt(model, prompt_ids, max_new_tokens + k)
    dev = model.wte.weight.device
    trace = Trace(method=method or drafter.name, prompt=prompt, k=k, schedule=schedule)
    cache = model.new_cache()
    tokens = list(prompt)
    m = max_new_tokens

    # prefill: the prompt in one forward gives the first new token; the cache then holds tokens[:-1]
    t0 = time.perf_counter()
    out = model(_ids(tokens, dev), cache)
    tok = pick_token(out.logits[0, -1], temperature, top_k, generator)
    tokens.append(tok)
    drafter.begin(model, tokens, out, len(prompt), max_new_tokens=m, generator=generator,
                  temperature=temperature, top_k=top_k)
    trace.steps.append(Step([], 0, [tok], tok, "target", 1, wall_s=time.perf_counter() - t0))

    predict_needed = False  # plain: the prefill was the first predict
    while len(tokens) - len(prompt) < m:
        t0 = time.perf_counter()
        remaining = m - (len(tokens) - len(prompt))
        base = cache.length  # == len(tokens) - 1: the last committed token is not in the cache yet
        forwards = 0
        predict_token = None
        emitted: list[int] = []
        if schedule == "plain" and predict_needed:
            # predict: one forward at the last token commits the target's own next token
            out = model(_ids(tokens[-1:], dev), cache)
            forwards += 1
            predict_token = pick_token(out.logits[0, -1], temperature, top_k, generator)
            tokens.append(predict_token)
            emitted.append(predict_token)
            drafter.feedback(out, 1, tokens)
            remaining -= 1
            base = cache.length
        n = min(k - 1, remaining - 1 if schedule == "overlap" else remaining)
        drafts, q = drafter.propose(n) if n > 0 else ([], None)
        draft_forwards = drafter.last_forwards
        n = len(drafts)
        predict_needed = True
        if schedule == "plain" and n == 0:
            if emitted:
                trace.steps.append(Step([], 0, emitted, None, "none", forwards, draft_forwards,
                                        time.perf_counter() - t0, predict_token))
            continue
        # verify: feed the last committed token and the drafts (plain: all but the last draft)
        fed = [tokens[-1]] + (drafts if schedule == "overlap" else drafts[:-1])
        out = model(_ids(fed, dev), cache)
        forwards += 1
        # greedy compares argmaxes, which the raw logits give; sampling needs the distributions
        p = check_finite(out.logits[0]) if greedy else distribution(out.logits[0], temperature, top_k)  # (len(fed), V)
        n_ok, nxt, source = accept(drafts, p, q, greedy=greedy, generator=generator)
        new = drafts[:n_ok] + ([nxt] if nxt >= 0 else [])
        tokens.extend(new)
        emitted.extend(new)
        cache.crop(len(tokens) - 1)
        drafter.feedback(out, len(tokens) - 1 - base, tokens)
        trace.steps.append(Step(drafts, n_ok, emitted, nxt if nxt >= 0 else None, source, forwards,
                                draft_forwards, time.perf_counter() - t0, predict_token))
        if on_step is not None:
            on_step(cache, drafter, tokens)
    return trace
