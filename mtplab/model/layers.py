"""Building blocks shared by the trunk and the head families: RMSNorm, rotary positions, the KV cache,
causal self-attention, the MLP and the pre-norm transformer block; and `RaggedKVCache`, a cache whose rows
have their own lengths (`mtplab.decoding.batch`).

B batch, T time (new tokens in this call), P cached positions, C channels, H heads, D head dim (C // H).

The decode step is what the lab times, so these are written to issue few small ops: the norm is one fused
kernel, rotary rotates q and k together as complex numbers, and the causal mask of a cached forward is a
view of one table built once (for windows up to MASK_CACHE positions; a longer one gets a mask of its own size).

Row-invariant by default (`mtplab.model.kernels`): outside autograd, a CPU forward over up to 16 new tokens computes
row i as the one-token forward at that position computes it, bit for bit. Every linear is the exact kernel, each norm
normalises its row alone, rotary turns each channel pair alone (the same elementwise loop for any number of rows),
and with a cache the attention of the new rows runs one query row at a time, with the shapes and ops of a one-token
decode (a token tree's node, or a ragged batch's row, over the keys it may see, gathered in order). A prefill of more
than 16 rows takes the stock kernels: every decoder of one prompt shares it, but a batch's prefill is not each
prompt's own. So a verify's rows are what plain decoding computes, and greedy speculative output
equals greedy AR's by construction, not by observation.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from mtplab.model import kernels
from mtplab.model.config import ModelConfig
from mtplab.errors import MtplabError


class Linear(nn.Linear):
    """nn.Linear through `kernels.linear`: exact for a few rows outside autograd, F.linear elsewhere."""

    def forward(self, x):
        return kernels.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    """RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g, computed in float32."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return kernels.rms_norm(x, self.weight, self.eps)
        return F.rms_norm(x.float(), self.weight.shape, self.weight.float(), self.eps).to(x.dtype)


def rotary_table(block_size: int, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """(block_size, D/2) complex unit numbers e^{i * pos * base^(-2j/D)}: channel pair j of position pos
    is rotated by that angle (RoFormer, Su et al. 2021)."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
    ang = torch.outer(torch.arange(block_size).float(), inv)  # (block_size, D/2)
    return torch.polar(torch.ones_like(ang), ang)


def apply_rotary(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """x: (B, T, ..., D) with channel pairs (x[2j], x[2j+1]) read as one complex number; rot: (T, D/2),
    or (B, T, D/2) when each row has its own positions.
    Returns x rotated, same shape and dtype. q and k go through in one call (stacked on a middle axis)."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))  # (B, T, ..., D/2)
    if rot.dim() == 2:
        shape = (x.shape[1],) + (1,) * (x.dim() - 3) + (rot.shape[-1],)
    else:  # (B, T, D/2): a position per row and token (ragged batches, token trees)
        shape = tuple(rot.shape[:2]) + (1,) * (x.dim() - 3) + (rot.shape[-1],)
    return torch.view_as_real(xc * rot.view(shape)).flatten(-2).to(x.dtype)


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

    @classmethod
    def for_config(cls, cfg: ModelConfig, n_layers: int, *, batch: int = 1, max_len: int | None = None,
                   like: torch.Tensor) -> "KVCache":
        """A cache shaped for `cfg`, with the dtype and device of the tensor `like` (a model weight)."""
        return cls(n_layers, batch, cfg.n_head, max_len or cfg.block_size, cfg.n_embd // cfg.n_head,
                   dtype=like.dtype, device=like.device)

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
        self.qkv = Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.proj = Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.dropout = cfg.dropout

    def forward(self, x, rot, cache: KVCache | None = None, layer: int = 0, mask: torch.Tensor | None = None):
        """x: (B, T, C); rot: (T, D/2) rotary factors of these positions. With a cache, x sits at positions
        len(cache)..len(cache)+T-1 and `mask` (T, P+T) says which keys each query may see (None: causal)."""
        B, T, C = x.shape
        H = self.n_head
        qkv = self.qkv(x).view(B, T, 3, H, C // H)  # (B, T, 3, H, D)
        qk = apply_rotary(qkv[:, :, :2], rot)  # (B, T, 2, H, D) q and k rotated together, each element alone
        q, k = qk[:, :, 0].transpose(1, 2), qk[:, :, 1].transpose(1, 2)  # (B, H, T, D)
        v = qkv[:, :, 2].transpose(1, 2)  # (B, H, T, D)
        p = 0
        if cache is not None:
            p = cache.length
            k, v = cache.append(layer, k, v)  # (B, H, P+T, D)
        drop = self.dropout if self.training else 0.0
        if mask is not None and cache is not None and drop == 0.0 and kernels.exact_rows(x):
            # a token tree's verify or a ragged batch: each row attends to the keys it may see (its prefix, and its
            # ancestors in a tree), gathered in order, as the one-token decode of that sequence alone does
            y = torch.cat([self.rows_alone(q[b:b + 1], k[b:b + 1], v[b:b + 1], mask[min(b, mask.shape[0] - 1), 0])
                           for b in range(B)], dim=0)
        elif mask is not None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop)
        elif T == 1:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=drop)  # one query sees every key
        elif isinstance(cache, KVCache) and drop == 0.0 and kernels.exact_rows(x):
            # a verify: each new row attends as the one-token decode at its position does (same shapes, same ops)
            y = torch.cat([F.scaled_dot_product_attention(q[:, :, t:t + 1], k[:, :, :p + t + 1], v[:, :, :p + t + 1])
                           for t in range(T)], dim=2)  # (B, H, T, D)
        elif p == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(p, T, x.device), dropout_p=drop)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return self.proj(y)

    @staticmethod
    def rows_alone(q, k, v, seen):
        """q (1, H, T, D), k and v (1, H, P, D), seen (T, P) bool -> (1, H, T, D): query t over the keys it sees."""
        keys = seen.nonzero()[:, 1].split(seen.sum(1).tolist())  # per query, the indices of its visible keys
        return torch.cat([F.scaled_dot_product_attention(q[:, :, t:t + 1], k[:, :, idx], v[:, :, idx])
                          for t, idx in enumerate(keys)], dim=2)


_MASKS: dict = {}
MASK_CACHE = 1024  # positions of the shared table (1 MB of bools); a longer window gets a mask of its own size


def causal_mask(p: int, T: int, device) -> torch.Tensor:
    """(T, p+T) bool: query t (at absolute position p+t) may see keys 0..p+t. Within MASK_CACHE positions, a
    view of one cached table; beyond, built for this window alone (T * (p+T) bools, never the square)."""
    if p + T > MASK_CACHE:
        return torch.ones(T, p + T, dtype=torch.bool, device=device).tril(diagonal=p)
    full = _MASKS.get(device)
    if full is None:
        full = _MASKS[device] = torch.ones(MASK_CACHE, MASK_CACHE, dtype=torch.bool, device=device).tril()
    return full[p:p + T, :p + T]


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False)
        self.proj = Linear(4 * cfg.n_embd, cfg.n_embd, bias=False)
        self.dropout = cfg.dropout

    def forward(self, x):
        y = self.proj(F.gelu(self.fc(x), approximate="tanh"))
        return F.dropout(y, self.dropout) if self.training and self.dropout > 0 else y


class Block(nn.Module):
    """Pre-norm transformer block: x + Attn(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm1 = RMSNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.norm2 = RMSNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x, rot, cache=None, layer=0, mask=None):
        x = x + self.attn(self.norm1(x), rot, cache, layer, mask)
        return x + self.mlp(self.norm2(x))


class StackedBlocks:
    """G transformer blocks with their own weights run side by side on one input, as batched matmuls.

    For drafting with parallel heads (Meta's extra layers all read the same trunk output z): one block's
    worth of small ops instead of G, the same bytes of weights. Inference only; the weights are copied
    (stacked) once, so build it again after training. G groups, then B, T, C, H, D as above.
    """

    def __init__(self, blocks):
        def stack(get):
            return torch.stack([get(b).detach() for b in blocks])

        self.n_head = blocks[0].attn.n_head
        self.eps = blocks[0].norm1.eps
        self.norm1 = stack(lambda b: b.norm1.weight).unsqueeze(1)  # (G, 1, C)
        self.norm2 = stack(lambda b: b.norm2.weight).unsqueeze(1)  # (G, 1, C)
        self.qkv = stack(lambda b: b.attn.qkv.weight.t())      # (G, C, 3C)
        self.proj = stack(lambda b: b.attn.proj.weight.t())    # (G, C, C)
        self.fc = stack(lambda b: b.mlp.fc.weight.t())         # (G, C, 4C)
        self.down = stack(lambda b: b.mlp.proj.weight.t())     # (G, 4C, C)

    def __call__(self, z, rot, cache: KVCache) -> torch.Tensor:
        """z: (1, T, C) at positions len(cache)..len(cache)+T-1 -> (G, T, C), one row per block; the cache
        holds one layer per block (batch 1) and is advanced by T."""
        G, C = self.qkv.shape[0], self.qkv.shape[1]
        T, H = z.shape[1], self.n_head
        x = z.expand(G, T, C)  # (G, T, C) the same input for every block
        h = F.rms_norm(x, (C,), None, self.eps) * self.norm1
        qkv = torch.bmm(h, self.qkv).view(G, T, 3, H, C // H)  # (G, T, 3, H, D)
        qk = apply_rotary(qkv[:, :, :2], rot)
        q, k = qk[:, :, 0].transpose(1, 2), qk[:, :, 1].transpose(1, 2)  # (G, H, T, D)
        v = qkv[:, :, 2].transpose(1, 2)
        p, end = cache.length, cache.length + T
        if end > cache.max_len:
            raise MtplabError(f"KV cache is full ({cache.max_len} positions); use a shorter prompt or fewer new tokens")
        cache.k[:, 0, :, p:end] = k
        cache.v[:, 0, :, p:end] = v
        keys, values = cache.k[:, 0, :, :end], cache.v[:, 0, :, :end]  # (G, H, P+T, D)
        mask = None if T == 1 or p == 0 else causal_mask(p, T, z.device)  # p == 0: is_causal, no table
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=p == 0 and T > 1)
        x = x + torch.bmm(y.transpose(1, 2).reshape(G, T, C), self.proj)
        h = F.rms_norm(x, (C,), None, self.eps) * self.norm2
        x = x + torch.bmm(F.gelu(torch.bmm(h, self.fc), approximate="tanh"), self.down)
        cache.advance(T)
        return x


class RaggedKVCache:
    """Keys and values of every layer for B rows, row b holding positions 0..lengths[b]-1.

    `plan(T)` gives the positions and mask of the next forward over T tokens per row; `append` (called by
    each attention layer) writes them at each row's own offset; `lengths` is set by the decoder."""

    def __init__(self, n_layers, batch, n_head, max_len, head_dim, *, dtype=torch.float32, device="cpu"):
        shape = (n_layers, batch, n_head, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.lengths = [0] * batch

    @classmethod
    def for_model(cls, model, batch: int) -> "RaggedKVCache":
        """A cache for the trunk of `model`, with its dtype and device."""
        cfg, w = model.config, model.wte.weight
        return cls(cfg.n_layer, batch, cfg.n_head, cfg.block_size, cfg.n_embd // cfg.n_head,
                   dtype=w.dtype, device=w.device)

    def plan(self, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (B, T) = L_b + t, and mask (B, 1, T, P) with key j visible to query t of row b iff j <= L_b + t."""
        dev = self.k.device
        lens = torch.tensor(self.lengths, device=dev)
        self._pos = lens[:, None] + torch.arange(T, device=dev)  # (B, T)
        self._end = max(self.lengths) + T
        if self._end > self.max_len:
            raise MtplabError(f"KV cache is full ({self.max_len} positions); use shorter prompts or fewer new tokens")
        keys = torch.arange(self._end, device=dev)
        mask = keys[None, None, None, :] <= self._pos[:, None, :, None]  # (B, 1, T, P)
        return self._pos, mask

    def append(self, layer: int, k, v):
        """k, v: (B, H, T, D) at the planned positions; returns this layer's keys and values (B, H, P, D)."""
        rows = torch.arange(k.shape[0], device=k.device)[:, None]  # (B, 1)
        self.k[layer][rows, :, self._pos] = k.transpose(1, 2)  # indexed as (B, T, H, D)
        self.v[layer][rows, :, self._pos] = v.transpose(1, 2)
        return self.k[layer, :, :, :self._end], self.v[layer, :, :, :self._end]

    @property
    def length(self) -> int:
        """The longest row (attention reads it only when no mask is given; decoders here always give one)."""
        return max(self.lengths)

    def advance(self, q: int):
        self.lengths = [n + q for n in self.lengths]

    def keep(self, rows: list[int]):
        """Only these rows stay in the batch (the others have finished)."""
        idx = torch.tensor(rows, device=self.k.device)
        self.k, self.v = self.k[:, idx], self.v[:, idx]
        self.lengths = [self.lengths[i] for i in rows]
