"""Notebook 01, the autoregressive bottleneck: decodes timed with and without the KV cache, dynamic INT8 on the
CPU, ms per token; and the checkers of its exercises (`check_speedup`, `check_latency_cut`).
"""
from __future__ import annotations

import math
import torch
from mtplab.measuring import theory
import statistics
import warnings
from mtplab.decoding.loop import autoregressive
from mtplab.decoding.trace import Trace
from mtplab.teaching.check import Check
from mtplab.teaching.check import _call
from mtplab.teaching.check import _number
from mtplab.errors import MtplabError
from mtplab import paths
from mtplab.decoding.drafters import pair
from mtplab.measuring.race import race
from mtplab.measuring.record import Record


# ---------------------------------------------------------------------------------- notebook 01
def check_speedup(fn) -> Check:
    """fn(tokens_per_step, cost_curve, q) -> predicted wall-clock speedup over autoregressive decoding.

    cost_curve is {q: t(q)/t(1)}; a step feeds q tokens to one forward and commits tokens_per_step tokens.
    """
    name = "predicted speedup"
    curves = [{1: 1.0, 2: 1.05, 4: 1.2, 8: 1.7}, {1: 1.0, 2: 1.6, 4: 2.9, 8: 5.5}, {1: 1.0, 4: 1.0, 8: 1.0}]
    cases = [(3.2, curves[0], 4), (1.8, curves[0], 2), (3.2, curves[1], 4), (4.0, curves[2], 4), (6.5, curves[0], 8)]
    for tps, curve, q in cases:
        want = theory.predicted_speedup(tps, curve, q)
        got, err = _call(fn, tps, dict(curve), q)
        if err:
            return Check(name, False, f"fn({tps}, {curve}, {q}) raised {err}")
        g = _number(got)
        if g is None:
            return Check(name, False, f"fn({tps}, {curve}, {q}) returned {got!r}; return a number")
        if not math.isclose(g, want, rel_tol=1e-6):
            hint = ""
            if math.isclose(g, tps, rel_tol=1e-6):
                hint = (" That is the step count alone (the sources' view); a step's forward over q tokens "
                        f"costs t(q)/t(1) = {curve[q]} forwards of one token, not 1.")
            elif math.isclose(g, tps * curve[q], rel_tol=1e-6):
                hint = " You multiplied by the cost of the step; divide: tokens per unit of time."
            return Check(name, False, f"wrong on a case like fn({tps}, {curve}, q={q}), which gave {g:.4g}.{hint}")
    return Check(name, True, "tokens per step divided by the step's cost in units of t(1), as "
                             "theory.predicted_speedup computes it")


def check_latency_cut(fn) -> Check:
    """fn(speedup) -> the fraction of decoding latency removed by that speedup (0.75 for 4x)."""
    name = "latency cut from a speedup"
    for s in (4.0, 2.0, 1.25, 1.0, 10.0):
        got, err = _call(fn, s)
        if err:
            return Check(name, False, f"fn({s}) raised {err}")
        g = _number(got)
        want = 1 - 1 / s
        if g is None:
            return Check(name, False, f"fn({s}) returned {got!r}; return a fraction between 0 and 1")
        if not math.isclose(g, want, abs_tol=1e-9):
            hint = ""
            if math.isclose(g, s - 1, abs_tol=1e-9):
                hint = " That is 'how much faster' (s - 1), not how much of the time is gone."
            elif math.isclose(g, 1 / s, abs_tol=1e-9):
                hint = " That is the latency that remains, not the part removed."
            return Check(name, False, f"wrong on a case like fn({s}), which gave {g:.4g}.{hint}")
    k4 = theory.sources_claim_latency_cut(4)
    return Check(name, True, f"a speedup s removes 1 - 1/s of the latency; the sources' 4x gives {k4:.0%}")


def timed_decodes(variants: dict, prompt_ids, *, max_new_tokens: int, repeats: int = 5,
                  progress: bool = False) -> tuple[dict[str, Trace], dict[str, list[float]]]:
    """Greedy autoregressive decoding of the same prompt by several (model, use_cache) variants, raced
    (`measuring.race`: one short warm-up decode each, then `repeats` rounds in rotating order).

    Returns ({label: the Trace of its median round}, {label: ms per token of every round}); each Trace's steps
    carry their wall time (`Step.wall_s`)."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise MtplabError(f"repeats must be an integer >= 1 (got {repeats!r})")
    traces: dict[str, list[Trace]] = {label: [] for label in variants}

    def decoder(label, model, use_cache):
        def run(ids, warm=False):
            tr = autoregressive(model, ids, max_new_tokens=4 if warm else max_new_tokens, use_cache=use_cache)
            if not warm:
                traces[label].append(tr)  # every round's trace: ms per token is read from its steps
            return tr
        return run
    fns = {label: decoder(label, *v) for label, v in variants.items()}
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=repeats * len(fns), desc="decoding", unit="decode")
    model = next(iter(variants.values()))[0]
    race(fns, [prompt_ids], baseline=next(iter(fns)), rounds=repeats, device=model.wte.weight.device, bar=bar,
         warmup=lambda label, fn: fn(prompt_ids, warm=True))  # the first decode pays one-off costs
    if bar is not None:
        bar.close()
    ms = {label: [ms_per_token(t) for t in ts] for label, ts in traces.items()}
    median = {label: sorted(ts, key=ms_per_token)[len(ts) // 2] for label, ts in traces.items()}
    return median, ms


def spread(values) -> str:
    """'median (min-max), n = N' of a list of numbers: how a live timing is printed."""
    v = sorted(values)
    return f"{statistics.median(v):.2f} (range {v[0]:.2f}-{v[-1]:.2f}, n = {len(v)})"


def benchmark_row(label: str, path=paths.DECODE_JSON) -> tuple[dict | None, str]:
    """The shipped decode benchmark's row for the pair labelled `label` and the machine it was measured on (a
    line), or (None, why) when the record has no such row."""
    rec = Record.load(path)
    p = pair(label)
    row = rec.row(method=p.method, checkpoint=p.checkpoint)
    if row is None:
        return None, f"{rec.path.name} has no row for {label!r}"
    return row, rec.machine_text().removeprefix("measured on ")  # notebook 01 prints "measured on {where}"


def ms_per_token(trace: Trace) -> float:
    """Median wall time of one decoding step after the prefill, in milliseconds."""
    return 1e3 * statistics.median(s.wall_s for s in trace.steps[1:]) if len(trace.steps) > 1 else float("nan")


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
