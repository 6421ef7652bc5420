"""Exact attention rows: all the query rows of one verify in one call, each row computed alone, by the same code in
the same order as a one-token decode computes it, whatever the other rows are.

R query rows, H query heads, Hkv key/value heads (G = H / Hkv query heads share one), D head dim (a multiple of 16),
S cache slots, N keys over all rows.

    o = sum_j p_j v_j / sum_j p_j,   p_j = exp(s_j - max_j s_j),   s_j = (q . k_j) * scale     (Vaswani et al. 2017)

Why. A verify over q rows must give each row the bits of the one-token forward at its position. torch's fused
attention picks its blocking by the shapes of the whole call, so the lab ran one `scaled_dot_product_attention` per
query row; each call costs about 20 us of overhead per row and layer, a third of what a verify adds to t(1). Here one
compiled call serves every row, head and key list (causal rows, a token tree's nodes, a ragged batch's rows).

How each row is computed, in a fixed order that depends only on its own key count n:
* q . k_j: 16 lanes, lane l summing q[d] k_j[d] for d = l, l+16, ... by fused multiply-adds in the order of d, then
  the 16 lanes added in a fixed tree (l with l+8, then l+4, l+2, l+1); heads of 64 channels run this as
  straight-line code two keys at a time, the same operations;
* exp: one polynomial (Cephes' expf: x = n ln2 + r, a degree-6 polynomial in r, times 2^n), no libm call;
* sum_j p_j: 16 lanes over j = l, l+16, ... (zeros past n), then the same tree;
* sum_j p_j v_j: per 16 channels, four partial sums over j mod 4 (fused multiply-adds in the order of j; the last
  n mod 4 keys join the first), added as (0 + 1) + (2 + 3), then divided by the sum.
Every sum is built from explicit fused multiply-adds and adds, never reassociated by the compiler, so the one-row
call and row i of an R-row call run the same operations on the same numbers. It matches torch's attention to about
1e-7 (not bit for bit: another order). One thread.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mtplab.model import kernels

LANES = 16  # float32 lanes of one AVX-512 vector: the unit of every sum here


@dataclass(frozen=True)
class Rows:
    """Which keys each query row sees: row r belongs to sequence batch[r] and sees cache slots
    keys[start[r]:start[r+1]], in that order."""
    batch: np.ndarray  # (R,) int64
    start: np.ndarray  # (R+1,) int64
    keys: np.ndarray   # (N,) int64

    @classmethod
    def of(cls, keys: list[np.ndarray], batch: list[int]) -> "Rows":
        """From each row's key slots (int arrays, in order) and its sequence."""
        start = np.zeros(len(keys) + 1, np.int64)
        np.cumsum([len(k) for k in keys], out=start[1:])
        return cls(np.asarray(batch, np.int64), start, np.concatenate(keys).astype(np.int64, copy=False))


def ready(D: int) -> bool:
    """Whether the exact attention kernel can serve heads of size D now (numba is there, use_stock is not in force)."""
    return kernels.active() and D % LANES == 0


if kernels.EXACT:  # pragma: no branch - numba's presence decides
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    _fma, _registers = kernels._fma, kernels._registers
    _V = ir.VectorType(ir.FloatType(), LANES)
    _I32 = ir.IntType(32)

    def _vptr(context, builder, ty, value, off):
        """A pointer to the LANES floats at element `off` of a C-contiguous float32 array, or of a float32 pointer."""
        base = value if isinstance(ty, types.CPointer) else context.make_array(ty)(context, builder, value).data
        return builder.bitcast(builder.gep(base, [off]), _V.as_pointer())

    def _splat(builder, x):
        v = builder.insert_element(ir.Constant(_V, ir.Undefined), x, ir.Constant(_I32, 0))
        return builder.shuffle_vector(v, ir.Constant(_V, ir.Undefined), ir.Constant(ir.VectorType(_I32, LANES), [0] * LANES))

    def _fma_v(builder, x, y, z):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V, [_V, _V, _V]), "llvm.fma.v16f32")
        return builder.call(fn, [x, y, z])

    @intrinsic
    def _vzero(typingctx, acc, i):
        """acc[i:i+16] = 0."""
        def codegen(context, builder, sig, args):
            builder.store(ir.Constant(_V, [0.0] * LANES), _vptr(context, builder, sig.args[0], *args), align=4)
            return context.get_dummy_value()
        return types.none(acc, i), codegen

    @intrinsic
    def _vfma(typingctx, acc, i, a, ai, b, bi):
        """acc[i:i+16] = fma(a[ai:ai+16], b[bi:bi+16], acc[i:i+16]): 16 independent fused steps."""
        def codegen(context, builder, sig, args):
            p = _vptr(context, builder, sig.args[0], args[0], args[1])
            x = builder.load(_vptr(context, builder, sig.args[2], args[2], args[3]), align=4)
            y = builder.load(_vptr(context, builder, sig.args[4], args[4], args[5]), align=4)
            builder.store(_fma_v(builder, x, y, builder.load(p, align=4)), p, align=4)
            return context.get_dummy_value()
        return types.none(acc, i, a, ai, b, bi), codegen

    @intrinsic
    def _vfmas(typingctx, acc, i, s, b, bi):
        """acc[i:i+16] = fma(s, b[bi:bi+16], acc[i:i+16]) for one float32 s."""
        def codegen(context, builder, sig, args):
            p = _vptr(context, builder, sig.args[0], args[0], args[1])
            y = builder.load(_vptr(context, builder, sig.args[3], args[3], args[4]), align=4)
            builder.store(_fma_v(builder, _splat(builder, args[2]), y, builder.load(p, align=4)), p, align=4)
            return context.get_dummy_value()
        return types.none(acc, i, s, b, bi), codegen

    @intrinsic
    def _vadd(typingctx, acc, i, a, ai):
        """acc[i:i+16] += a[ai:ai+16]."""
        def codegen(context, builder, sig, args):
            p = _vptr(context, builder, sig.args[0], args[0], args[1])
            x = builder.load(_vptr(context, builder, sig.args[2], args[2], args[3]), align=4)
            builder.store(builder.fadd(builder.load(p, align=4), x), p, align=4)
            return context.get_dummy_value()
        return types.none(acc, i, a, ai), codegen

    @intrinsic
    def _vsum(typingctx, acc, i):
        """acc[i] + ... + acc[i+15] in a fixed tree: lane l with l+8, then l+4, l+2, l+1."""
        def codegen(context, builder, sig, args):
            v = builder.load(_vptr(context, builder, sig.args[0], *args), align=4)
            for w in (8, 4, 2, 1):
                lo = ir.Constant(ir.VectorType(_I32, w), list(range(w)))
                hi = ir.Constant(ir.VectorType(_I32, w), list(range(w, 2 * w)))
                v = builder.fadd(builder.shuffle_vector(v, v, lo), builder.shuffle_vector(v, v, hi))
            return builder.extract_element(v, ir.Constant(_I32, 0))
        return types.float32(acc, i), codegen

    @intrinsic
    def _vout(typingctx, acc, out, oi, total):
        """out[oi:oi+16] = ((acc[0:16] + acc[16:32]) + (acc[32:48] + acc[48:64])) / total."""
        def codegen(context, builder, sig, args):
            part = [builder.load(_vptr(context, builder, sig.args[0], args[0], ir.Constant(ir.IntType(64), LANES * c)),
                                 align=4) for c in range(4)]
            y = builder.fdiv(builder.fadd(builder.fadd(part[0], part[1]), builder.fadd(part[2], part[3])),
                             _splat(builder, args[3]))
            builder.store(y, _vptr(context, builder, sig.args[1], args[1], args[2]), align=4)
            return context.get_dummy_value()
        return types.none(acc, out, oi, total), codegen

    @intrinsic
    def _pow2(typingctx, n):
        """2.0**n as float32 for an int32 n in -126..127, from its bits."""
        def codegen(context, builder, sig, args):
            e = builder.shl(builder.add(args[0], ir.Constant(_I32, 127)), ir.Constant(_I32, 23))
            return builder.bitcast(e, ir.FloatType())
        return types.float32(types.int32), codegen

    _LOG2E, _LN2_HI, _LN2_LO = np.float32(1.4426950408889634), np.float32(0.693359375), np.float32(-2.12194440e-4)
    _EXP_POLY = tuple(np.float32(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                                              1.6666665459e-1, 5.0000001201e-1))

    @kernels._jit()
    def _exp(x):
        """e**x for float32 x <= 0 (Cephes' expf: x = n ln2 + r, |r| <= ln2/2; below -87, about 1e-38)."""
        x = max(x, np.float32(-87.0))
        n = np.float32(np.floor(x * _LOG2E + np.float32(0.5)))
        r = _fma(n, -_LN2_LO, _fma(n, -_LN2_HI, x))
        c0, c1, c2, c3, c4, c5 = _EXP_POLY
        p = _fma(_fma(_fma(_fma(_fma(c0, r, c1), r, c2), r, c3), r, c4), r, c5)
        return (_fma(p * r, r, r) + np.float32(1.0)) * _pow2(np.int32(n))

    @kernels._jit()
    def _scores(q, q0, k, kv0, D, keys, a0, n, scale, s, acc):
        """s[j] = (q . k_j) * scale for the n keys of one row and head; returns max_j s[j]. Heads of 64 channels (SmolLM2's)
        take straight-line code, two keys at a time; the sums are the same either way."""
        top = np.float32(-np.inf)
        j = 0
        if D == 64:
            while j + 1 < n:
                k0, k1 = kv0 + keys[a0 + j] * D, kv0 + keys[a0 + j + 1] * D
                _vzero(acc, 0)
                _vzero(acc, 16)
                for c in (0, 16, 32, 48):
                    _vfma(acc, 0, q, q0 + c, k, k0 + c)
                    _vfma(acc, 16, q, q0 + c, k, k1 + c)
                s[j], s[j + 1] = _vsum(acc, 0) * scale, _vsum(acc, 16) * scale
                top = max(top, max(s[j], s[j + 1]))
                j += 2
        for i in range(j, n):
            _vzero(acc, 0)
            for c in range(0, D, LANES):
                _vfma(acc, 0, q, q0 + c, k, kv0 + keys[a0 + i] * D + c)
            s[i] = _vsum(acc, 0) * scale
            top = max(top, s[i])
        return top

    @kernels._jit()
    def _attend(q, k, v, H, D, Hkv, S, batch, start, keys, scale, out, s):
        """q, out: (R*H*D,) flat (R, H, D); k, v: (B*Hkv*S*D,) flat (B, Hkv, S, D); s: scratch of S + 16 floats."""
        G = H // Hkv
        acc = _registers(64)  # 4 x 16 sums, kept in registers
        for r in range(batch.shape[0]):
            a0, n = start[r], start[r + 1] - start[r]
            for h in range(H):
                kv0 = (batch[r] * Hkv + h // G) * S * D  # this head's keys and values
                q0 = (r * H + h) * D
                top = _scores(q, q0, k, kv0, D, keys, a0, n, scale, s, acc)
                for j in range(n):
                    s[j] = _exp(s[j] - top)
                for j in range(n, n + LANES):
                    s[j] = np.float32(0.0)
                _vzero(acc, 0)
                for j in range(0, n, LANES):
                    _vadd(acc, 0, s, j)
                total = _vsum(acc, 0)
                n4 = n - n % 4
                for c in range(0, D, LANES):  # sum_j p_j v_j, 16 channels at a time
                    for i in range(0, 64, LANES):
                        _vzero(acc, i)
                    for j in range(0, n4, 4):
                        _vfmas(acc, 0, s[j], v, kv0 + keys[a0 + j] * D + c)
                        _vfmas(acc, 16, s[j + 1], v, kv0 + keys[a0 + j + 1] * D + c)
                        _vfmas(acc, 32, s[j + 2], v, kv0 + keys[a0 + j + 2] * D + c)
                        _vfmas(acc, 48, s[j + 3], v, kv0 + keys[a0 + j + 3] * D + c)
                    for j in range(n4, n):
                        _vfmas(acc, 0, s[j], v, kv0 + keys[a0 + j] * D + c)
                    _vout(acc, out, q0 + c, total)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: Rows, scale: float) -> torch.Tensor:
    """q (R, H, D) float32; k, v (B, Hkv, S, D) float32 (a layer of the cache, or the new keys), C-contiguous;
    row r over the key slots `rows` gives it -> (R, H*D). Needs `ready(D)`."""
    R, H, D = q.shape
    B, Hkv, S, _ = k.shape
    if not (k.is_contiguous() and v.is_contiguous()):
        k, v = k.contiguous(), v.contiguous()
    out = np.empty(R * H * D, np.float32)
    scratch = np.empty(S + LANES, np.float32)
    _attend(np.ascontiguousarray(q.numpy()).reshape(-1), k.numpy().reshape(-1), v.numpy().reshape(-1), H, D, Hkv, S,
            rows.batch, rows.start, rows.keys, np.float32(scale), out, scratch)
    return torch.from_numpy(out).view(R, H * D)
