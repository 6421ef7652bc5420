"""The lab's own forward for Llama-family checkpoints (SmolLM2): every row of a verify is the one-token decode's row.

B batch, T time (new tokens in this call), P cached positions, C channels, H query heads, Hkv key/value heads,
G = H / Hkv query heads per key/value head, D head dim, F MLP width, V vocabulary, L layers.

transformers loads the weights and the config and stays the reference (the tests hold this forward's logits to its
forward within a tolerance); this module computes (Touvron et al. 2023, Llama: pre-norm, RoPE, SwiGLU):

    x_0 = Emb(t)
    a_l = x_l + W_o Attn(RoPE(W_q n), RoPE(W_k n), W_v n),  n = RMSNorm(x_l)
    x_{l+1} = a_l + W_down (SiLU(W_gate m) * W_up m),       m = RMSNorm(a_l)
    logits = W_out RMSNorm(x_L)

Exact by construction: for T <= EXACT_ROWS new tokens, row i of the T-row call is bit for bit the one-token call at
its position, so a greedy verify accepts exactly what greedy AR would have produced:
* every linear goes through `mtplab.model.kernels.linear` and every RMSNorm through `kernels.rms_norm`, whose rows
  do not depend on one another;
* RoPE, SiLU, products and residual adds work element by element;
* attention computes each query row alone, row i reading the cached keys plus new rows 0..i (or, with a mask, the
  keys it sees), by the same code in the same order as a one-token decode: all rows of a layer in one call of
  `mtplab.model.attend` (head sizes that are multiples of 16), else one `attend_row` per row.
Above EXACT_ROWS rows (a prefill, teacher-forced training) attention is one batched causal call: a prefill is shared
by AR and every speculative method, so its rows need not match anything.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from mtplab.errors import MtplabError
from mtplab.model import attend, kernels
from mtplab.model.gpt import TrunkOutput
from mtplab.model.layers import KVCache, causal_mask

EXACT_ROWS = kernels.MAX_ROWS  # new tokens up to which every row is the one-token forward's
LLAMA_TYPES = ("llama",)       # config.model_type values this forward computes


def unsupported(hf) -> str | None:
    """Why this forward cannot compute `hf` (a transformers causal LM), or None when it can."""
    c = hf.config
    if getattr(c, "model_type", None) not in LLAMA_TYPES:
        return f"model_type {getattr(c, 'model_type', None)!r} is not Llama-family"
    if getattr(c, "hidden_act", "silu") != "silu":
        return f"hidden_act {c.hidden_act!r} (this forward computes SiLU-gated MLPs)"
    if (getattr(c, "pretraining_tp", 1) or 1) != 1:
        return f"pretraining_tp {c.pretraining_tp}"
    rope = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
    kind = str(rope.get("rope_type", rope.get("type", "default")))
    if "dynamic" in kind:
        return f"rope_type {kind!r} (this forward reads one rotary table, made at load)"
    base = hf.base_model
    if not all(hasattr(base, n) for n in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return f"{type(base).__name__} lacks the Llama modules (embed_tokens, layers, norm, rotary_emb)"
    return None


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in the Llama layout (Su et al. 2021; the two halves of each head are a channel pair):
    x * cos + rotate_half(x) * sin, with rotate_half([x1, x2]) = [-x2, x1]. x: (B, T, heads, D); cos, sin: (T, D),
    or (B, T, D) when each row has its own positions (a token tree, a ragged batch)."""
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[..., None, :] + turned * sin[..., None, :]


def attend_row(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """One query row against n keys: softmax(q k^T * scale) v, with G query heads sharing each key/value head.
    q: (B, H, D); keys, values: (B, Hkv, n, D) -> (B, H*D). A one-token decode is this call with the new token's
    row; a verify calls it once per row, with the same shapes for the same position."""
    B, H, D = q.shape
    Hkv = keys.shape[1]
    # the G query heads of one key/value head, read as G queries of that head: no mask, each sees every key
    y = F.scaled_dot_product_attention(q.view(B, Hkv, H // Hkv, D), keys, values, scale=scale)  # (B, Hkv, G, D)
    return y.reshape(B, H * D)


def check_mask(mask: torch.Tensor | None, B: int, T: int, P: int) -> torch.Tensor | None:
    """mask (B or 1, 1, T, P+T) bool -> (B or 1, T, P+T); None stays None (causal). Every query must see a key."""
    if mask is None:
        return None
    if mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[0] not in (1, B) or tuple(mask.shape[1:]) != (1, T, P + T):
        raise MtplabError(f"mask must be bool (B or 1, 1, T, P+T) = ({B} or 1, 1, {T}, {P + T}): which of the P cached and "
                          f"T new keys each new token sees (got {mask.dtype} {tuple(mask.shape)})")
    seen = mask[:, 0]
    if not bool(seen.any(-1).all()):
        raise MtplabError("every query must see at least one key (its own, at least); fix the mask")
    return seen


def visible(seen: torch.Tensor | None, B: int, T: int, P: int) -> list[list]:
    """For each new row t and sequence b, the keys it attends to, in order: a slice 0..n-1 when they are a prefix
    (causal: n = P+t+1), else their indices. A tree's node sees the prefix, then its ancestors and itself."""
    if seen is None:
        return [[slice(0, P + t + 1)] * B for t in range(T)]
    rows = []
    for t in range(T):
        row = []
        for b in range(B):
            keys = seen[min(b, seen.shape[0] - 1), t].nonzero()[:, 0]
            row.append(slice(0, len(keys)) if int(keys[-1]) == len(keys) - 1 else keys)
        rows.append(row)
    return rows


class LlamaLayer:
    """One decoder layer's weights: q, k and v as one (H*D + 2*Hkv*D, C) matrix, gate and up as one (2F, C)."""

    def __init__(self, layer):
        att, mlp = layer.self_attn, layer.mlp
        self.norm1, self.norm2 = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        self.eps = layer.input_layernorm.variance_epsilon
        self.qkv, self.qkv_b = fuse([att.q_proj, att.k_proj, att.v_proj])
        self.o, self.o_b = att.o_proj.weight, att.o_proj.bias
        self.gate_up, self.gate_up_b = fuse([mlp.gate_proj, mlp.up_proj])
        self.down, self.down_b = mlp.down_proj.weight, mlp.down_proj.bias


def fuse(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weights (and biases) of linears that read one input, stacked by output: one kernel call instead of
    several. Each linear's weight then becomes a view of the stacked one, so the model's memory does not grow."""
    w = torch.cat([m.weight.detach() for m in linears])  # (sum of outputs, C)
    at = 0
    for m in linears:
        n = m.weight.shape[0]
        m.weight.data = w[at:at + n]
        at += n
    if all(m.bias is None for m in linears):
        return w, None
    b = torch.cat([m.bias.detach() if m.bias is not None else w.new_zeros(m.weight.shape[0]) for m in linears])
    return w, b


class LlamaForward:
    """A transformers Llama causal LM computed by the lab (see the module docstring). `__call__(idx, cache)` returns
    the `TrunkOutput` that `HFTarget` gives the decoders; `new_cache` the lab's `KVCache` of every layer (preallocated,
    `crop(n)` drops rejected drafts)."""

    def __init__(self, hf, max_context: int):
        c, base = hf.config, hf.base_model
        self.H, self.Hkv = c.num_attention_heads, c.num_key_value_heads
        self.D = getattr(c, "head_dim", None) or c.hidden_size // self.H
        self.scale = self.D ** -0.5
        self.n_layer = c.num_hidden_layers
        self.embed = base.embed_tokens.weight
        self.layers = [LlamaLayer(layer) for layer in base.layers]
        self.norm, self.eps = base.norm.weight, base.norm.variance_epsilon
        self.out = hf.get_output_embeddings().weight  # (V, C), the embedding itself when tied
        ctx = min(int(c.max_position_embeddings), max_context)
        pos = torch.arange(ctx, device=self.embed.device)[None]  # (1, ctx)
        with torch.no_grad():  # transformers' own rotary table (any rope type), cos and sin: (ctx, D) each
            cos, sin = base.rotary_emb(self.embed[:1], pos)
        self.cos, self.sin = cos[0], sin[0]

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> KVCache:
        return KVCache(self.n_layer, batch, self.Hkv, max_len or self.cos.shape[0], self.D,
                       dtype=self.embed.dtype, device=self.embed.device)

    def unembed(self, h: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Final norm, then the output projection (over `rows` of it when given: a draft vocabulary, (N, C))."""
        return kernels.linear(kernels.rms_norm(h, self.norm, self.eps), self.out if rows is None else rows)

    def attention(self, lay: LlamaLayer, x: torch.Tensor, cache: KVCache | None, layer: int, rope, seen,
                  keys, rows: attend.Rows | None) -> torch.Tensor:
        """x: (B, T, C) normed input, written to the cache at P..P+T-1 (P = cache length, 0 without a cache); rope:
        (cos, sin) of its positions; seen: (B or 1, T, P+T) bool, the keys each query may see (None: causal); keys:
        `visible(seen)` for a verify of up to EXACT_ROWS rows, else None; rows: the same keys for the exact attention
        kernel (row b*T + t), None where it does not serve -> (B, T, C)."""
        B, T, _ = x.shape
        H, Hkv, D = self.H, self.Hkv, self.D
        P = cache.length if cache is not None else 0
        qkv = kernels.linear(x, lay.qkv, lay.qkv_b)  # (B, T, (H + 2 Hkv) D)
        qk = qkv[..., :(H + Hkv) * D].view(B, T, H + Hkv, D)  # (B, T, H + Hkv, D) q and k rotated together
        qk = rotate(qk, *rope)
        q, k = qk[:, :, :H], qk[:, :, H:].transpose(1, 2)  # (B, T, H, D), (B, Hkv, T, D)
        v = qkv[..., (H + Hkv) * D:].view(B, T, Hkv, D).transpose(1, 2)  # (B, Hkv, T, D)
        if cache is not None:
            k, v = cache.append(layer, k, v)  # (B, Hkv, P+T, D)
        if rows is not None:  # every row in one call, each alone over the keys it sees (`mtplab.model.attend`)
            kv = (cache.k[layer], cache.v[layer]) if cache is not None else (k, v)  # (B, Hkv, S, D) the slots
            y = attend.attend(q.reshape(B * T, H, D), *kv, rows, self.scale).view(B, T, H * D)
        elif keys is not None:  # each row alone over the keys it sees, as the one-token decode of its sequence does
            y = torch.stack([torch.cat([attend_row(q[b:b + 1, t], k[b:b + 1, :, ks], v[b:b + 1, :, ks], self.scale)
                                        for b, ks in enumerate(row)]) for t, row in enumerate(keys)], dim=1)  # (B, T, H*D)
        else:  # a prefill: one batched call
            mask = seen[:, None] if seen is not None else causal_mask(P, T, x.device) if P else None
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask, is_causal=mask is None,
                                               scale=self.scale, enable_gqa=True)  # (B, H, T, D)
            y = y.transpose(1, 2).reshape(B, T, H * D)  # (B, T, H*D)
        return kernels.linear(y, lay.o, lay.o_b)

    def mlp(self, lay: LlamaLayer, x: torch.Tensor) -> torch.Tensor:
        """SwiGLU (Shazeer 2020): W_down (SiLU(W_gate x) * W_up x). x: (B, T, C) normed."""
        gate, up = kernels.linear(x, lay.gate_up, lay.gate_up_b).chunk(2, dim=-1)  # (B, T, F) each
        return kernels.linear(F.silu(gate) * up, lay.down, lay.down_b)

    def rope_at(self, P: int, T: int, positions: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) of positions P..P+T-1, (T, D) each; or of explicit `positions` (B, T), (B, T, D) each."""
        ctx = self.cos.shape[0]
        if positions is None:
            if P + T > ctx:
                raise MtplabError(f"positions {P}..{P + T - 1} exceed the context window of {ctx}; shorten the prompt "
                                  "or ask for fewer new tokens")
            return self.cos[P:P + T], self.sin[P:P + T]
        if int(positions.min()) < 0 or int(positions.max()) >= ctx:
            raise MtplabError(f"positions must lie in 0..{ctx - 1} (the context window); got "
                              f"{int(positions.min())}..{int(positions.max())}")
        return self.cos[positions], self.sin[positions]

    def __call__(self, idx: torch.Tensor, cache: KVCache | None = None, *, positions: torch.Tensor | None = None,
                 mask: torch.Tensor | None = None) -> TrunkOutput:
        """idx: (B, T) token ids; with a cache they are written at cache.length.. and the cache advances by T.

        `positions` (B, T) and `mask` (B or 1, 1, T, P+T) bool, both optional, override the positions P..P+T-1 and the
        causal mask, as `mtplab.model.gpt.GPT.forward` takes them: each token's rotary position and the keys each
        query may see (a token tree's nodes sit at L + depth and see the prefix and their ancestors,
        `mtplab.decoding.tree`). Every row is then the one-token forward of its own sequence (its branch), bit for bit."""
        B, T = idx.shape
        P = cache.length if cache is not None else 0
        if positions is not None and tuple(positions.shape) != (B, T):
            raise MtplabError(f"positions must be (B, T) = {(B, T)}, one per token of idx (got {tuple(positions.shape)})")
        rope = self.rope_at(P, T, positions)
        seen = check_mask(mask, B, T, P)
        keys = visible(seen, B, T, P) if T <= EXACT_ROWS else None
        rows = None
        if keys is not None and attend.ready(self.D) and self.embed.dtype == torch.float32 and self.embed.is_cpu:
            rows = attend.Rows.of([np.arange(ks.stop) if isinstance(ks, slice) else ks.numpy()
                                   for row in zip(*keys) for ks in row], [b for b in range(B) for _ in range(T)])
        x = F.embedding(idx, self.embed)  # (B, T, C)
        pre_last = x
        for i, lay in enumerate(self.layers):
            if i == len(self.layers) - 1:
                pre_last = x  # the last layer's input: Meta heads branch off here
            x = x + self.attention(lay, kernels.rms_norm(x, lay.norm1, lay.eps), cache, i, rope, seen, keys, rows)
            x = x + self.mlp(lay, kernels.rms_norm(x, lay.norm2, lay.eps))
        if cache is not None:
            cache.advance(T)
        return TrunkOutput(hidden=x, logits=self.unembed(x), pre_last=pre_last)
