"""`python -m mtplab bench decode`: every method on the shipped checkpoints, against AR of the same model.

One race (`measuring.race`): every round runs every prompt through AR of each checkpoint and through every
pair, in rotating order; a pair's speedup in a round is its checkpoint's AR time over its own. The oracle draws
one random stream per (round, prompt), so its verdicts are not one stream copied over every prompt; the report
gives medians, ratios and the race's busy-machine verdict. Every number that feeds the prediction is measured:

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
from mtplab.device import describe, machine, pick
from mtplab.decoding.drafters import pairs
from mtplab.decoding.generate import DTYPES, decode_with, load_for, max_k
from mtplab.measuring.race import race
from mtplab.measuring.speedup import tokens_per_step, verify_width
from mtplab.measuring.timing import measure_cost_curve
from mtplab.decoding.trace import Trace, conditional_counts, pooled
from mtplab.bench.report import held_out_count, _md, _write
from mtplab.data import held_out_prompts
from mtplab.measuring.theory import predicted_speedup
from mtplab.model import checkpoint as ckpt
from mtplab.tokenizer import encode

# every shipped pair (label, method, checkpoint, k; k None = the most the checkpoint supports), but the reused
# module, which `bench k` studies
ROWS = [p for p in pairs() if p.method != "deepseek-reuse"]


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


def _row(label, method, name, k, traces, ratios, curve, mismatches, ar_traces) -> dict:
    """One pair's row: counts from the pooled traces, the step's split (medians), the per-round speedups, and the
    target's time per step beside AR's own on the same checkpoint, prompts and round (`ar_step_ms_target`: one
    forward over one new token at the decode's own cache lengths)."""
    tr = pooled(traces)
    steps = tr.decoding_steps  # the prefills (`Step.prefill`) draft nothing
    tps = tokens_per_step(tr)  # tokens per step after the prefill
    acc = (tr.acceptance_rate_per_position + [0.0] * (k - 1))[:k - 1]
    counts = conditional_counts(tr)  # (accepted, reached) per position
    counts = (counts + [(0, 0)] * (k - 1))[:k - 1]
    t1 = curve.seconds[1]
    plain = tr.schedule == "plain"  # plain: one more forward (the predict) per step
    target_step = statistics.median(s.target_s for s in steps)
    draft_step = statistics.median(s.draft_s for s in steps)
    wall_step = statistics.median(s.wall_s for s in steps)
    ar_step = statistics.median(s.target_s for s in pooled(ar_traces).decoding_steps)
    predicted = predicted_speedup(tps, curve.ratio, verify_width(tr), plain=plain, draft_cost=draft_step / t1)
    measured = statistics.median(ratios)
    return {"label": label, "method": method, "checkpoint": name, "k": k, "tokens_per_forward": tr.tokens_per_forward,
            "tokens_per_forward_first64": _first_tokens_per_forward(traces), "tokens_per_step": tps,
            "acceptance_per_position": acc, "conditional_acceptance": [a / r if r else float("nan") for a, r in counts],
            "drafting_steps": tr.num_drafts, "reached": [r for _, r in counts], "accepted": [a for a, _ in counts],
            "mean_accepted_length": tr.mean_accepted_length,
            "step_ms_target": target_step * 1e3, "step_ms_drafter": draft_step * 1e3,
            "step_ms_overhead": max(0.0, wall_step - target_step - draft_step) * 1e3,
            "ar_step_ms_target": ar_step * 1e3, "target_over_ar_step": target_step / ar_step,
            "drafts_per_step": sum(len(s.drafted) for s in steps) / max(1, len(steps)),
            "drafter_cost_t1": draft_step / t1, "speedup_wall": measured, "speedup_wall_reps": ratios,
            "speedup_predicted": predicted,
            "efficiency": measured / predicted if predicted else float("nan"),
            "greedy_mismatches": mismatches}


def _table(data: dict) -> str:
    """The record's markdown: the setting and the cost curve on one line, then a row per pair."""
    curve = " ".join(f"{q}:{v:.2f}" for q, v in data["cost_curve"].items())
    return (f"decode benchmark: {data['prompts']} held-out prompts, m={data['max_new_tokens']} new tokens, "
            f"{data['repeats']} interleaved repeats (median; {data['verdict']}), {data['dtype']}, {data['device']}, "
            f"{data['threads']} threads; t(1) = {data['t1_ms']:.2f} ms at {data['cost_curve_context']} cached tokens "
            f"(the decode's mean), t(q)/t(1): {curve}\n"
            "step_ms_*: median per decoding step (target forwards, drafter, the rest of the loop), measured; "
            "ar_step_ms_target: AR's median step on the same checkpoint in the same round; drafts_per_step: mean "
            "drafts a verify checked.\n\n"
            + _md(data["rows"], ["label", "k", "tokens_per_forward", "tokens_per_step", "acceptance_per_position",
                                 "conditional_acceptance", "mean_accepted_length", "step_ms_target", "step_ms_drafter",
                                 "step_ms_overhead", "ar_step_ms_target", "drafts_per_step", "speedup_wall",
                                 "speedup_predicted", "efficiency", "greedy_mismatches"]))


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
        n_prompts = held_out_count(a)
    prompts = [encode(p)[:48] for p in held_out_prompts("code", n_prompts, 48)]
    models = {p.checkpoint: load_for(p.method, p.checkpoint, device=a.device, dtype=a.dtype)[0] for p in ROWS}
    draft = ckpt.load("draft", device=dev, dtype=DTYPES[a.dtype])
    # the cost curve at the decode's mean cache length (prompt + m/2), so t(q) is timed where the verifies run
    context = round(statistics.mean(len(p) for p in prompts)) + m // 2
    curve = measure_cost_curve(models["ntp"], qs=range(1, 9), context=context, repeats=5 if a.quick else 15)
    ks = {p.label: p.k if p.k is not None else max_k(p.method, models[p.checkpoint]) for p in ROWS}
    # the oracle knows AR's greedy text (untimed: its knowledge is not part of its time) and draws one random
    # stream per (round, prompt): its calls are counted per prompt
    refs = [decode_with("ar", models["ntp"], p, max_new_tokens=m).tokens for p in prompts]
    rounds_seen = [0] * len(prompts)

    def decoder(p, kk):
        def run(ip, warm=False):
            i, ids = ip
            seed = oracle_seed(rounds_seen[i], i)
            if p.method == "oracle" and not warm:
                rounds_seen[i] += 1
            return decode_with(p.method, models[p.checkpoint], ids, max_new_tokens=8 if warm else m, k=kk,
                               draft_model=draft, alpha=0.8, seed=seed, reference=refs[i])
        return run

    # AR of each checkpoint, and every pair: every prompt through all of them in each round (`race`)
    fns = {f"AR {name}": (lambda ip, warm=False, model=model: decode_with("ar", model, ip[1],
                                                                          max_new_tokens=8 if warm else m))
           for name, model in models.items()}
    fns.update({p.label: decoder(p, ks[p.label]) for p in ROWS})
    bar = tqdm(total=reps * len(prompts) * len(fns), desc=f"bench decode m={m}")
    res = race(fns, list(enumerate(prompts)), baseline="AR ntp", rounds=reps, device=dev, bar=bar,
               warmup=lambda label, fn: fn((0, prompts[0]), warm=True))  # the first decode pays one-off costs
    bar.close()
    rows = []
    for p in ROWS:
        ar = f"AR {p.checkpoint}"  # each pair against AR of its own checkpoint, round by round
        ratios = [b / c for b, c in zip(res.round_totals(ar), res.round_totals(p.label))]
        rows.append(_row(p.label, p.method, p.checkpoint, ks[p.label], res.outputs[p.label], ratios, curve,
                         len(prompts) - sum(x == y for x, y in zip(res.tokens[p.label], res.tokens[ar])),
                         res.outputs[ar]))
    data = {"device": describe(dev), "machine": machine(dev), "valid": res.valid, "verdict": res.verdict(),
            "dtype": a.dtype, "threads": torch.get_num_threads(), "prompts": len(prompts),
            "max_new_tokens": m, "repeats": reps, "t1_ms": curve.seconds[1] * 1e3,
            "cost_curve_context": context, "cost_curve": {str(q): v for q, v in curve.ratio.items()}, "rows": rows}
    _write(Path(a.out), record_name(a), data, _table(data), device=dev)
    return data
