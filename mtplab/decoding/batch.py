"""Batched decoding: B prompts at once, each row accepting its own number of drafts every step.

B batch (rows still decoding), T tokens fed per row in one forward, P cached positions, C channels,
H heads, D head dim, V vocabulary, L_b the cache length of row b.

Rows are ragged, and stay so without padding anything into their output. Each row has its own cache
length L_b; one forward writes row b's T new tokens at positions L_b..L_b+T-1 (their rotary positions
too), and a mask lets query t of row b see keys 0..L_b+t and nothing else. Whatever row b's cache holds
beyond L_b (a shorter prompt's prefill filler, rejected drafts, filler that evens out the draft counts)
is never seen and is overwritten by the next write. A row that has all its tokens leaves the batch.

The target runs batched; each row keeps its own drafter (`mtplab.decoding.drafters`: begin / propose / feedback
on that row's slice of every forward), so the per-row drafter state of Stern, Meta and DeepSeek heads is
exactly that of a B = 1 decode. Greedy only: every row's output equals that row decoded alone by
`decoding.autoregressive` (tested).
"""
from __future__ import annotations

from dataclasses import dataclass, field
import torch
from mtplab.decoding.accept import Sampling, decide
from mtplab.decoding.checks import check_drafts, check_finite, check_k, check_prompt
from mtplab.device import now
from mtplab.errors import MtplabError
from mtplab.model.layers import RaggedKVCache
from mtplab.decoding.trace import Step, Trace
from mtplab.decoding.drafters import MetaDrafter, SternDrafter
from mtplab.model.gpt import TrunkOutput


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
    make = getattr(model, "new_ragged_cache", None)  # a model with its own cache layout (a real model's GQA heads)
    cache = make(len(rows)) if make is not None else RaggedKVCache.for_model(model, len(rows))
    lens = [len(r.tokens) for r in rows]
    T = max(lens)
    t0 = now(model.wte.weight.device)
    out = _forward(model, cache, [r.tokens + [r.tokens[-1]] * (T - n) for r, n in zip(rows, lens)], res)
    cache.lengths = list(lens)  # cache: each row's prompt; the filler beyond it is dead
    dt = now(model.wte.weight.device) - t0
    for b, (r, n) in enumerate(zip(rows, lens)):
        tok = int(check_finite(out.logits[b, n - 1]).argmax())
        r.tokens.append(tok)
        r.trace.steps.append(Step(drafted=[], accepted=0, emitted=[tok], bonus=tok, bonus_source="target",
                                  forwards=1, prefill=True, wall_s=dt, target_s=dt))
    if drafter is not None:
        drafter.begin(model, out, rows)
    return cache


def _step(model, cache: RaggedKVCache, rows: list[Row], drafter, k: int, res: BatchTrace) -> None:
    """propose -> verify (one batched forward) -> accept and commit (per row) -> the drafter's feedback."""
    t0 = now(model.wte.weight.device)
    ns = [min(k - 1, r.remaining - 1) for r in rows]  # overlap schedule: keep one place free for the bonus token
    drafts = drafter.propose(ns) if drafter is not None else [[] for _ in rows]
    t1 = now(model.wte.weight.device)
    T = 1 + max(len(d) for d in drafts)
    # row b feeds its last committed token and its drafts; filler evens out the rows and is never kept
    fed = [[r.tokens[-1]] + d + [r.tokens[-1]] * (T - 1 - len(d)) for r, d in zip(rows, drafts)]
    out = _forward(model, cache, fed, res)
    t2 = now(model.wte.weight.device)
    n_keep = []
    for b, (r, d) in enumerate(zip(rows, drafts)):
        # greedy: keep the longest prefix of the drafts that the target would also have chosen
        decision = decide("exact", d, check_finite(out.logits[b, :len(d) + 1]), None, Sampling())
        new = decision.new(d)
        r.tokens.extend(new)
        r.trace.steps.append(Step(drafted=d, accepted=decision.n_ok, emitted=new, bonus=decision.bonus,
                                  bonus_source=decision.source, forwards=1, draft_forwards=int(bool(d)),
                                  target_s=t2 - t1))
        cache.lengths[b] = len(r.tokens) - 1  # cache: this row's tokens[:-1]; its rejected drafts are dead
        n_keep.append(decision.n_ok + 1)
    if drafter is not None:
        drafter.feedback(out, n_keep, rows)
    wall = now(model.wte.weight.device) - t0
    for r in rows:  # the batch shares one clock: every row's step took the whole step
        r.trace.steps[-1].wall_s = wall
        r.trace.steps[-1].draft_s = wall - (t2 - t1)


@torch.inference_mode()
def batched_speculative(model, make_drafter, prompts, *, max_new_tokens, k: int, method: str | None = None,
                        per_row: bool = False) -> BatchTrace:
    """Greedy speculative decoding of B prompts at once (overlap schedule: one target forward a step).

    make_drafter: model -> a fresh B = 1 drafter (e.g. `SternDrafter`), one per row; Stern and Meta heads
    then draft for all rows in one call (the batch drafter contract below) unless per_row=True, other drafters
    run row by row. None decodes without drafts (batched autoregressive). max_new_tokens: one int, or one
    per prompt. Row b's output equals `autoregressive(model, prompts[b], max_new_tokens=...)` greedy output.
    """
    check_k(k)
    t0 = now(model.wte.weight.device)
    checked = _check(model, prompts, max_new_tokens, k)
    drafters = [make_drafter(model) for _ in checked] if make_drafter is not None else []
    d = drafters[0] if drafters else None
    if d is not None:
        check_drafts(k, d)
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
    res.wall_s = now(model.wte.weight.device) - t0
    return res


def batched_autoregressive(model, prompts, *, max_new_tokens) -> BatchTrace:
    """Greedy autoregressive decoding of B prompts at once: the baseline, one token per row per forward."""
    return batched_speculative(model, None, prompts, max_new_tokens=max_new_tokens, k=1, method="ar")


def row_output(out: TrunkOutput, b: int, n: int) -> TrunkOutput:
    """Row b's first n positions of a batched forward, shaped as a B = 1 forward (what a drafter reads)."""
    return out.cut((slice(b, b + 1), slice(None, n)))


def _at(x: torch.Tensor, n_keep: list[int]) -> torch.Tensor:
    """x: (B, T, ...) -> (B, ...): row b's position n_keep[b]-1 (the one that predicted its last token)."""
    rows = torch.arange(x.shape[0], device=x.device)
    return x[rows, torch.tensor(n_keep, device=x.device) - 1]


class PerRow:
    """One B = 1 drafter per row, each fed its own row of every forward (per-row drafter state as is)."""

    def __init__(self, drafters: list):
        self.drafters = drafters
        self.name = drafters[0].name

    def begin(self, model, out, rows):
        for b, (d, r) in enumerate(zip(self.drafters, rows)):
            n = len(r.trace.prompt)
            d.begin(model, r.tokens, row_output(out, b, n), n, max_new_tokens=r.max_new_tokens, sampling=Sampling())

    def propose(self, ns):
        return [d.propose(n).tokens if n > 0 else [] for d, n in zip(self.drafters, ns)]

    def feedback(self, out, n_keep, rows):
        for b, (d, n, r) in enumerate(zip(self.drafters, n_keep, rows)):
            d.feedback(row_output(out, b, n), n, r.tokens)

    def keep(self, idx):
        self.drafters = [self.drafters[i] for i in idx]


class BatchedStern:
    """Stern et al. 2018 heads for all rows at once: depths 2..K read each row's last kept hidden state."""
    name = "blockwise"

    def begin(self, model, out, rows):
        self.model = model
        self.h = _at(out.hidden, [len(r.trace.prompt) for r in rows])[:, None]  # (B, 1, C)

    def propose(self, ns):
        if max(ns) == 0:
            return [[] for _ in ns]
        logits = self.model.unembed(self.model.mtp.hidden(self.h, max(ns))[:, 0])  # (B, n, V)
        return [d[:n] for d, n in zip(logits.float().argmax(-1).tolist(), ns)]

    def feedback(self, out, n_keep, rows):
        self.h = _at(out.hidden, n_keep)[:, None]  # (B, 1, C)

    def keep(self, idx):
        self.h = self.h[idx]


class BatchedMeta:
    """Gloeckle et al. 2024 heads for all rows at once: the K-1 head layers keep one ragged KV cache over
    the trunk. Each forward's positions all go through the heads; a row's cache length then grows by what it
    kept, so its rejected positions are dead (masked, then overwritten), as in the target's cache."""
    name = "meta"

    def begin(self, model, out, rows):
        self.model = model
        cfg, w = model.config, model.wte.weight
        self.cache = RaggedKVCache(len(model.mtp.blocks), len(rows), cfg.n_head, cfg.block_size,
                                   cfg.n_embd // cfg.n_head, dtype=w.dtype, device=w.device)
        self._extend(out.pre_last, [len(r.trace.prompt) for r in rows])

    def _extend(self, z, n_keep):
        pos, mask = self.cache.plan(z.shape[1])
        rot = self.model.rope_at(pos)
        h = torch.stack([blk(z, rot, self.cache, j, mask) for j, blk in enumerate(self.model.mtp.blocks)],
                        dim=2)  # (B, T, K-1, C)
        self.cache.lengths = [L + n for L, n in zip(self.cache.lengths, n_keep)]
        self.h_last = _at(h, n_keep)  # (B, K-1, C)

    def propose(self, ns):
        if max(ns) == 0:
            return [[] for _ in ns]
        logits = self.model.unembed(self.h_last[:, :max(ns)])  # (B, n, V)
        return [d[:n] for d, n in zip(logits.float().argmax(-1).tolist(), ns)]

    def feedback(self, out, n_keep, rows):
        self._extend(out.pre_last, n_keep)

    def keep(self, idx):
        self.cache.keep(idx)
        self.h_last = self.h_last[idx]


BATCHED = {SternDrafter: BatchedStern, MetaDrafter: BatchedMeta}


def for_rows(drafters: list, *, per_row: bool = False):
    """The batch drafter for these per-row drafters: the batched heads where there are some, else `PerRow`."""
    cls = BATCHED.get(type(drafters[0]))
    return cls() if (cls is not None and not per_row) else PerRow(drafters)
