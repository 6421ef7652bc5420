"""Notebook 02, blockwise parallel decoding: forward counts with a perfect drafter, one verify forward laid out row by
row, the cache's length through a step, the shipped heads' whole training record; and the checkers of its exercises.

Also used by notebooks 03, 04 and 06: `loop_split`, which counts the greedy continuations that fall into a loop and
keeps the steps taken before each loop began, so that every acceptance rate shown in class carries its loop count.
Notebooks 03 and 04 also print `lineage_words`: how much a head set was trained, its last phase and its whole record.
"""
from __future__ import annotations

import torch
import math
from mtplab.measuring import teacher_forced as tf
from mtplab.measuring.acceptance import wilson
from mtplab.measuring.record import Record
from mtplab.teaching.words import compare_rates, rate_text
from mtplab.decoding.loop import autoregressive, iter_steps, speculative
from mtplab.decoding.drafters import OracleDrafter, method as get_method
from mtplab.errors import MtplabError
from mtplab.tokenizer import token_repr
from mtplab.teaching.check import Check, _call, _number
from mtplab.decoding.trace import Trace, conditional_counts
from mtplab.measuring.quality import loop_onset
from mtplab.model import checkpoint


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
# The checkers compare with fixed cases, counted once with a perfect drafter on the lab's own loop (the counts cell
# 16 of notebook 02 measures), never with a function of the package: the answers are not one call away.
_PLAIN_CASES = {(12, 4): 6, (8, 2): 8, (7, 4): 4, (9, 4): 5, (13, 3): 9, (1, 3): 1, (10, 1): 10, (25, 5): 10,
                (6, 6): 2, (2, 5): 2}
_OVERLAP_CASES = {(12, 4): 4, (8, 2): 5, (7, 4): 3, (9, 4): 3, (13, 3): 5, (1, 3): 1, (10, 1): 10, (25, 5): 6,
                  (6, 6): 2, (2, 5): 2}


def _same_everywhere(fn, cases, formula) -> bool:
    """Whether fn gives formula(m, k) on every case: a mistake is named from the whole answer, not from one case
    (one wrong count can fit two mistakes)."""
    for m, k in cases:
        got, err = _call(fn, m, k)
        if err or _number(got) is None or not math.isclose(_number(got), formula(m, k)):
            return False
    return True


def _check_counts(fn, name, cases, best_case, why_ok, hints, mistakes=(), otherwise=""):
    """`mistakes`: (formula(m, k), text) pairs: when the answer gives that formula on every case, the text names the
    mistake; `hints`: (test(m, k, given), text) pairs for the first wrong case; `otherwise`: the hint for a wrong
    whole number that nothing else names (a way to set the count up, never the count itself)."""
    for (m, k), want in cases.items():
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
            elif math.isclose(g, best_case(m, k)) and k > 1:  # k = 1: the hint below says why
                hint = " That is Stern's formula, exact only when k divides m."
            named = next((text for formula, text in mistakes if _same_everywhere(fn, cases, formula)), None)
            if named:
                hint += " " + named
            for test, text in hints if named is None else ():
                if test(m, k, g):
                    hint += " " + text
            if not hint and otherwise:
                hint = " " + otherwise
            return Check(name, False, f"wrong on a case like m={m}, k={k} (you gave {got!r}).{hint}")
    return Check(name, True, why_ok)


def check_plain_steps(fn) -> Check:
    """fn(m, k) -> target forwards of the plain (predict, verify) schedule when every draft is kept."""
    return _check_counts(
        fn, "plain schedule forwards", _PLAIN_CASES, lambda m, k: 2 * m / k,
        "every block of k tokens costs a predict and a verify forward; a last block of one token needs only "
        "its predict",
        [(lambda m, k, g: g == 2 * math.ceil(m / k) and m % k == 1,
          "A last block holding a single token has no drafts left to verify: only its predict forward runs."),
         (lambda m, k, g: k == 1 and g == 2 * m, "With k = 1 there are no drafts, so nothing to verify.")])


def check_overlap_steps(fn) -> Check:
    """fn(m, k) -> target forwards of the overlapped schedule when every draft is kept."""
    return _check_counts(
        fn, "overlapped schedule forwards", _OVERLAP_CASES, lambda m, k: 1 + m / k,
        "the first forward gives one token; each later forward verifies k-1 drafts and adds up to k tokens",
        [],
        mistakes=[(lambda m, k: math.ceil(m / k),  # the same whole numbers as 1 + (m - 1) // k: two mistakes fit
                   "Your count is one forward short: either count the first forward too (the prefill that predicts "
                   "the first token and the first drafts), or, if you did, a last, partial block of fewer than k "
                   "tokens still costs a whole forward: round up, not down."),
                  (lambda m, k: 1 + math.ceil(m / k),
                   "The first forward already commits one of the m tokens (the first one), so the later forwards "
                   "carry only the rest. Try m = 1: one forward and nothing left."),
                  (lambda m, k: 1 + m // k, "A last, partial block of fewer than k tokens still costs a whole "
                                            "forward: round the number of later forwards up, not down.")],
        otherwise="Count it in two parts: the first forward, and how many tokens it commits; then the later "
                  "forwards, each committing at most k tokens, as many as the tokens still left need (a last, partial "
                  "block counts as a whole forward). Try it by hand on m = 5, k = 2 and on m = 1.")


# (drafts, the target's own tokens) -> drafts kept, counted by hand
_PREFIX_CASES = [(([5, 6, 7], [5, 6, 7]), 3), (([5, 6, 7], [9, 6, 7]), 0), (([5, 6, 7], [5, 9, 7]), 1),
                 (([1, 2, 3, 4], [1, 2, 3, 9]), 3), (([], []), 0), (([4], [4]), 1), (([8, 8, 8], [8, 3, 8]), 1),
                 (([2, 2, 5], [7, 2, 5]), 0)]


def check_accepted_prefix(fn) -> Check:
    """fn(drafts, target) -> how many drafts greedy verification keeps.

    target[i] is the target model's own greedy token at the position of drafts[i].
    """
    name = "greedy accepted prefix"
    for (drafts, target), want in _PREFIX_CASES:
        got, err = _call(fn, list(drafts), list(target))
        if err:
            return Check(name, False, f"fn({drafts}, {target}) raised {err}")
        if _number(got) != want:
            hint = ""
            if _number(got) == sum(a == b for a, b in zip(drafts, target)):
                hint = (" You counted every match; only the prefix before the first mismatch survives, because "
                        "every later draft was conditioned on the wrong token.")
            return Check(name, False, f"wrong on a case like drafts {drafts}, target {target} (you kept {got!r}).{hint}")
    return Check(name, True, "the longest prefix of the drafts that the target would also have chosen")


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
    loops = [loop_onset(ids[n:]) is not None for ids, n in paths]  # the greedy continuation falls into a loop
    free = [r for (ids, n), looped in zip(paths, loops) if not looped for r in tf.verdict_rows(model, [(ids, n)], k)]
    return {"k": k, "steps": len(rows), "observed": tf.within_step_rates(rows),
            "shuffled": tf.within_step_rates(tf.shuffled_across_steps(rows, seed)),
            "pair": tf.kept_given_previous(rows), "prompts": len(prompts), "max_new_tokens": max_new_tokens,
            "looping": sum(loops), "no_loop": tf.within_step_rates(free) if free else None}


def correlation_lines(study: dict) -> list[str]:
    """The study's numbers, every rate with its 95% Wilson interval and its n."""
    obs, shu = study["observed"], study["shuffled"]

    def by_position(accepted, reached) -> str:  # each draft position's rate with its interval and n
        return "; ".join(f"{j + 1}: {rate_text(a, n)}" for j, (a, n) in enumerate(zip(accepted, reached)))
    out = [f"{study['steps']} drafting steps of the overlapped schedule ({study['prompts']} prompts x "
           f"{study['max_new_tokens']} tokens, k = {study['k']}); {study['looping']} of {study['prompts']} greedy "
           f"continuations fall into a loop"]
    for name, r in (("observed", obs), ("shuffled across steps", shu)):
        out.append(f"  {name:>22}: conditional by position " + by_position(r["accepted"], r["reached"]))
    out.append("  unconditional (headline)  by position " + by_position(obs["accepted"], [obs["steps"]] * len(obs["accepted"])))
    free = study.get("no_loop")
    if study.get("looping") and free:
        out.append(f"  without the {study['looping']} looping continuations ({free['steps']} steps), observed conditional "
                   "by position " + by_position(free["accepted"], free["reached"]))
    (a1, n1), (a0, n0) = study["pair"]["after_kept"], study["pair"]["after_rejected"]
    out.append(f"  draft 2 kept when draft 1 was kept: {rate_text(a1, n1)}; when draft 1 was rejected: {rate_text(a0, n0)}")
    return out


def rise_words(counts: list[tuple[int, int]]) -> str:
    """Does conditional acceptance rise from the first draft position to the last? A sentence chosen from the
    (accepted, reached) counts of both ends and their 95% Wilson intervals."""
    counts = [c for c in counts if c[1]]
    if len(counts) < 2:
        return "conditional acceptance has fewer than two positions with steps: nothing to compare"
    (a0, n0), (a1, n1) = counts[0], counts[-1]
    words = compare_rates((a0, n0), (a1, n1), "rises", "falls")
    return (f"from position 1 to {len(counts)} conditional acceptance {words}: "
            f"{rate_text(a0, n0)} -> {rate_text(a1, n1)}")


def correlation_verdict(study: dict) -> str:
    """One sentence chosen from the numbers and their 95% Wilson intervals: does the observed conditional rate
    rise, does the shuffle undo it, and is draft 2 kept more often after draft 1 was kept?"""
    obs, shu = study["observed"], study["shuffled"]
    last = len(obs["reached"]) - 1
    first_o, last_o = (obs["accepted"][0], obs["reached"][0]), (obs["accepted"][last], obs["reached"][last])
    first_s, last_s = (shu["accepted"][0], shu["reached"][0]), (shu["accepted"][last], shu["reached"][last])
    words = compare_rates(first_o, last_o, "rises", "falls")
    swords = compare_rates(first_s, last_s, "rises", "falls")
    kept, rejected = study["pair"]["after_kept"], study["pair"]["after_rejected"]
    corr = compare_rates(rejected, kept, "positively correlated", "negatively correlated")
    if corr.startswith(("ends", "cannot")):
        corr = "not clearly correlated (the 95% intervals of the two rates below overlap)"
    rate = lambda kn: f"{kn[0] / kn[1]:.0%}" if kn[1] else "n/a"
    return (f"Observed, from position 1 to {last + 1} conditional acceptance {words} "
            f"({obs['conditional'][0]:.2f} -> {obs['conditional'][last]:.2f}); with each position's verdicts shuffled "
            f"across steps it {swords} ({shu['conditional'][0]:.2f} -> {shu['conditional'][last]:.2f}). "
            f"Within a step the verdicts are {corr}: draft 2 matched {rate(kept)} of the time after draft 1 matched "
            f"(n = {kept[1]}), {rate(rejected)} after it did not (n = {rejected[1]})." + _without_loops(study))


def _without_loops(study: dict) -> str:
    free = study.get("no_loop")
    if not study.get("looping") or not free:
        return ""
    last = len(free["reached"]) - 1
    words = compare_rates((free["accepted"][0], free["reached"][0]), (free["accepted"][last], free["reached"][last]),
                     "rises", "falls")
    return (f" Without the {study['looping']} looping continuations ({free['steps']} steps) the observed rate {words} "
            f"({free['conditional'][0]:.2f} -> {free['conditional'][last]:.2f}).")


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


def rise_count(counts: dict[str, list[tuple[int, int]] | Trace], what: str = "(method, k)",
               who: str = "this run") -> str:
    """counts: label -> (accepted, reached) per draft position, or the label's pooled Trace (its counts are read
    off it). One sentence: for how many labels the conditional rate's first and last positions have 95% Wilson
    intervals that separate upward (a rise this run measured), separate downward, or overlap (no difference
    measured, whichever way the point estimate went)."""
    counts = {n: conditional_counts(cs) if isinstance(cs, Trace) else cs for n, cs in counts.items()}
    rows = {n: [c for c in cs if c[1]] for n, cs in counts.items()}
    rows = {n: cs for n, cs in rows.items() if len(cs) >= 2}
    words = {n: compare_rates(cs[0], cs[-1], "rises", "falls") for n, cs in rows.items()}
    up = [n for n, w in words.items() if w == "rises"]
    down = [n for n, w in words.items() if w == "falls"]
    higher = sum(w.startswith("ends higher") for w in words.values())
    rest = len(rows) - len(up) - len(down)
    out = (f"conditional acceptance rises from the first position to the last, with 95% intervals that do not overlap, "
           f"for {len(up)} of {len(rows)} {what}" + (f": {', '.join(up)}" if up else ""))
    if down:
        out += f"; falls, intervals apart, for {len(down)} ({', '.join(down)})"
    if rest:
        out += (f"; for {rest} the two intervals overlap, so {who} measured no difference there (the point "
                f"estimate ended higher for {higher} of them)")
    return out


def bench_rise_line() -> str:
    """Whether the shipped decode benchmark shows the same rise, per pair, from its (accepted, reached) counts and
    their 95% intervals (`rise_count`); the oracle is left out (its verdicts are independent by construction)."""
    try:
        rows = Record.load("decode").rows
    except MtplabError as e:
        return str(e)
    rows = [r for r in rows if len(r.get("conditional_acceptance", [])) >= 2 and not r["method"].startswith("oracle")]
    table = "; ".join(f"{r['label']} " + "/".join(f"{c:.2f}" for c in r["conditional_acceptance"]) for r in rows)
    counts = {r["label"]: list(zip(r["accepted"], r["reached"])) for r in rows}
    untrained = [r["label"] for r in rows if r["method"] == "ngram"]
    what = "drafters" + (f" ({', '.join(untrained)} is prompt lookup, not trained)" if untrained else "")
    source = Record.load("decode").source_line()
    return (f"The benchmark ({source}): {rise_count(counts, what, 'the record')}. Conditional rates by "
            f"position: {table}.")


# ---------------------------------------------------------------------------------- loops, for 02, 03, 04 and 06
def loop_split(traces: list[Trace]) -> dict:
    """Greedy continuations that loop, and the steps taken before each loop began.

    Returns {"continuations", "looping", "free": one Trace of the steps that started before their
    continuation's loop (all steps of a continuation that does not loop), "in_loop": steps dropped}."""
    steps, looping, dropped = [], 0, 0
    for tr in traces:
        onset = loop_onset(tr.tokens)
        looping += onset is not None
        pos = 0
        for s in tr.steps:
            if onset is None or pos < onset:
                steps.append(s)
            else:
                dropped += 1
            pos += len(s.emitted)
    t0 = traces[0] if traces else Trace(method="", prompt=[])
    free = Trace(method=t0.method, prompt=[], steps=steps, k=t0.k, schedule=t0.schedule)
    return {"continuations": len(traces), "looping": looping, "free": free, "in_loop": dropped}


def loop_line(traces: list[Trace]) -> str:
    """How many continuations loop, and the unconditional acceptance by position with and without the loops."""
    sp = loop_split(traces)
    allp = Trace(method="", prompt=[], steps=[s for t in traces for s in t.steps])
    free = sp["free"]
    line = lambda t: ", ".join(rate_text(a, t.num_drafts) for a in t.accepted_per_position)
    out = (f"{sp['looping']} of {sp['continuations']} greedy continuations fall into a loop; unconditional acceptance "
           f"by position, all steps: {line(allp)}")
    if sp["looping"]:
        out += f"; the {free.num_drafts} drafting steps before any loop began: {line(free) or 'none'}"
    return out


# ---------------------------------------------------------------------------------- training records, 02 and 03
def heads_history(name: str) -> dict[str, list[dict]]:
    """The shipped heads' whole training record: {checkpoint: meta.history} for every phase, oldest first.

    A checkpoint whose heads started from another's (`meta.heads_from`, e.g. stern-k4 from stern-k4-l4) carries
    only its own phase; the earlier phases are read from the checkpoints it names."""
    phases: dict[str, list[dict]] = {}
    seen = name
    while seen and seen not in phases:
        meta = checkpoint.read_info(seen)["meta"]
        phases[seen] = meta.get("history") or []
        seen = meta.get("heads_from")
    return dict(reversed(list(phases.items())))


def lineage_words(name: str) -> str:
    """How much the heads of `name` were trained: steps and tokens of its own (last) phase and, when they continued
    another checkpoint's heads (`meta.heads_from`), of the whole record, each phase read from its own checkpoint's
    meta. Notebooks 03 and 04 print it so that a comparison of two head sets says which training it counts."""
    metas = {p: checkpoint.read_info(p)["meta"] for p in heads_history(name)}
    own = metas[name]
    out = f"{own.get('steps')} steps on {own.get('tokens', 0):,} tokens"
    if len(metas) < 2:
        return out
    earlier = ", ".join(repr(p) for p in metas if p != name)
    steps, tokens = sum(m.get("steps") or 0 for m in metas.values()), sum(m.get("tokens") or 0 for m in metas.values())
    return (f"{out} in its last phase, continuing the heads of {earlier}; {steps:,} steps on {tokens:,} tokens over "
            "the whole record")


def history_lines(phases: dict[str, list[dict]]) -> list[str]:
    """What the training record shows, in words chosen from its numbers: validation bits per byte at each draft
    depth from the first record to the last, and the spread of the one-batch training loss in the last phase."""
    rows = [r for h in phases.values() for r in h]
    if not rows:
        return ["no training history was recorded"]
    first, last = rows[0], rows[-1]
    moves = [f"depth {d}: {a:.2f} -> {b:.2f} ({'fell' if b < a else 'rose' if b > a else 'unchanged'})"
             for d, (a, b) in enumerate(zip(first["val_bpb_depth"][1:], last["val_bpb_depth"][1:]), start=2)]
    out = [f"validation bits per byte over the whole record ({len(phases)} phase(s): {', '.join(phases)}; "
           f"{sum(h[-1]['tokens'] for h in phases.values() if h):,} tokens): " + "; ".join(moves)]
    tail = list(phases.values())[-1]
    if len(tail) >= 2:
        losses = [r["loss"] for r in tail]
        va, vb = tail[0]["val_bpb_depth"][1:], tail[-1]["val_bpb_depth"][1:]
        down = sum(y < x for x, y in zip(va, vb))
        out.append(f"last phase ({list(phases)[-1]}): the training loss, one batch at each point, moved between "
                   f"{min(losses):.3f} and {max(losses):.3f} ({losses[0]:.3f} first, {losses[-1]:.3f} last), while "
                   f"validation on the same fixed windows fell at {down} of {len(va)} draft depths")
    return out


def accuracy_against_acceptance(acc_live: list[float], agree: list[float], pooled_k: Trace) -> list[str]:
    """Per depth: accuracy against the true text, agreement with the target's greedy choice (both teacher-forced),
    and unconditional acceptance of the draft at that depth (which also needs every earlier draft kept)."""
    acc = pooled_k.acceptance_rate_per_position
    depths = range(2, min(len(acc) + 1, len(acc_live), len(agree)) + 1)  # the depths that have all three figures
    out = [f"depth {d}: accuracy {acc_live[d - 1]:.2f}, agreement with the target {agree[d - 1]:.2f}, "
           f"unconditional acceptance {acc[d - 2]:.2f}" for d in depths]
    above = [j + 2 for j, a in enumerate(acc) if j + 2 <= len(agree) and agree[j + 1] > acc_live[j + 1]]
    below = [j + 2 for j, a in enumerate(acc) if j + 2 <= len(acc_live) and a < acc_live[j + 1]]
    words = lambda ds: ("depth " if len(ds) == 1 else "depths ") + ", ".join(str(d) for d in ds) if ds else "no depth"
    out.append(f"agreement with the target exceeds accuracy against the true text at {words(above)}; "
               f"unconditional acceptance falls below accuracy at {words(below)}")
    return out


def first_draft_line(study: dict, plain: Trace) -> str:
    """Notebook 02 §4: the first draft's rate on the overlapped schedule (the correlation study) beside the plain
    schedule's (section 4's decodes), with their intervals, and why the two need not agree."""
    a_o, n_o = study["observed"]["accepted"][0], study["steps"]
    a_p, n_p = plain.accepted_per_position[0], plain.num_drafts
    words = compare_rates((a_p, n_p), (a_o, n_o), "is higher, intervals apart", "is lower, intervals apart")
    if not words.startswith("is"):
        words = "is not told apart from it (the 95% intervals overlap)"
    return (f"first draft kept: {rate_text(a_o, n_o)} over the overlapped schedule's steps here, against "
            f"{rate_text(a_p, n_p)} over the plain schedule's steps in section 4; the overlapped rate {words}. The two "
            "schedules start their steps at different places of the same greedy text (the plain one once every two "
            "forwards, the overlapped one at every forward), so these are rates over different steps.")


def loop_count_line(traces: list[Trace], looping: int, window: int) -> str:
    """Notebook 05 §2: its loop count (the last `window` tokens repeat, `engines.looping`) beside notebook 02's test
    (`loop_split`) on the same continuations, since 02-04 report loops of the same prompts with that test."""
    sp = loop_split(traces)
    n = len(traces[0].tokens) if traces else 0
    same = sp["looping"] == looping
    return (f"loops: {looping} of {len(traces)} by this notebook's test (the last {window} tokens repeat) on these "
            f"{n}-token continuations; notebook 02's test (`blockwise.loop_split`), which notebooks 02-04 apply to "
            f"longer continuations of the same prompts, finds {sp['looping']} of {sp['continuations']} here"
            + (": the tests agree, so where notebooks 02-04 count more, the loop begins later in the same greedy text "
               "(greedy decoding continues it token for token)" if same else
               ": the two tests disagree on these continuations, so compare counts made by one test"))
