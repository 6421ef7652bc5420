"""`python -m mtplab bench decode`: every method on the shipped checkpoints, against AR of the same model.

Each (prompt, method) pair runs AR and the method back to back, over several interleaved repeats; the oracle
draws one random stream per (repeat, prompt), so its verdicts are not one stream copied over every prompt; the
report gives medians and ratios. Every number that feeds the prediction is measured:

    predicted speedup = tokens per step * t(1) / (t(q) + drafter time per step [+ t(1) for plain's predict])

with t(q) from the cost curve (one forward over q new tokens on a warm cache) and the drafter's time per
step from the traces themselves (`Trace.time_split`). Efficiency = measured / predicted; what is left is
the loop's own overhead and the difference between the cost curve's cache length and the decode's.

Greedy output is compared with AR token for token. In fp32 it must be identical (the lab's guarantee); in
bf16, near-ties (top-2 logits within about 0.004) can flip between a one-token and a q-token forward, so
mismatching prompts are counted and reported, not asserted.
"""
from __future__ import annotations

import statistics
from pathlib import Path
import torch
from mtplab.device import now
from mtplab.device import describe, machine, pick
from mtplab.decoding.drafters import PAIRS
from mtplab.decoding.generate import DTYPES, decode_with, load_for, max_k
from mtplab.measuring.timing import measure_cost_curve
from mtplab.decoding.trace import Trace, conditional_counts, pooled
from mtplab.bench.report import _md, _write
from mtplab.data import held_out_prompts
from mtplab.measuring.theory import predicted_speedup
from mtplab.errors import MtplabError
from mtplab.model import checkpoint as ckpt
from mtplab.tokenizer import encode

# every shipped pair (label, method, checkpoint, k; k None = the most the checkpoint supports), but the reused
# module, which `bench k` studies
ROWS = [p for p in PAIRS if p.method != "deepseek-reuse"]


def oracle_seed(repeat: int, prompt: int) -> int:
    """The oracle's seed for one (repeat, prompt): one random stream per prompt, never one stream copied over all."""
    return 1000 * repeat + prompt


def _first_tokens_per_forward(traces: list[Trace], limit: int = 64) -> float:
    toks = fw = 0
    for t in traces:
        c = 0
        for s in t.steps:
            if c >= limit:
                break
            c += len(s.emitted)
            toks += len(s.emitted)
            fw += s.forwards
    return toks / max(1, fw)


def _row(label, method, name, k, traces, walls, walls_ar, curve, mismatches, reps) -> dict:
    n = len(walls) // reps
    per_rep = [sum(walls_ar[i * n:(i + 1) * n]) / sum(walls[i * n:(i + 1) * n]) for i in range(reps)]
    toks = sum(len(t.tokens) for t in traces)
    fw = sum(t.forwards for t in traces)
    drafts = sum(t.num_drafts for t in traces)
    steps = [s for t in traces for s in t.steps[1:]]
    tps = sum(len(s.emitted) for s in steps) / max(1, len(steps))  # tokens per step after the prefill
    acc = [sum(t.accepted_per_position[i] if i < len(t.accepted_per_position) else 0 for t in traces)
           / max(1, drafts) for i in range(k - 1)]
    counts = conditional_counts(pooled(traces))  # (accepted, reached) per position; the prefill drafts nothing
    counts = (counts + [(0, 0)] * (k - 1))[:k - 1]
    accepted, reached = [a for a, _ in counts], [r for _, r in counts]
    cond = [a / r if r else float("nan") for a, r in counts]
    t1 = curve.seconds[1]
    plain = method == "blockwise"
    q = k - 1 if plain else k
    target_step = statistics.median(s.target_s for s in steps)
    draft_step = statistics.median(s.draft_s for s in steps)
    wall_step = statistics.median(s.wall_s for s in steps)
    predicted = predicted_speedup(tps, curve.ratio, q, plain=plain, draft_cost=draft_step / t1)
    measured = statistics.median(per_rep)
    return {"label": label, "method": method, "checkpoint": name, "k": k, "tokens_per_forward": toks / fw,
            "tokens_per_forward_first64": _first_tokens_per_forward(traces), "tokens_per_step": tps,
            "acceptance_per_position": acc, "conditional_acceptance": cond,
            "drafting_steps": sum(1 for s in steps if s.drafted), "reached": reached,
            "accepted": accepted,
            "mean_accepted_length": 1 + sum(t.num_accepted_tokens for t in traces) / max(1, drafts),
            "step_ms_target": target_step * 1e3, "step_ms_drafter": draft_step * 1e3,
            "step_ms_overhead": max(0.0, wall_step - target_step - draft_step) * 1e3,
            "drafter_cost_t1": draft_step / t1, "speedup_wall": measured, "speedup_wall_reps": per_rep,
            "speedup_predicted": predicted,
            "efficiency": measured / predicted if predicted else float("nan"),
            "greedy_mismatches": mismatches}


def record_name(a) -> str:
    """decode[-quick][-bf16][-Nthreads]: one thread is the default record."""
    threads = torch.get_num_threads()
    return (("decode-quick" if a.quick else "decode") + ("" if a.dtype == "fp32" else f"-{a.dtype}")
            + ("" if threads == 1 else f"-{threads}threads"))


def run_decode(a) -> dict:
    from tqdm.auto import tqdm


    dev = pick(a.device)
    n_prompts, m, reps = (4, 64, 2) if a.quick else (20, 128, 3)
    if getattr(a, "prompts", None) is not None:
        if not 1 <= a.prompts <= 20:
            raise MtplabError(f"--prompts must be in 1..20, the held-out prompts there are (got {a.prompts})")
        n_prompts = a.prompts
    prompts = [encode(p)[:48] for p in held_out_prompts("code", n_prompts, 48)]
    models = {name: load_for(method, name, device=a.device, dtype=a.dtype)[0] for _, method, name, _ in ROWS}
    draft = ckpt.load("draft", device=dev, dtype=DTYPES[a.dtype])
    curve = measure_cost_curve(models["ntp"], qs=range(1, 9), context=300, repeats=5 if a.quick else 15)
    walls = {r[0]: [] for r in ROWS}
    walls_ar = {r[0]: [] for r in ROWS}
    traces: dict[str, list[Trace]] = {r[0]: [] for r in ROWS}
    mismatches = {r[0]: 0 for r in ROWS}
    for _, method, name, k in ROWS:  # warm-up: the first decode of each method pays one-off costs
        decode_with(method, models[name], prompts[0], max_new_tokens=8, k=k, draft_model=draft,
                    reference=list(range(8)))
    bar = tqdm(total=reps * len(prompts) * len(ROWS), desc=f"bench decode m={m}")
    for r in range(reps):
        for i, p in enumerate(prompts):
            for label, method, name, k in ROWS:  # interleaved: AR of the same model right beside each method
                model = models[name]
                kk = k if k is not None else max_k(method, model)
                t0 = now(dev)
                ar = decode_with("ar", model, p, max_new_tokens=m)
                walls_ar[label].append(now(dev) - t0)
                t0 = now(dev)
                tr = decode_with(method, model, p, max_new_tokens=m, k=kk, draft_model=draft, alpha=0.8,
                                 seed=oracle_seed(r, i), reference=ar.tokens)  # the oracle's knowledge is not part of its time
                walls[label].append(now(dev) - t0)
                if r == 0:
                    mismatches[label] += tr.tokens != ar.tokens
                    traces[label].append(tr)
                bar.update(1)
    bar.close()
    rows = []
    for label, method, name, k in ROWS:
        kk = k if k is not None else max_k(method, models[name])
        rows.append(_row(label, method, name, kk, traces[label], walls[label], walls_ar[label], curve,
                         mismatches[label], reps))
    data = {"device": describe(dev), "machine": machine(dev),
            "dtype": a.dtype, "threads": torch.get_num_threads(), "prompts": len(prompts),
            "max_new_tokens": m, "repeats": reps, "t1_ms": curve.seconds[1] * 1e3,
            "cost_curve": {str(q): v for q, v in curve.ratio.items()}, "rows": rows}
    table = (f"decode benchmark: {len(prompts)} held-out prompts, m={m} new tokens, {reps} interleaved repeats "
             f"(median), {a.dtype}, {describe(dev)}, {torch.get_num_threads()} threads; t(1) = "
             f"{curve.seconds[1] * 1e3:.2f} ms, t(q)/t(1): " + " ".join(f"{q}:{v:.2f}" for q, v in curve.ratio.items())
             + "\nstep_ms_*: median per decoding step (target forwards, drafter, the rest of the loop), measured.\n\n"
             + _md(rows, ["label", "k", "tokens_per_forward", "tokens_per_step", "acceptance_per_position",
                          "conditional_acceptance", "mean_accepted_length", "step_ms_target", "step_ms_drafter",
                          "step_ms_overhead", "speedup_wall", "speedup_predicted", "efficiency",
                          "greedy_mismatches"]))
    _write(Path(a.out), record_name(a), data, table, device=dev)
    return data
