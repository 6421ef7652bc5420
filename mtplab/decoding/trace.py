"""The record of a decode: one `Step` per decoding step, collected in a `Trace`.

Words (README, glossary): the *target* is the model whose output must be reproduced; the *drafter*
proposes *drafts*; a step commits the *accepted* prefix of its drafts, then one *bonus* token from the
target: after every draft was accepted (`bonus_source='target'`), or in place of the first *rejected*
draft, as its *correction* (`bonus_source='correction'`). Drafts after the rejected one are *discarded*.
A *forward* is one call of the target over one or more positions; drafter calls are counted apart.

Counters follow vLLM's spec-decode metrics (unconditional acceptance per position).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from mtplab.errors import MtplabError
from mtplab.tokenizer import decode

if TYPE_CHECKING:
    import torch


BonusSource = Literal["target", "correction", "none"]


@dataclass(kw_only=True)
class Step:
    """One decoding step. `emitted` is what the step committed, in order."""
    drafted: list[int]             # tokens the drafter proposed
    accepted: int                  # how many of them the target kept (a prefix)
    emitted: list[int]             # committed tokens: [predict token] + accepted drafts + [bonus]
    bonus: int | None              # the target's token after the accepted prefix (None: the step had none)
    bonus_source: BonusSource      # 'target': every draft accepted; 'correction': replaces a rejected draft
    forwards: int                  # target forward passes in this step
    prefill: bool = False          # the prompt's own forward (decodes nothing yet): left out of per-step numbers
    draft_forwards: int = 0        # drafter calls in this step (head pass, module calls, draft-model forwards)
    wall_s: float = 0.0            # the whole step
    target_s: float = 0.0          # of which: target forwards (predict, verify)
    draft_s: float = 0.0           # of which: the drafter (propose, and its bookkeeping on what was kept)
    predict_token: int | None = None  # plain schedule: the token the predict forward committed
    draws: list[tuple[float, float, float]] = field(default_factory=list)  # sampling only: (p(d), q(d), u)
    # for each draft d the accept rule examined, in order; kept when u < min(1, p(d)/q(d))
    # probe=True only (what the accept rule saw, kept as references into the verify forward: no copy, no sync):
    verify_row: torch.Tensor | None = field(default=None, compare=False, repr=False)  # (V,) the verify logits at
    # the decisive row: the one that predicts the rejected draft, or the bonus when every draft was kept
    q: torch.Tensor | None = field(default=None, compare=False, repr=False)  # (n, V) the drafter's q for its drafts
    # (None: a greedy drafter, one-hot on its drafts)


def _summed(field_name: str) -> property:
    """A Trace property: one Step field summed over the steps."""
    return property(lambda self: sum(getattr(s, field_name) for s in self.steps))


@dataclass
class Trace:
    """What a decoder did, step by step. Step 0 is the prefill (the prompt in one forward)."""
    method: str
    prompt: list[int]
    steps: list[Step] = field(default_factory=list)
    k: int = 1                     # tokens per step: at most k committed per step (k-1 drafts + 1)
    schedule: str = "ar"
    draft_vocab: int | None = None  # how many token ids the drafts were drawn from (None: the full vocabulary)

    @property
    def tokens(self) -> list[int]:
        return [t for s in self.steps for t in s.emitted]

    @property
    def text(self) -> str:
        return decode(self.tokens)

    # totals over the steps: target forwards, drafter calls, and seconds (the whole steps, the target's, the drafter's)
    forwards = _summed("forwards")
    draft_forwards = _summed("draft_forwards")
    wall_s = _summed("wall_s")
    target_s = _summed("target_s")
    draft_s = _summed("draft_s")

    @property
    def decoding_steps(self) -> list[Step]:
        """The steps after the prefills (a pooled Trace holds one prefill per prompt)."""
        return [s for s in self.steps if not s.prefill]

    def time_split(self, *, skip_prefill: bool = True) -> dict[str, float]:
        """Seconds per decoding step spent in target forwards, in the drafter, and in the rest of the loop
        (the accept rule, cache bookkeeping, Python), measured; every prefill is left out by default."""
        steps = self.decoding_steps if skip_prefill else self.steps
        n = max(1, len(steps))
        target = sum(s.target_s for s in steps) / n
        draft = sum(s.draft_s for s in steps) / n
        wall = sum(s.wall_s for s in steps) / n
        return {"target_s": target, "draft_s": draft, "overhead_s": max(0.0, wall - target - draft), "wall_s": wall,
                "steps": len(steps)}

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
        """accepted_per_position[i]: steps whose draft i (0-based; depth i+2) was accepted."""
        return [a for a, _ in conditional_counts(self)]

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        """Unconditional (vLLM style): accepted at position i / number of drafting steps."""
        d = max(1, self.num_drafts)
        return [a / d for a in self.accepted_per_position]

    @property
    def conditional_acceptance(self) -> list[float]:
        """P(draft i accepted | drafts 0..i-1 accepted and draft i existed)."""
        return [a / reached if reached else float("nan") for a, reached in conditional_counts(self)]

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per drafting step counting the bonus token, as vLLM reports it:
        1 + num_accepted_tokens / num_drafts."""
        return 1.0 + self.num_accepted_tokens / max(1, self.num_drafts)

    def summary(self, detokenize=decode) -> dict:
        """Every counter in one dict; `text` by `detokenize` (the lab's bytes; a Hugging Face model's own tokenizer)."""
        return {
            "method": self.method, "k": self.k, "schedule": self.schedule,
            "text": detokenize(self.tokens), "tokens": self.tokens, "forwards": self.forwards,
            "draft_forwards": self.draft_forwards, "tokens_per_forward": self.tokens_per_forward,
            "num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "accepted_per_position": self.accepted_per_position,
            "acceptance_rate_per_position": self.acceptance_rate_per_position,
            "conditional_acceptance": self.conditional_acceptance,
            "mean_accepted_length": self.mean_accepted_length, "wall_s": self.wall_s,
            "time_split": self.time_split(),
        }


def pooled(traces: list[Trace]) -> Trace:
    """One Trace holding the steps of many (same method and k), so its counters pool over prompts; each prompt's
    prefill stays marked (`Step.prefill`), so `time_split` leaves every one out."""
    if not traces:
        raise MtplabError("no traces to pool")
    t0 = traces[0]
    return Trace(method=t0.method, prompt=[], steps=[s for t in traces for s in t.steps], k=t0.k,
                 schedule=t0.schedule)


def conditional_counts(trace: Trace) -> list[tuple[int, int]]:
    """(accepted, reached) per draft position: the counts behind `Trace.conditional_acceptance`."""
    n = max((len(s.drafted) for s in trace.steps), default=0)
    return [(sum(1 for s in trace.steps if s.accepted > i),
             sum(1 for s in trace.steps if len(s.drafted) > i and s.accepted >= i)) for i in range(n)]
