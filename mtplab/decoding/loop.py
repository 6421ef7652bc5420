"""Decoding: autoregressive, and one speculative loop that every drafter plugs into.

B batch (always 1 here), V vocabulary, n drafts in a step, k tokens per step (at most k tokens are
committed a step: n <= k-1 drafts plus one token from the target).

Layers, from the bottom: `distribution` (logits -> probabilities), `accept` (the rule that decides how
many drafts survive), then the phases of a step: `prefill`, `predict`, `propose`, `verify`, `accept`, `commit`.
Stern et al. 2018 (sec. 3) name three substeps, Predict, Verify and Accept; prefill, propose and commit are the
lab's own names for the rest of the work. `iter_steps` runs them and yields one
`Step` at a time; `speculative` collects the steps into a `Trace`; `autoregressive` is the baseline.
A drafter only proposes tokens and hears back what was committed (`mtplab.decoding.drafters`); the loop owns
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

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from mtplab.decoding.accept import RULES, Decision, Sampling, decide, distribution
from mtplab.decoding.adaptive import Fixed, Policy
from mtplab.decoding.checks import check_drafts, check_finite, check_k, check_options, check_prompt, fitted
from mtplab.decoding.drafters import Draft
from mtplab.decoding.trace import Step, Trace
from mtplab.device import now
from mtplab.errors import MtplabError
from mtplab.model.layers import KVCache

if TYPE_CHECKING:  # typing only
    from mtplab.decoding.drafters import Drafter
    from mtplab.model.gpt import GPT


def _ids(tokens: list[int], device) -> torch.Tensor:
    return torch.tensor([tokens], dtype=torch.long, device=device)


class Clock:
    """Wall time per part of a step ('target', 'draft'), read after syncing the device: on a GPU a forward
    returns before its kernels finish, so a clock read without a sync would time the launch, not the work."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.start = self.now()
        self.parts = {"target": 0.0, "draft": 0.0}

    def now(self) -> float:
        return now(self.device)

    @contextmanager
    def __call__(self, part: str):
        t0 = self.now()
        try:
            yield
        finally:
            self.parts[part] += self.now() - t0

    def step(self, **fields) -> Step:
        """The Step, with its wall time and the time of its parts."""
        return Step(**fields, wall_s=self.now() - self.start, target_s=self.parts["target"],
                    draft_s=self.parts["draft"])


# ---------------------------------------------------------------------------------- decoders
@torch.inference_mode()
def autoregressive(model, prompt_ids, *, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
                   generator: torch.Generator | None = None, use_cache: bool = True, stop: int | None = None) -> Trace:
    """m new tokens in m forward passes: the baseline every speculative decoder must reproduce.
    `stop` (a chat model's end-of-turn token): the decode ends with it, after at most m tokens."""
    check_options(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, generator=generator)
    prompt = check_prompt(model, prompt_ids, max_new_tokens)
    sampling = Sampling(temperature, top_k, generator)
    dev = model.wte.weight.device
    trace = Trace(method="ar", prompt=prompt, k=1, schedule="ar")
    cache = model.new_cache(max_len=fitted(model, len(prompt) + max_new_tokens)) if use_cache else None
    tokens = list(prompt)
    fed = tokens  # the first forward reads the whole prompt: the prefill
    while len(tokens) - len(prompt) < max_new_tokens:
        clock = Clock(dev)
        with clock("target"):
            out = model(_ids(fed, dev), cache) if use_cache else model(_ids(tokens, dev))
            tok = sampling.pick(out.logits[0, -1])  # reading the token waits for the device anyway
        tokens.append(tok)
        fed = tokens[-1:]
        trace.steps.append(clock.step(drafted=[], accepted=0, emitted=[tok], bonus=tok, bonus_source="target",
                                      forwards=1, prefill=len(tokens) - len(prompt) == 1))
        if tok == stop:
            break
    return trace


def end_turn(step: Step, stop: int | None) -> bool:
    """True when `step` committed `stop` (the end of the answer): the step is cut after it, since what followed
    (drafts, the bonus) belongs to no answer and is neither kept nor counted as accepted."""
    if stop is None or stop not in step.emitted:
        return False
    i = step.emitted.index(stop)
    j = i - (step.predict_token is not None)  # index among the accepted drafts and the bonus
    step.emitted = step.emitted[:i + 1]
    if j < step.accepted:  # the stop was the plain predict token (j < 0) or an accepted draft
        n = max(0, j + 1)
        step.drafted, step.accepted, step.draws = step.drafted[:n], n, step.draws[:n]
        step.bonus, step.bonus_source = None, "none"
    return True


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
    sampling: Sampling = field(default_factory=Sampling)
    adapt: Policy = field(default_factory=Fixed)  # how many drafts a step asks for (`mtplab.decoding.adaptive`)
    rule: str = "exact"                           # the accept rule: 'exact', or 'typical' (Medusa, LOSSY)
    predicted_once: bool = False  # plain schedule: the prefill served as the first predict
    stop: int | None = None       # a chat model's end-of-turn token: the decode ends once it is committed
    ended: bool = False           # `stop` was committed

    @property
    def remaining(self) -> int:
        return 0 if self.ended else self.max_new_tokens - (len(self.tokens) - self.prompt_len)

    @property
    def device(self):
        return self.model.wte.weight.device

    def forward(self, ids: list[int]):
        return self.model(_ids(ids, self.device), self.cache)


def start(model, drafter, prompt_ids, *, max_new_tokens: int, k: int, schedule: str, sampling: Sampling,
          cache=None, adapt=None, rule: str = "exact", stop: int | None = None) -> Decode:
    """Every input check, then the decode's state: the prompt, an empty cache, the sampling options."""
    check_options(max_new_tokens=max_new_tokens, temperature=sampling.temperature, top_k=sampling.top_k,
                  generator=sampling.generator)
    check_k(k)
    if schedule not in ("plain", "overlap"):
        raise MtplabError(f"unknown schedule {schedule!r}; use 'plain' or 'overlap'")
    check_drafts(k, drafter)
    if rule not in RULES:
        raise MtplabError(f"unknown accept rule {rule!r}; choose one of {', '.join(RULES)}")
    if not sampling.greedy and not drafter.supports_sampling:
        raise MtplabError(f"the {drafter.name} drafter is greedy-only; use temperature=0")
    prompt = check_prompt(model, prompt_ids, max_new_tokens, k)
    if cache is None:
        cache = model.new_cache(max_len=fitted(model, len(prompt) + max_new_tokens + k))
    return Decode(model, drafter, cache, list(prompt), len(prompt),
                  max_new_tokens, k, schedule, sampling, adapt if adapt is not None else Fixed(), rule, stop=stop)


def prefill(run: Decode) -> Step:
    """The prompt in one forward: its last row gives the first new token (in the plain schedule this is
    also the first predict). The drafter starts from the same forward."""
    clock = Clock(run.device)
    with clock("target"):
        out = run.forward(run.tokens)
        tok = run.sampling.pick(out.logits[0, -1])
    run.tokens.append(tok)
    run.ended = run.stop is not None and tok == run.stop
    # cache: the prompt; tokens: prompt + tok
    with clock("draft"):
        run.drafter.begin(run.model, run.tokens, out, run.prompt_len, max_new_tokens=run.max_new_tokens,
                          sampling=run.sampling)
    return clock.step(drafted=[], accepted=0, emitted=[tok], bonus=tok, bonus_source="target", forwards=1,
                      prefill=True)


def predict(run: Decode, clock: Clock) -> int | None:
    """Plain schedule only: one forward at the last committed token commits the target's own next token
    (the drafter hears of its one row). The overlap schedule gets this token from the previous verify."""
    if run.schedule != "plain" or not run.predicted_once:
        run.predicted_once = True  # plain: the prefill was the first predict
        return None
    with clock("target"):
        out = run.forward(run.tokens[-1:])
        tok = run.sampling.pick(out.logits[0, -1])
    run.tokens.append(tok)
    with clock("draft"):
        run.drafter.feedback(out, 1, run.tokens)
    # cache: tokens[:-1] again
    return tok


def propose(run: Decode, clock: Clock) -> Draft:
    """The drafter's tokens (and their q when it samples), maybe none. Overlap keeps one place free for the bonus
    token; plain commits no bonus after all drafts."""
    n = min(run.adapt.drafts(run.k - 1), run.remaining - 1 if run.schedule == "overlap" else run.remaining)
    if n <= 0:
        return Draft([])
    stop = run.adapt.stop  # a confidence stop: a drafter that drafts in turn ends its draft there
    with clock("draft"):
        return run.adapt.cut(run.drafter.propose(n) if stop is None else run.drafter.propose(n, stop=stop))


def verify(run: Decode, drafts: list[int], clock: Clock) -> tuple[Any, torch.Tensor]:
    """One forward over the last committed token and the drafts (plain: all but the last draft, whose
    successor the plain schedule does not need). Row i predicts the token after fed[i]: drafts[i], then
    the bonus. Returns the forward and p: raw logits (greedy compares argmaxes) or distributions."""
    fed = [run.tokens[-1]] + (drafts if run.schedule == "overlap" else drafts[:-1])
    with clock("target"):
        out = run.forward(fed)
        # cache: now also holds fed, some of which may be rejected drafts (commit crops them)
        logits = out.logits[0]  # (len(fed), V)
        s = run.sampling
        p = check_finite(logits) if s.greedy else distribution(logits, s.temperature, s.top_k)
    return out, p


def predicted_alone(run: Decode, predicted: int | None, clock: Clock) -> list[Step]:
    """Plain schedule, no drafts to verify: the predict forward was the whole step (none before the first predict)."""
    if predicted is None:
        return []
    run.ended = run.stop is not None and predicted == run.stop
    return [clock.step(drafted=[], accepted=0, emitted=[predicted], bonus=None, bonus_source="none", forwards=1,
                       predict_token=predicted)]


def commit(run: Decode, draft: Draft, decision: Decision, out, predicted: int | None, clock: Clock, *,
           probe: bool = False) -> Step:
    """Append the accepted drafts and the bonus, crop the cache to the committed tokens, tell the drafter and the
    adaptive policy; returns the step's `Step`. probe=True keeps in it what the accept rule saw, as references (no
    copy): the verify row that predicts the rejected draft or the bonus (plain schedule, every draft kept: the
    row of the last draft), and the drafter's q."""
    base = len(run.tokens) - 1  # the cache held tokens[:-1] before the verify forward
    new = decision.new(draft.tokens)
    run.tokens.extend(new)
    run.cache.crop(len(run.tokens) - 1)
    # cache: tokens[:-1] exactly; rows base..len-2 of this forward are kept positions
    with clock("draft"):  # commit's own work is a crop; the rest is the drafter's feedback
        run.drafter.feedback(out, len(run.tokens) - 1 - base, run.tokens)
    run.adapt.after(len(draft.tokens), decision.n_ok)
    step = clock.step(drafted=draft.tokens, accepted=decision.n_ok, emitted=([predicted] if predicted is not None
                      else []) + new, bonus=decision.bonus, bonus_source=decision.source,
                      forwards=1 + (predicted is not None), draft_forwards=draft.calls, predict_token=predicted,
                      draws=decision.draws)
    if probe:
        step.verify_row = out.logits[0, min(decision.n_ok, out.logits.shape[1] - 1)]
        step.q = draft.q
    run.ended = end_turn(step, run.stop)  # the answer's last token: the step is cut after it, the decode ends
    return step


def iter_steps(model, drafter, prompt_ids, *, max_new_tokens: int, k: int, schedule: str = "overlap",
               temperature: float = 0.0, top_k: int | None = None, generator: torch.Generator | None = None,
               cache=None, adapt=None, rule: str = "exact", probe: bool = False,
               stop: int | None = None) -> Iterator[Step]:
    """Speculative decoding one step at a time: yields the prefill, then one `Step` per decoding step.
    Greedy output equals `autoregressive`'s; sampled output has the target's distribution (rule='exact').
    `cache`: the target's KV cache to use, to look at between steps. `adapt`: how many of the k-1 drafts a step
    asks for (`mtplab.decoding.adaptive`). rule='typical': Medusa's typical acceptance, LOSSY when sampling.
    probe=True: each verifying Step keeps what its accept rule saw (`Step.verify_row`, `Step.q`; see `commit`).
    `stop` (a chat model's end-of-turn token): the decode ends at the step that commits it (`end_turn`).
    Wrap the iteration in `torch.inference_mode()` (as `speculative` does) when no gradients are wanted."""
    run = start(model, drafter, prompt_ids, max_new_tokens=max_new_tokens, k=k, schedule=schedule,
                sampling=Sampling(temperature, top_k, generator), cache=cache, adapt=adapt, rule=rule, stop=stop)
    yield prefill(run)                                            # the prompt in one forward
    while run.remaining > 0:                                      # (none once `stop` is committed)
        clock = Clock(run.device)
        predicted = predict(run, clock)                           # plain only: the target's own next token
        draft = propose(run, clock)                               # the drafter's tokens (and q), maybe none
        if not draft.tokens and run.schedule == "plain":          # nothing to verify: the predict was the step
            yield from predicted_alone(run, predicted, clock)
            continue
        out, p = verify(run, draft.tokens, clock)                 # one target forward over them
        decision = decide(run.rule, draft.tokens, p, draft.q, run.sampling)  # how many survive, and the bonus
        yield commit(run, draft, decision, out, predicted, clock, probe=probe)  # append, crop, tell the drafter


@torch.inference_mode()
def speculative(model, drafter, prompt_ids, *, max_new_tokens: int, k: int, schedule: str = "overlap",
                temperature: float = 0.0, top_k: int | None = None, generator: torch.Generator | None = None,
                method: str | None = None, adapt=None, rule: str = "exact", probe: bool = False,
                stop: int | None = None) -> Trace:
    """Speculative decoding of `model` with any drafter; at most k tokens per step (k-1 drafts + 1).

    Greedy output equals `autoregressive` greedy output; sampled output has the target's distribution
    (accept with min(1, p/q), resample rejections from norm(max(0, p - q))).
    """
    steps = iter_steps(model, drafter, prompt_ids, max_new_tokens=max_new_tokens, k=k, schedule=schedule,
                       temperature=temperature, top_k=top_k, generator=generator, adapt=adapt,
                       rule=rule, probe=probe, stop=stop)
    first = next(steps)  # checks the input before the Trace is made
    vocab = getattr(model, "draft_vocab", None)  # the heads' draft vocabulary (Hugging Face targets), if any
    trace = Trace(method=method or drafter.name, prompt=[int(t) for t in prompt_ids], k=k, schedule=schedule,
                  steps=[first], draft_vocab=None if vocab is None else len(vocab))
    trace.steps.extend(steps)
    return trace
