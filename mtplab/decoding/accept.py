"""The accept rule, written once where it is applied: which drafts the target keeps, and the token it adds.

Greedy: keep the longest prefix of the drafts that the target's own argmax agrees with, then the target's token.
Sampling (Leviathan et al. 2023, Chen et al. 2023): keep draft d with probability min(1, p(d)/q(d)); at the first
rejection, sample from the residual norm(max(0, p - q)); after all drafts, sample from p.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from mtplab.decoding.checks import check_finite
from mtplab.decoding.trace import BonusSource


# ---------------------------------------------------------------------------------- the rules
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
           generator: torch.Generator | None, draws: list | None = None) -> tuple[int, int | None, BonusSource]:
    """Decide how many drafts survive and which token follows them.

    The sampling rule is speculative sampling (Leviathan, Kalman, Matias 2023, "Fast Inference from
    Transformers via Speculative Decoding", sec. 2.3; Chen et al. 2023, "Accelerating Large Language Model
    Decoding with Speculative Sampling", algorithm 2); the greedy rule is its temperature-0 limit and
    Stern et al.'s (2018) exact-match verification.

    p: (n+1, V) target distributions at the rows that predict drafts[0..n-1] and then the bonus
    (p may have only n rows in the plain schedule, when the last draft's successor was not computed).
    q: (n, V) draft distributions, or None for one-hot drafts (self-speculative heads, n-gram, oracle).
    draws: when a list, sampling appends (p(d), q(d), u) for every draft it examines (the lab shows them).
    Returns (n_accepted, next_token or None, source).
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
        return n, (top[n] if len(top) > n else None), ("target" if len(top) > n else "none")
    for i, d in enumerate(drafts):
        pi = p[i]
        qd = 1.0 if q is None else float(q[i, d])
        # sampling: keep draft d with probability min(1, p(d) / q(d)) ...
        u = float(torch.rand(1, generator=generator))
        if draws is not None:
            draws.append((float(pi[d]), qd, u))
        if u < min(1.0, float(pi[d]) / qd):
            continue
        # ... and on rejection draw from the residual norm(max(0, p - q)), which makes the output exact
        qi = torch.nn.functional.one_hot(torch.tensor(d), pi.shape[0]).float() if q is None else q[i].float()
        resid = torch.clamp(pi - qi, min=0)
        total = float(resid.sum())
        return i, sample(resid / total if total > 0 else pi, generator), "correction"
    if p.shape[0] > n:
        return n, sample(p[n], generator), "target"
    return n, None, "none"


def typical(drafts: list[int], p: torch.Tensor, *, generator: torch.Generator | None, epsilon: float = 0.09,
            delta: float = 0.3) -> tuple[int, int | None, BonusSource]:
    """Typical acceptance (Medusa, Cai et al. 2024, sec. 2.3.1). LOSSY: the output no longer has the target's
    distribution; notebook 06's chi-square test shows by how much.

    Keep draft d at row i while p_i(d) > min(epsilon, delta * exp(-H(p_i))), with H the entropy of the target's
    row: a confident target demands the draft be likely, an unsure one lets more through. At the first draft that
    fails, or after all drafts, the token is sampled from the target's row there (no residual correction: that
    is what would have made it exact). At temperature 0 the rows are one-hot, H = 0, and the rule is greedy.
    p: (n+1, V) target distributions (as for `accept`)."""
    n = len(drafts)
    for i, d in enumerate(drafts):
        pi = p[i].float()
        h = float(-(pi * torch.log(pi.clamp_min(1e-12))).sum())
        if float(pi[d]) > min(epsilon, delta * math.exp(-h)):
            continue
        return i, sample(pi, generator), "correction"
    if p.shape[0] > n:
        return n, sample(p[n].float(), generator), "target"
    return n, None, "none"


RULES = {"exact": "speculative sampling (lossless: the target's distribution)",
         "typical": "typical acceptance, Medusa (LOSSY: changes the output distribution)"}


@dataclass(frozen=True)
class Decision:
    """What the accept rule decided for one step's drafts."""
    n_ok: int                     # how many drafts the target kept (a prefix)
    bonus: int | None             # the target's token after them (None: the step had none)
    source: BonusSource           # 'target', 'correction' or 'none' (`Step.bonus_source`)
    draws: list[tuple[float, float, float]] = field(default_factory=list)  # sampling, exact rule: (p(d), q(d), u)

    def new(self, drafts: list[int]) -> list[int]:
        """The tokens the step commits after its predict token: the kept drafts, then the bonus."""
        return drafts[:self.n_ok] + ([self.bonus] if self.bonus is not None else [])


def decide(rule: str, drafts: list[int], p: torch.Tensor, q: torch.Tensor | None, sampling: Sampling) -> Decision:
    """The one call the loop makes: `rule` 'exact' (`accept`: greedy prefix, or min(1, p/q) with the residual) or
    'typical' (`typical`, LOSSY when sampling; at temperature 0 it is the greedy rule, so greedy takes `accept`)."""
    if rule == "typical" and not sampling.greedy:
        return Decision(*typical(drafts, p, generator=sampling.generator))
    draws: list[tuple[float, float, float]] = []
    n_ok, bonus, source = accept(drafts, p, q, greedy=sampling.greedy, generator=sampling.generator, draws=draws)
    return Decision(n_ok, bonus, source, draws)


@dataclass(frozen=True)
class Sampling:
    """How the target picks a token: greedy (temperature 0), or sampled at `temperature` from the `top_k` most
    likely tokens, with `generator` as the one source of randomness (passed in, never hidden)."""
    temperature: float = 0.0
    top_k: int | None = None
    generator: torch.Generator | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def pick(self, logits_row: torch.Tensor) -> int:
        if self.greedy:
            return int(check_finite(logits_row).argmax())
        return sample(distribution(logits_row.unsqueeze(0), self.temperature, self.top_k)[0], self.generator)
