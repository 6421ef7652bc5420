"""The real model's study: SmolLM2-135M-Instruct with every head family the lab ships for it, raced the lab's way
(`mtplab.measuring.race`) against AR of the same model on held-out chat prompts, and what is read off the first
round. `bench real` writes it as a record; notebooks 01, 05 and 09 run short live versions of it.

Rows: AR; transformers' `generate` and its prompt lookup; mtplab's n-gram drafter; each head family with the full
and the reduced draft vocabulary. Per row: tokens per target forward, the wall-clock ratio against AR (median and
range over rounds), acceptance by position with 95% Wilson intervals (pooled and per category), the looping count,
the split of a step (target forward, drafter, the rest), and whether the tokens equal AR's and `generate`'s.
"""
from __future__ import annotations

import statistics

import torch

from mtplab.decoding.drafters import Pair, pairs, real_label
from mtplab.decoding.generate import decode_with
from mtplab.errors import MtplabError
from mtplab.hf.real import REAL_MODELS, end_of_turn, shipped_heads, shipped_vocab
from mtplab.hf.run import generate_ids
from mtplab.hf.heads_file import load_heads
from mtplab.hf.target import load_hf
from mtplab.measuring.acceptance import wilson
from mtplab.measuring.quality import loop_period
from mtplab.measuring.race import race
from mtplab.training.losses import CACHED_LOSSES


def rows_of_real() -> list[Pair]:
    """The study's rows: the real model's `PAIRS` rows (`decoding.drafters.pairs`), AR first. A real model given by
    its folder races the same rows."""
    return pairs(next(iter(REAL_MODELS)))


# the rows are the real model's `PAIRS` rows (`decoding.drafters.pairs(name)`); these are filters of them, by label
QUICK = (real_label("ar", None), real_label("hf-generate", None), real_label("deepseek", 2, "reduced"),
         real_label("deepseek-reuse", 4, "reduced"))


class Heads:
    """One target with every shipped head family, swapped in per call (the trunk is loaded once); `bf16`: the same
    in bf16, for the rows of the faster mode, loaded on first use."""

    def __init__(self, target, families: dict, vocab: list[int] | None, name: str | None = None):
        self.target, self.families, self.vocab = target, families, vocab
        self.name = name if name is not None else next(iter(REAL_MODELS))
        self._bf16: Heads | None = None

    def bf16(self) -> "Heads":
        if self._bf16 is None:
            self._bf16 = load_heads_all(self.name, self.target.wte.weight.device, dtype=torch.bfloat16)
        return self._bf16

    def use(self, family: str | None, vocab: str):
        t = self.target
        if family is not None:
            t.mtp, t.config = self.families[family]
        t._use_draft_vocab(self.vocab if vocab == "reduced" else None)
        return t


def contenders(heads: Heads, rows: list[Pair], m: int) -> dict:
    """Each row as a decode of one prompt; every decode ends with the answer (the model's end of turn), or at m."""
    t = heads.target
    stop = end_of_turn(t)

    def run(row: Pair):
        if row.dtype == "bf16":
            low = heads.bf16()
            return lambda ids: decode_with(row.method, low.use(row.family, row.draft_vocab), ids, max_new_tokens=m, k=row.k,
                                           stop=stop)
        if row.method == "hf-generate":
            return lambda ids: generate_ids(t.hf, ids, m, stop=stop)
        if row.method == "hf-lookup":
            return lambda ids: generate_ids(t.hf, ids, m, stop=stop, prompt_lookup_num_tokens=row.k - 1)
        return lambda ids: decode_with(row.method, heads.use(row.family, row.draft_vocab), ids, max_new_tokens=m, k=row.k,
                                       stop=stop)
    return {r.label: run(r) for r in rows}


def acceptance_table(traces: list, cats: list[str]) -> dict:
    """Acceptance by draft position (unconditional: accepted at position i over drafting steps), pooled and per
    category, each with its counts and 95% Wilson interval."""
    def pool(ts):
        steps = sum(t.num_drafts for t in ts)
        n = max((len(t.accepted_per_position) for t in ts), default=0)
        acc = [sum(t.accepted_per_position[i] for t in ts if len(t.accepted_per_position) > i) for i in range(n)]
        return {"steps": steps, "accepted": acc, "rate": [a / max(1, steps) for a in acc],
                "interval": [list(wilson(a, steps)) for a in acc]}
    out = {"pooled": pool(traces)}
    for c in dict.fromkeys(cats):
        out[c] = pool([t for t, cc in zip(traces, cats) if cc == c])
    return out


def _split(traces: list) -> dict:
    """Milliseconds per step in target forwards, the drafter and the rest, summed over the decodes."""
    tot = {"target_s": 0.0, "draft_s": 0.0, "overhead_s": 0.0, "steps": 0}
    for t in traces:
        s = t.time_split()
        n = s["steps"]
        tot["steps"] += n
        for key in ("target_s", "draft_s", "overhead_s"):
            tot[key] += s[key] * n
    n = max(1, tot["steps"])
    return {"target_ms": 1e3 * tot["target_s"] / n, "draft_ms": 1e3 * tot["draft_s"] / n,
            "overhead_ms": 1e3 * tot["overhead_s"] / n}


def study(heads: Heads, prompts: list[list[int]], cats: list[str], *, rows: list[Pair], m: int, rounds: int,
          bar=None) -> dict:
    """The race and what is read off its first round (module docstring)."""
    if rows[0].label != "AR":
        rows = [rows_of_real()[0]] + [r for r in rows if r.label != "AR"]
    res = race(contenders(heads, rows, m), prompts, baseline="AR", rounds=rounds, device=heads.target.wte.weight.device,
               warmup=lambda _n, fn: fn(prompts[0][:8]), bar=bar)
    hf_label = "transformers generate"
    out = []
    for r in rows:
        sp = res.row(r.label)
        traces = [o for o in res.outputs[r.label] if hasattr(o, "steps")]
        toks = res.tokens[r.label]
        row = {"label": r.label, "method": r.method, "family": r.family, "k": r.k, "draft_vocab": r.draft_vocab,
               "dtype": r.dtype,
               **sp, "identical_to_ar": sp["identical"],
               "looping": sum(loop_period(t) is not None for t in toks)}
        if r.dtype == "bf16" and "AR, bf16" in res.tokens:  # against AR of the same (bf16) model too
            row["vs_ar_same_dtype"] = statistics.median(
                b / max(1e-12, c) for b, c in zip(res.round_totals("AR, bf16"), res.round_totals(r.label)))
            row["identical_to_ar_same_dtype"] = sum(a == b for a, b in zip(toks, res.tokens["AR, bf16"]))
        if hf_label in res.tokens:
            row["identical_to_generate"] = sum(a == b for a, b in zip(toks, res.tokens[hf_label]))
        if traces:
            row["tokens_per_forward"] = sum(len(t.tokens) for t in traces) / max(1, sum(t.forwards for t in traces))
            row["split"] = _split(traces)
            if r.method not in ("ar",):
                row["acceptance"] = acceptance_table(traces, cats)
        out.append(row)
    return {"rows": out, "valid": res.valid, "verdict": res.verdict(), "others_cores": res.others_cores,
            "machine": res.machine, "rounds": rounds, "m": m, "prompts": len(prompts),
            "categories": sorted(set(cats)),
            "answer_tokens": sum(len(t) for t in res.tokens["AR"]),  # each answer up to its end of turn, at most m
            "ar_ms_per_token": 1e3 * statistics.median(res.round_totals("AR")) / max(1, sum(len(t) for t in
                                                                                          res.tokens["AR"]))}


def rejections_outside(traces: list, vocab) -> tuple[int, int]:
    """(rejections whose target token lies outside the draft vocabulary, all rejections) over decodes: a draft at
    such a position could never be kept, whatever the heads learnt."""
    inside = set(vocab) if vocab is not None else None
    rej = [s.bonus for t in traces for s in t.steps if s.bonus_source == "correction" and s.bonus is not None]
    return (sum(1 for tok in rej if tok not in inside) if inside is not None else 0), len(rej)


ACCEPTANCE_ROWS = (real_label("deepseek", 2, "reduced"), real_label("deepseek-reuse", 4, "reduced"))


def acceptance_study(heads: Heads, prompts: list[list[int]], cats: list[str], *, m: int,
                     labels=ACCEPTANCE_ROWS, bar=None) -> dict:
    """Untimed: each row decoded once on every prompt, for acceptance by position (pooled and per category, with
    intervals), the looping count and exactness on more prompts than a timed race can afford."""
    by = {r.label: r for r in rows_of_real()}
    stop = end_of_turn(heads.target)  # acceptance on the answer only
    ars = [decode_with("ar", heads.use(None, "full"), p, max_new_tokens=m, stop=stop).tokens for p in prompts]
    out = {}
    for label in labels:
        r = by[label]
        if r.family is not None and r.family not in heads.families:
            continue
        traces, same = [], 0
        for p, ar in zip(prompts, ars):
            tr = decode_with(r.method, heads.use(r.family, r.draft_vocab), p, max_new_tokens=m, k=r.k, stop=stop)
            traces.append(tr)
            same += tr.tokens == ar
            if bar is not None:
                bar.update(1)
        outside, rejections = rejections_outside(traces, heads.vocab if r.draft_vocab == "reduced" else None)
        out[label] = {"acceptance": acceptance_table(traces, cats), "prompts": len(prompts), "identical_to_ar": same,
                      "rejections": rejections, "rejected_outside_vocab": outside,
                      "looping": sum(loop_period(t.tokens) is not None for t in traces),
                      "tokens_per_forward": sum(len(t.tokens) for t in traces) / max(1, sum(t.forwards for t in traces))}
    return out


def load_heads_all(name: str, device, dtype=torch.float32) -> Heads:
    """The model with every head family the lab ships for it, and its draft vocabulary."""
    target = load_hf(name, device=device, dtype=dtype)
    fams = {}
    for fam in CACHED_LOSSES:  # the families distill trains: deepseek, stern
        p = shipped_heads(name, fam)
        if p is not None:
            load_heads(target, p)
            fams[fam] = (target.mtp, target.config)
    return Heads(target, fams, shipped_vocab(name), name)


def pick_rows(heads: Heads, only: str | None, quick: bool) -> list[Pair]:
    every = rows_of_real()
    rows = [r for r in every if r.family is None or r.family in heads.families]
    rows = [r for r in rows if r.draft_vocab == "full" or heads.vocab is not None]
    if quick:
        rows = [r for r in rows if r.label in QUICK]
    if only:
        want = [s.strip() for s in only.split(";") if s.strip()]
        bad = [w for w in want if w not in {r.label for r in every}]
        if bad:
            raise MtplabError(f"no bench real row named {bad[0]!r}; choose among: {'; '.join(r.label for r in every)}")
        rows = [r for r in rows if r.label in want or r.label == "AR"]
    return rows
