"""Measurements and small text tables that the teaching notebooks share.

B batch, T time, K depths, V vocabulary, q tokens fed to one forward, L tokens already in the KV cache.

Everything here returns numbers, records or strings; pictures are `mtplab.viz`, checkers are
`mtplab.exercises`. Timings synchronise the device before reading the clock, repeat the
measurement with the sizes interleaved (so that a slow moment hits every size alike), and
report medians.
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

from .config import ModelConfig
from .decoding import accept, autoregressive, distribution, speculative
from .trace import Trace
from .drafters import DeepSeekDrafter, OracleDrafter
from .errors import MtplabError
from .model import TrunkOutput
from .tokenizer import token_repr


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


# ---------------------------------------------------------------------------------- decoding studies
def pooled(traces: list[Trace]) -> Trace:
    """One Trace holding the steps of many (same method and k), so its counters pool over prompts."""
    if not traces:
        raise MtplabError("no traces to pool")
    t0 = traces[0]
    return Trace(method=t0.method, prompt=[], steps=[s for t in traces for s in t.steps], k=t0.k,
                 schedule=t0.schedule)


def run_prompts(method: str, model, prompts, *, max_new_tokens: int, k: int | None = None, progress: bool = False,
                **kw) -> list[Trace]:
    """`generate.decode_with` over a list of prompts (str or token lists); prompts are cut to fit the window."""
    from .generate import decode_with
    from .tokenizer import encode

    it = prompts
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(prompts, desc=method if k is None else f"{method} k={k}", unit="prompt", leave=False)
    room = model.config.block_size - max_new_tokens - (k or 8)
    out = []
    for p in it:
        ids = encode(p) if isinstance(p, str) else list(p)
        out.append(decode_with(method, model, ids[-room:], max_new_tokens=max_new_tokens, k=k, **kw))
    return out


def oracle_forward_counts(model, prompt, ms, ks, *, schedule: str) -> dict[int, list[int]]:
    """Forwards spent by speculative decoding with a perfect drafter (alpha = 1), for every m and k.

    With alpha = 1 the count depends only on m, k and the schedule, never on what the model says,
    which is what `theory.plain_forwards` and `theory.overlap_forwards` claim.
    """
    ms = list(ms)
    reference = autoregressive(model, prompt, max_new_tokens=max(ms)).tokens  # greedy: a prefix for every m
    return {k: [speculative(model, OracleDrafter(reference, 1.0), prompt, max_new_tokens=m, k=k,
                            schedule=schedule).forwards for m in ms] for k in ks}


def format_steps(trace: Trace, limit: int | None = None) -> str:
    """The steps of a speculative Trace as a text table: what each step drafted, kept and added."""
    def toks(ids):
        return " ".join(token_repr(t) for t in ids) or "-"

    lines = [f"{trace.method} (k={trace.k}, schedule={trace.schedule}): {len(trace.tokens)} tokens in "
             f"{trace.forwards} target forwards",
             f"{'step':>4} {'fwd':>3}  {'predict':<7}  {'drafts':<24} {'kept':>4}  {'then':<16} emitted"]
    steps = trace.steps if limit is None else trace.steps[:limit]
    for i, s in enumerate(steps):
        pred = token_repr(s.predict_token) if s.predict_token is not None else "-"
        if i == 0:
            then = "prefill"
        elif s.bonus is None:
            then = "-"
        else:
            then = f"{token_repr(s.bonus)} ({'bonus' if s.bonus_source == 'target' else 'fix'})"
        lines.append(f"{i:>4} {s.forwards:>3}  {pred:<7}  {toks(s.drafted):<24} {s.accepted:>4}  {then:<16} "
                     f"{toks(s.emitted)}")
    if limit is not None and len(trace.steps) > limit:
        lines.append(f"... {len(trace.steps) - limit} more steps")
    return "\n".join(lines)


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


def meta_backward_memory(ks=(2, 4, 8), *, preset: str = "tiny", batch_size: int = 8, device="cpu",
                         seed: int = 0, progress: bool = False) -> dict[str, dict[int, float]]:
    """Peak memory (MiB) of one `train.meta_step` for K heads, memory-efficient against joint backward."""
    from .config import preset as get_preset
    from .data import get_batch, load_corpus
    from .model import GPT
    from .train import meta_step

    data = load_corpus("code", "train")
    out: dict[str, dict[int, float]] = {"memory-efficient": {}, "joint backward": {}}
    if progress:
        from tqdm.auto import tqdm
        ks = tqdm(list(ks), desc="peak memory", unit="K")
    for K in ks:
        cfg = get_preset(preset).with_heads("meta", K)
        torch.manual_seed(seed)
        model = GPT(cfg).to(device).train()
        x = get_batch(data, batch_size, cfg.block_size, torch.Generator().manual_seed(seed)).to(device)
        for label, eff in (("memory-efficient", True), ("joint backward", False)):
            model.zero_grad(set_to_none=True)
            out[label][K] = peak_memory(lambda m=model, x=x, e=eff: meta_step(m, x, freeze_trunk=False, memory_efficient=e),
                                        device) / 2 ** 20
    return out


def meta_gradients_agree(*, preset: str = "tiny", K: int = 4, batch_size: int = 4, seed: int = 0) -> float:
    """Largest absolute difference between the gradients of the two `meta_step` backward orders."""
    from .config import preset as get_preset
    from .data import get_batch, load_corpus
    from .model import GPT
    from .train import meta_step

    cfg = get_preset(preset).with_heads("meta", K)
    torch.manual_seed(seed)
    model = GPT(cfg).train()
    x = get_batch(load_corpus("code", "train"), batch_size, cfg.block_size, torch.Generator().manual_seed(seed))
    grads = []
    for eff in (True, False):
        model.zero_grad(set_to_none=True)
        meta_step(model, x, freeze_trunk=False, memory_efficient=eff)
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    return max(float((a - b).abs().max()) for a, b in zip(*grads))


# ---------------------------------------------------------------------------------- the losses' shift
def shift_table(T: int, K: int) -> str:
    """Which token each head is scored against in `losses.multi_token_loss` (targets = next-token shift).

    Rows are heads k = 0..K-1, columns positions i = 0..T-1; a cell names the input token x[j]
    that head k at position i must predict (j = i + k + 1), or '.' where the target lies past the window.
    """
    lines = ["head  " + " ".join(f"i={i:<3}" for i in range(T))]
    for k in range(K):
        cells = [f"x[{i + k + 1}]" if i + k + 1 <= T else "." for i in range(T)]
        lines.append(f"k={k:<3} " + " ".join(f"{c:<5}" for c in cells))
    return "\n".join(lines)


def peaked_logits(x: torch.Tensor, K: int, V: int, *, shift: int, strength: float = 8.0) -> torch.Tensor:
    """Packed (B, T, K*V) logits for x of shape (B, T+1) in which head k at position i puts its mass
    on x[i + k + shift] (uniform where that lies past the window): a model that is perfect at `shift`."""
    B, T1 = x.shape
    T = T1 - 1
    logits = torch.zeros(B, T, K, V)
    for k in range(K):
        for i in range(T):
            j = i + k + shift
            if j < T1:
                logits[torch.arange(B), i, k, x[:, j]] = strength
    return logits.view(B, T, K * V)  # (B, T, K*V)


# ---------------------------------------------------------------------------------- DeepSeek
def label_layout(T: int = 10, D: int = 1) -> list[dict]:
    """DeepSeek-V3's training layout for a sequence t_1..t_{T+1} (1-based token numbers).

    Row 'main': position i reads t_i and is scored against t_{i+1}, i = 1..T.
    Row 'module k': position i (i = 1..T-k) reads the depth-(k-1) hidden state at i and Emb(t_{i+k}),
    and is scored against t_{i+k+1}: labels t_{2+k..T+1}, eq. (24).
    Each row maps position i -> (token read, label).
    """
    if T < 1 or D < 0:
        raise MtplabError(f"need T >= 1 and D >= 0 (got T={T}, D={D})")
    rows = [{"name": "main model", "k": 0, "reads": {i: i for i in range(1, T + 1)},
             "labels": {i: i + 1 for i in range(1, T + 1)}}]
    for k in range(1, D + 1):
        rows.append({"name": f"MTP module {k}", "k": k, "reads": {i: i + k for i in range(1, T - k + 1)},
                     "labels": {i: i + k + 1 for i in range(1, T - k + 1)}})
    return rows


@torch.inference_mode()
def layout_matches_model(model, *, T: int = 10, seed: int = 0) -> bool:
    """Check `label_layout` against the model itself, by perturbing one token at a time.

    For every depth and position of the layout: changing the token the depth reads changes its
    logits there, and changing its label (and everything after it) does not.
    """
    D = model.config.n_modules
    dev = model.wte.weight.device
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(V, (1, T), generator=g).to(dev)  # t_1..t_T at 0-based indices 0..T-1
    base = model.depth_logits(x)  # (1, T, D+1, V)

    def bumped(from_token: int):  # add 1 to t_j for every j >= from_token (1-based)
        y = x.clone()
        y[0, from_token - 1:] = (y[0, from_token - 1:] + 1) % V
        return model.depth_logits(y)

    def one(token: int):
        y = x.clone()
        y[0, token - 1] = (y[0, token - 1] + 1) % V
        return model.depth_logits(y)

    for row in label_layout(T, D):
        d = row["k"]  # depth index: 0 the main model, k module k
        for i, reads in row["reads"].items():
            label = row["labels"][i]
            if torch.allclose(one(reads)[0, i - 1, d], base[0, i - 1, d]):  # must see what it reads
                return False
            if label <= T and not torch.equal(bumped(label)[0, i - 1, d], base[0, i - 1, d]):
                return False
    return True


@torch.inference_mode()
def forced_and_free(model, windows: torch.Tensor, prompt_lens, *, progress: bool = False) -> dict[str, list[float]]:
    """Accuracy of DeepSeek depths 2..D+1 against the true tokens, teacher-forced against free-running.

    For each window x and prompt length P: the main model reads x[:P] and guesses g = the token at P.
    Teacher forcing (training): module k reads the true x[P-1+k] and predicts x[P+k].
    Free running (inference): module 1 reads g, module k > 1 reads the draft of module k-1, and
    predicts the same x[P+k]. Returns per-depth accuracy under each, and the main model's own.
    """
    D = model.config.n_modules
    if D < 1:
        raise MtplabError("forced_and_free needs a DeepSeek checkpoint (deepseek-d1, deepseek-d3)")
    dev = model.wte.weight.device
    forced = torch.zeros(D)
    free = torch.zeros(D)
    main = 0
    n = 0
    it = windows
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(windows, desc="forced and free", unit="window")
    for x in it:
        x = x.tolist()
        for P in prompt_lens:
            if P + D + 1 > len(x) or P + D + 1 > model.config.block_size:
                continue
            ids = torch.tensor([x[:P + D]], device=dev)
            full = model(ids)  # the trunk is causal: its first P positions are the prompt's own forward
            logits = model.mtp.train_logits(model, ids, full)  # (1, P+D, D, V) teacher-forced modules
            out = TrunkOutput(hidden=full.hidden[:, :P], logits=full.logits[:, :P], pre_last=full.pre_last[:, :P])
            g = int(out.logits[0, -1].argmax())
            drafter = DeepSeekDrafter(model)
            drafter.begin(model, x[:P] + [g], out, P, max_new_tokens=D + 1, generator=None,
                          temperature=0.0, top_k=None)
            drafts = drafter.propose(D).tokens
            for k in range(1, D + 1):
                truth = x[P + k]
                forced[k - 1] += int(logits[0, P - 1, k - 1].argmax()) == truth
                free[k - 1] += drafts[k - 1] == truth
            main += g == x[P]
            n += 1
    if n == 0:
        raise MtplabError("no (window, prompt length) pair fits; use longer windows or shorter prompts")
    return {"main": [main / n], "teacher-forced": (forced / n).tolist(), "free-running": (free / n).tolist(),
            "n": n}


# ---------------------------------------------------------------------------------- sampling
def random_model(*, vocab_size: int = 8, seed: int = 0, noise: float = 2.0, heads: str = "none", n_depths: int = 1,
                 device="cpu", n_layer: int = 2, n_head: int = 2, n_embd: int = 32, block_size: int = 96):
    """A small random GPT whose distributions are far from uniform (for exact sampling studies and tests)."""
    from .model import GPT

    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab_size, n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size,
                      heads=heads, n_depths=n_depths)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * noise * p.std().clamp(min=0.02))
    return model.to(device)



def accept_counts(p: torch.Tensor, q: torch.Tensor, n: int, *, generator: torch.Generator, rule=None) -> dict:
    """Draw a draft d ~ q, let `rule` (default: `decoding.accept`) keep it or replace it, n times.

    p, q: (V,) target and draft distributions. Returns counts of the emitted token (V,) and the
    fraction of drafts kept. `rule(drafts, p_rows, q_rows, greedy=False, generator=...)` has
    `decoding.accept`'s signature; p_rows has one row, so a kept draft ends the step.
    """
    rule = rule or accept
    V = p.shape[0]
    counts = torch.zeros(V)
    kept = 0
    for _ in range(n):
        d = int(torch.multinomial(q, 1, generator=generator))
        n_ok, nxt, _ = rule([d], p[None], q[None], greedy=False, generator=generator)
        tok = d if n_ok == 1 else nxt
        counts[tok] += 1
        kept += n_ok
    return {"counts": counts, "kept": kept / n}


def chi_square(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> dict:
    """Pearson's chi-square test of counts against probs; cells expecting < min_expected are pooled.

    The p-value is the upper tail of the chi-square distribution, via torch.special.gammaincc.
    A p-value far below 0.01 says the counts were not drawn from probs.
    """
    counts = counts.double().flatten()
    expected = probs.double().flatten() * counts.sum()
    big = expected >= min_expected
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = max(1, int(keep.sum()) - 1)
    pvalue = float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                           torch.tensor(stat / 2.0, dtype=torch.float64)))
    return {"stat": stat, "dof": dof, "pvalue": pvalue}


@torch.inference_mode()
def second_token_marginal(model, prompt: list[int], *, temperature: float = 1.0, top_k=None) -> torch.Tensor:
    """Exact P(second new token) after `prompt`, summing over the first: (V,)."""
    V = model.config.vocab_size
    dev = model.wte.weight.device
    p1 = distribution(model(torch.tensor([prompt], device=dev)).logits[0, -1:], temperature, top_k)[0]  # (V,)
    seqs = torch.tensor([prompt + [a] for a in range(V)], device=dev)  # (V, P+1)
    p2 = distribution(model(seqs).logits[:, -1], temperature, top_k)  # (V, V): first -> second
    return (p1[:, None] * p2).sum(0).cpu()


def second_token_counts(model, make_drafter, prompt: list[int], n: int, *, k: int = 3, temperature: float = 1.0,
                        top_k=None, seed: int = 0, progress: bool = False) -> dict:
    """Counts of the second new token over n speculative runs (the first is sampled in the prefill,
    the second is the first one a drafter proposes), and the fraction of drafts kept."""
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V)
    drafted = kept = 0
    it = range(n)
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc="speculative samples", unit="run")
    for _ in it:
        tr = speculative(model, make_drafter(), prompt, max_new_tokens=3, k=k, temperature=temperature,
                         top_k=top_k, generator=g)
        counts[tr.tokens[1]] += 1
        drafted += tr.num_draft_tokens
        kept += tr.num_accepted_tokens
    return {"counts": counts, "kept": kept / max(1, drafted)}


@torch.inference_mode()
def acceptance_by_rule(target, draft, windows: torch.Tensor, *, temperatures=(1.0,)) -> dict:
    """Expected acceptance of one draft token at every position of some windows (teacher-forced).

    greedy: the draft is the drafter's argmax, kept if it equals the target's argmax.
    sampling at temperature T: the draft d ~ q is kept with probability min(1, p(d)/q(d)); averaged
    over d this is sum_v min(p(v), q(v)) = 1 - total variation distance between p and q.
    Returns {"greedy": float, "sampling": {T: float}}.
    """
    dev = target.wte.weight.device
    x = windows[:, :-1]
    p_logits = target(x.to(dev)).logits.float()  # (B, T, V)
    q_logits = draft(x.to(draft.wte.weight.device)).logits.float().to(dev)
    greedy = (p_logits.argmax(-1) == q_logits.argmax(-1)).float().mean().item()
    sampling = {}
    for t in temperatures:
        p = torch.softmax(p_logits / t, -1)
        q = torch.softmax(q_logits / t, -1)
        sampling[t] = torch.minimum(p, q).sum(-1).mean().item()
    return {"greedy": greedy, "sampling": sampling}
