"""`python -m mtplab bench k`: the choices engines make, measured on the shipped checkpoints.

* the best k: every head family and the n-gram drafter at k = 2 .. the most its checkpoint supports, each against AR
  of the same checkpoint, with the speedup the cost curve and the measured acceptance predict;
* adaptive k at the largest k: HF's "heuristic" schedule (+2 after a step that kept every draft, else -1; an option:
  transformers' default is a constant 20 drafts) and a confidence stop, against the best fixed k;
* one DeepSeek module reused (`deepseek-reuse`, module 1 applied recurrently) beside D = 3 separate modules and
  Meta's heads, by acceptance per position.
Greedy, fp32, interleaved with AR, median of rounds. Run alone.
"""
from __future__ import annotations

from pathlib import Path

from mtplab.bench.report import _md, _write
from mtplab.data import held_out_ids
from mtplab.decoding.drafters import METHODS, pair
from mtplab.decoding.generate import load_for, max_k
from mtplab.decoding.trace import pooled
from mtplab.device import pick
from mtplab.measuring.speedup import tokens_per_step
from mtplab.measuring.theory import predicted_speedup
from mtplab.measuring.timing import interleaved_race, measure_cost_curve

# the shipped pairs swept over k: each family's default on its deepest checkpoint, one module reused, n-gram
SWEEP = [pair(label) for label in ("blockwise-overlap", "meta", "deepseek D=3", "deepseek D=1 reused", "ngram")]


def _row(label, method, name, k, race, curve, adapt=None) -> dict:
    tr = pooled(race["traces"])
    ar = pooled(race["ar_traces"])
    tps = tokens_per_step(tr)  # after the prefills (`Step.prefill`), which draft nothing
    draft_cost = tr.time_split()["draft_s"] / max(1e-12, ar.time_split()["target_s"])
    plain = METHODS[method].schedule == "plain"
    return {"label": label, "method": method, "checkpoint": name, "k": k, "adapt": adapt or "fixed",
            "tokens_per_forward": race["tokens_per_forward"],
            "tokens_per_step": tps, "acceptance_per_position": tr.acceptance_rate_per_position,
            "speedup": race["speedup"], "speedup_min": race["speedup_min"], "speedup_max": race["speedup_max"],
            "speedup_predicted": predicted_speedup(tps, curve.ratio, k - 1 if plain else k, draft_cost=draft_cost,
                                                   plain=plain),
            "identical": race["identical"], "prompts": race["prompts"]}


def run_k(a) -> dict:
    from tqdm.auto import tqdm

    dev = pick(a.device)
    n, m, reps = (2, 24, 1) if a.quick else (4, 64, 3)
    prompts = held_out_ids(n)
    sweep = SWEEP[:2] + SWEEP[-1:] if a.quick else SWEEP
    models = {p.checkpoint: load_for(p.method, p.checkpoint, device=a.device)[0] for p in sweep}
    curve = measure_cost_curve(models[sweep[0].checkpoint], qs=range(1, 9), context=128, repeats=3 if a.quick else 9)
    plan = []
    for p in sweep:  # by field: a Pair has more fields than these (`decoding.drafters.Pair`)
        top = max_k(p.method, models[p.checkpoint]) or 8
        top = min(top, 4 if a.quick else 8)
        plan += [(p.label, p.method, p.checkpoint, k, None) for k in range(2, top + 1)]
        plan += [(p.label, p.method, p.checkpoint, top, ad) for ad in ("schedule", "confidence")]
    rows = []
    for label, method, name, k, ad in tqdm(plan, desc="bench k", unit="setting"):
        race = interleaved_race(method, models[name], prompts, max_new_tokens=m, k=k, repeats=reps, adapt=ad)
        rows.append(_row(label, method, name, k, race, curve, ad))
    best = {}
    for r in rows:
        if r["adapt"] == "fixed" and r["speedup"] > best.get(r["label"], {"speedup": 0})["speedup"]:
            best[r["label"]] = r
    data = {"prompts": n, "max_new_tokens": m, "repeats": reps, "cost_curve": {str(q): v for q, v in curve.ratio.items()},
            "rows": rows, "best": {k: {"k": v["k"], "speedup": v["speedup"]} for k, v in best.items()}}
    cols = ["label", "k", "adapt", "tokens_per_forward", "tokens_per_step", "acceptance_per_position", "speedup",
            "speedup_min", "speedup_max", "speedup_predicted", "identical", "prompts"]
    table = (f"k sweep: greedy, fp32, m = {m}, {n} held-out prompts, {reps} interleaved rounds with AR of the same "
             "checkpoint (median, range); predicted = tokens per step / (t(q)/t(1) + drafter time in units of t(1)); "
             "t(q)/t(1): " + " ".join(f"{q}:{v:.2f}" for q, v in curve.ratio.items()) + "\n\n" + _md(rows, cols)
             + "\n\nbest fixed k: " + ", ".join(f"{k} k={v['k']} ({v['speedup']:.2f}x)" for k, v in best.items()))
    _write(Path(a.out), "k-quick" if a.quick else "k", data, table, device=dev)
    return data
