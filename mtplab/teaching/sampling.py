"""Notebook 06, speculative sampling: exact counts of what the accept rule emits, chi-square against the target p,
the second token's marginal, acceptance by rule; and the checkers of its exercises.
"""
from __future__ import annotations

import math
import torch
from mtplab.decoding.accept import accept, distribution
from mtplab.decoding.loop import speculative
from mtplab.teaching.check import Check, _call, _number
from mtplab.measuring.acceptance import wilson
from mtplab.teaching.blockwise import loop_split
from mtplab.teaching.words import rate_text


# ---------------------------------------------------------------------------------- notebook 06
# Three fixed (p, q) pairs (V = 6, 5, 8) and, for each, the rate at which the rule keeps a draft d ~ q, computed
# once: the checkers compare with these numbers, never with a function of the package.
_PAIRS = [([0.351, 0.187, 0.172, 0.085, 0.165, 0.04], [0.115, 0.226, 0.02, 0.218, 0.138, 0.283], 0.585),
          ([0.015, 0.158, 0.2, 0.074, 0.553], [0.574, 0.302, 0.081, 0.029, 0.014], 0.297),
          ([0.192, 0.149, 0.109, 0.143, 0.073, 0.173, 0.064, 0.097],
           [0.097, 0.079, 0.112, 0.09, 0.175, 0.186, 0.111, 0.15], 0.782)]


def _pairs() -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    return [(torch.tensor(p), torch.tensor(q), rate) for p, q, rate in _PAIRS]


def check_acceptance_rate(fn) -> Check:
    """fn(p, q) -> the probability that a draft d ~ q survives the sampling rule min(1, p(d)/q(d))."""
    name = "sampling acceptance rate"
    pairs = _pairs()
    pairs.append((pairs[0][0], pairs[0][0], 1.0))  # a drafter equal to the target: every draft survives
    for p, q, want in pairs:
        got, err = _call(fn, p.clone(), q.clone())
        if err:
            return Check(name, False, f"your function raised {err}")
        gv = _number(got)
        if gv is None or not math.isclose(gv, want, abs_tol=1e-5):
            hint = ""
            if gv is not None and gv in (0.0, 1.0):
                hint = " That is greedy acceptance (argmax equal or not); sampling keeps a draft with a probability."
            elif gv is not None and math.isclose(gv, float((p * q).sum()), abs_tol=1e-6):
                hint = " sum p*q is the chance that two independent samples agree; the rule does better."
            return Check(name, False, f"wrong on a case like V={len(p)} (you gave {got!r}).{hint}")
    return Check(name, True, "the chance of a draft, weighted by the chance that the rule keeps it, summed over the "
                             "vocabulary: the overlap of the two distributions")


def check_accept_rule(fn, n: int = 2000, seed: int = 0) -> Check:
    """fn(p, q, d, generator) -> (kept, token): decide one draft d ~ q against the target p.

    kept: whether d survives; token: the token emitted at this position (d when kept, otherwise a
    replacement). Checked by sampling: emitted tokens must follow p (chi-square), and drafts must be
    kept as often as the rule allows (fixed rates, computed once).
    """

    name = "speculative sampling rule"
    g = torch.Generator().manual_seed(seed)
    for p, q, best in _pairs():
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
        rate = kept / n
        test = chi_square(counts, p)
        if test["pvalue"] < 1e-3:
            qtest = chi_square(counts, q)
            hint = ""
            if qtest["pvalue"] > 1e-3:
                hint = " Your tokens follow the draft distribution q: rejected drafts must be replaced."
            elif abs(rate - best) < 4 * math.sqrt(best * (1 - best) / n) + 1e-9:
                hint = (" You keep drafts at the right rate, so the replacement is off: it must put back only the "
                        "mass of p that the kept drafts left short, not all of p.")
            return Check(name, False, f"over {n} draws (V={V}) the emitted tokens do not follow p "
                                      f"(chi-square p-value {test['pvalue']:.1e}).{hint}")
        if abs(rate - best) > 4 * math.sqrt(best * (1 - best) / n) + 1e-9:
            more = "fewer" if rate < best else "more"
            return Check(name, False, f"the emitted tokens follow p, but on a case like V={V} you kept {more} drafts "
                                      f"than the rule would ({rate:.1%} of {n}): lossless, yet it wastes drafts.")
    return Check(name, True, "the emitted tokens follow p, and drafts are kept as often as the rule allows")


def accept_counts(p: torch.Tensor, q: torch.Tensor, n: int, *, generator: torch.Generator, rule=None) -> dict:
    """Draw a draft d ~ q, let `rule` (default: `decoding.accept`) keep it or replace it, n times.

    p, q: (V,) target and draft distributions. Returns counts of the emitted token (V,) and the
    fraction of drafts kept. `rule(drafts, p_rows, q_rows, greedy=False, generator=...)` has
    `decoding.accept`'s signature; p_rows has one row, so a kept draft ends the step.
    """
    rule = rule or accept
    V = p.shape[0]
    counts = torch.zeros(V)
    kept = 0
    for _ in range(n):
        d = int(torch.multinomial(q, 1, generator=generator))
        n_ok, nxt, _ = rule([d], p[None], q[None], greedy=False, generator=generator)
        tok = d if n_ok == 1 else nxt
        counts[tok] += 1
        kept += n_ok
    return {"counts": counts, "kept": kept / n}


def chi_square(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> dict:
    """Pearson's chi-square test of counts against probs; cells expecting < min_expected are pooled.

    The p-value is the upper tail of the chi-square distribution, via torch.special.gammaincc.
    A p-value far below 0.01 says the counts were not drawn from probs.
    """
    counts = counts.double().flatten()
    expected = probs.double().flatten() * counts.sum()
    big = expected >= min_expected
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = max(1, int(keep.sum()) - 1)
    pvalue = float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                           torch.tensor(stat / 2.0, dtype=torch.float64)))
    return {"stat": stat, "dof": dof, "pvalue": pvalue}


@torch.inference_mode()
def second_token_marginal(model, prompt: list[int], *, temperature: float = 1.0, top_k=None) -> torch.Tensor:
    """Exact P(second new token) after `prompt`, summing over the first: (V,)."""
    V = model.config.vocab_size
    dev = model.wte.weight.device
    p1 = distribution(model(torch.tensor([prompt], device=dev)).logits[0, -1:], temperature, top_k)[0]  # (V,)
    seqs = torch.tensor([prompt + [a] for a in range(V)], device=dev)  # (V, P+1)
    p2 = distribution(model(seqs).logits[:, -1], temperature, top_k)  # (V, V): first -> second
    return (p1[:, None] * p2).sum(0).cpu()


def second_token_counts(model, make_drafter, prompt: list[int], n: int, *, k: int = 3, temperature: float = 1.0,
                        top_k=None, seed: int = 0, progress: bool = False, rule: str = "exact") -> dict:
    """Counts of the second new token over n speculative runs with accept rule `rule` (the first token is sampled
    in the prefill, the second is the first one a drafter proposes), the fraction of drafts kept and drafts kept
    per run."""
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V)
    drafted = kept = 0
    it = range(n)
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc="speculative samples", unit="run")
    for _ in it:
        tr = speculative(model, make_drafter(), prompt, max_new_tokens=3, k=k, temperature=temperature,
                         top_k=top_k, generator=g, rule=rule)
        counts[tr.tokens[1]] += 1
        drafted += tr.num_draft_tokens
        kept += tr.num_accepted_tokens
    return {"counts": counts, "kept": kept / max(1, drafted), "kept_per_run": kept / max(1, n)}


# Student's t, 97.5% quantile by degrees of freedom (a few windows make a wide interval); 1.96 beyond 30
_T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 12: 2.18,
         15: 2.13, 20: 2.09, 30: 2.04}


def _mean_interval(per_window: torch.Tensor) -> tuple[float, float, float]:
    """Mean of per-window values with a 95% t interval that treats each window as one draw (positions inside a
    window are not independent): mean +- t(0.975, B - 1) * sd / sqrt(B). One window gives no spread, so its
    interval is the mean."""
    m, b = float(per_window.mean()), per_window.numel()
    if b < 2:
        return m, m, m
    t = 1.96 if b - 1 > 30 else _T975[max(d for d in _T975 if d <= b - 1)]
    half = t * float(per_window.std()) / b ** 0.5
    return m, m - half, m + half


@torch.inference_mode()
def acceptance_by_rule(target, draft, windows: torch.Tensor, *, temperatures=(1.0,)) -> dict:
    """Expected acceptance of one draft token at every position of some windows (teacher-forced).

    greedy: the draft is the drafter's argmax, kept if it equals the target's argmax.
    sampling at temperature T: the draft d ~ q is kept with probability min(1, p(d)/q(d)); averaged
    over d this is sum_v min(p(v), q(v)) = 1 - total variation distance between p and q.
    Returns {"greedy": float, "sampling": {T: float}, "n": positions, "windows": B,
    "interval": {"greedy": (lo, hi), T: (lo, hi)}, "difference": {T: (sampling - greedy, lo, hi)}}; every interval
    is 95% over the windows (`_mean_interval`), the difference is paired window by window.
    """
    dev = target.wte.weight.device
    x = windows[:, :-1]
    p_logits = target(x.to(dev)).logits.float()  # (B, T, V)
    q_logits = draft(x.to(draft.wte.weight.device)).logits.float().to(dev)
    g_win = (p_logits.argmax(-1) == q_logits.argmax(-1)).float().mean(-1)  # (B,)
    greedy, glo, ghi = _mean_interval(g_win)
    sampling, interval, difference = {}, {"greedy": (glo, ghi)}, {}
    for t in temperatures:
        p = torch.softmax(p_logits / t, -1)
        q = torch.softmax(q_logits / t, -1)
        s_win = torch.minimum(p, q).sum(-1).mean(-1)  # (B,)
        sampling[t], lo, hi = _mean_interval(s_win)
        interval[t] = (lo, hi)
        difference[t] = _mean_interval(s_win - g_win)
    return {"greedy": greedy, "sampling": sampling, "n": int(x.numel()), "windows": int(x.shape[0]),
            "interval": interval, "difference": difference}


def rule_verdicts(by_rule: dict) -> list[str]:
    """`acceptance_by_rule` read in words: for each temperature, does sampling keep more or fewer drafts than greedy,
    or can these windows not tell (the paired interval spans 0); then which temperature sits closest to greedy, against
    the limit T -> 0 where both distributions become one-hot and sampling acceptance becomes greedy acceptance."""
    diff, w = by_rule["difference"], by_rule["windows"]
    lines = []
    for t, (d, lo, hi) in diff.items():
        words = ("keeps more drafts than greedy" if lo > 0 else "keeps fewer drafts than greedy" if hi < 0 else
                 "cannot be told apart from greedy on these windows (the interval spans 0)")
        lines.append(f"sampling at T={t} {words}: {d:+.3f} [{lo:+.3f}, {hi:+.3f}], paired over {w} windows "
                     f"({by_rule['n']} positions)")
    if len(diff) > 1:
        ts = sorted(diff)
        near = min(ts, key=lambda t: abs(diff[t][0]))
        shrinking = all(abs(diff[a][0]) <= abs(diff[b][0]) for a, b in zip(ts, ts[1:]))
        apart = any(lo > 0 or hi < 0 for _, lo, hi in diff.values())
        order = ("the distance shrinks as T falls" if shrinking else f"the lowest temperature, T={ts[0]}, is not the closest")
        lines.append("as T -> 0 both distributions become one-hot on their argmax, so sampling acceptance tends to "
                     "greedy acceptance; "
                     + (f"at the temperatures measured here the closest to greedy is T={near}, and {order}"
                        + ("" if shrinking else ": the limit is not approached in order at these temperatures")
                        if apart else
                        f"on the point estimates the closest to greedy is T={near} and {order}, but every difference "
                        "is within its interval of 0, so this run cannot order the temperatures"))
    return lines


def live_against_estimate(runs: dict[str, list], estimate: dict[str, float], greedy: str = "T=0.0",
                          sampled: str = "T=1.0") -> list[str]:
    """The first draft's live acceptance per decode (kept, n, 95% Wilson interval, looping continuations) against
    the teacher-forced estimate for the same rule, in words chosen from the interval.

    runs: {label: the per-prompt traces of one decode}; estimate: {label: the teacher-forced estimate}. With both
    `greedy` and `sampled` labels there, a last line reads the loop story against the intervals (`loop_story_line`)."""
    out = []
    for label, trs in runs.items():
        steps = [s for t in trs for s in t.steps if s.drafted]
        k, n = sum(s.accepted > 0 for s in steps), len(steps)
        sp = loop_split(trs)
        line = (f"{label}: first draft kept in {k} of {n} drafting steps, {rate_text(k, n)}; {sp['looping']} of "
                f"{sp['continuations']} continuations loop")
        if label in estimate and n:
            lo, hi = wilson(k, n)
            e = estimate[label]
            where = ("above the live interval" if e > hi else "below the live interval" if e < lo
                     else "inside the live interval, so this run cannot tell the two apart")
            line += f"; the teacher-forced estimate {e:.3f} lies {where}"
        out.append(line)
    if greedy in runs and sampled in runs and greedy in estimate and sampled in estimate:
        out.append(loop_story_line(runs, estimate, greedy, sampled))
    return out


def _side(trs: list, e: float) -> str:
    """Where the first draft's live 95% interval lies against the estimate e: 'above', 'below' or 'inside'."""
    steps = [s for t in trs for s in t.steps if s.drafted]
    if not steps:
        return "inside"
    lo, hi = wilson(sum(s.accepted > 0 for s in steps), len(steps))
    return "above" if lo > e else "below" if hi < e else "inside"


def loop_story_line(runs: dict[str, list], estimate: dict[str, float], greedy: str, sampled: str) -> str:
    """The loop story (greedy decoding falls into loops that are easy to draft, so its live acceptance could rise
    above the teacher-forced estimate; sampling writes varied text, so its live acceptance could stay near it) read
    against this run's intervals: what the numbers show, and nothing they do not."""
    g, t = _side(runs[greedy], estimate[greedy]), _side(runs[sampled], estimate[sampled])
    loops = loop_split(runs[greedy])
    looped = f"{loops['looping']} of {loops['continuations']} continuations"
    if g == "above":
        gw = ("greedy live acceptance lies above its estimate (outside the live 95% interval), "
              + (f"with {looped} looping: the inflation is measured here" if loops["looping"] else
                 "with no continuation looping: a difference this run measured, not one the loops made"))
    else:
        gw = (("greedy live acceptance's interval holds its estimate" if g == "inside" else
               "greedy live acceptance lies below its estimate (outside the live 95% interval)")
              + (f", although {looped} loop: no inflation measured in this run" if loops["looping"] else
                 f", and none of the {loops['continuations']} continuations loops: no inflation to measure in this run"))
    tw = ("sampling's estimate lies inside its live interval: no difference measured" if t == "inside" else
          f"sampling's live acceptance lies {t} its estimate (outside the live 95% interval): a difference this run measured")
    return f"the loop story against these numbers: {gw}; {tw}"
