"""Checkers for the exercises at the end of each notebook.

A student writes a function (or a number); a checker runs it on several inputs, compares it with
mtplab's own implementation and returns a `Check`: right or not yet, and why. A checker never
raises because of the student's code: an exception becomes the `why`.

    check_plain_steps(my_fn)        # notebook 02
    Check(ok=False, ...) displays as: "not yet (plain schedule forwards): for m=7, k=4 ..."
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import theory
from .decoding import accept
from .losses import multi_token_loss


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


# ---------------------------------------------------------------------------------- notebook 01
def check_speedup(fn) -> Check:
    """fn(tokens_per_step, cost_curve, q) -> predicted wall-clock speedup over autoregressive decoding.

    cost_curve is {q: t(q)/t(1)}; a step feeds q tokens to one forward and commits tokens_per_step tokens.
    """
    name = "predicted speedup"
    curves = [{1: 1.0, 2: 1.05, 4: 1.2, 8: 1.7}, {1: 1.0, 2: 1.6, 4: 2.9, 8: 5.5}, {1: 1.0, 4: 1.0, 8: 1.0}]
    cases = [(3.2, curves[0], 4), (1.8, curves[0], 2), (3.2, curves[1], 4), (4.0, curves[2], 4), (6.5, curves[0], 8)]
    for tps, curve, q in cases:
        want = theory.predicted_speedup(tps, curve, q)
        got, err = _call(fn, tps, dict(curve), q)
        if err:
            return Check(name, False, f"fn({tps}, {curve}, {q}) raised {err}")
        g = _number(got)
        if g is None:
            return Check(name, False, f"fn({tps}, {curve}, {q}) returned {got!r}; return a number")
        if not math.isclose(g, want, rel_tol=1e-6):
            hint = ""
            if math.isclose(g, tps, rel_tol=1e-6):
                hint = (" That is the step count alone (the sources' view); a step's forward over q tokens "
                        f"costs t(q)/t(1) = {curve[q]} forwards of one token, not 1.")
            elif math.isclose(g, tps * curve[q], rel_tol=1e-6):
                hint = " You multiplied by the cost of the step; divide: tokens per unit of time."
            return Check(name, False, f"fn({tps}, {curve}, q={q}) gave {g:.4g}, expected {want:.4g}.{hint}")
    return Check(name, True, "tokens per step divided by the step's cost in units of t(1), as "
                             "theory.predicted_speedup computes it")


def check_latency_cut(fn) -> Check:
    """fn(speedup) -> the fraction of decoding latency removed by that speedup (0.75 for 4x)."""
    name = "latency cut from a speedup"
    for s in (4.0, 2.0, 1.25, 1.0, 10.0):
        got, err = _call(fn, s)
        if err:
            return Check(name, False, f"fn({s}) raised {err}")
        g = _number(got)
        want = 1 - 1 / s
        if g is None:
            return Check(name, False, f"fn({s}) returned {got!r}; return a fraction such as 0.75")
        if not math.isclose(g, want, abs_tol=1e-9):
            hint = ""
            if math.isclose(g, s - 1, abs_tol=1e-9):
                hint = " That is 'how much faster' (s - 1), not how much of the time is gone."
            elif math.isclose(g, 1 / s, abs_tol=1e-9):
                hint = " That is the latency that remains, not the part removed."
            return Check(name, False, f"fn({s}) gave {g:.4g}, expected {want:.4g}.{hint}")
    k4 = theory.sources_claim_latency_cut(4)
    return Check(name, True, f"a speedup s removes 1 - 1/s of the latency; the sources' 4x gives {k4:.0%}")


# ---------------------------------------------------------------------------------- notebook 02
_COUNT_CASES = [(12, 4), (8, 2), (7, 4), (9, 4), (13, 3), (1, 3), (10, 1), (25, 5), (6, 6), (2, 5)]


def _check_counts(fn, name, exact, best_case, why_ok, hints):
    for m, k in _COUNT_CASES:
        want = exact(m, k)
        got, err = _call(fn, m, k)
        if err:
            return Check(name, False, f"fn(m={m}, k={k}) raised {err}")
        g = _number(got)
        if g is None:
            return Check(name, False, f"fn(m={m}, k={k}) returned {got!r}; return a whole number of forwards")
        if g != want:
            hint = ""
            if g != int(g):
                hint = (" Forwards are whole numbers. Stern's formula is a best case that is exact only when "
                        "k divides m; a last, partial block still costs forwards.")
            elif math.isclose(g, best_case(m, k)):
                hint = " That is Stern's formula, exact only when k divides m."
            for test, text in hints:
                if test(m, k, g):
                    hint += " " + text
            return Check(name, False, f"for m={m}, k={k} you gave {got!r}, mtplab counts {want}.{hint}")
    return Check(name, True, why_ok)


def check_plain_steps(fn) -> Check:
    """fn(m, k) -> target forwards of the plain (predict, verify) schedule when every draft is kept."""
    return _check_counts(
        fn, "plain schedule forwards", theory.plain_forwards, theory.stern_plain_steps,
        "every block of k tokens costs a predict and a verify forward; a last block of one token needs only "
        "its predict (theory.plain_forwards)",
        [(lambda m, k, g: g == 2 * math.ceil(m / k) and m % k == 1,
          "A last block holding a single token has no drafts left to verify: only its predict forward runs."),
         (lambda m, k, g: k == 1 and g == 2 * m, "With k = 1 there are no drafts, so nothing to verify.")])


def check_overlap_steps(fn) -> Check:
    """fn(m, k) -> target forwards of the overlapped schedule when every draft is kept."""
    return _check_counts(
        fn, "overlapped schedule forwards", theory.overlap_forwards, theory.stern_overlap_steps,
        "the first forward gives one token; each later forward verifies k-1 drafts and adds one token: "
        "1 + ceil((m-1)/k) (theory.overlap_forwards)",
        [(lambda m, k, g: g == math.ceil(m / k), "Count the first forward too (the prefill that predicts the "
                                                 "first token and the first drafts).")])


def check_accepted_prefix(fn) -> Check:
    """fn(drafts, target) -> how many drafts greedy verification keeps.

    target[i] is the target model's own greedy token at the position of drafts[i].
    """
    name = "greedy accepted prefix"
    cases = [([5, 6, 7], [5, 6, 7]), ([5, 6, 7], [9, 6, 7]), ([5, 6, 7], [5, 9, 7]), ([1, 2, 3, 4], [1, 2, 3, 9]),
             ([], []), ([4], [4]), ([8, 8, 8], [8, 3, 8])]
    for drafts, target in cases:
        p = torch.nn.functional.one_hot(torch.tensor(target + [0], dtype=torch.long), 16).float()
        want, _, _ = accept(drafts, p, None, greedy=True, generator=None)
        got, err = _call(fn, list(drafts), list(target))
        if err:
            return Check(name, False, f"fn({drafts}, {target}) raised {err}")
        if _number(got) != want:
            hint = ""
            if _number(got) == sum(a == b for a, b in zip(drafts, target)):
                hint = (" You counted every match; only the prefix before the first mismatch survives, because "
                        "every later draft was conditioned on the wrong token.")
            return Check(name, False, f"drafts {drafts}, target {target}: you kept {got!r}, mtplab keeps {want}.{hint}")
    return Check(name, True, "the longest prefix of the drafts that the target would also have chosen "
                             "(decoding.accept, greedy)")


# ---------------------------------------------------------------------------------- notebook 03
def check_shift(fn) -> Check:
    """fn(logits, x, K) -> the multi-token loss.

    logits: (B, T, K, V), head k at position i; x: (B, T+1) a window of token ids. Head k (0-based)
    must be scored against the token k+1 positions ahead, the mean over heads of each head's mean
    cross-entropy (the sources' MultiTokenLoss, `losses.multi_token_loss`).
    """
    name = "multi-token loss shift"
    g = torch.Generator().manual_seed(0)
    for B, T, K, V in ((2, 9, 3, 11), (1, 6, 4, 7), (3, 12, 2, 5)):
        logits = 3 * torch.randn(B, T, K, V, generator=g)
        x = torch.randint(V, (B, T + 1), generator=g)
        want = float(multi_token_loss(logits.reshape(B, T, K * V), x[:, 1:], K))
        got, err = _call(fn, logits.clone(), x.clone(), K)
        if err:
            return Check(name, False, f"on logits {tuple(logits.shape)}, x {tuple(x.shape)} your function raised {err}")
        gv = _number(got)
        if gv is None:
            return Check(name, False, f"your function returned {type(got).__name__}; return a scalar loss")
        if not math.isclose(gv, want, rel_tol=1e-4, abs_tol=1e-5):
            copy = float(multi_token_loss(logits.reshape(B, T, K * V), x[:, :-1], K))
            hint = ""
            if math.isclose(gv, copy, rel_tol=1e-4):
                hint = (" You scored head k against x[i+k]: the inputs themselves. Head 0 would learn to copy "
                        "the token it reads; targets must be the next-token shift x[i+1+k].")
            return Check(name, False, f"for B={B}, T={T}, K={K}, V={V} you gave {gv:.5f}, expected {want:.5f}.{hint}")
    return Check(name, True, "head k at position i is scored against x[i+k+1], and the last k positions, whose "
                             "target lies past the window, are dropped")


def check_expected_tokens(fn) -> Check:
    """fn(alpha, n_drafts) -> expected tokens per step: the accepted prefix plus the target's token,
    when each draft is kept with probability alpha given the ones before it were."""
    name = "expected tokens per step"
    for alpha, n in ((0.8, 3), (0.5, 1), (0.0, 4), (0.9, 6), (1.0, 3), (0.3, 0)):
        want = theory.expected_tokens_per_step(alpha, n)
        got, err = _call(fn, alpha, n)
        if err:
            return Check(name, False, f"fn(alpha={alpha}, n_drafts={n}) raised {err}"
                         + (" (alpha = 1 needs its own case)" if alpha == 1 else ""))
        gv = _number(got)
        if gv is None or not math.isclose(gv, want, rel_tol=1e-6, abs_tol=1e-9):
            hint = ""
            if gv is not None and math.isclose(gv, 1 + alpha * n, rel_tol=1e-6):
                hint = (" That treats drafts as independent; draft i counts only if drafts 0..i-1 were all kept, "
                        "so it adds alpha^(i+1).")
            elif gv is not None and math.isclose(gv, want - 1, rel_tol=1e-6, abs_tol=1e-9):
                hint = " Add the token the target itself contributes every step (bonus or correction)."
            return Check(name, False, f"fn(alpha={alpha}, n_drafts={n}) gave {got!r}, expected {want:.4f}.{hint}")
    return Check(name, True, "1 + alpha + ... + alpha^n = (1 - alpha^(n+1)) / (1 - alpha), "
                             "theory.expected_tokens_per_step")


# ---------------------------------------------------------------------------------- notebook 04
def check_deepseek_labels(fn) -> Check:
    """fn(T, k) -> (reads, labels): the 1-based token numbers depth k reads and is scored against,
    position by position, for a training sequence t_1..t_{T+1}. k = 0 is the main model
    (reads t_i); k >= 1 is MTP module k (reads Emb(t_{i+k}) beside the depth k-1 hidden state)."""
    from .lab import label_layout

    name = "DeepSeek label layout"
    for T, k in ((10, 0), (10, 1), (10, 2), (7, 3), (5, 1)):
        row = label_layout(T, max(k, 1))[k]
        want = ([row["reads"][i] for i in sorted(row["reads"])], [row["labels"][i] for i in sorted(row["labels"])])
        got, err = _call(fn, T, k)
        if err:
            return Check(name, False, f"fn(T={T}, k={k}) raised {err}")
        try:
            got = (list(int(t) for t in got[0]), list(int(t) for t in got[1]))
        except (TypeError, ValueError, IndexError):
            return Check(name, False, f"fn(T={T}, k={k}) returned {got!r}; return two lists of token numbers")
        if got != want:
            hint = ""
            if got[1] and want[1] and got[1][0] == want[1][0] - 1:
                hint = " Your labels start one token early: depth k at position i predicts t_(i+k+1)."
            elif got[1] and want[1] and got[1][-1] != want[1][-1]:
                hint = f" The last label is t_{T + 1}: eq. (24) scores labels t_(2+k)..t_(T+1)."
            if len(got[0]) != len(want[0]):
                hint += f" Module {k} has T-k = {T - k} positions: it needs t_(i+k) to exist."
            return Check(name, False, f"T={T}, k={k}: you gave reads {got[0]}, labels {got[1]}; "
                                      f"expected reads {want[0]}, labels {want[1]}.{hint}")
    return Check(name, True, "depth k at position i = 1..T-k reads t_(i+k) and is scored against t_(i+k+1): "
                             "labels t_(2+k)..t_(T+1), eq. (24)")


def check_deepseek_forwards(fn) -> Check:
    """fn(m, D) -> target forwards of self-speculative decoding with D modules when every draft is kept."""
    name = "DeepSeek self-speculation forwards"
    for m, D in ((12, 1), (12, 3), (9, 2), (1, 1), (20, 3), (7, 1)):
        want = theory.deepseek_forwards(m, D)
        got, err = _call(fn, m, D)
        if err:
            return Check(name, False, f"fn(m={m}, D={D}) raised {err}")
        if _number(got) != want:
            hint = ""
            if _number(got) == theory.overlap_forwards(m, D):
                hint = " D modules give D drafts, so a step commits D+1 tokens (k = D+1 tokens per step)."
            return Check(name, False, f"fn(m={m}, D={D}) gave {got!r}, mtplab counts {want}.{hint}")
    return Check(name, True, "D drafts a step make blocks of D+1 tokens on the overlapped schedule: "
                             "1 + ceil((m-1)/(D+1)) (theory.deepseek_forwards)")


# ---------------------------------------------------------------------------------- notebook 06
def _pairs():
    g = torch.Generator().manual_seed(3)
    out = []
    for V, temp in ((6, 1.0), (5, 0.5), (8, 2.0)):
        p = torch.softmax(torch.randn(V, generator=g) / temp, -1)
        q = torch.softmax(torch.randn(V, generator=g) / temp, -1)
        out.append((p, q))
    return out


def check_acceptance_rate(fn) -> Check:
    """fn(p, q) -> the probability that a draft d ~ q survives the sampling rule min(1, p(d)/q(d))."""
    name = "sampling acceptance rate"
    pairs = _pairs()
    pairs.append((pairs[0][0], pairs[0][0]))
    for p, q in pairs:
        want = float((q * torch.clamp(p / q, max=1.0)).sum())
        got, err = _call(fn, p.clone(), q.clone())
        if err:
            return Check(name, False, f"your function raised {err}")
        gv = _number(got)
        if gv is None or not math.isclose(gv, want, abs_tol=1e-6):
            hint = ""
            if gv is not None and gv in (0.0, 1.0):
                hint = " That is greedy acceptance (argmax equal or not); sampling keeps a draft with a probability."
            elif gv is not None and math.isclose(gv, float((p * q).sum()), abs_tol=1e-6):
                hint = " sum p*q is the chance that two independent samples agree; the rule does better."
            return Check(name, False, f"for V={len(p)} you gave {got!r}, expected {want:.4f}.{hint}")
    return Check(name, True, "sum_d q(d) min(1, p(d)/q(d)) = sum_v min(p(v), q(v)) = 1 - TV(p, q)")


def check_accept_rule(fn, n: int = 2000, seed: int = 0) -> Check:
    """fn(p, q, d, generator) -> (kept, token): decide one draft d ~ q against the target p.

    kept: whether d survives; token: the token emitted at this position (d when kept, otherwise a
    replacement). Checked by sampling: emitted tokens must follow p (chi-square), and drafts must be
    kept as often as the rule allows, sum_v min(p(v), q(v)).
    """
    from .lab import chi_square

    name = "speculative sampling rule"
    g = torch.Generator().manual_seed(seed)
    for p, q in _pairs():
        V = len(p)
        counts = torch.zeros(V)
        kept = 0
        for _ in range(n):
            d = int(torch.multinomial(q, 1, generator=g))
            got, err = _call(fn, p.clone(), q.clone(), d, g)
            if err:
                return Check(name, False, f"your function raised {err}")
            try:
                ok, tok = bool(got[0]), int(got[1])
            except (TypeError, ValueError, IndexError):
                return Check(name, False, f"your function returned {got!r}; return (kept, token)")
            if not 0 <= tok < V:
                return Check(name, False, f"token {tok} is outside the vocabulary 0..{V - 1}")
            if ok and tok != d:
                return Check(name, False, f"you reported the draft {d} as kept but emitted {tok}")
            counts[tok] += 1
            kept += ok
        rate, best = kept / n, float(torch.minimum(p, q).sum())
        test = chi_square(counts, p)
        if test["pvalue"] < 1e-3:
            qtest = chi_square(counts, q)
            hint = ""
            if qtest["pvalue"] > 1e-3:
                hint = " Your tokens follow the draft distribution q: rejected drafts must be replaced."
            elif abs(rate - best) < 4 * math.sqrt(best * (1 - best) / n) + 1e-9:
                hint = (" You keep drafts at the right rate, so the replacement is off: draw it from "
                        "norm(max(0, p - q)), not from p.")
            return Check(name, False, f"over {n} draws (V={V}) the emitted tokens do not follow p "
                                      f"(chi-square p-value {test['pvalue']:.1e}).{hint}")
        if abs(rate - best) > 4 * math.sqrt(best * (1 - best) / n) + 1e-9:
            return Check(name, False, f"the emitted tokens follow p, but you kept {rate:.1%} of drafts where "
                                      f"min(1, p/q) keeps {best:.1%}: lossless, yet it wastes drafts.")
    return Check(name, True, "keep d with probability min(1, p(d)/q(d)), else draw from norm(max(0, p - q)): the "
                             "emitted tokens follow p, and drafts are kept at the rate sum min(p, q)")
