"""Notebook 02, blockwise parallel decoding: forward counts with a perfect drafter, one verify forward laid out row by
row, the cache's length through a step; and the checkers of its exercises.
"""
from __future__ import annotations

import torch
import math
from mtplab.measuring import theory
from mtplab.measuring import teacher_forced as tf
from mtplab.measuring.acceptance import wilson
from mtplab.measuring.speedup import bench_source, read_decode_bench
from mtplab.decoding.accept import accept
from mtplab.decoding.loop import autoregressive, speculative
from mtplab.decoding.drafters import OracleDrafter
from mtplab.errors import MtplabError
from mtplab.tokenizer import token_repr
from mtplab.teaching.check import Check
from mtplab.teaching.check import _call
from mtplab.teaching.check import _number
from mtplab.decoding.drafters import method as get_method
from mtplab.decoding.loop import iter_steps


@torch.inference_mode()
def cache_lengths(model, method: str, prompt_ids: list[int], *, k: int, max_new_tokens: int) -> list[dict]:
    """Step through a greedy speculative decode on a KV cache the caller can see, and record per step the cache
    length before it, after its verify forward (drafts written) and after `KVCache.crop` (rejected ones gone)."""

    m = get_method(method)
    cache = model.new_cache()
    out, before = [], 0
    steps = iter_steps(model, m.make(model), prompt_ids, max_new_tokens=max_new_tokens, k=k, schedule=m.schedule,
                       cache=cache)
    for i, step in enumerate(steps):
        # written this step: the predict forward's token (plain), the last committed token, the drafts fed
        drafts_fed = max(0, len(step.drafted) - (m.schedule == "plain"))
        fed = 0 if i == 0 else 1 + drafts_fed + (step.predict_token is not None)
        out.append({"step": step, "before": before, "after_verify": before + fed if i else cache.length,
                    "after_crop": cache.length, "drafts_fed": drafts_fed if i else 0})
        before = cache.length
    return out


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


def oracle_forward_counts(model, prompt, ms, ks, *, schedule: str) -> dict[int, list[int]]:
    """Forwards spent by speculative decoding with a perfect drafter (alpha = 1), for every m and k.

    With alpha = 1 the count depends only on m, k and the schedule, never on what the model says,
    which is what `theory.plain_forwards` and `theory.overlap_forwards` claim.
    """
    ms = list(ms)
    reference = autoregressive(model, prompt, max_new_tokens=max(ms)).tokens  # greedy: a prefix for every m
    return {k: [speculative(model, OracleDrafter(reference, 1.0), prompt, max_new_tokens=m, k=k,
                            schedule=schedule).forwards for m in ms] for k in ks}


@torch.no_grad()
def verify_example(model, prompt: list[int], k: int) -> dict:
    """One verify forward on `prompt`, laid out row by row (`viz_lessons.verify_forward` draws it).

    The prefill gives the target's next token P (depth 1, committed) and k-1 drafts (depths 2..k). Verify feeds
    [P, draft 1, ..., draft k-1] in one forward; the target's argmax after fed token j is compared with draft
    j+1, and the argmax after the last draft is the bonus (the plain schedule does not feed the last draft, so
    it stops one row short). Returns printable labels: the prompt's last token, fed, predicted and drafts."""
    if model.mtp is None or k > model.config.n_depths:
        raise MtplabError(f"verify_example needs a checkpoint with at least k = {k} depths, e.g. stern-k4")
    dev = model.wte.weight.device
    first = model.depth_logits(torch.tensor([prompt], device=dev))[0, -1, :k].argmax(-1).tolist()  # (k,)
    logits = model(torch.tensor([prompt + first], device=dev)).logits  # (1, T + k, V): one forward
    predicted = logits[0, len(prompt):].argmax(-1).tolist()            # (k,) the target's token after each
    return {"context": token_repr(prompt[-1]), "fed": [token_repr(t) for t in first],
            "predicted": [token_repr(t) for t in predicted], "drafts": [token_repr(t) for t in first[1:]]}


def correlation_study(model, prompts, *, k: int, max_new_tokens: int, seed: int = 0) -> dict:
    """Acceptance within a step, observed and with the verdicts shuffled across steps.

    The target decodes each prompt greedily; one teacher-forced forward per prompt gives every draft's verdict
    at every live step start, including the drafts after a rejection that the live loop never checks
    (`teacher_forced.verdict_rows`). 'observed' counts those rows as the live loop does; 'shuffled' permutes each
    position's verdicts across steps first (`shuffled_across_steps`): the same marginal rates, no within-step
    correlation. If the verdicts were independent (the i.i.d. model), both would rise or fall alike."""
    paths = tf.greedy_paths(model, prompts, max_new_tokens=max_new_tokens, k=k)
    rows = tf.verdict_rows(model, paths, k)
    if not rows:
        raise MtplabError("no step drafted all k-1 drafts; use more prompts or more new tokens")
    return {"k": k, "steps": len(rows), "observed": tf.within_step_rates(rows),
            "shuffled": tf.within_step_rates(tf.shuffled_across_steps(rows, seed)),
            "pair": tf.kept_given_previous(rows), "prompts": len(prompts), "max_new_tokens": max_new_tokens}


def _interval(a: int, n: int) -> str:
    lo, hi = wilson(a, n)
    return f"{a / n:.2f} [{lo:.2f}, {hi:.2f}] (n = {n})" if n else "n/a (n = 0)"


def correlation_lines(study: dict) -> list[str]:
    """The study's numbers, every rate with its 95% Wilson interval and its n."""
    obs, shu = study["observed"], study["shuffled"]
    n = len(obs["reached"])
    out = [f"{study['steps']} drafting steps ({study['prompts']} prompts x {study['max_new_tokens']} tokens, k = {study['k']})"]
    for name, r in (("observed", obs), ("shuffled across steps", shu)):
        out.append(f"  {name:>22}: conditional by position " + "; ".join(
            f"{j + 1}: {_interval(r['accepted'][j], r['reached'][j])}" for j in range(n)))
    out.append("  unconditional (headline)  by position " + "; ".join(
        f"{j + 1}: {_interval(obs['accepted'][j], obs['steps'])}" for j in range(n)))
    (a1, n1), (a0, n0) = study["pair"]["after_kept"], study["pair"]["after_rejected"]
    out.append(f"  draft 2 kept when draft 1 was kept: {_interval(a1, n1)}; when draft 1 was rejected: {_interval(a0, n0)}")
    return out


def correlation_verdict(study: dict) -> str:
    """One sentence chosen from the numbers: does the observed conditional rate rise, and does the shuffle undo it?"""
    obs, shu = study["observed"]["conditional"], study["shuffled"]["conditional"]
    rise = obs[-1] - obs[0]
    srise = shu[-1] - shu[0]
    (a1, n1), (a0, n0) = study["pair"]["after_kept"], study["pair"]["after_rejected"]
    p1, p0 = (a1 / n1 if n1 else float("nan")), (a0 / n0 if n0 else float("nan"))
    words = "rises" if rise > 0.02 else ("falls" if rise < -0.02 else "stays about level")
    swords = "rises" if srise > 0.02 else ("falls" if srise < -0.02 else "stays about level")
    corr = ("positively correlated" if p1 > p0 else "not positively correlated")
    return (f"Observed, conditional acceptance {words} from position 1 to {len(obs)} ({obs[0]:.2f} -> {obs[-1]:.2f}); "
            f"with each position's verdicts shuffled across steps it {swords} ({shu[0]:.2f} -> {shu[-1]:.2f}). "
            f"Within a step the verdicts are {corr}: draft 2 matched {p1:.0%} of the time after draft 1 matched, "
            f"{p0:.0%} after it did not.")


def correlation_figure(study: dict):
    """Conditional acceptance by position, observed against shuffled, with 95% Wilson intervals; the marginal
    rate (draft j right, whatever came before) dotted."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(6.2, 3.6))
    fig.subplots_adjust(bottom=0.16, right=0.97)
    ax = fig.subplots()
    n = len(study["observed"]["reached"])
    xs = list(range(1, n + 1))
    for shift, (label, key, colour) in zip((-0.06, 0.06), (("observed (as the live loop counts)", "observed", "#0072B2"),
                                                         ("verdicts shuffled across steps", "shuffled", "#D55E00"))):
        r = study[key]
        ys = r["conditional"]
        ci = [wilson(a, b) for a, b in zip(r["accepted"], r["reached"])]
        ax.errorbar([x + shift for x in xs], ys, yerr=[[y - lo for y, (lo, _) in zip(ys, ci)],
                                                       [hi - y for y, (_, hi) in zip(ys, ci)]],
                    marker="o", capsize=3, label=label, color=colour)
    ax.plot(xs, study["observed"]["marginal_rate"], ":", color="grey", label="marginal: draft right, whatever came before")
    ax.set_xticks(xs)
    ax.set_xlabel("draft position (1 = the 2nd token of the step)")
    ax.set_ylabel("P(kept | earlier drafts kept)")
    ax.set_ylim(0, 1)
    ax.set_title(f"conditional acceptance, 95% Wilson intervals, {study['steps']} steps", fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    return fig


def bench_rise_line() -> str:
    """Whether the shipped decode benchmark shows the same rise: its conditional rates by position, per method."""
    try:
        rows = read_decode_bench()["rows"]
    except MtplabError as e:
        return str(e)
    rows = [r for r in rows if len(r.get("conditional_acceptance", [])) >= 2 and not r["method"].startswith("oracle")]
    rise = [r["method"] for r in rows if r["conditional_acceptance"][-1] > r["conditional_acceptance"][0]]
    table = "; ".join(f"{r['method']} " + "/".join(f"{c:.2f}" for c in r["conditional_acceptance"]) for r in rows)
    return (f"The benchmark ({bench_source()}): conditional acceptance ends higher than it starts for {len(rise)} of "
            f"{len(rows)} trained drafters: {table}.")
