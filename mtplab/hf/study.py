"""The real model's study: SmolLM2-135M-Instruct with every head family the lab ships for it, raced the lab's way
(`mtplab.measuring.race`) against AR of the same model on held-out chat prompts, and what is read off the first
round. `bench real` writes it as a record; notebooks 01, 05 and 09 run short live versions of it.

Rows (the real model's `PAIRS` rows; `bench real --rows` picks grids of them, `bench.real.GRIDS`): AR; the baselines
that need no training (transformers' `generate` and its prompt lookup, mtplab's n-gram drafter); each head family with
the full and the reduced draft vocabulary and at several k; the stock kernels against the exact ones; a token tree
against the chain. Per row: tokens per target forward, the wall-clock ratio against AR (median and range over rounds),
acceptance by position with 95% Wilson intervals (pooled and per category), the looping count, the split of a step
(target forward, drafter, the rest), and whether the tokens equal AR's and `generate`'s.

The record names the heads file each row decoded with by its sha256 and the kernel it ran on, so that `choose_k` can
take the best k for a method from rows of the very heads that are loaded, and says so when it cannot.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mtplab import paths
from mtplab.decoding.drafters import METHODS, Pair, method as get_method, pairs
from mtplab.decoding.generate import decode_with
from mtplab.decoding.trace import pooled
from mtplab.decoding.tree import tree_speculative
from mtplab.errors import MtplabError
from mtplab.files import sha256
from mtplab.hf.real import REAL_MODELS, end_of_turn, shipped_heads, shipped_vocab
from mtplab.hf.run import generate_ids
from mtplab.hf.heads_file import load_heads, read_heads_info
from mtplab.hf.target import load_hf
from mtplab.measuring.acceptance import wilson
from mtplab.measuring.quality import loop_period
from mtplab.measuring.race import race
from mtplab.measuring.record import Record, speedup_text
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
    """One of the lab's decodes of a row: the chain (`decode_with`), or a token tree of the row's widths (greedy)."""
    if row.widths:
        drafter = METHODS[row.method].make(target)
        return tree_speculative(target, drafter, ids, max_new_tokens=m, widths=row.widths, stop=stop)
    return decode_with(row.method, target, ids, max_new_tokens=m, k=row.k, stop=stop)


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


# ---------------------------------------------------------------------------------- the default k, from the record
REAL_JSON, RERUN = paths.REAL_JSON, paths.REAL_RERUN  # `bench real`'s record, and what rewrites it
FALLBACK_K = 4  # no matching row: the most the heads support, at most this (`decode_with` alone takes the most)


@dataclass(frozen=True)
class KChoice:
    """The k a decode runs with, and where it came from: 'given' (--k), 'record' (the exact row of these heads with
    the highest median in `bench real`'s record; `why` gives every compared row's median and range and makes no
    ranking of its own: `teaching.real.k_words` says whether the ranges rank them) or 'default' (no such row:
    `FALLBACK_K`, or fewer where the heads allow fewer)."""
    k: int
    source: str
    why: str
    rows: tuple = field(default=(), compare=False)  # 'record': the rows compared, at one thread count, the chosen
    # one first (record rows are dicts: left out of == and hash(), which the three fields above decide)


def heads_sha256(path) -> str | None:
    """The sha256 of a heads file: what a `bench real` row names the heads it decoded with by."""
    return sha256(Path(path)) if path is not None else None


def record_rows(rec: Record, name: str, method: str, *, heads_sha: str | None, draft_vocab: str, kernel: str,
                dtype: str = "fp32") -> list[dict]:
    """The record's chain rows of this method that decoded exactly (every prompt equal to AR) with these heads (by
    sha256; none for a method without heads), this draft vocabulary, kernel and dtype."""
    if rec.get("model") != name:
        return []
    out = []
    for r in rec.rows:
        same = (r.get("method") == method and r.get("heads_sha256") == heads_sha and not r.get("widths")
                and r.get("draft_vocab", "full") == draft_vocab and (r.get("kernel") or rec.kernel()) == kernel
                and r.get("dtype", "fp32") == dtype and isinstance(r.get("k"), int) and r.get("valid", True))
        if same and r.get("identical_to_ar") == r.get("prompts"):
            out.append(r)
    return out


def choose_k(name: str, method: str, *, k: int | None = None, heads=None, draft_vocab: str = "full",
             kernel: str = "exact", limit: int | None = None, dtype: str = "fp32", threads: int | None = None,
             record=None) -> KChoice:
    """The k of a decode of `method` on the real model `name`: k when given; else the k of the record's exact row
    with the highest median of these heads (`heads`: the heads file, by its sha256) on this kernel, draft vocabulary
    and dtype, at `threads` (default: torch's now) when the record has such rows, else at any thread count; else `FALLBACK_K`,
    capped at `limit` (the most the heads support). `record`: default `REAL_JSON`. `why` says which, in one line:
    the only row, or the highest median of several with every one's median and range (at the chosen row's thread
    count), never 'fastest', which their ranges may not carry."""
    if k is not None:
        return KChoice(k, "given", f"k={k}, given")
    record = REAL_JSON if record is None else record
    fallback = min(FALLBACK_K, limit) if limit else FALLBACK_K
    threads = threads or torch.get_num_threads()
    sha = heads_sha256(heads) if heads is not None else None
    where = Path(record).name
    try:
        rows = record_rows(Record.load(record), name, method, heads_sha=sha, draft_vocab=draft_vocab, kernel=kernel,
                           dtype=dtype) if Path(record).is_file() else []
    except MtplabError:
        rows = []
    rows = [r for r in rows if limit is None or r["k"] <= limit]
    here = [r for r in rows if r.get("threads") == threads] or rows
    if not here:
        of = f" with these heads (sha256 {sha[:12]})" if sha else ""
        return KChoice(fallback, "default", f"k={fallback}, the default (the most the heads support, at most "
                       f"{FALLBACK_K}): {where} has no exact row of {method}{of}, {draft_vocab} vocabulary, "
                       f"{kernel} kernel; {RERUN} measures them")
    best = max(here, key=lambda r: r["speedup"])
    same = [best] + sorted((r for r in here if r is not best and r.get("threads") == best.get("threads")),
                           key=lambda r: -r["speedup"])  # like with like: one thread count
    of = (f"exact row{'s' if len(same) > 1 else ''} of {method} in {where}" + (" with these heads" if sha else "")
          + f" at {best['threads']} thread{'s' if best['threads'] != 1 else ''}")
    if len(same) == 1:
        why = f"k={best['k']}, the only {of} ({best['label']}: {speedup_text(best)}), so the record compares no other k"
        if limit == best["k"]:
            why += f"; {method} drafts at most k={limit} with these heads"
    else:  # the highest median, every compared row with its range: 'fastest' is the teaching layer's verdict to make
        why = (f"k={best['k']}, the highest median of the {len(same)} {of} ("
               + "; ".join(f"{r['label']}: {speedup_text(r)}" for r in same) + ")")
    return KChoice(best["k"], "record", why, tuple(same))


def generate_defaults(name: str, method: str, *, heads=None, draft_vocab: str | None = None, k: int | None = None,
                      kernel: str = "exact", dtype: str = "fp32") -> dict:
    """What `generate --hf NAME --method M` decodes with when flags are left out: the heads file's draft vocabulary
    (`reduced` where it carries one), and k from `choose_k` (the record's best for these heads, else the default).
    Heads that cannot be read are left for `run_hf_generate` to refuse in its own words."""
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
        return {"k": k, "draft_vocab": vocab, "k_source": None, "k_why": None, "draft_vocab_why": vocab_why}
    limit = None
    if info is not None and info.get("heads") == m.family and m.max_k is not None:
        limit = m.max_k(ModelConfig().with_heads(info["heads"], info["n_depths"]))
    choice = choose_k(name, method, k=k, heads=path if m.family and info is not None else None, draft_vocab=vocab,
                      kernel=kernel, limit=limit, dtype=dtype)  # unreadable heads: no sha256 to match, the default
    return {"k": choice.k, "draft_vocab": vocab, "k_source": choice.source, "k_why": choice.why,
            "draft_vocab_why": vocab_why}
