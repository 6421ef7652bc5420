"""Notebook 02, blockwise parallel decoding: forward counts with a perfect drafter, one verify forward laid out row by
row, the cache's length through a step; and the checkers of its exercises.
"""
from __future__ import annotations

import torch
import math
from mtplab.measuring import theory
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
