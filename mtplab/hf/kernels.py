"""Kernels for the verify forward on a CPU: a linear over a few rows that reads its weights once.

A decode step of speculative decoding runs the target over q = 2..8 new tokens. On a GPU, and on a CPU whose
matrix unit is busy anyway, that costs about what one token costs: the weights are read once for all q rows.
Stock float32 GEMM on a CPU does not do that for a few rows: measured here (one thread), a 49,152 x 576 projection
over 4 rows cost 3-5x one row, and the trunk's 1536 x 576 linears 1.8x. `streamed` splits each weight into
blocks of about `BLOCK_BYTES` (they stay in the core's L2 cache while every row uses them) and multiplies all rows
by one block before moving to the next, so the weights stream from memory once per forward.

A one-row forward (autoregressive decoding, the baseline) is left exactly as it was. A row of a multi-row call is
computed by another kernel than the one-row call, so its last bits can differ (about 1e-6 relative in float32), as
they already do with the stock multi-row GEMM; greedy output stays identical to AR's unless two logits tie to that
precision, which `bench real` counts on every prompt rather than assumes.
"""
from __future__ import annotations

import types

import torch
import torch.nn as nn

BLOCK_BYTES = 1 << 20   # a weight block: ~1 MiB stays in a core's L2 while every row of the call uses it
MAX_ROWS = 16           # above this the stock GEMM is efficient enough


def _streamed_forward(self, x):
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    w = self.weight
    if rows <= 1 or rows > MAX_ROWS or w.dtype != torch.float32 or w.device.type != "cpu" or \
            (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)):
        return nn.functional.linear(x, w, self.bias)
    x2 = x.reshape(rows, x.shape[-1])
    out = torch.empty(rows, self.out_features, dtype=x.dtype)
    for s, block in self._mtplab_blocks(w):
        out[:, s:s + block.shape[0]] = torch.mm(x2, block.t())
    if self.bias is not None:
        out = out + self.bias
    return out.reshape(*x.shape[:-1], self.out_features)


def streamed(model: nn.Module, *, block_bytes: int = BLOCK_BYTES, min_bytes: int = 0) -> int:
    """Give every `nn.Linear` of `model` the streamed multi-row forward (in place); returns how many. Idempotent;
    `plain(model)` undoes it."""
    n = 0
    for m in model.modules():
        if isinstance(m, nn.Linear) and m.weight.numel() * 4 >= min_bytes:
            step = max(16, block_bytes // (4 * m.in_features))
            m._mtplab_blocks = lambda w, step=step: [(s, w[s:s + step]) for s in range(0, w.shape[0], step)]
            m.forward = types.MethodType(_streamed_forward, m)
            n += 1
    return n


def plain(model: nn.Module) -> int:
    """Back to the stock forward of every `nn.Linear`; returns how many were streamed."""
    n = 0
    for m in model.modules():
        if isinstance(m, nn.Linear) and "forward" in m.__dict__:
            del m.forward
            n += 1
    return n
