"""Timing: the cost curve t(q) (one forward over q tokens at a cached context), the batch cost t(B)/t(1), the
roofline's numbers (bytes and FLOPs of a forward, the machine's balance) and peak memory. Every timer syncs the
device before it reads the clock (`mtplab.device.sync`).
"""
from __future__ import annotations

import statistics
import torch
from mtplab.decoding.batch import batched_autoregressive, batched_speculative
from mtplab.decoding.generate import decode_with, max_k
from mtplab.device import sync
from mtplab.model import kernels
from mtplab.model.layers import RaggedKVCache
import contextlib
import os
import sys
from dataclasses import dataclass, field
from mtplab.model.config import ModelConfig
from mtplab.errors import MtplabError
from mtplab.measuring.race import race


def untimed_output(fn):
    """A race contender from a zero-argument call whose output is no text (a forward, a whole batch): it gives the
    race no tokens to compare."""
    def run(_prompt):
        fn()
        return []
    return run


@torch.inference_mode()
def batch_cost_ratio(model, B: int, q: int, *, context: int = 64, repeats: int = 5) -> dict:
    """t(q)/t(1) at batch size B: one cached forward over q new tokens per row, against one token per row, raced
    (`race`: a warm-up each, `repeats` interleaved rounds, the medians). Returns {"ratio", "busy"} (the race's
    busy-machine verdict: None when valid) and "kernels": the kernel of each forward (`kernels.kernel_for`: B and
    B * q rows), which differ where B <= 16 < B * q."""
    dev = model.wte.weight.device
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    cache = RaggedKVCache.for_model(model, B)
    cache.lengths = [context] * B  # the keys there are zeros: the cost does not depend on their values
    new = torch.randint(V, (B, q), generator=g).to(dev)

    def forward(n):
        pos, mask = cache.plan(n)
        model(new[:, :n], cache, positions=pos, mask=mask)
        cache.lengths = [context] * B
    res = race({n: untimed_output(lambda n=n: forward(n)) for n in (1, q)}, [None], baseline=1, rounds=repeats,
               device=dev)
    return {"ratio": res.seconds_median(q) / res.seconds_median(1), "busy": res.busy,
            "kernels": (kernels.kernel_for(B), kernels.kernel_for(B * q))}


class _Batch:
    """A batched decode as a race sees it: its tokens row after row (the race compares them), and the batch."""

    def __init__(self, batch):
        self.batch, self.tokens = batch, [t for row in batch.tokens for t in row]


def measure_batch(model, make_drafter, prompts, *, batch_sizes, max_new_tokens: int, k: int,
                  repeats: int = 1) -> list[dict]:
    """For each batch size B: batched AR and batched speculation on the first B prompts, raced (`race`: a warm-up
    each, `repeats` interleaved rounds). Rows: batch_size, tokens_per_s and latency_ms_per_token (the median round;
    latency is wall time over the tokens one row got), tokens_per_forward (per row), the speedup over AR at the
    same B and the busy-machine guard's verdict (`RaceResult.row`: speedup, speedup_min, speedup_max, rounds,
    valid, busy), and the kernel of its forwards (`kernels.kernel_for`: AR's B rows, a verify's B * k). Checks greedy
    equality."""
    dev = model.wte.weight.device
    rows = []
    for B in batch_sizes:
        ps = [prompts[i % len(prompts)] for i in range(B)]
        res = race({"ar": lambda b: _Batch(batched_autoregressive(model, b, max_new_tokens=max_new_tokens)),
                    "spec": lambda b: _Batch(batched_speculative(model, make_drafter, b, max_new_tokens=max_new_tokens,
                                                                 k=k))}, [ps], baseline="ar", rounds=repeats, device=dev)
        if res.outputs["spec"][0].batch.tokens != res.outputs["ar"][0].batch.tokens:
            raise MtplabError(f"batch {B}: batched speculative output differs from batched AR")
        for name in ("ar", "spec"):
            wall = res.seconds_median(name)
            out, row = res.outputs[name][0].batch, res.row(name)
            del row["identical"], row["prompts"]  # one batch: its tokens were checked above
            rows.append({"kind": name, "batch_size": B, "tokens_per_s": out.new_tokens / wall,
                         "latency_ms_per_token": 1e3 * wall / max_new_tokens,
                         "tokens_per_forward": out.new_tokens / sum(out.batch_sizes), **row, "repeats": repeats,
                         "kernel": kernels.kernel_for(B * (k if name == "spec" else 1))})
    return rows


@dataclass
class CostCurve:
    """t(q): seconds for one forward over q new tokens with a warm KV cache of `context` tokens."""
    seconds: dict[int, float]               # q -> median seconds
    context: int
    device: str
    samples: dict[int, list[float]] = field(default_factory=dict, repr=False)
    busy: str | None = None                 # the race's busy-machine verdict (None: valid)

    @property
    def ratio(self) -> dict[int, float]:
        """t(q) / t(1), the curve `theory.predicted_speedup` takes."""
        return {q: s / self.seconds[1] for q, s in self.seconds.items()}


@torch.inference_mode()
def measure_cost_curve(model, qs=(1, 2, 4, 8, 16, 32), *, context: int = 256, repeats: int = 9,
                       seed: int = 0, progress: bool = False) -> CostCurve:
    """Time one forward over q new tokens on top of `context` cached tokens, for every q in qs.

    The cache is filled once; after each timed forward it is cropped back to `context`, so every
    measurement sees the same cache. The sizes are raced (`race`: one warm-up forward each, then `repeats`
    rounds in rotating order, the clock read after a sync), and each q keeps the median; `busy` says why
    the busy-machine guard doubts the curve (None: it does not).
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

    def forward(q):
        model(new[:, :q], cache)
        cache.crop(context)  # back to the same cache for the next forward

    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=repeats * len(qs), desc="cost curve", unit="forward")
    res = race({q: untimed_output(lambda q=q: forward(q)) for q in qs}, [None], baseline=1, rounds=repeats,
               device=dev, bar=bar)
    if bar is not None:
        bar.close()
    samples = {q: res.round_totals(q) for q in qs}
    return CostCurve({q: statistics.median(s) for q, s in samples.items()}, context, str(dev), samples, res.busy)


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

    A forward whose FLOPs per byte moved lies below the ridge is bound by memory, above it by compute. The two are
    raced (`race`), and "busy" is the race's busy-machine verdict (None when valid).
    """
    device = torch.device(device)
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    src = torch.randn(2 ** 24, device=device)  # 64 MiB of float32, more than a CPU cache holds
    dst = torch.empty_like(src)

    res = race({"matmul": untimed_output(lambda: a @ b), "copy": untimed_output(lambda: dst.copy_(src))}, [None],
               baseline="matmul", rounds=repeats, device=device)
    t_mm, t_cp = (res.seconds_median(n) for n in ("matmul", "copy"))
    flops_per_s = 2 * n ** 3 / t_mm
    bytes_per_s = 2 * src.numel() * 4 / t_cp  # read and write
    return {"flops_per_s": flops_per_s, "bytes_per_s": bytes_per_s, "ridge": flops_per_s / bytes_per_s,
            "busy": res.busy}


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


@torch.inference_mode()
def interleaved_race(method: str, model, prompts, *, max_new_tokens: int, k: int | None = None, repeats: int = 5,
                     draft_model=None, bar=None, baseline_model=None, **options) -> dict:
    """A method against AR of the same model, through the lab's one race (`mtplab.measuring.race`): a warm-up each,
    then `repeats` interleaved rounds over the prompts. The speedup of a round is its AR time over its method time;
    the result is the race's one row shape (`RaceResult.row`: speedup, speedup_min, speedup_max, rounds, identical,
    prompts, valid, busy), with the guard's `verdict` line, the traces of the first round (`traces`, `ar_traces`),
    tokens_per_forward, ar_ms_per_token, method, k, repeats and max_new_tokens.
    `options` go to `decode_with` (adapt, threshold, rule). `baseline_model`: the model AR runs on, when it is not
    `model`."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise MtplabError(f"repeats must be an integer >= 1 (got {repeats!r})")
    if not prompts:
        raise MtplabError("give at least one prompt")
    dev = model.wte.weight.device
    k = k if k is not None else (max_k(method, model) or 4)
    kw = {"k": k, "draft_model": draft_model, **options} if method != "ar" else {}
    ar_model = model if baseline_model is None else baseline_model
    res = race({"ar": lambda p: decode_with("ar", ar_model, p, max_new_tokens=max_new_tokens),
                "method": lambda p: decode_with(method, model, p, max_new_tokens=max_new_tokens, **kw)},
               list(prompts), baseline="ar", rounds=repeats, device=dev, bar=bar,
               warmup=lambda name, _fn: decode_with("ar", ar_model, prompts[0], max_new_tokens=8) if name == "ar"
               else decode_with(method, model, prompts[0], max_new_tokens=8, **kw))
    traces, ar_traces = res.outputs["method"], res.outputs["ar"]
    toks = sum(len(t.tokens) for t in traces)
    ar_s = [s for r in res.seconds["ar"] for s in r]
    return {**res.row("method"), "verdict": res.verdict(), "method": method, "k": k, "repeats": repeats,
            "max_new_tokens": max_new_tokens, "tokens_per_forward": toks / max(1, sum(t.forwards for t in traces)),
            "ar_ms_per_token": 1e3 * statistics.median(ar_s) / max_new_tokens, "traces": traces,
            "ar_traces": ar_traces}
