"""The real model's study: SmolLM2-135M-Instruct with every head family the lab ships for it, raced the lab's way
(`mtplab.measuring.race`) against AR of the same model on held-out chat prompts, and what is read off the first
round. `bench real` writes it as a record; notebooks 01, 05 and 09 run short live versions of it.

Rows (the real model's `PAIRS` rows; `bench real --rows` picks grids of them, `bench.real.GRIDS`): AR; the baselines
that need no training (transformers' `generate` and its prompt lookup, mtplab's n-gram drafter); each head family with
the full and the reduced draft vocabulary and at several k, with k-1 drafts every step or a confidence stop; the stock
kernels against the exact ones; a token tree against the chain. Per row: tokens per target forward, the wall-clock
ratio against AR (median and range over rounds), acceptance by position with 95% Wilson intervals (pooled and per
category), the looping count, the split of a step (target forward, drafter, the rest), and whether the tokens equal
AR's and `generate`'s.

The record names the heads file each row decoded with by its sha256 and the kernel it ran on, so that
`measuring.choice.choose_k` can take the best k and stop for a method from rows of the very heads that are loaded.
"""
from __future__ import annotations

import statistics
import torch

from mtplab.decoding import adaptive
from mtplab.decoding.drafters import METHODS, Pair, method as get_method, pairs
from mtplab.decoding.generate import decode_with
from mtplab.decoding.trace import pooled
from mtplab.decoding.tree import tree_speculative
from mtplab.errors import MtplabError
from mtplab.hf.real import REAL_MODELS, end_of_turn, shipped_heads, shipped_vocab
from mtplab.hf.run import generate_ids
from mtplab.hf.heads_file import load_heads, read_heads_info
from mtplab.hf.target import load_hf
from mtplab.measuring.acceptance import wilson
from mtplab.measuring.quality import loop_period
from mtplab.measuring.race import race
from mtplab.measuring.choice import choose_k
from mtplab.model import kernels
from mtplab.model.config import ModelConfig
from mtplab.training.losses import CACHED_LOSSES


def rows_of_real() -> list[Pair]:
    """The study's rows: the real model's `PAIRS` rows (`decoding.drafters.pairs`), AR first. A real model given by
    its folder races the same rows."""
    return pairs(next(iter(REAL_MODELS)))


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
        if row.method == "hf-generate":
            return lambda ids: generate_ids(t.hf, ids, m, stop=stop)
        if row.method == "hf-lookup":
            return lambda ids: generate_ids(t.hf, ids, m, stop=stop, prompt_lookup_num_tokens=row.k - 1)
        low = heads.bf16() if row.dtype == "bf16" else heads
        return on_kernel(row.kernel, low.target, lambda ids: lab_decode(row, low.use(row.family, row.draft_vocab), ids,
                                                                        m=m, stop=stop))
    return {r.label: run(r) for r in rows}


def lab_decode(row: Pair, target, ids, *, m: int, stop: int | None):
    """One of the lab's decodes of a row: the chain (`decode_with`; with the row's confidence stop where it has one),
    or a token tree of the row's widths (greedy)."""
    if row.widths:
        drafter = METHODS[row.method].make(target)
        return tree_speculative(target, drafter, ids, max_new_tokens=m, widths=row.widths, stop=stop)
    return decode_with(row.method, target, ids, max_new_tokens=m, k=row.k, stop=stop, **adaptive.stop_at(row.stop))


def on_kernel(kernel: str, target, fn):
    """fn, run through the kernel a row names: 'exact' (the default), or 'stock' (transformers' forward, F.linear)."""
    if kernel == "exact":
        return fn

    def stock(ids):
        target.use_kernel("stock")
        try:
            with kernels.use_stock(True):
                return fn(ids)
        finally:
            target.use_kernel("exact")
    return stock


def acceptance_table(traces: list, cats: list[str]) -> dict:
    """Acceptance by draft position (unconditional: accepted at position i over drafting steps), pooled and per
    category, each with its counts and 95% Wilson interval."""
    def pool(ts):
        one = pooled(ts)  # every step of the decodes in one Trace: its counters sum over them
        steps, acc = one.num_drafts, one.accepted_per_position
        return {"steps": steps, "accepted": acc, "rate": [a / max(1, steps) for a in acc],
                "interval": [list(wilson(a, steps)) for a in acc]}
    out = {"pooled": pool(traces)}
    for c in dict.fromkeys(cats):
        out[c] = pool([t for t, cc in zip(traces, cats) if cc == c])
    return out


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
               "dtype": r.dtype, "kernel": r.kernel, "widths": list(r.widths) if r.widths else None,
               "adapt": "fixed" if r.stop is None else "confidence", "threshold": r.stop,  # as bench k's rows say it
               **sp, "identical_to_ar": sp["identical"],
               "looping": sum(loop_period(t) is not None for t in toks)}
        if r.dtype == "bf16" and "AR, bf16" in res.tokens:  # against AR of the same (bf16) model too
            row["vs_ar_same_dtype"] = statistics.median(
                b / max(1e-12, c) for b, c in zip(res.round_totals("AR, bf16"), res.round_totals(r.label)))
            row["identical_to_ar_same_dtype"] = sum(a == b for a, b in zip(toks, res.tokens["AR, bf16"]))
        if hf_label in res.tokens:
            row["identical_to_generate"] = sum(a == b for a, b in zip(toks, res.tokens[hf_label]))
        if traces:
            one = pooled(traces)  # every step of the decodes in one Trace (each prompt's prefill left out of its split)
            row["tokens_per_forward"] = one.tokens_per_forward
            split = one.time_split()  # milliseconds per step in target forwards, the drafter and the rest
            row["split"] = {f"{part}_ms": 1e3 * split[f"{part}_s"] for part in ("target", "draft", "overhead")}
            if r.method not in ("ar",) and not r.widths:  # a tree's steps have no chain positions
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


def generate_defaults(name: str, method: str, *, heads=None, draft_vocab: str | None = None, k: int | None = None,
                      kernel: str = "exact", dtype: str = "fp32", stop: float | None = None) -> dict:
    """What `generate --hf NAME --method M` decodes with when flags are left out: the heads file's draft vocabulary
    (`reduced` where it carries one), and k and the confidence stop from `measuring.choice.choose_k` (the record's
    best for these heads, else the default). Heads that cannot be read are left for `run_hf_generate` to refuse in
    its own words."""
    m = get_method(method)
    path = heads if heads is not None else (shipped_heads(name, m.family) if m.family else None)
    try:
        info = read_heads_info(path, tensors=False) if path is not None else None
    except MtplabError:
        info = None
    carried = bool(info and info.get("draft_vocab"))
    vocab = draft_vocab or ("reduced" if m.family and carried else "full")
    vocab_why = ("given (--draft-vocab)" if draft_vocab else "the heads file's" if vocab == "reduced" else
                 "no heads" if not m.family else "the heads file carries none")
    if not m.speculative:
        return {"k": k, "stop": None, "draft_vocab": vocab, "k_source": None, "k_why": None, "draft_vocab_why": vocab_why}
    limit = None
    if info is not None and info.get("heads") == m.family and m.max_k is not None:
        limit = m.max_k(ModelConfig().with_heads(info["heads"], info["n_depths"]))
    choice = choose_k(name, method, k=k, heads=path if m.family and info is not None else None, draft_vocab=vocab,
                      kernel=kernel, limit=limit, dtype=dtype, stop=stop)  # unreadable heads: no sha256, the default
    return {"k": choice.k, "stop": choice.stop, "draft_vocab": vocab, "k_source": choice.source, "k_why": choice.why,
            "draft_vocab_why": vocab_why}
