"""Per-step costs of the decode loop, for comparing two versions of the code on the same checkpoints.

    OMP_NUM_THREADS=2 python scripts/step_costs.py --json out.json            # this checkout
    PYTHONPATH=/path/to/old/checkout python scripts/step_costs.py --json old.json

Measures t(1) and t(4) (one cached forward over 1 or 4 new tokens, 300 cached tokens, median), the
fraction of the memory roofline t(1) reaches (weight and cache bytes / the bandwidth a large matrix-vector
product reaches here), and each drafter's time per decoding step (its propose and its feedback, timed by
wrapping them, so the same script measures code that records no drafter time of its own). Works with both
the old drafter contract (propose returns a tuple) and the new one (a Draft). Run it alone on the machine.
"""
import argparse
import json
import statistics
import time

import torch

from mtplab.model import checkpoint as ckpt
from mtplab.data import held_out_prompts
from mtplab.decoding.loop import speculative
from mtplab.measuring.timing import forward_cost, measure_cost_curve
from mtplab.tokenizer import encode

ROWS = [("blockwise-overlap", "stern-k4", 4), ("meta", "meta-k4", 4), ("deepseek", "deepseek-d1", 2),
        ("deepseek", "deepseek-d3", 4), ("draft-model", "ntp", 4), ("ngram", "ntp", 4)]


def make_drafter(method, model, draft):
    from mtplab.decoding import drafters
    if hasattr(drafters, "METHODS"):
        m = drafters.METHODS[method]
        return m.make(model, draft_model=draft), m.schedule
    return drafters.for_method(method, model, draft_model=draft)


def matvec_bandwidth(repeats=9) -> float:
    """Bytes per second a large fp32 matrix-vector product reads (64 MiB matrix, median)."""
    a, x = torch.randn(4096, 4096), torch.randn(4096)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ x
        ts.append(time.perf_counter() - t0)
    return a.numel() * 4 / statistics.median(ts)


def drafter_step_cost(method, model, draft, prompts, k, reps=3):
    costs = []
    for _ in range(reps):
        for p in prompts:
            d, schedule = make_drafter(method, model, draft)
            spent = [0.0]

            def timed(fn, spent=spent):
                def wrap(*a, **kw):
                    t0 = time.perf_counter()
                    r = fn(*a, **kw)
                    spent[0] += time.perf_counter() - t0
                    return r
                return wrap
            d.propose, d.feedback = timed(d.propose), timed(d.feedback)
            tr = speculative(model, d, p, max_new_tokens=64, k=k, schedule=schedule)
            costs.append(spent[0] / max(1, len(tr.steps) - 1))
    return statistics.median(costs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    prompts = [encode(p)[:48] for p in held_out_prompts("code", 5, 48)]
    ntp = ckpt.load("ntp")
    curve = measure_cost_curve(ntp, qs=(1, 2, 4), context=300, repeats=21)
    bw = matvec_bandwidth()
    roof = forward_cost(ntp.config, 1, context=300)["bytes"] / bw
    res = {"t1_ms": curve.seconds[1] * 1e3, "t4_ms": curve.seconds[4] * 1e3, "t4_over_t1": curve.ratio[4],
           "matvec_GB_s": bw / 1e9, "roofline_t1_ms": roof * 1e3, "roofline_fraction": roof / curve.seconds[1],
           "threads": torch.get_num_threads(), "drafter_ms_per_step": {}}
    draft = ckpt.load("draft")
    with torch.inference_mode():
        for method, name, k in ROWS:
            model = ckpt.load(name)
            ms = drafter_step_cost(method, model, draft, prompts, k) * 1e3
            res["drafter_ms_per_step"][f"{method} ({name}, k={k})"] = ms
            print(f"{method:18s} {name:12s} k={k}: drafter {ms:.3f} ms/step", flush=True)
    print(json.dumps({k: v for k, v in res.items() if k != "drafter_ms_per_step"}, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
