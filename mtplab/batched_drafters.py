"""Drafters for a batch of rows (`mtplab.batched`): every row's drafts from one call a step.

B rows, T positions of a forward per row, C channels, V vocabulary, K-1 extra depths, n drafts.

The contract, the batched sibling of `mtplab.drafters.Drafter`:
    begin(model, out, rows)       after the prefill forward `out` (B, T, ...); row b's prompt is its first rows
    propose(ns) -> list[list[int]] ns[b] drafts for row b (0: none)
    feedback(out, n_keep, rows)   after each verify forward: row b keeps its first n_keep[b] positions
    keep(idx)                     only these rows stay (the others finished)
`PerRow` runs any B = 1 drafter once per row; `BatchedStern` and `BatchedMeta` run the heads once for the
whole batch and give the same drafts (tested). `for_rows` picks the batched one where there is one.
"""
from __future__ import annotations

import torch

from .drafters import MetaDrafter, SternDrafter
from .layers import RaggedKVCache
from .model import TrunkOutput


def row_output(out: TrunkOutput, b: int, n: int) -> TrunkOutput:
    """Row b's first n positions of a batched forward, shaped as a B = 1 forward (what a drafter reads)."""
    return TrunkOutput(hidden=out.hidden[b:b + 1, :n], logits=out.logits[b:b + 1, :n],
                       pre_last=out.pre_last[b:b + 1, :n])


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
            d.begin(model, r.tokens, row_output(out, b, n), n, max_new_tokens=r.max_new_tokens, generator=None,
                    temperature=0.0, top_k=None)

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
