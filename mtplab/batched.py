"""Batched decoding: B prompts at once, each row accepting its own number of drafts every step.

B batch (rows still decoding), T tokens fed per row in one forward, P cached positions, C channels,
H heads, D head dim, V vocabulary, L_b the cache length of row b.

Rows are ragged, and stay so without padding anything into their output. Each row has its own cache
length L_b; one forward writes row b's T new tokens at positions L_b..L_b+T-1 (their rotary positions
too), and a mask lets query t of row b see keys 0..L_b+t and nothing else. Whatever row b's cache holds
beyond L_b (a shorter prompt's prefill filler, rejected drafts, filler that evens out the draft counts)
is never seen and is overwritten by the next write. A row that has all its tokens leaves the batch.

The target runs batched; each row keeps its own drafter (`mtplab.drafters`: begin / propose / feedback
on that row's slice of every forward), so the per-row drafter state of Stern, Meta and DeepSeek heads is
exactly that of a B = 1 decode. Greedy only: every row's output equals that row decoded alone by
`decoding.autoregressive` (tested).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .batched_drafters import for_rows
from .decoding import accept, check_finite, check_k, check_prompt
from .errors import MtplabError
from .layers import RaggedKVCache
from .trace import Step, Trace


@dataclass
class Row:
    """One prompt's decode inside the batch."""
    trace: Trace
    tokens: list[int]          # prompt + committed tokens
    max_new_tokens: int

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - (len(self.tokens) - len(self.trace.prompt))


@dataclass
class BatchTrace:
    """Per-row traces (in prompt order) and what the batch as a whole cost."""
    traces: list[Trace]
    forwards: int = 0                                   # batched target forwards, prefill included
    batch_sizes: list[int] = field(default_factory=list)  # rows in each forward
    wall_s: float = 0.0

    @property
    def tokens(self) -> list[list[int]]:
        return [t.tokens for t in self.traces]

    @property
    def new_tokens(self) -> int:
        return sum(len(t.tokens) for t in self.traces)


def _forward(model, cache: RaggedKVCache, fed: list[list[int]], res: BatchTrace):
    T = len(fed[0])
    pos, mask = cache.plan(T)
    out = model(torch.tensor(fed, dtype=torch.long, device=model.wte.weight.device), cache,
                positions=pos, mask=mask)
    res.forwards += 1
    res.batch_sizes.append(len(fed))
    return out


def _check(model, prompts, max_new_tokens, extra: int) -> list[tuple[list[int], int]]:
    if not prompts:
        raise MtplabError("no prompts given; pass a list of prompts (lists of token ids)")
    ms = max_new_tokens if isinstance(max_new_tokens, (list, tuple)) else [max_new_tokens] * len(prompts)
    if len(ms) != len(prompts):
        raise MtplabError(f"max_new_tokens has {len(ms)} entries for {len(prompts)} prompts; give one per prompt")
    if any(not isinstance(m, int) or m < 1 for m in ms):
        raise MtplabError(f"max_new_tokens must be integers >= 1 (got {ms})")
    return [(check_prompt(model, p, m + extra), m) for p, m in zip(prompts, ms)]


def _prefill(model, rows: list[Row], drafter, res: BatchTrace) -> RaggedKVCache:
    """Every prompt in one forward; a shorter prompt is followed by filler that its mask never lets it see."""
    cache = RaggedKVCache.for_model(model, len(rows))
    lens = [len(r.tokens) for r in rows]
    T = max(lens)
    t0 = time.perf_counter()
    out = _forward(model, cache, [r.tokens + [r.tokens[-1]] * (T - n) for r, n in zip(rows, lens)], res)
    cache.lengths = list(lens)  # cache: each row's prompt; the filler beyond it is dead
    dt = time.perf_counter() - t0
    for b, (r, n) in enumerate(zip(rows, lens)):
        tok = int(check_finite(out.logits[b, n - 1]).argmax())
        r.tokens.append(tok)
        r.trace.steps.append(Step(drafted=[], accepted=0, emitted=[tok], bonus=tok, bonus_source="target",
                                  forwards=1, wall_s=dt, target_s=dt))
    if drafter is not None:
        drafter.begin(model, out, rows)
    return cache


def _step(model, cache: RaggedKVCache, rows: list[Row], drafter, k: int, res: BatchTrace) -> None:
    """propose -> verify (one batched forward) -> accept and commit (per row) -> the drafter's feedback."""
    t0 = time.perf_counter()
    ns = [min(k - 1, r.remaining - 1) for r in rows]  # overlap schedule: keep one place free for the bonus token
    drafts = drafter.propose(ns) if drafter is not None else [[] for _ in rows]
    t1 = time.perf_counter()
    T = 1 + max(len(d) for d in drafts)
    # row b feeds its last committed token and its drafts; filler evens out the rows and is never kept
    fed = [[r.tokens[-1]] + d + [r.tokens[-1]] * (T - 1 - len(d)) for r, d in zip(rows, drafts)]
    out = _forward(model, cache, fed, res)
    t2 = time.perf_counter()
    n_keep = []
    for b, (r, d) in enumerate(zip(rows, drafts)):
        # greedy: keep the longest prefix of the drafts that the target would also have chosen
        n_ok, nxt, source = accept(d, check_finite(out.logits[b, :len(d) + 1]), None, greedy=True, generator=None)
        new = d[:n_ok] + [nxt]
        r.tokens.extend(new)
        r.trace.steps.append(Step(drafted=d, accepted=n_ok, emitted=new, bonus=nxt, bonus_source=source,
                                  forwards=1, draft_forwards=int(bool(d)), target_s=t2 - t1))
        cache.lengths[b] = len(r.tokens) - 1  # cache: this row's tokens[:-1]; its rejected drafts are dead
        n_keep.append(n_ok + 1)
    if drafter is not None:
        drafter.feedback(out, n_keep, rows)
    wall = time.perf_counter() - t0
    for r in rows:  # the batch shares one clock: every row's step took the whole step
        r.trace.steps[-1].wall_s = wall
        r.trace.steps[-1].draft_s = wall - (t2 - t1)


@torch.inference_mode()
def batched_speculative(model, make_drafter, prompts, *, max_new_tokens, k: int, method: str | None = None,
                        per_row: bool = False) -> BatchTrace:
    """Greedy speculative decoding of B prompts at once (overlap schedule: one target forward a step).

    make_drafter: model -> a fresh B = 1 drafter (e.g. `SternDrafter`), one per row; Stern and Meta heads
    then draft for all rows in one call (`mtplab.batched_drafters`) unless per_row=True, other drafters
    run row by row. None decodes without drafts (batched autoregressive). max_new_tokens: one int, or one
    per prompt. Row b's output equals `autoregressive(model, prompts[b], max_new_tokens=...)` greedy output.
    """
    check_k(k)
    t0 = time.perf_counter()
    checked = _check(model, prompts, max_new_tokens, k)
    drafters = [make_drafter(model) for _ in checked] if make_drafter is not None else []
    d = drafters[0] if drafters else None
    if d is not None and d.max_drafts is not None and k - 1 > d.max_drafts:
        raise MtplabError(f"k={k} needs {k - 1} drafts a step but {d.name} gives at most {d.max_drafts}; "
                          f"use k <= {d.max_drafts + 1}")
    name = method or (d.name if d is not None else "ar")
    rows = [Row(Trace(method=name, prompt=p, k=k, schedule="overlap" if d else "ar"), list(p), m) for p, m in checked]
    drafter = for_rows(drafters, per_row=per_row) if drafters else None
    res = BatchTrace([r.trace for r in rows])
    cache = _prefill(model, rows, drafter, res)
    while True:
        live = [b for b, r in enumerate(rows) if r.remaining > 0]
        if not live:
            break
        if len(live) < len(rows):  # finished rows leave the batch
            cache.keep(live)
            if drafter is not None:
                drafter.keep(live)
            rows = [rows[b] for b in live]
        _step(model, cache, rows, drafter, k, res)
    res.wall_s = time.perf_counter() - t0
    return res


def batched_autoregressive(model, prompts, *, max_new_tokens) -> BatchTrace:
    """Greedy autoregressive decoding of B prompts at once: the baseline, one token per row per forward."""
    return batched_speculative(model, None, prompts, max_new_tokens=max_new_tokens, k=1, method="ar")
