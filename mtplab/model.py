"""A small decoder-only GPT trunk with a KV cache.

B batch, T time (new tokens in this call), P cached positions, C channels, H heads,
D head dim (C // H), V vocabulary, L layers.

Pre-norm RMSNorm blocks, causal self-attention with rotary positions, a tied
embedding / unembedding. `GPT.forward` returns the last block's hidden states and
the next-token logits; the multi-token head families live in `mtplab.heads` and sit
on top of these hidden states.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig
from .errors import MtplabError


class RMSNorm(nn.Module):
    """RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g, computed in float32."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def rotary_tables(block_size: int, head_dim: int, base: float = 10000.0):
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
    ang = torch.outer(torch.arange(block_size).float(), inv)  # (block_size, D/2)
    return torch.cos(ang), torch.sin(ang)


def apply_rotary(x, cos, sin):
    """x: (B, H, T, D); cos, sin: (T, D/2). Rotates channel pairs (x1, x2) by the position's angle."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    y1 = x1 * cos - x2 * sin
    y2 = x1 * sin + x2 * cos
    return torch.stack((y1, y2), dim=-1).flatten(-2)


class KVCache:
    """Keys and values of `n_layers` attention layers for positions 0..len-1.

    A forward over q new tokens writes positions len..len+q-1 of every layer and then
    calls `advance(q)`; `crop(n)` rolls back to the first n positions (rejected drafts).
    """

    def __init__(self, n_layers, batch, n_head, max_len, head_dim, *, dtype=torch.float32, device="cpu"):
        shape = (n_layers, batch, n_head, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.length = 0

    def __len__(self):
        return self.length

    def append(self, layer: int, k, v):
        """Write q new positions for one layer; return that layer's keys and values for 0..len+q-1."""
        q = k.shape[2]
        end = self.length + q
        if end > self.max_len:
            raise MtplabError(f"KV cache is full ({self.max_len} positions); use a shorter prompt or fewer new tokens")
        self.k[layer, :, :, self.length:end] = k
        self.v[layer, :, :, self.length:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def advance(self, q: int):
        self.length += q

    def crop(self, n: int):
        """Keep positions 0..n-1 (n may not exceed the current length)."""
        if n < 0 or n > self.length:
            raise ValueError(f"crop({n}) outside 0..{self.length}")
        self.length = n


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.dropout = cfg.dropout

    def forward(self, x, cos, sin, cache: KVCache | None = None, layer: int = 0):
        B, T, C = x.shape
        H = self.n_head
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, H, C // H).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, H, C // H).transpose(1, 2)  # (B, H, T, D)
        v = v.view(B, T, H, C // H).transpose(1, 2)  # (B, H, T, D)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        p = 0
        if cache is not None:
            p = cache.length
            k, v = cache.append(layer, k, v)  # (B, H, P+T, D)
        drop = self.dropout if self.training else 0.0
        if T == 1:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=drop)
        elif p == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop)
        else:
            # query t (at absolute position p+t) may see keys 0..p+t
            mask = torch.ones(T, p + T, dtype=torch.bool, device=x.device).tril(diagonal=p)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=False)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.drop(self.proj(F.gelu(self.fc(x), approximate="tanh")))


class Block(nn.Module):
    """Pre-norm transformer block: x + Attn(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm1 = RMSNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.norm2 = RMSNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, cache=None, layer=0):
        x = x + self.attn(self.norm1(x), cos, sin, cache, layer)
        return x + self.mlp(self.norm2(x))


@dataclass
class TrunkOutput:
    hidden: torch.Tensor        # (B, T, C) output of the last block, before the final norm
    logits: torch.Tensor        # (B, T, V) next-token logits (depth 1)
    pre_last: torch.Tensor      # (B, T, C) input of the last block (Meta heads branch off here)


class GPT(nn.Module):
    """Decoder-only trunk plus an optional multi-token head family (`self.mtp`)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = RMSNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: the shared embedding and output head
        cos, sin = rotary_tables(cfg.block_size, cfg.n_embd // cfg.n_head)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer))
        from .heads import build_heads  # heads import Block from here

        self.mtp = build_heads(cfg, self)

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    # ---- pieces shared with the head families -------------------------------------------
    def rope(self, start: int, length: int):
        if start + length > self.config.block_size:
            raise MtplabError(
                f"positions {start}..{start + length - 1} exceed the context window of {self.config.block_size}; "
                "shorten the prompt or ask for fewer new tokens")
        return self.rope_cos[start:start + length], self.rope_sin[start:start + length]

    def unembed(self, h):
        """The shared output head: final RMSNorm, then the (tied) vocabulary projection."""
        return self.lm_head(self.ln_f(h))

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> KVCache:
        cfg = self.config
        p = self.wte.weight
        return KVCache(cfg.n_layer, batch, cfg.n_head, max_len or cfg.block_size, cfg.n_embd // cfg.n_head,
                       dtype=p.dtype, device=p.device)

    # ---- forward -------------------------------------------------------------------------
    def forward(self, idx, cache: KVCache | None = None) -> TrunkOutput:
        """idx: (B, T) token ids. With a cache, they sit at positions len(cache)..len(cache)+T-1."""
        B, T = idx.shape
        start = cache.length if cache is not None else 0
        cos, sin = self.rope(start, T)
        x = self.wte(idx)  # (B, T, C)
        pre_last = x
        for i, block in enumerate(self.blocks):
            if i == len(self.blocks) - 1:
                pre_last = x
            x = block(x, cos, sin, cache, i)
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
        return torch.cat([out.logits.unsqueeze(2), self.mtp.train_logits(self, idx, out)], dim=2)

    def num_params(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)
