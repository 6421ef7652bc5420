"""The exact linear: row i of a q-row call is bit for bit the one-row call on that row, for q up to MAX_ROWS.

q rows (tokens of one verify), n inputs, m outputs, JB outputs per panel.

Why. Speculative decoding checks q drafted tokens in one forward, and greedy output is identical to plain decoding
only if each verify row computes what a one-token forward computes. Stock float32 GEMM on a CPU picks its blocking
and its summation order by the number of rows, so row 0 of a four-row `F.linear` can differ from the one-row call in
its last bits; a near-tie between two logits can then flip. Equality is observed, not guaranteed.

How. Every output is one plain sum, y[i, j] = fma(x[i,n-1], W[j,n-1], ... fma(x[i,1], W[j,1], fma(x[i,0], W[j,0], 0))),
in the order of k, whatever q is: no row's sum depends on another row or on the count of rows. Each step is one
fused multiply-add (IEEE 754 fusedMultiplyAdd, `llvm.fma`: one rounding), asked for explicitly, so no compiler choice
to fuse or not can make two code paths round differently. The weights are stored once more as panels of JB outputs,
k-major (W[j0:j0+JB, k] contiguous for each k), so that a panel's JB sums advance side by side: the CPU's vector
lanes hold JB independent outputs, never parts of one sum, so nothing is reassociated. Rows go in blocks through one
loop whose block x JB sums stay in registers, and each weight vector loaded is multiplied with all of them: a block
reads the weights as one row does. The blocks are chosen at import by the CPU (ROWS; `blocks(q)` lists them):
* with AVX-512 (32 vector registers of 16 lanes), blocks of 8 (16 registers of sums at 16 lanes) while more than eight rows
  remain, then one block for the rest: of 2 for one or two rows, of 3 for three, of 4 for four, of 8 for five to
  eight. A one-row call took a block of 4 until measured on a Xeon (AMX, one thread, SmolLM2's linears and whole
  forward, the plans interleaved in one process): the block of 2 does half the arithmetic for the same weight
  reads, and a one-row forward took 53.0, 57.0 and 61.7 ms in three runs against 59.4, 62.8 and 64.2 ms with the
  block of 4 (linears alone: 47.1 against 51.4 ms; stock F.linear 47.7). There LLVM compiled the lanes as 256-bit
  vectors (the assembly: 889 ymm operands, 117 zmm), so a block of 8 needs all 32 registers for its sums;
* without it (AVX2: 16 registers of 8 lanes), blocks of 3 (12 registers of sums: with the weight vector and three
  broadcasts they fill the 16) and of 2 (8 registers): one or two rows one block of 2, three one block of 3, four two
  blocks of 2, more rows blocks of 3 while more than four or exactly three rows remain, then blocks of 2. A block of
  4 there needs all 16 registers for its sums alone and spills them to memory at every step. Measured on a Zen 3
  (AMD EPYC, one thread, SmolLM2, the two plans interleaved in one process, medians of 10): a one-row forward took
  47.0 ms with the block of 4 and 39.0 ms with the block of 2 (four rows: 49.0 and 48.8), and a DeepSeek draft step
  (module and draft projection) 3.56 and 2.20 ms.
Each later block of a panel reads its weights from the L2 cache, which the first brought in. At every step of k a
block asks the CPU to start loading the weight vector it will need some steps later (`llvm.prefetch`, a hint that
changes no value): the hardware's own prefetcher alone kept one thread's stream of weights slower than stock
F.linear's. Measured on a Xeon (AMX), SmolLM2's whole forward through the lab's Llama forward after a short chat prompt,
the kernel before and after interleaved in one process with the same forward on F.linear (`use_stock`), medians of
12, in runs a few minutes apart: one thread, one row 64.4 -> 51.4-53.9 ms (F.linear 52.1-54.1), four rows
72.6 -> 59.5-64.3, eight 99.5 -> 66.6-71.5; two threads, one row 44.7 -> 37.5 ms (F.linear 31.7). These were
profiling runs; the record is `bench real`'s cost curve (docs/bench/real.json), whose stock rows are transformers'
own forward. A last, partial block
repeats its last row (computed, not written). Which block computes a row changes no bit of it: every output is the
same chain of fused steps, so both plans give the same bits (the tests run both on any machine). Two
threads split the panels (outputs), so each output is still computed by one thread in one order: one and two
threads give the same bits. The split runs on numba's OpenMP layer (or TBB's) where one loads: its threads wait
spinning, so a forward's 121 calls (SmolLM2: four fused linears in each of 30 layers, and the output
projection) each start at once. numba's own `workqueue` layer wakes its threads through the operating system at
every call; measured on a 2-core Zen 4 with SmolLM2, that made a one-row forward slower at two
threads than at one (83 ms against 35), where the OpenMP layer did not (26-36 ms over three runs). So where only `workqueue`
loads, the kernel keeps to one thread unless a caller asks for more (`split_layer()` says which).

The kernel is compiled by numba (cached on disk after the first call). Where numba is missing or fails, `linear` is
`F.linear`, `EXACT` is False and `status()` says so. Above MAX_ROWS rows (a prefill), under autograd (training), off
the CPU and for inputs other than float32, `linear` is `F.linear` too: those calls are not what a verify compares.
`use_stock()` runs the stock kernel everywhere, to race the two. The panels are a second copy of each weight used,
made at its first exact call and kept while the weight lives (SmolLM2: another 540 MB): float32, or bf16 bits where
every value of the weight is a bf16 value (`compact`: a bf16 weight, or heads shipped in bf16), which halves what a
call reads and changes no sum (each entry is widened to the same float32 before its fused step)."""
from __future__ import annotations

import contextlib
import os
import threading
import weakref

import numpy as np
import torch
import torch.nn.functional as F

MAX_ROWS = 16  # rows up to which `linear` is exact; above, F.linear (a prefill)
JB = 32        # outputs per panel: the lanes that advance side by side (two AVX-512 vectors)
PARALLEL_MIN = 1 << 18  # weight entries (1 MB in float32) from which torch's thread count splits a call by default


def _avx512() -> bool:
    """Whether the host CPU has AVX-512 (32 vector registers), as LLVM, which compiles the kernels, sees it."""
    try:
        from llvmlite import binding
        return bool(binding.get_host_cpu_features().get("avx512f", False))
    except Exception:  # pragma: no cover - llvmlite missing or unable to say
        return False


# the block plan (8: AVX-512, blocks of 2, 3, 4 and 8; 3: AVX2, blocks of 2 and 3): read at each call, so a test may set
# either plan on any CPU; both give the same bits, only their speed depends on the CPU
ROWS = 8 if _avx512() else 3
assert JB == 32 and ROWS in (3, 8)  # the kernel's scratch and its unrolled rows

_state = {"stock": False, "layer": None}  # use_stock() sets stock for the whole process; layer: split_layer()
_WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # packed as their float32 values
_POOL = threading.Lock()    # numba's workqueue pool serves one caller at a time; another runs the serial kernel
_NUMBA_ERROR = ""

try:  # pragma: no cover - the branch taken depends on the environment
    import numba
    if "NUMBA_THREADING_LAYER" not in os.environ and "NUMBA_THREADING_LAYER_PRIORITY" not in os.environ:
        # a pool whose threads wait spinning first (see the docstring: workqueue's wake-ups cost more than a split saves)
        numba.config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    def _jit(**kw):
        """numba.njit with its cache on disk where numba finds a writable place, and without where it finds none."""
        def wrap(f):
            try:
                return numba.njit(cache=True, **kw)(f)
            except RuntimeError:  # no writable cache directory: compile at each start instead
                return numba.njit(cache=False, **kw)(f)
        return wrap

    @intrinsic
    def _registers(typingctx, size):
        """A float32 scratch of `size` (a literal) on the stack: unlike a heap array, the compiler may keep it in
        registers across the k loop, which is what makes a block of rows cost about one row's weight reads."""
        if not isinstance(size, types.IntegerLiteral):
            return None

        def codegen(context, builder, sig, args):
            return cgutils.alloca_once(builder, context.get_value_type(types.float32), size=size.literal_value)
        return types.CPointer(types.float32)(size), codegen

    @intrinsic
    def _fma(typingctx, a, b, c):
        """a * b + c rounded once (IEEE 754 fusedMultiplyAdd, llvm.fma) for float32: the one operation every sum of
        the kernels is built from, the same bits in a vector lane or a scalar, in any block of rows."""
        if not all(t == types.float32 for t in (a, b, c)):
            return None

        def codegen(context, builder, sig, args):
            return builder.fma(*args)
        return types.float32(types.float32, types.float32, types.float32), codegen

    @intrinsic
    def _f32(typingctx, w):
        """A panel entry as float32: itself, or from bfloat16 bits (uint16, the upper half of a float32's bits):
        compact panels hold half the bytes and give the same float32 values, hence the same sums."""
        if w == types.float32:
            return types.float32(w), lambda context, builder, sig, args: args[0]
        if w == types.uint16:
            def codegen(context, builder, sig, args):
                wide = builder.shl(builder.zext(args[0], ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
                return builder.bitcast(wide, ir.FloatType())
            return types.float32(w), codegen
        return None

    from llvmlite import binding as _llvm
    # the intrinsic's name mangles its pointer type: opaque pointers (LLVM 15 on) are "p0", typed ones "p0i8"
    _PREFETCH = "llvm.prefetch.p0" if _llvm.llvm_version_info[0] >= 15 else "llvm.prefetch.p0i8"

    @intrinsic
    def _prefetch(typingctx, wp, at):
        """Ask the CPU to start loading the panel entry at flat index `at` (`llvm.prefetch`: read, keep in every
        cache level). A hint only: it changes no value, and an address past the array's end is harmless (a prefetch
        never faults)."""
        if not isinstance(wp, types.Array):
            return None

        def codegen(context, builder, sig, args):
            p = builder.bitcast(builder.gep(context.make_array(sig.args[0])(context, builder, args[0]).data, [args[1]]),
                                ir.IntType(8).as_pointer())
            i32 = ir.IntType(32)
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [p.type, i32, i32, i32]),
                                                _PREFETCH)
            builder.call(fn, [p, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
            return context.get_dummy_value()
        return types.void(wp, types.intp), codegen

    @_jit()
    def _ahead(wp, b, k, d):
        """Prefetch the weight vector d steps of k further on (into the next panel near a panel's end). A block of
        more rows spends longer on each step, so it asks fewer steps ahead for about the same time: 48 for a block
        of 2 (6 KB of float32), 24 for 3 or 4, 16 for 8 (see the module's docstring)."""
        at = (b * wp.shape[1] + k + d) * JB
        _prefetch(wp, at)
        _prefetch(wp, at + 16)  # float32: the vector's second cache line (bf16: the same line again)

    @_jit()
    def _rows4(x, i0, k):
        """x[i, k] of rows i0..i0+3, a row past the last repeating it (computed, never written)."""
        q = x.shape[0]
        return x[i0, k], x[min(i0 + 1, q - 1), k], x[min(i0 + 2, q - 1), k], x[min(i0 + 3, q - 1), k]

    @_jit()
    def _rows3(x, i0, k):
        """x[i, k] of rows i0..i0+2, a row past the last repeating it (computed, never written)."""
        q = x.shape[0]
        return x[i0, k], x[min(i0 + 1, q - 1), k], x[min(i0 + 2, q - 1), k]

    @_jit()
    def _fma4(a, r0, jj, w, x4):
        """a[r0 + r, jj] = fma(x4[r], w, a[r0 + r, jj]) for r < 4: one weight, four rows' sums, in the order of k."""
        a[r0, jj] = _fma(x4[0], w, a[r0, jj])
        a[r0 + 1, jj] = _fma(x4[1], w, a[r0 + 1, jj])
        a[r0 + 2, jj] = _fma(x4[2], w, a[r0 + 2, jj])
        a[r0 + 3, jj] = _fma(x4[3], w, a[r0 + 3, jj])

    @_jit()
    def _write(a, out, b, i0):
        """Rows i0.. of outputs b*JB..b*JB+JB-1 from the sums a (rows past the last are not written)."""
        for r in range(min(a.shape[0], out.shape[0] - i0)):
            for jj in range(min(JB, out.shape[1] - b * JB)):
                out[i0 + r, b * JB + jj] = a[r, jj]

    @_jit()
    def _block4(x, wp, out, b, i0):
        """Rows i0..i0+3 of outputs b*JB..b*JB+JB-1: for each k, one weight vector (JB outputs) times each row's
        x[i, k], fused into that row's JB sums: 4 x JB sums in registers (8 AVX-512 registers)."""
        a = numba.carray(_registers(128), (4, JB))
        a[:] = 0.0
        for k in range(x.shape[1]):
            _ahead(wp, b, k, 24)
            x4 = _rows4(x, i0, k)
            for jj in range(JB):
                _fma4(a, 0, jj, _f32(wp[b, k, jj]), x4)
        _write(a, out, b, i0)

    @_jit()
    def _block8(x, wp, out, b, i0):
        """`_block4` for rows i0..i0+7: 8 x JB sums (16 AVX-512 registers), each weight vector used by 8 rows."""
        a = numba.carray(_registers(256), (8, JB))
        a[:] = 0.0
        for k in range(x.shape[1]):
            _ahead(wp, b, k, 16)
            lo, hi = _rows4(x, i0, k), _rows4(x, min(i0 + 4, x.shape[0] - 1), k)
            for jj in range(JB):
                w = _f32(wp[b, k, jj])
                _fma4(a, 0, jj, w, lo)
                _fma4(a, 4, jj, w, hi)
        _write(a, out, b, i0)

    @_jit()
    def _block3(x, wp, out, b, i0):
        """`_block4` for rows i0..i0+2: 3 x JB sums, 12 AVX2 registers, which with the weight vector and the three
        rows' x[i, k] fit the 16 (a block of 4 or 8 spills sums to memory at every k there)."""
        a = numba.carray(_registers(96), (3, JB))
        a[:] = 0.0
        for k in range(x.shape[1]):
            _ahead(wp, b, k, 24)
            x3 = _rows3(x, i0, k)
            for jj in range(JB):
                w = _f32(wp[b, k, jj])
                a[0, jj] = _fma(x3[0], w, a[0, jj])
                a[1, jj] = _fma(x3[1], w, a[1, jj])
                a[2, jj] = _fma(x3[2], w, a[2, jj])
        _write(a, out, b, i0)

    @_jit()
    def _block2(x, wp, out, b, i0):
        """`_block3` for rows i0..i0+1 (a row past the last repeating it): 2 x JB sums, 8 AVX2 registers (4 AVX-512
        ones). A one-row call runs here too, with either plan. A separate block of one row was tried: though it does
        half the arithmetic, it measured slower on a Zen 3 (four chains of fused steps, each waiting on its last, cannot
        keep the FMA units busy)."""
        a = numba.carray(_registers(64), (2, JB))
        a[:] = 0.0
        last = x.shape[0] - 1
        for k in range(x.shape[1]):
            _ahead(wp, b, k, 48)
            x0, x1 = x[i0, k], x[min(i0 + 1, last), k]
            for jj in range(JB):
                w = _f32(wp[b, k, jj])
                a[0, jj] = _fma(x0, w, a[0, jj])
                a[1, jj] = _fma(x1, w, a[1, jj])
        _write(a, out, b, i0)

    @_jit()
    def _panel(x, wp, out, b, rows):
        """Outputs b*JB..b*JB+JB-1 of every row, in the blocks `blocks` lists: with rows = 8, blocks of 8 while more
        than 8 remain, then one block of 2, 3, 4 or 8 for the rest; with rows = 3, blocks of 3 while more than 4 or
        exactly 3 remain, then blocks of 2."""
        q = x.shape[0]
        i0 = 0
        if rows == 3:
            while q - i0 > 4 or q - i0 == 3:
                _block3(x, wp, out, b, i0)
                i0 += 3
            while i0 < q:
                _block2(x, wp, out, b, i0)
                i0 += 2
            return
        while q - i0 > 8:
            _block8(x, wp, out, b, i0)
            i0 += 8
        left = q - i0
        if left <= 2:
            _block2(x, wp, out, b, i0)
        elif left == 3:
            _block3(x, wp, out, b, i0)
        elif left == 4:
            _block4(x, wp, out, b, i0)
        else:
            _block8(x, wp, out, b, i0)

    @_jit()
    def _serial(x, wp, out, rows):
        for b in range(wp.shape[0]):
            _panel(x, wp, out, b, rows)

    @_jit(parallel=True)
    def _parallel(x, wp, out, rows):
        for b in numba.prange(wp.shape[0]):
            _panel(x, wp, out, b, rows)

    @_jit()
    def _rms_rows(x, w, eps, out):
        """Each row alone: its sum of squares in the order of k (float64), then x * rsqrt(mean + eps) * g."""
        q, n = x.shape
        for i in range(q):
            s = 0.0
            for k in range(n):
                s += np.float64(x[i, k]) * np.float64(x[i, k])
            r = 1.0 / np.sqrt(s / n + eps)
            for k in range(n):
                out[i, k] = np.float32(x[i, k] * r) * w[k]

    EXACT = True
except Exception as e:  # pragma: no cover - numba missing or broken
    EXACT = False
    _NUMBA_ERROR = f"{type(e).__name__}: {e}"


def blocks(q: int, rows: int | None = None) -> list[int]:
    """The row blocks a q-row call runs in (`_panel`'s loop, `rows` default ROWS); each block reads every weight once,
    a partial one repeating its last row. AVX-512 (rows = 8): blocks of 8 while more than 8 rows remain, then one block
    of the rest: of 2 (one or two rows), 3, 4, or 8 (five to eight). AVX2 (rows = 3): blocks of 3 while more than 4 or
    exactly 3 rows remain, then blocks of 2 (one or two rows: one block of 2; four: two)."""
    rows = ROWS if rows is None else rows
    if rows == 3:
        plan, left = [], q
        while left > 4 or left == 3:
            plan, left = plan + [3], left - 3
        return plan + [2] * -(-left // 2)
    left = q - 8 * ((q - 1) // 8)  # 1..8 rows after the blocks of 8
    return [8] * ((q - 1) // 8) + [2 if left <= 2 else left if left <= 4 else 8]


SPLIT_LAYERS = ("omp", "tbb")  # numba threading layers whose split pays at every call (see the module's docstring)


def split_layer() -> str:
    """The numba threading layer the two-thread split runs on ('omp', 'tbb' or 'workqueue'), loaded by one tiny
    parallel call the first time it is asked; '' without numba."""
    if not EXACT:
        return ""
    if _state["layer"] is None:
        with _POOL, _keep_torch_threads():
            _parallel(np.zeros((1, 1), np.float32), np.zeros((1, 1, JB), np.float32), np.empty((1, 1), np.float32), ROWS)
            _state["layer"] = numba.threading_layer()
    return _state["layer"]


@contextlib.contextmanager
def _keep_torch_threads():
    """torch's thread count as it was before the block. numba's OpenMP layer runs on the libgomp torch loaded, so
    launching it (or changing numba's count) sets that runtime's count, which torch reads as its own: a process on
    one thread was left on two, and its OpenMP teams of two then spun beside other processes."""
    saved = torch.get_num_threads()
    try:
        yield
    finally:
        if torch.get_num_threads() != saved:
            torch.set_num_threads(saved)


def status() -> str:
    """One line: which kernel `linear` runs, and what that promises."""
    if not EXACT:
        return (f"stock kernel (F.linear): numba is not available ({_NUMBA_ERROR or 'not installed'}); equality "
                "with plain decoding is observed, not guaranteed (pip install numba for the exact kernel)")
    if _stock():
        return "stock kernel (F.linear), forced by use_stock(): equality is observed, not guaranteed"
    split = (f"split over threads by numba's {split_layer()} layer" if split_layer() in SPLIT_LAYERS else
             f"on one thread (only numba's {split_layer()} layer loads, whose split costs more than it saves)")
    return (f"exact kernel (numba {numba.__version__}): each row of a call of up to {MAX_ROWS} rows is bit for bit "
            f"the one-row call; {split}")


def _stock() -> bool:
    return _state["stock"]


@contextlib.contextmanager
def use_stock(stock: bool = True):
    """Within the block, `linear` is F.linear (stock=True) or the exact kernel (stock=False): to race the two."""
    old = _stock()
    _state["stock"] = stock
    try:
        yield
    finally:
        _state["stock"] = old


def active() -> bool:
    """Whether `linear` runs the exact kernel now (numba is there and `use_stock` is not in force)."""
    return EXACT and not _stock()


def kernel_for(rows: int) -> str:
    """Which kernel a float32 CPU call over `rows` rows runs now: "exact" up to MAX_ROWS, "stock" above (or with the
    exact kernel off). A batch of B rows verifying k tokens each is B * k rows."""
    return "exact" if active() and 1 <= rows <= MAX_ROWS else "stock"


# ---- panels: each weight packed once, kept while the weight lives and is not changed in place ----------------------
_PANELS: dict[int, tuple] = {}


def compact(w: torch.Tensor) -> bool:
    """Whether every value of `w` is a bfloat16 value: a bf16 weight, or a float32 one whose low 16 bits are all zero
    (heads shipped in bf16 and loaded as float32). Such a weight is packed as bf16 bits: half the bytes to read, the
    same float32 values, so the same sums."""
    if w.dtype == torch.bfloat16:
        return True
    return w.dtype == torch.float32 and bool(((w.detach().contiguous().view(torch.int32) & 0xFFFF) == 0).all())


def _pack(w: torch.Tensor) -> np.ndarray:
    """(m, n) weight -> (ceil(m/JB), n, JB) panels, zero-padded outputs at the end: uint16 bf16 bits where
    `compact(w)`, float32 otherwise."""
    m, n = w.shape
    nb = -(-m // JB)
    small = compact(w)
    wp = torch.zeros(nb * JB, n, dtype=torch.bfloat16 if small else torch.float32)
    wp[:m] = w.detach().to(wp.dtype)  # exact either way (see `compact`)
    wp = wp.view(nb, JB, n).transpose(1, 2).contiguous()  # (nb, n, JB)
    return wp.view(torch.int16).numpy().view(np.uint16) if small else wp.numpy()


def panels(w: torch.Tensor) -> np.ndarray:
    """The packed copy of `w`, made at first use and again whenever `w` changes in place or is freed."""
    key = id(w)
    hit = _PANELS.get(key)
    try:
        version = w._version
    except RuntimeError:  # an inference tensor keeps no version (it cannot be changed in place outside inference)
        version = -1
    stamp = (w.data_ptr(), version)  # a new shape or dtype is a new storage or a new version
    if hit is not None and hit[0]() is w and hit[1] == stamp:
        return hit[2]
    wp = _pack(w)
    _PANELS[key] = (weakref.ref(w, lambda _, key=key: _PANELS.pop(key, None)), stamp, wp)
    return wp


def _threads(threads: int | None, weight: torch.Tensor) -> int:
    """`threads`, or torch's count for a weight of at least PARALLEL_MIN entries (a smaller one costs less than waking
    a second thread) where the split pays (`split_layer`), at most one per panel."""
    m = weight.shape[0]
    if threads is not None:
        t = threads
    else:
        t = torch.get_num_threads() if weight.numel() >= PARALLEL_MIN else 1
        if t > 1 and split_layer() not in SPLIT_LAYERS:
            t = 1
    return max(1, min(t, numba.config.NUMBA_NUM_THREADS, -(-m // JB)))


def _rows(x: torch.Tensor, rows: int) -> np.ndarray:
    """x (..., n) as a C-contiguous (rows, n) float32 array, a view where it can be (numpy's reshape is cheaper than
    torch's for these few-row tensors)."""
    return np.ascontiguousarray((x.detach() if x.requires_grad else x).numpy().reshape(rows, x.shape[-1]))


def exact_rows(x: torch.Tensor, *params: torch.Tensor | None) -> bool:
    """Whether a call on `x` (..., n) with these weights takes the exact path: the exact kernel is active, x is
    float32 on the CPU with 1..MAX_ROWS rows, and autograd is not recording (training keeps the stock path)."""
    if not EXACT or _state["stock"] or x.dtype != torch.float32 or not x.is_cpu or not x.dim():
        return False
    n = x.shape[-1]
    if not n or not 0 < x.numel() // n <= MAX_ROWS or any(p is not None and not p.is_cpu for p in params):
        return False
    # checked last, and only while autograd records: the decode runs under inference_mode
    return not torch.is_grad_enabled() or not (x.requires_grad or any(p is not None and p.requires_grad for p in params))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           threads: int | None = None) -> torch.Tensor:
    """y = x W^T + b, x (..., n) -> (..., m), like F.linear; exact (see the module's docstring) where
    `exact_rows` says so, F.linear elsewhere. `threads` (default: torch's) splits the outputs."""
    if (not exact_rows(x, weight, bias) or weight.dim() != 2 or x.shape[-1] != weight.shape[1]
            or weight.dtype not in _WEIGHT_DTYPES):
        return F.linear(x, weight, bias)  # F.linear's own error names mismatched shapes
    m, n = weight.shape
    rows = x.numel() // n
    wp = panels(weight)
    x2 = _rows(x, rows)
    out = np.empty((rows, m), np.float32)
    t = _threads(threads, weight)
    # same bits either way: the split is over outputs; split_layer() first, so that numba's layer (which
    # numba.get_num_threads would launch) is launched once, keeping torch's thread count
    if t > 1 and split_layer() and _POOL.acquire(blocking=False):
        try:
            if numba.get_num_threads() != t:
                with _keep_torch_threads():
                    numba.set_num_threads(t)
            _parallel(x2, wp, out, ROWS)
        finally:
            _POOL.release()
    else:
        _serial(x2, wp, out, ROWS)
    y = torch.from_numpy(out)
    if bias is not None:
        y = y + bias.detach().float()
    return y.view(*x.shape[:-1], m)



def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last axis, x / sqrt(mean(x^2) + eps) * g: each row alone, in one order, where `exact_rows`
    says so; F.rms_norm elsewhere."""
    if not exact_rows(x, weight) or weight.dtype != torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    n = x.shape[-1]
    out = np.empty((x.numel() // n, n), np.float32)
    _rms_rows(_rows(x, out.shape[0]), _rows(weight, 1)[0], float(eps), out)
    return torch.from_numpy(out).view(x.shape)
