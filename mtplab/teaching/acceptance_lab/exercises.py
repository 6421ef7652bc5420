"""Checkers for notebook 05 (the acceptance lab). The contract of `mtplab.teaching.check`: a checker runs the
student's function on several inputs, compares it with fixed cases whose answers were computed once (never with a
function of the package, so no answer is one call away) and returns a `Check`; it never raises because of the
student's code.

    check_conditional_acceptance(fn)   fn(steps) -> P(draft i accepted | drafts 1..i-1 accepted), per i
    check_sampled_verdict(fn)          fn(p_d, q_d, u) -> was the sampled draft kept?
    check_step_speedup(fn)             fn(tokens_per_step, split, ar_step_s) -> wall-clock speedup over AR
"""
from __future__ import annotations

import math
from mtplab.teaching.check import Check, _call, _number

NAN = float("nan")
# steps [(n_drafted, n_accepted), ...] -> the conditional rate per draft position, counted by hand
_STEP_CASES = [
    ([(3, 3), (3, 1), (3, 0), (3, 2)], [3 / 4, 2 / 3, 1 / 2]),
    ([(3, 0), (3, 0)], [0.0, NAN, NAN]),
    ([(2, 2), (2, 2), (2, 1)], [1.0, 2 / 3]),
    ([(3, 3), (1, 1), (3, 0)], [2 / 3, 1.0, 1.0]),  # a short step (the end of the decode) proposes fewer drafts
    ([(0, 0), (3, 1)], [1.0, 0.0, NAN]),           # the prefill proposes nothing
]


def check_conditional_acceptance(fn) -> Check:
    """fn(steps) -> list: steps is a list of (n_drafted, n_accepted); entry i (0-based) is the fraction of
    the steps that reached draft i+1 (proposed it, and accepted every draft before it) that accepted it too;
    NaN where no step reached it."""
    name = "conditional acceptance"
    for pairs, want in _STEP_CASES:
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
    return Check(name, True, "of the steps that reached draft i, the share that kept it")


# (p(d), q(d), u) -> kept, decided once by hand from the rule of Leviathan et al. 2023, sec. 2.3
_VERDICT_CASES = [
    (0.5, 0.25, 0.9, True), (0.2, 0.8, 0.1, True), (0.2, 0.8, 0.3, False), (0.0, 0.5, 0.0, False),
    (0.62, 0.75, 0.8, True), (0.94, 0.75, 0.92, True), (0.03, 0.48, 0.94, False), (0.65, 0.9, 0.11, True),
    (0.47, 0.26, 0.54, True), (0.57, 0.03, 0.22, True), (0.28, 0.92, 0.77, False), (0.16, 0.8, 0.14, True),
    (0.62, 0.14, 0.0, True), (0.87, 0.23, 0.22, True), (0.98, 0.87, 0.29, True), (0.96, 0.55, 0.68, True),
    (0.2, 0.94, 0.69, False), (0.97, 0.9, 0.3, True), (0.36, 0.18, 0.15, True), (0.07, 0.32, 0.6, False),
    (0.0, 0.68, 0.34, False), (0.31, 0.82, 0.48, False), (0.32, 0.49, 0.7, False), (0.06, 0.98, 0.02, True),
    (0.75, 0.85, 0.02, True), (0.79, 0.38, 0.58, True), (0.01, 0.07, 0.18, False), (0.96, 0.21, 0.76, True),
    (0.93, 0.94, 0.34, True), (0.35, 0.53, 0.78, False), (0.11, 0.75, 0.8, False), (0.86, 0.06, 0.95, True),
    (0.3, 0.6, 0.45, True), (0.3, 0.6, 0.55, False), (0.1, 0.4, 0.2, True), (0.1, 0.4, 0.3, False),
]


def check_sampled_verdict(fn) -> Check:
    """fn(p_d, q_d, u) -> True when speculative sampling keeps a draft d with target probability p_d,
    drafter probability q_d and uniform draw u (Leviathan et al. 2023, sec. 2.3)."""
    name = "sampled verdict"
    for p, q, u, want in _VERDICT_CASES:
        got, err = _call(fn, p, q, u)
        if err:
            return Check(name, False, f"fn({p:.3f}, {q:.3f}, {u:.3f}) raised {err}")
        if not isinstance(got, (bool, int)) and not hasattr(got, "__bool__") or got is None:
            return Check(name, False, f"fn({p:.3f}, {q:.3f}, {u:.3f}) returned {got!r}; return True (kept) or False")
        if bool(got) != want:
            hint = " Compare u with p/q, not with p alone: q is how eager the drafter was." if (u < p) == bool(got) else ""
            return Check(name, False, f"wrong on a case like p(d)={p:.3f}, q(d)={q:.3f}, u={u:.3f}, where you said "
                                      f"{'kept' if got else 'rejected'}.{hint}")
    return Check(name, True, "a draft the drafter over-proposes is thinned to exactly the target's probability")


# (tokens per step, the split in seconds, AR step in seconds) -> the speedup, computed once
_SPLIT_CASES = [(2.0, dict(target_s=0.010, draft_s=0.002, overhead_s=0.001), 0.008, 1.2307692307692308),
                (3.1, dict(target_s=0.012, draft_s=0.010, overhead_s=0.004), 0.009, 1.073076923076923),
                (1.0, dict(target_s=0.008, draft_s=0.0, overhead_s=0.0), 0.008, 1.0)]


def check_step_speedup(fn) -> Check:
    """fn(tokens_per_step, split, ar_step_s) -> speedup over AR. split is Trace.time_split() (seconds per step
    in target_s, draft_s, overhead_s); an AR step takes ar_step_s and commits one token."""
    name = "speedup from the time split"
    for tps, split, ar, want in _SPLIT_CASES:
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
    return Check(name, True, "a step's tokens against what the step costs in AR steps, drafter and overhead "
                             "included")
