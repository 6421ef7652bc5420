"""One metric converter: the acceptance conventions that projects report, and how they relate.

n drafts per step; draft j (0-based) sits at depth j+2. Conventions:

* unconditional per position (vLLM's spec-decode metrics): a_j = P(draft j accepted)
  = steps whose draft j was accepted / steps that drafted;
* conditional per position: c_j = P(draft j accepted | drafts 0..j-1 accepted);
* mean accepted length: E[accepted drafts] = sum_j a_j without the bonus token, 1 + sum_j a_j with it;
* one number, accepted / drafted tokens: sum_j a_j / n.

With every step drafting the same n tokens, a_j = c_0 c_1 ... c_j and c_j = a_j / a_{j-1}. A `Trace`
whose last steps drafted fewer tokens (the end of the text) makes the product only approximately a_j;
`from_trace` therefore counts each convention from the steps themselves, and the mean accepted length
rebuilt from a_j is exact for any trace.
"""
from __future__ import annotations

import itertools
import math
import numbers
import operator
from dataclasses import dataclass
from mtplab.errors import MtplabError
from mtplab.measuring import theory
from mtplab.decoding.trace import Trace

KINDS = ("unconditional", "conditional")


@dataclass(frozen=True)
class Acceptance:
    """One measurement in every convention."""
    unconditional: list[float]   # a_j: P(draft j accepted), vLLM's per-position metric
    conditional: list[float]     # c_j: P(draft j accepted | drafts before it accepted)

    @property
    def mean_accepted(self) -> float:
        """Mean accepted drafts per step, without the bonus token: sum_j a_j."""
        return float(sum(self.unconditional))

    @property
    def mean_accepted_length(self) -> float:
        """Mean tokens committed per drafting step, with the bonus token: 1 + sum_j a_j (vLLM's)."""
        return 1.0 + self.mean_accepted

    @property
    def draft_acceptance_rate(self) -> float:
        """Accepted drafts / drafted tokens, sum_j a_j / n: the one-number rate (vLLM's
        num_accepted_tokens / num_draft_tokens when every step drafts n tokens)."""
        return self.mean_accepted / max(1, len(self.unconditional))


def _rates(rates) -> list[float]:
    try:
        out = [float(r) for r in rates]
    except (TypeError, ValueError):
        raise MtplabError(f"rates must be a list of numbers in [0, 1] (got {rates!r})") from None
    if not all(0.0 <= r <= 1.0 for r in out):  # also refuses NaN
        raise MtplabError(f"rates must lie in [0, 1] (got {out}); percentages? divide by 100")
    return out


def to_conditional(unconditional) -> list[float]:
    """c_j = a_j / a_{j-1} (a_{-1} = 1); NaN where a_{j-1} = 0 (no step reached draft j)."""
    a = _rates(unconditional)
    if any(later > earlier + 1e-12 for earlier, later in itertools.pairwise(a)):
        raise MtplabError(f"unconditional rates cannot rise with the position (got {a}); were these conditional? "
                          "pass kind='conditional'")
    prev = [1.0] + a[:-1]
    return [x / b if b > 0 else float("nan") for x, b in zip(a, prev)]


def to_unconditional(conditional) -> list[float]:
    """a_j = c_0 c_1 ... c_j."""
    return list(itertools.accumulate(_rates(conditional), operator.mul))


def convert(source, kind: str = "unconditional") -> Acceptance:
    """A `Trace`, or a list of per-position rates of the given kind, in every convention."""
    if isinstance(source, Trace):
        return from_trace(source)
    if isinstance(source, Acceptance):
        return source
    if kind not in KINDS:
        raise MtplabError(f"unknown kind {kind!r}; use one of {', '.join(KINDS)} (or pass a Trace)")
    if kind == "unconditional":
        a = _rates(source)
        return Acceptance(unconditional=a, conditional=to_conditional(a))
    c = _rates(source)
    return Acceptance(unconditional=to_unconditional(c), conditional=c)


def from_trace(trace: Trace) -> Acceptance:
    """Counted from the steps: unconditional as vLLM counts it, conditional over the steps that reached j."""
    return Acceptance(unconditional=list(trace.acceptance_rate_per_position),
                      conditional=list(trace.conditional_acceptance))


def alpha_from_length(length: float, n_drafts: int, *, bonus: bool = True) -> float:
    """The constant conditional rate alpha that gives this mean accepted length with n drafts a step:
    solves alpha + ... + alpha^n = length (- 1 with the bonus). Only the mean is known, so this is the
    one-parameter reading (Leviathan et al. 2023, eq. 1: (1 - alpha^(n+1)) / (1 - alpha)), which assumes i.i.d.
    verdicts; measured verdicts within a step are positively correlated, so no position need have this rate.
    The inverse is theory's one bisection (`conditional_from_tokens_per_step`)."""
    if isinstance(n_drafts, bool) or not isinstance(n_drafts, int) or n_drafts < 1:
        raise MtplabError(f"n_drafts must be an integer >= 1 (got {n_drafts!r})")
    if isinstance(length, bool) or not isinstance(length, numbers.Real):
        raise MtplabError(f"length must be a number: the mean accepted length a step (got {length!r})")
    target = float(length) - (1.0 if bonus else 0.0)
    if not 0.0 <= target <= n_drafts:
        lo, hi = (1, n_drafts + 1) if bonus else (0, n_drafts)
        raise MtplabError(f"a mean accepted length of {length} is impossible with {n_drafts} drafts "
                          f"({'with' if bonus else 'without'} the bonus it lies in [{lo}, {hi}])")
    return theory.conditional_from_tokens_per_step(target + 1.0, n_drafts)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for k successes in n trials ((nan, nan) when n = 0)."""
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return min(p, max(0.0, centre - half)), max(p, min(1.0, centre + half))  # always holds p, despite rounding
