"""Counting forwards and predicting speedups.

m new tokens, k tokens per step (at most k tokens a step, k-1 drafts), alpha the chance that a
draft is accepted given that the ones before it were, q tokens fed to one forward.

Where the i.i.d. alpha model misfits. `expected_tokens_per_step` and its inverse assume one alpha for
every position and independent verdicts (Leviathan et al. 2023, eq. 1). On the lab's text the verdicts
of one step are positively correlated (an easy stretch makes every draft right, a hard one every draft
wrong), so the measured conditional rate *rises* with the position, and the one alpha fitted to a mean
length sits between the first position's rate and the later ones': it is a summary, not a rate any
position has. `per_position_tokens_per_step` takes the measured rates instead, and
`teacher_forced.shuffled_across_steps` is the control in which the independence assumption holds.
"""
from __future__ import annotations

import itertools
import math
import operator
from mtplab.errors import MtplabError


def _check(m: int, k: int):
    if m < 1 or k < 1:
        raise MtplabError(f"need m >= 1 and k >= 1 (got m={m}, k={k})")


def stern_plain_steps(m: int, k: int) -> float:
    """Stern et al. 2018, best case without overlap: predict + verify for every k tokens, 2m/k."""
    return 2 * m / k


def stern_overlap_steps(m: int, k: int) -> float:
    """Stern et al. 2018, best case with verify n overlapped with predict n+1: 1 + m/k."""
    return 1 + m / k


def plain_forwards(m: int, k: int) -> int:
    """Exact forwards of our plain schedule when every draft is accepted.

    Each block of k tokens costs a predict and a verify forward. A last block of a single
    token needs only its predict. So 2*ceil(m/k), minus 1 when m mod k == 1; for k = 1 there is
    nothing to verify and it is m. Equals 2m/k when k divides m.
    """
    _check(m, k)
    if k == 1:
        return m
    return 2 * math.ceil(m / k) - (1 if m % k == 1 else 0)


def overlap_forwards(m: int, k: int) -> int:
    """Exact forwards of the overlapped schedule when every draft is accepted.

    The prefill gives the first token; each later forward commits k tokens (k-1 drafts and
    the bonus), the last one possibly fewer: 1 + ceil((m-1)/k). Equals 1 + m/k when k divides m.
    """
    _check(m, k)
    return 1 + math.ceil((m - 1) / k)


def deepseek_forwards(m: int, D: int) -> int:
    """DeepSeek-V3 self-speculation with D modules: D drafts a step, so blocks of D+1 tokens."""
    return overlap_forwards(m, D + 1)


def expected_tokens_per_step(alpha: float, n_drafts: int) -> float:
    """E[tokens per step] = (1 - alpha^(n+1)) / (1 - alpha) for i.i.d. acceptance alpha and n drafts
    (the accepted prefix plus the bonus token). n_drafts = k - 1 for k tokens per step."""
    if not 0 <= alpha <= 1:
        raise MtplabError(f"alpha must lie in [0, 1] (got {alpha})")
    if alpha == 1:
        return float(n_drafts + 1)
    return (1 - alpha ** (n_drafts + 1)) / (1 - alpha)


def per_position_tokens_per_step(conditional: list[float]) -> float:
    """E[tokens per step] from measured conditional rates c_j, one per position: 1 + sum_j c_0 ... c_j.
    Exact for any correlation, because c_j is already conditioned on the drafts before it being kept."""
    out = 1.0
    for run in itertools.accumulate(conditional, operator.mul):
        out += run  # left to right, as written (sum() of floats is compensated from Python 3.12)
    return out


def conditional_from_tokens_per_step(tps: float, n_drafts: int) -> float:
    """Invert expected_tokens_per_step: the i.i.d. alpha that gives `tps` tokens per step (100 halvings: to 1e-30).

    A one-number summary: with correlated verdicts no position need have this rate (see the module docstring)."""
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if expected_tokens_per_step(mid, n_drafts) < tps:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def predicted_speedup(tokens_per_step: float, cost_curve: dict[int, float], q: int, *,
                      draft_cost: float = 0.0, plain: bool = False) -> float:
    """Wall-clock speedup over autoregressive decoding predicted from measured pieces.

    tokens_per_step: measured tokens committed per step; cost_curve: {q: t(q)/t(1)} measured with a
    warm KV cache; q: tokens fed to the verify forward; draft_cost: the drafter's time per step in
    units of t(1); plain: add the predict forward (cost t(1)) to every step.
    AR makes 1 token per t(1), so speedup = tokens_per_step / (cost of a step in units of t(1)).
    """
    c = _interp(cost_curve, q)
    step = c + draft_cost + (1.0 if plain else 0.0)
    return tokens_per_step / step


def _interp(curve: dict[int, float], q: int) -> float:
    if q in curve:
        return curve[q]
    keys = sorted(curve)
    if q <= keys[0]:
        return curve[keys[0]]
    if q >= keys[-1]:
        return curve[keys[-1]] * q / keys[-1]
    lo = max(x for x in keys if x < q)
    hi = min(x for x in keys if x > q)
    return curve[lo] + (curve[hi] - curve[lo]) * (q - lo) / (hi - lo)


def sources_claim_latency_cut(k: int) -> float:
    """Seed article 000's claim ("MTP推理加速", the lab's first seed): predicting k tokens at once cuts decoding
    steps to 1/k, so, in theory, latency by 1 - 1/k. It cites no paper."""
    return 1 - 1 / k
