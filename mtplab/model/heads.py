"""The three multi-token head families, on top of the `GPT` trunk.

B batch, T time, C channels, K prediction depths, V vocabulary.

Depth 1 is always the trunk's own next-token head (the original model); a family adds
depths 2..K. All families share the trunk's final norm and vocabulary projection
(`GPT.unembed`); DeepSeek's modules also share its embedding.

* Stern et al. 2018 (blockwise parallel decoding): a shared FFN h -> 4h, a per-depth
  FFN 4h -> h with a residual back to the trunk's hidden state, then the shared output.
* Gloeckle et al. 2024 (Meta): the trunk is every layer but the last; the last layer is
  head 1 and each extra depth is its own transformer layer on the trunk's output.
* DeepSeek-V3 (sec. 2.2): D sequential modules; module k at position i sees the
  previous depth's hidden state and Emb(t_{i+k}) and predicts t_{i+k+1}.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from mtplab.model.config import ModelConfig
from mtplab.model.layers import Block, KVCache, Linear, RMSNorm, StackedBlocks


class SternHeads(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        C, K = cfg.n_embd, cfg.n_depths
        self.up = Linear(C, 4 * C)  # shared h -> 4h
        # per-depth 4h -> h, batched as one weight (K-1, C, 4C); zero init: every depth starts as a copy of depth 1
        self.down_w = nn.Parameter(torch.zeros(K - 1, C, 4 * C))
        self.down_b = nn.Parameter(torch.zeros(K - 1, C))
        nn.init.normal_(self.up.weight, std=0.02)
        nn.init.zeros_(self.up.bias)

    def hidden(self, h, n: int | None = None):
        """h: (B, T, C) trunk output -> (B, T, n, C) hidden state of depths 2..n+1 (default: all K-1)."""
        n = self.down_w.shape[0] if n is None else n
        u = F.relu(self.up(h))  # (B, T, 4C)
        # Stern et al. 2018 sec. 6: p_d(y | x) = softmax(W (f_d(h) + h)): a residual back to the trunk's state
        return h.unsqueeze(2) + torch.einsum("btf,kcf->btkc", u, self.down_w[:n]) + self.down_b[:n]  # (B, T, n, C)

    def train_logits(self, model, idx, out):
        return model.unembed(self.hidden(out.hidden))  # (B, T, K-1, V)


class MetaHeads(nn.Module):
    def __init__(self, cfg: ModelConfig, last_block: nn.Module | None = None):
        super().__init__()
        blocks = [Block(cfg) for _ in range(cfg.n_depths - 1)]
        if last_block is not None:  # start each extra head as a copy of head 1 (the trunk's last layer)
            for b in blocks:
                b.load_state_dict(last_block.state_dict())
        self.blocks = nn.ModuleList(blocks)

    def new_cache(self, model, batch: int = 1, max_len: int | None = None) -> KVCache:
        return KVCache.for_config(model.config, len(self.blocks), batch=batch, max_len=max_len, like=model.wte.weight)

    def stacked(self) -> StackedBlocks:
        """The K-1 head layers as one stacked block, for drafting (same outputs as `hidden`, fewer ops)."""
        return StackedBlocks(list(self.blocks))

    def hidden(self, model, z, cache: KVCache | None = None):
        """z: (B, T, C) trunk output (input of the last layer) -> (B, T, K-1, C)."""
        start = cache.length if cache is not None else 0
        rot = model.rope(start, z.shape[1])
        hs = [blk(z, rot, cache, j) for j, blk in enumerate(self.blocks)]
        if cache is not None:
            cache.advance(z.shape[1])
        return torch.stack(hs, dim=2)  # (B, T, K-1, C)

    def train_logits(self, model, idx, out):
        return model.unembed(self.hidden(model, out.pre_last))  # (B, T, K-1, V)


class DeepSeekModule(nn.Module):
    """One MTP module: projection M_k (2d -> d), then a transformer block TRM_k."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm_h = RMSNorm(cfg.n_embd)
        self.norm_e = RMSNorm(cfg.n_embd)
        self.proj = Linear(2 * cfg.n_embd, cfg.n_embd, bias=False)  # M_k in R^{d x 2d}
        self.block = Block(cfg)
        nn.init.normal_(self.proj.weight, std=0.02)

    def forward(self, model, h_prev, emb_next, cache: KVCache | None = None):
        """h_prev: (B, T, C) depth k-1 hidden at positions i; emb_next: (B, T, C) Emb(t_{i+k})."""
        # DeepSeek-V3 eq. (21): h'_i^k = M_k [RMSNorm(h_i^{k-1}); RMSNorm(Emb(t_{i+k}))]
        h = self.proj(torch.cat([self.norm_h(h_prev), self.norm_e(emb_next)], dim=-1))  # (B, T, C)
        start = cache.length if cache is not None else 0
        rot = model.rope(start, h.shape[1])
        # eq. (22): h_{1:T-k}^k = TRM_k(h'_{1:T-k}^k)
        h = self.block(h, rot, cache, 0)
        if cache is not None:
            cache.advance(h.shape[1])
        return h


class DeepSeekModules(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.layers = nn.ModuleList(DeepSeekModule(cfg) for _ in range(cfg.n_depths - 1))

    def train_logits(self, model, idx, out):
        """Teacher forcing: module k reads the true token t_{i+k}. Positions i > T-1-k are left at zero."""
        B, T = idx.shape
        h = out.hidden
        V = model.config.vocab_size
        per_depth = []
        for k, mod in enumerate(self.layers, start=1):
            if T - k <= 0:
                per_depth.append(h.new_zeros(B, T, V))
                continue
            h = mod(model, h[:, : T - k], model.wte(idx[:, k:]))  # (B, T-k, C)
            # eq. (23): P^k_{i+k+1} = OutHead(h_i^k)
            logits = model.unembed(h)  # (B, T-k, V)
            per_depth.append(F.pad(logits, (0, 0, 0, k)))  # (B, T, V), zeros where no input token exists
        return torch.stack(per_depth, dim=2)  # (B, T, K-1, V)


BUILD = {"stern": lambda cfg, last: SternHeads(cfg), "meta": lambda cfg, last: MetaHeads(cfg, last_block=last),
         "deepseek": lambda cfg, last: DeepSeekModules(cfg)}  # family -> its heads (Meta's copy the last block)


def build_heads(cfg: ModelConfig, last_block: nn.Module | None = None) -> nn.Module | None:
    return None if cfg.heads == "none" else BUILD[cfg.heads](cfg, last_block)
