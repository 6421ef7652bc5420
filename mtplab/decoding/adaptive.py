"""How many drafts a step asks for: fixed, or adapted as engines adapt it. Every policy is exact: the verify keeps
only what the target agrees with, so changing the number of drafts changes the speed, never the output.

* `Fixed`: k-1 drafts every step (the lab's default).
* `Schedule`: Hugging Face assisted generation's heuristic schedule: after a step that kept every draft, ask for
  2 more next time, otherwise 1 fewer, between 1 and k-1.
* `ConfidenceStop`: draft until the drafter's own top-1 probability falls below a threshold, as Hugging Face's
  `assistant_confidence_threshold` stops drafting when the drafter is unsure (after Mamou et al. 2024, "Dynamic
  Speculation Lookahead", arXiv 2405.04304). The step verifies the drafts before the first unsure one. (transformers
  differs by one token: its `ConfidenceCriteria` checks a token after it joined the candidates, so it verifies the
  first unsure draft too.) DeepSeek's modules, which draft one token at a time, stop at the unsure draft and save the
  deeper drafts' work (`stop`); heads that draft every depth at once save only verify rows; the draft-model drafter
  reports no confidence, so the policy leaves its drafts alone.
  EAGLE-2 uses the drafter's confidence differently: to choose which branches of a draft tree to grow, not to stop a
  chain.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Protocol

from mtplab.errors import MtplabError


class Policy(Protocol):
    name: str

    @property
    def stop(self) -> Callable[[float], bool] | None:
        """Told to a drafter that drafts in turn: end the draft at a draft whose confidence makes it true."""

    def drafts(self, limit: int) -> int: ...

    def cut(self, draft): ...

    def after(self, drafted: int, accepted: int) -> None: ...


class Fixed:
    """k-1 drafts every step; the other policies take its defaults for what they leave alone."""
    name = "fixed"
    stop = None

    def drafts(self, limit: int) -> int:
        return limit

    def cut(self, draft):
        return draft

    def after(self, drafted: int, accepted: int) -> None:
        pass


@dataclass
class Schedule(Fixed):
    """+2 drafts after a step that kept all of them, -1 otherwise, within 1..k-1; starts at `start` (or k-1)."""
    start: int | None = None
    n: int | None = field(default=None, init=False)
    name = "schedule"

    def drafts(self, limit: int) -> int:
        if self.n is None:
            self.n = limit if self.start is None else self.start
        self.n = max(1, min(limit, self.n))
        return self.n

    def after(self, drafted: int, accepted: int) -> None:
        if self.n is not None and drafted:
            self.n = self.n + 2 if accepted == drafted else self.n - 1


@dataclass
class ConfidenceStop(Fixed):
    """Keep the drafts before the first whose drafter probability is below `threshold`."""
    threshold: float = 0.4
    name = "confidence"

    def __post_init__(self):
        if not (isinstance(self.threshold, (int, float)) and 0 <= self.threshold <= 1):
            raise MtplabError(f"the confidence threshold must be a probability in [0, 1] (got {self.threshold!r})")

    def cut(self, draft):
        if draft.confidence is None:
            return draft
        n = next((i for i, c in enumerate(draft.confidence) if self.stop(c)), len(draft.tokens))
        if n == len(draft.tokens):
            return draft
        q = draft.q[:n] if draft.q is not None else None
        return replace(draft, tokens=draft.tokens[:n], q=q, confidence=draft.confidence[:n])

    def stop(self, confidence: float) -> bool:
        return confidence < self.threshold


POLICIES = {"fixed": Fixed, "schedule": Schedule, "confidence": ConfidenceStop}


def stop_at(threshold: float | None) -> dict:
    """`generate.decode_with`'s keywords for a confidence stop at `threshold` (None: k-1 drafts every step)."""
    return {} if threshold is None else {"adapt": "confidence", "threshold": threshold}


def policy(name: str | None, **kw):
    """A fresh policy by name (None: fixed). Each decode needs its own (a schedule has state)."""
    if name is None:
        return Fixed()
    if name not in POLICIES:
        raise MtplabError(f"unknown adaptive policy {name!r}; choose one of {', '.join(POLICIES)}")
    return POLICIES[name](**kw)
