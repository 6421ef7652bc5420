"""Timing: the cost curve t(q), decode timings, the roofline's numbers, INT8 quantization, peak memory.

q tokens fed to one forward, L tokens already in the KV cache. Timings synchronise the device before reading
the clock, interleave the sizes (so that a slow moment hits every size alike) and report medians.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field

import torch

from ..config import ModelConfig
from ..decoding import autoregressive
from ..trace import Trace
from ..errors import MtplabError


# ---------------------------------------------------------------------------------- timing
def sync(device) -> None:
    """Wait for queued device work, so that a clock read afterwards includes it."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


@dataclass
class CostCurve:
    """t(q): seconds for one forward over q new tokens with a warm KV cache of `context` tokens."""
    seconds: dict[int, float]               # q -> median seconds
    context: int
    device: str
    samples: dict[int, list[float]] = field(default_factory=dict, repr=False)

    @property
    def ratio(self) -> dict[int, float]:
        """t(q) / t(1), the curve `theory.predicted_speedup` takes."""
        return {q: s / self.seconds[1] for q, s in self.seconds.items()}


@torch.inference_mode()
def measure_cost_curve(model, qs=(1, 2, 4, 8, 16, 32), *, context: int = 256, repeats: int = 9,
                       seed: int = 0, progress: bool = False) -> CostCurve:
    """Time one forward over q new tokens on top of `context` cached tokens, for every q in qs.

    The cache is filled once; after each timed forward it is cropped back to `context`, so every
    measurement sees the same cache. Sizes are interleaved (forwards, then backwards) over `repeats`
    rounds after one untimed warm-up round, and each q keeps the median.
    """
    qs = sorted(set(int(q) for q in qs) | {1})
    if context + max(qs) > model.config.block_size:
        raise MtplabError(f"context {context} + q {max(qs)} exceeds the context window {model.config.block_size}; "
                          "use a shorter context or smaller q")
    dev = model.wte.weight.device
    g = torch.Generator().manual_seed(seed)
    V = model.config.vocab_size
    cache = model.new_cache()
    model(torch.randint(V, (1, context), generator=g).to(dev), cache)
    new = torch.randint(V, (1, max(qs)), generator=g).to(dev)
    samples: dict[int, list[float]] = {q: [] for q in qs}

    def timed(q):
        sync(dev)
        t0 = time.perf_counter()
        model(new[:, :q], cache)
        sync(dev)
        dt = time.perf_counter() - t0
        cache.crop(context)
        return dt

    for q in qs:  # warm-up: first calls allocate and pick kernels
        timed(q)
    rounds = range(repeats)
    if progress:
        from tqdm.auto import tqdm
        rounds = tqdm(rounds, desc="cost curve", unit="round")
    for r in rounds:
        for q in (qs if r % 2 == 0 else qs[::-1]):
            samples[q].append(timed(q))
    return CostCurve({q: statistics.median(s) for q, s in samples.items()}, context, str(dev), samples)


def timed_decodes(variants: dict, prompt_ids, *, max_new_tokens: int, progress: bool = False) -> dict[str, Trace]:
    """Greedy autoregressive decoding of the same prompt by several (model, use_cache) variants.

    Returns {label: Trace}; each Trace's steps carry their wall time (`Step.wall_s`).
    """
    it = variants.items()
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(list(it), desc="decoding", unit="variant")
    return {label: autoregressive(model, prompt_ids, max_new_tokens=max_new_tokens, use_cache=use_cache)
            for label, (model, use_cache) in it}


def ms_per_token(trace: Trace) -> float:
    """Median wall time of one decoding step after the prefill, in milliseconds."""
    return 1e3 * statistics.median(s.wall_s for s in trace.steps[1:]) if len(trace.steps) > 1 else float("nan")


def forward_cost(cfg: ModelConfig, q: int, *, context: int, bytes_per_param: float = 4.0,
                 bytes_per_cache_value: float = 4.0) -> dict:
    """Rough FLOPs and bytes moved by one forward over q new tokens with `context` cached tokens.

    FLOPs: 2 per weight per token for the matrix products (2 * N * q), plus attention scores and
    the weighted sum of values (4 * L * C * (context + q) * q). Bytes: every weight read once
    (N * bytes_per_param), plus the cached keys and values read once (2 * L * C * (context + q)).
    Activations are small next to these and are left out.
    """
    C, L, V = cfg.n_embd, cfg.n_layer, cfg.vocab_size
    n_weights = L * 12 * C * C + V * C  # attention 4C^2 + MLP 8C^2 per layer, and the (tied) vocabulary matrix
    flops = 2 * n_weights * q + 4 * L * C * (context + q) * q
    moved = n_weights * bytes_per_param + 2 * L * C * (context + q) * bytes_per_cache_value
    return {"flops": float(flops), "bytes": float(moved), "intensity": flops / moved, "weights": n_weights}


@torch.inference_mode()
def machine_balance(device="cpu", *, n: int = 768, repeats: int = 5) -> dict:
    """Measure this machine's matmul FLOP/s and memory copy bandwidth; their ratio is the roofline's ridge.

    A forward whose FLOPs per byte moved lies below the ridge is bound by memory, above it by compute.
    """
    device = torch.device(device)
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    src = torch.randn(2 ** 24, device=device)  # 64 MiB of float32, more than a CPU cache holds
    dst = torch.empty_like(src)

    def best(fn):
        fn()
        ts = []
        for _ in range(repeats):
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    t_mm = best(lambda: a @ b)
    t_cp = best(lambda: dst.copy_(src))
    flops_per_s = 2 * n ** 3 / t_mm
    bytes_per_s = 2 * src.numel() * 4 / t_cp  # read and write
    return {"flops_per_s": flops_per_s, "bytes_per_s": bytes_per_s, "ridge": flops_per_s / bytes_per_s}


def quantize_int8(model):
    """Dynamic INT8 quantization of every nn.Linear (weights stored in int8, activations quantized on the fly).

    Returns (quantized model on CPU, or None, and a one-line note). CPU only: torch's dynamic
    quantized kernels do not run on CUDA or MPS. The torch.ao API is deprecated in recent torch
    releases; if it is missing, the note says so and the caller skips the comparison.
    """
    try:
        from torch.ao.quantization import quantize_dynamic
    except ImportError as e:  # removed from this torch
        return None, f"torch.ao.quantization.quantize_dynamic is not available in torch {torch.__version__} ({e})"
    import copy

    cpu_model = copy.deepcopy(model).to("cpu").float().eval()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the API announces its own deprecation on every call
            qm = quantize_dynamic(cpu_model, {torch.nn.Linear}, dtype=torch.qint8)
    except (RuntimeError, AssertionError, NotImplementedError) as e:
        return None, f"dynamic INT8 quantization failed on torch {torch.__version__}: {e}"
    n = sum(1 for mod in qm.modules() if type(mod).__module__.startswith("torch.ao.nn.quantized"))
    return qm, f"torch {torch.__version__}: {n} nn.Linear layers now hold int8 weights (deprecated torch.ao API)"


# ---------------------------------------------------------------------------------- memory
@contextlib.contextmanager
def _native_output_silenced():
    """Send file descriptors 1 and 2 to /dev/null for a while (Python-level prints are unaffected)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved + [null]:
            os.close(fd)


def peak_memory(fn, device) -> float:
    """Peak bytes allocated while fn() runs, above what was allocated before it started.

    CUDA: the caching allocator's own peak counter. CPU: torch's profiler records every
    allocation and free of the CPU allocator; the running sum of those events, in time order,
    peaks at the answer (tracemalloc cannot see torch's allocations). Other devices: NaN.
    """
    device = torch.device(device)
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        sync(device)
        return float(torch.cuda.max_memory_allocated(device) - before)
    if device.type != "cpu":
        fn()
        return float("nan")
    from torch.profiler import ProfilerActivity, profile

    with _native_output_silenced():  # the profiler's C++ side logs start and stop lines to stdout
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
    try:
        events = prof.profiler.kineto_results.events()
        allocs = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    except AttributeError:  # the profiler's result layout changed in this torch
        return float("nan")
    cur = peak = 0
    for _, nbytes in allocs:
        cur += nbytes
        peak = max(peak, cur)
    return float(peak)


def memory_method(device) -> str:
    """How `peak_memory` measures on this device, in words (for plot labels)."""
    kind = torch.device(device).type
    if kind == "cuda":
        return "torch.cuda.max_memory_allocated during the step"
    if kind == "cpu":
        return "CPU allocator events recorded by torch.profiler (profile_memory=True)"
    return f"not measurable on {kind}"
