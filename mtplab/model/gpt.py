"""The trunk: a small decoder-only GPT with a KV cache, plus an optional multi-token head family.

B batch, T time (new tokens in this call), C channels, V vocabulary, L layers.

Pre-norm RMSNorm blocks (`mtplab.model.layers`), causal self-attention with rotary positions, a tied
embedding / unembedding. `GPT.forward` returns the last block's hidden states and the next-token
logits; the multi-token head families live in `mtplab.model.heads` and sit on top of these hidden states.
A cached forward over a few new tokens gives each row the bits of the one-token forward at its position
(`mtplab.model.layers`, `mtplab.model.kernels`): a verify computes what plain decoding computes.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, fields, replace
import torch
import torch.nn as nn
from mtplab.model.config import ModelConfig
from mtplab.errors import MtplabError
from mtplab.model.heads import MetaHeads, build_heads
from mtplab.model.layers import Block, KVCache, Linear, RMSNorm, rotary_table


@dataclass
class TrunkOutput:
    hidden: torch.Tensor        # (B, T, C) output of the last block, before the final norm
    logits: torch.Tensor        # (B, T, V) next-token logits (depth 1)
    pre_last: torch.Tensor      # (B, T, C) input of the last block (Meta heads branch off here)

    def cut(self, index) -> "TrunkOutput":
        """Every field indexed alike (`out.cut((slice(None), rows))`): a new field needs no change where outputs
        are cut to rows or positions."""
        return TrunkOutput(**{f.name: getattr(self, f.name)[index] for f in fields(self)})


class GPT(nn.Module):
    """Decoder-only trunk plus an optional multi-token head family (`self.mtp`)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = RMSNorm(cfg.n_embd)
        self.lm_head = Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: the shared embedding and output head
        # complex64, kept out of the module's buffers so that casting the model to bf16 leaves the angles exact
        self._rot = rotary_table(cfg.block_size, cfg.n_embd // cfg.n_head)  # (block_size, D/2)
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer))
        self.mtp = build_heads(cfg, last_block=self.blocks[-1])

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    # ---- pieces shared with the head families -------------------------------------------
    def rope(self, start: int, length: int) -> torch.Tensor:
        """(length, D/2) rotary factors of positions start..start+length-1."""
        if start + length > self.config.block_size:
            raise MtplabError(
                f"positions {start}..{start + length - 1} exceed the context window of {self.config.block_size}; "
                "shorten the prompt or ask for fewer new tokens")
        dev = self.wte.weight.device
        if self._rot.device != dev:
            self._rot = self._rot.to(dev)
        return self._rot[start:start + length]

    def unembed(self, h):
        """The shared output head: final RMSNorm, then the (tied) vocabulary projection."""
        return self.lm_head(self.ln_f(h))

    def draft_unembed(self, h):
        """What a drafter's depths project through: the full output head here (an `HFTarget` may use a draft
        vocabulary instead)."""
        return self.unembed(h)

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> KVCache:
        return KVCache.for_config(self.config, self.config.n_layer, batch=batch, max_len=max_len,
                                  like=self.wte.weight)

    # ---- forward -------------------------------------------------------------------------
    def rope_at(self, positions: torch.Tensor) -> torch.Tensor:
        """(B, T, D/2) rotary factors of explicit positions (B, T): ragged batches and token trees."""
        top = int(positions.max())
        if top >= self.config.block_size:
            raise MtplabError(f"position {top} exceeds the context window of {self.config.block_size}; "
                              "shorten the prompts or ask for fewer new tokens")
        self.rope(0, 1)  # moves the table to the model's device
        return self._rot[positions]

    def forward(self, idx, cache=None, *, positions=None, mask=None) -> TrunkOutput:
        """idx: (B, T) token ids. With a cache, they sit at positions len(cache)..len(cache)+T-1.

        `positions` (B, T) and `mask` (B or 1, 1, T, P+T) bool, both optional, override that: each token's
        rotary position and the cached keys each query may see (`mtplab.decoding.batch`, `mtplab.decoding.tree`)."""
        B, T = idx.shape
        if positions is None:
            rot = self.rope(cache.length if cache is not None else 0, T)
        else:
            rot = self.rope_at(positions)
        x = self.wte(idx)  # (B, T, C)
        pre_last = x
        for i, block in enumerate(self.blocks):
            if i == len(self.blocks) - 1:
                pre_last = x
            x = block(x, rot, cache, i, mask)
        if cache is not None:
            cache.advance(T)
        return TrunkOutput(hidden=x, logits=self.unembed(x), pre_last=pre_last)

    def depth_logits(self, idx) -> torch.Tensor:
        """Teacher-forced logits for every depth: (B, T, K, V). Depth d at position i predicts idx[i+d].

        For DeepSeek modules, depth d at position i needs token idx[i+d-1], so positions
        i > T-d are left at zero; every loss reads only positions 0..T-d of depth d.
        """
        out = self(idx)
        if self.mtp is None:
            return out.logits.unsqueeze(2)  # (B, T, 1, V)
        extra = self.mtp.train_logits(self, idx, out)  # type: ignore[operator]
        return torch.cat([out.logits.unsqueeze(2), extra], dim=2)

    def num_params(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)


def attach_heads(model: GPT, heads: str, n_depths: int) -> GPT:
    """A new model with the same trunk weights and a fresh head family (used for frozen-trunk training)."""
    cfg = model.config.with_heads(heads, n_depths)
    new = GPT(cfg).to(model.wte.weight.device)
    trunk = {n: t for n, t in model.state_dict().items() if not n.startswith("mtp.")}
    new.load_state_dict(trunk, strict=False)
    if isinstance(new.mtp, MetaHeads):  # copy head 1 into each new head again, now that the trunk's weights are in
        for b in new.mtp.blocks:
            b.load_state_dict(copy.deepcopy(new.blocks[-1].state_dict()))
    return new


def deepen_plan(n_old: int, n_layer: int) -> list[int | None]:
    """Where each block of a deepened trunk comes from: an old block's index, or None for a new identity block.

    The new blocks are spread over the gaps between the first n_old - 1 old blocks (as LLaMA Pro interleaves
    its expansion blocks), and the old last block stays last: Meta heads branch off at its input, so every
    head family reads the same hidden states as before."""
    if n_layer < n_old:
        raise MtplabError(f"deepen: the model already has {n_old} layers; ask for n_layer >= {n_old}")
    extra, gaps = n_layer - n_old, max(1, n_old - 1)
    plan: list[int | None] = []
    for i in range(n_old):
        plan.append(i)
        if i < n_old - 1 or n_old == 1:
            plan.extend([None] * (extra // gaps + (1 if i < extra % gaps else 0)))
    return plan


def deepen(model: GPT, n_layer: int) -> GPT:
    """A deeper copy of `model` that computes the same function (block expansion, Wu et al. 2024, LLaMA Pro;
    Net2Net's identity initialisation, Chen et al. 2016).

    Each new block has zero attention and MLP output projections, so x + Attn(.) + MLP(.) = x: it passes its
    input through unchanged, and the logits of every depth are the same as the original's. Training moves the
    zeros (their gradient is not zero), so the grown model starts at the old loss and can only learn more.
    The heads (`model.mtp`) are copied as they are."""
    old = model.config
    if isinstance(n_layer, bool) or not isinstance(n_layer, int):
        raise MtplabError(f"deepen: n_layer must be an integer (got {n_layer!r})")
    plan = deepen_plan(old.n_layer, n_layer)
    new = GPT(replace(old, n_layer=n_layer)).to(device=model.wte.weight.device, dtype=model.wte.weight.dtype)
    state = {n: t for n, t in model.state_dict().items() if not n.startswith("blocks.")}
    for j, src in enumerate(plan):
        if src is None:
            continue
        prefix = f"blocks.{src}."
        for n, t in model.state_dict().items():
            if n.startswith(prefix):
                state[f"blocks.{j}." + n[len(prefix):]] = t
    missing, unexpected = new.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    for j, src in enumerate(plan):
        if src is None:
            blk: Block = new.blocks[j]  # type: ignore[assignment]
            nn.init.zeros_(blk.attn.proj.weight)  # x + Attn(.) = x
            nn.init.zeros_(blk.mlp.proj.weight)   # x + MLP(.) = x
    return new
