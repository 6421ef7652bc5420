"""Checkers for notebook 05 (the acceptance lab). The contract of `mtplab.teaching.check`: a checker runs the
student's function on several inputs, compares it with mtplab's own answer and returns a `Check`; it never
raises because of the student's code.

    check_conditional_acceptance(fn)   fn(steps) -> P(draft i accepted | drafts 1..i-1 accepted), per i
    check_sampled_verdict(fn)          fn(p_d, q_d, u) -> was the sampled draft kept?
    check_step_speedup(fn)             fn(tokens_per_step, split, ar_step_s) -> wall-clock speedup over AR
"""
from __future__ import annotations

import math
import random
from mtplab.teaching.check import Check, _call, _number
from mtplab.decoding.trace import Step, Trace


def _trace(pairs: list[tuple[int, int]]) -> Trace:
    steps = [Step(drafted=[0] * n, accepted=a, emitted=[0] * (a + 1), bonus=0,
                  bonus_source="target" if a == n else "correction", forwards=1) for n, a in pairs]
    return Trace(method="exercise", prompt=[0], steps=steps, k=4)


_STEP_CASES = [
    [(3, 3), (3, 1), (3, 0), (3, 2)],
    [(3, 0), (3, 0)],
    [(2, 2), (2, 2), (2, 1)],
    [(3, 3), (1, 1), (3, 0)],  # a short step (the end of the decode) proposes fewer drafts
    [(0, 0), (3, 1)],          # the prefill proposes nothing
]


def check_conditional_acceptance(fn) -> Check:
    """fn(steps) -> list: steps is a list of (n_drafted, n_accepted); entry i (0-based) is the fraction of
    the steps that reached draft i+1 (proposed it, and accepted every draft before it) that accepted it too;
    NaN where no step reached it."""
    name = "conditional acceptance"
    for pairs in _STEP_CASES:
        want = _trace(pairs).conditional_acceptance
        got, err = _call(fn, list(pairs))
        if err:
            return Check(name, False, f"fn({pairs}) raised {err}")
        try:
            got = [float(g) for g in got]
        except Exception:  # noqa: BLE001 - any shape of wrong answer is reported
            return Check(name, False, f"fn({pairs}) returned {got!r}; return a list of numbers")
        same = len(got) == len(want) and all((math.isnan(g) and math.isnan(w)) or abs(g - w) < 1e-9
                                             for g, w in zip(got, want))
        if not same:
            n = len(pairs)
            uncond = [sum(1 for _, a in pairs if a > i) / n for i in range(len(want))]
            hint = ""
            if len(got) == len(uncond) and all(abs(g - u) < 1e-9 for g, u in zip(got, uncond)):
                hint = (" You divided by every step: that is the unconditional rate. Divide by the steps that "
                        "reached draft i, whose earlier drafts were all accepted.")
            return Check(name, False, f"wrong on a case like steps {pairs}, where you gave {got}.{hint}")
    return Check(name, True, "accepted at i / reached i, as Trace.conditional_acceptance counts it")


def check_sampled_verdict(fn, n: int = 200, seed: int = 0) -> Check:
    """fn(p_d, q_d, u) -> True when speculative sampling keeps a draft d with target probability p_d,
    drafter probability q_d and uniform draw u (Leviathan et al. 2023, sec. 2.3)."""
    name = "sampled verdict"
    rng = random.Random(seed)
    cases = [(0.5, 0.25, 0.9), (0.2, 0.8, 0.1), (0.2, 0.8, 0.3), (0.0, 0.5, 0.0)]
    cases += [(rng.random(), rng.random() * 0.99 + 0.01, rng.random()) for _ in range(n)]
    for p, q, u in cases:
        want = u < min(1.0, p / q)
        got, err = _call(fn, p, q, u)
        if err:
            return Check(name, False, f"fn({p:.3f}, {q:.3f}, {u:.3f}) raised {err}")
        if not isinstance(got, (bool, int)) and not hasattr(got, "__bool__") or got is None:
            return Check(name, False, f"fn({p:.3f}, {q:.3f}, {u:.3f}) returned {got!r}; return True (kept) or False")
        if bool(got) != want:
            hint = " Compare u with p/q, not with p alone: q is how eager the drafter was." if (u < p) == bool(got) else ""
            return Check(name, False, f"wrong on a case like p(d)={p:.3f}, q(d)={q:.3f}, u={u:.3f}, where you said "
                                      f"{'kept' if got else 'rejected'}.{hint}")
    return Check(name, True, "keep when u < min(1, p(d)/q(d)): a draft the drafter over-proposes is thinned "
                             "to exactly the target's probability")


def check_step_speedup(fn) -> Check:
    """fn(tokens_per_step, split, ar_step_s) -> speedup over AR. split is Trace.time_split() (seconds per step
    in target_s, draft_s, overhead_s); an AR step takes ar_step_s and commits one token."""
    name = "speedup from the time split"
    cases = [(2.0, dict(target_s=0.010, draft_s=0.002, overhead_s=0.001), 0.008),
             (3.1, dict(target_s=0.012, draft_s=0.010, overhead_s=0.004), 0.009),
             (1.0, dict(target_s=0.008, draft_s=0.0, overhead_s=0.0), 0.008)]
    for tps, split, ar in cases:
        step = split["target_s"] + split["draft_s"] + split["overhead_s"]
        want = tps * ar / step
        got, err = _call(fn, tps, dict(split), ar)
        if err:
            return Check(name, False, f"fn({tps}, {split}, {ar}) raised {err}")
        g = _number(got)
        if g is None or not math.isclose(g, want, rel_tol=1e-6):
            hint = ""
            if g is not None and math.isclose(g, tps * ar / split["target_s"], rel_tol=1e-6):
                hint = " You left out the drafter and the overhead: the step takes all three."
            return Check(name, False, f"wrong on a case like tokens/step {tps}, split {split}, AR step {ar}, "
                                      f"where you gave {got!r}.{hint}")
    return Check(name, True, "speedup = tokens per step x AR time per token / time per step (target + drafter + "
                             "overhead)")
