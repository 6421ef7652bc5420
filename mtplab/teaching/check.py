"""Checkers for the exercises at the end of each notebook: a checker runs the student's function on several inputs,
compares it with fixed cases whose answers were computed once, or tests properties, and returns a `Check`; it never
calls the package function that answers the exercise, and never raises on the student's code.
"""
from __future__ import annotations

from dataclasses import dataclass
import torch


@dataclass
class Check:
    """The verdict of one checker. bool(check) is True when the answer is right."""
    name: str
    ok: bool
    why: str

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return f"{'right' if self.ok else 'not yet'} ({self.name}): {self.why}"

    __repr__ = __str__


def _call(fn, *args):
    """(value, None) or (None, 'TypeError: ...') when the student's function raises."""
    try:
        return fn(*args), None
    except Exception as e:  # noqa: BLE001 - any failure of student code is reported, not raised
        return None, f"{type(e).__name__}: {e}"


def _number(v) -> float | None:
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def number_from(fn, *args, case: str) -> tuple[float | None, str | None]:
    """(the student's number, None), or (None, why not) when fn raised or returned something else; `case` names
    the inputs in words, for the message ('on widths (3, 2, 1)')."""
    got, err = _call(fn, *args)
    if err:
        return None, f"your function raised {err} {case}"
    v = _number(got)
    if v is None:
        return None, f"return a number (got {got!r} {case})"
    return v, None


# ---------------------------------------------------------------------------------- checked by properties and cases
# These checkers hold no formula of their own: each tests properties that a right answer has on every case
# (limits, monotonicity, invariances) and a few fixed cases whose answers were computed once, so the package carries
# no reference solution for them. Every checker of the lab works so: it compares with fixed cases or properties,
# never with a function of the package that answers the exercise (tests/teaching/test_exercises.py checks it).
def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


def check_context_ratio(fn) -> Check:
    """Notebook 01, exercise 3: fn(weights_ms, attn_ms, q, context) -> t(q)/t(1) for a forward that reads the
    weights once (weights_ms, whatever q is) and spends attn_ms for every (new token, context token) pair. Checked
    by its limits: q = 1 gives 1; no attention gives 1; weights for free give q; it lies in [1, q]; with both
    parts it grows with the context; and by fixed cases (a wrong formula can have every limit right)."""
    name = "t(q)/t(1) against the context"
    grid = [(w, a, q, c) for w in (0.5, 3.0, 20.0) for a in (0.0, 0.001, 0.02) for q in (1, 2, 4, 8)
            for c in (16, 128, 1024)]
    got = {}
    for w, a, q, c in grid:
        case = f"on a case like weights_ms={w}, attn_ms={a}, q={q}, context={c}"
        v, why = number_from(fn, w, a, q, c, case=case)
        if why:
            return Check(name, False, why)
        if q == 1 and not _close(v, 1.0):
            return Check(name, False, f"{case}: one token is the unit, so t(1)/t(1) is 1 whatever the parts cost")
        if a == 0 and not _close(v, 1.0):
            return Check(name, False, f"{case}: without attention work a forward costs the weights' read alone, "
                                      "the same for 1 token as for q")
        if not 1 - 1e-9 <= v <= q + 1e-9:
            return Check(name, False, f"{case}: a forward over q tokens costs at least one over 1 token and at most q "
                                      "of them")
        got[(w, a, q, c)] = v
    for a in (0.001, 0.02):
        for q in (2, 8):
            v, why = number_from(fn, 0.0, a, q, 64, case=f"on a case like weights_ms=0, attn_ms={a}, q={q}")
            if why:
                return Check(name, False, why)
            if not _close(v, q):
                return Check(name, False, f"on a case like weights_ms=0, attn_ms={a}, q={q}, context=64: with the "
                                          "weights free, every token costs the same attention work")
            for w in (0.5, 3.0, 20.0):
                row = [got[(w, a, q, c)] for c in (16, 128, 1024)]
                if not row[0] < row[1] < row[2]:
                    return Check(name, False, f"on a case like weights_ms={w}, attn_ms={a}, q={q}: the longer the "
                                              "context, the larger attention's share of a forward, and only that "
                                              "share grows with q")
    for (w, a, q, c), want in _CONTEXT_CASES.items():
        case = f"on a case like weights_ms={w}, attn_ms={a}, q={q}, context={c}"
        v, why = number_from(fn, w, a, q, c, case=case)
        if why:
            return Check(name, False, why)
        if not abs(v - want) <= 1e-6 * want:
            return Check(name, False, f"{case}: every limit holds, but not the sizes in between: the weights are read "
                                      "once per forward, and attention costs attn_ms for each (new token, context "
                                      "token) pair")
    return Check(name, True, "the weights are read once per forward and attention grows with q x context, so a "
                             "longer context moves t(q)/t(1) towards q")


# (weights_ms, attn_ms, q, context) -> t(q)/t(1), computed once
_CONTEXT_CASES = {(3.0, 0.001, 4, 256): 1.2358722358722358, (0.5, 0.02, 8, 64): 6.033707865168539,
                  (20.0, 0.003, 2, 1000): 1.1304347826086956, (1.0, 0.0005, 16, 512): 4.057324840764331}


def check_best_k(fn) -> Check:
    """Notebook 09, exercise: fn(alpha, cost_curve, draft_cost, ks) -> the k in ks with the largest predicted
    speedup, for a step of k tokens (k - 1 drafts, each kept with probability alpha given the ones before it), a
    verify that costs cost_curve[k] one-token forwards and draft_cost per draft. Checked by properties: an answer
    from ks; nothing kept -> the shortest step; every draft kept and everything free -> the longest; a verify that
    costs k forwards -> the shortest; the answer never shrinks as alpha grows; scaling every cost together or
    shuffling ks changes nothing."""
    name = "the best k"
    ks = [1, 2, 3, 4, 6, 8]
    flat = {k: 1.0 for k in ks}
    memory_bound = {k: 1 + 0.04 * (k - 1) for k in ks}
    compute_bound = {k: float(k) for k in ks}

    def ask(alpha, curve, draft, order=ks):
        case = f"on a case like alpha={alpha}, cost_curve={ {k: round(v, 3) for k, v in curve.items()} }, " \
               f"draft_cost={draft}, ks={list(order)}"
        v, err = _call(fn, alpha, dict(curve), draft, list(order))
        if err:
            return None, f"your function raised {err} {case}"
        if isinstance(v, bool) or not isinstance(v, int) or v not in order:
            return None, f"return one of the k in ks (got {v!r} {case})"
        return v, case

    checks = [((0.0, memory_bound, 0.05), lambda k: k == 1, "nothing is ever kept, so every extra draft only costs"),
              ((0.999, flat, 0.0), lambda k: k == 8, "drafts are almost always kept and cost nothing: the longest "
                                                      "step commits the most"),
              ((0.8, compute_bound, 0.0), lambda k: k == 1, "a verify of k tokens costs k forwards here, and a step "
                                                             "commits fewer than k tokens on average"),
              ((0.9, flat, 1.5), lambda k: k == 1, "each draft costs more here than the token it can add"),
              ((0.5, {k: 1 + 0.3 * (k - 1) for k in ks}, 0.0), lambda k: k == 2,
               "a draft counts only when every draft before it was kept, so each further draft adds less than the "
               "one before, while each adds the same verify cost")]
    for args, ok, why in checks:
        k, case = ask(*args)
        if k is None:
            return Check(name, False, case)
        if not ok(k):
            return Check(name, False, f"{case} you gave k={k}: {why}")
    last = None
    for alpha in (0.1, 0.3, 0.5, 0.7, 0.85, 0.95):
        k, case = ask(alpha, memory_bound, 0.05)
        if k is None:
            return Check(name, False, case)
        if last is not None and k < last[1]:
            return Check(name, False, f"the best k fell from {last[1]} to {k} as alpha rose from {last[0]} to {alpha} "
                                      f"({case}): likelier drafts never make shorter steps pay more")
        last = (alpha, k)
        k2, case2 = ask(alpha, {q: 3 * v for q, v in memory_bound.items()}, 0.15, order=list(reversed(ks)))
        if k2 is None:
            return Check(name, False, case2)
        if k2 != k:
            return Check(name, False, f"{case2} gave k={k2} but k={k} with every cost a third and ks in order: a "
                                      "speedup is a ratio, so scaling every cost together changes nothing")
    return Check(name, True, "the predicted speedup is tokens per step over the step's cost; its maximum moves with "
                             "alpha and the cost curve")
