"""`bench cost-curve`, `bench train` and `bench crossover`: what one forward costs against the tokens it is fed, what a
training step costs per head family, and where a drafter's cost stops paying.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
import torch

from mtplab.measuring.race import race
from mtplab.model.config import preset as get_preset
from mtplab.device import describe, now, pick
from mtplab.decoding.generate import DTYPES
from mtplab.measuring.timing import measure_cost_curve
from mtplab.model.gpt import GPT
from mtplab.bench.report import _md, _write
from mtplab.decoding.drafters import OracleDrafter
from mtplab.decoding.loop import autoregressive, speculative
from mtplab.training.steps import train_step
from mtplab.platform_compat import peak_rss_bytes


# ------------------------------------------------------------------------------------ cost curve
def run_cost_curve(a) -> dict:
    dev = pick(a.device)
    cfg = get_preset(a.preset)
    torch.manual_seed(0)
    model = GPT(cfg).to(dev, DTYPES[a.dtype]).eval()
    res = measure_cost_curve(model, qs=range(1, 17), context=min(300, cfg.block_size - 16),
                             repeats=5 if a.quick else 15, progress=True)
    data = {"preset": a.preset, "dtype": a.dtype, "device": describe(dev), "threads": torch.get_num_threads(),
            "context": res.context, "busy": res.busy, "t_s": {str(q): v for q, v in res.seconds.items()},
            "ratio": {str(q): v for q, v in res.ratio.items()}}
    rows = [{"q": q, "t (ms)": res.seconds[q] * 1e3, "t(q)/t(1)": res.ratio[q]} for q in res.ratio]
    from mtplab import viz
    _write(Path(a.out), f"cost-curve-{a.preset}-{a.dtype}", data,
           f"cost curve, preset {a.preset}, {a.dtype}, {describe(dev)}, cache {res.context} tokens"
           + (f"\n\nnot valid here: the machine was busy ({res.busy})" if res.busy else "") + "\n\n"
           + _md(rows, ["q", "t (ms)", "t(q)/t(1)"]), viz.cost_curve({a.dtype: res}, title=f"cost curve, preset {a.preset}"),
           device=dev)
    return data


# ------------------------------------------------------------------------------------ training
def _grown(before: int | None, after: int | None) -> int | None:
    """How far the peak resident memory grew (bytes); None where this system cannot read it."""
    return None if before is None or after is None else after - before


def _train_probe(spec: dict) -> dict:
    """One configuration, in this (fresh) process: median step time and peak memory."""
    dev = pick(spec["device"])
    torch.manual_seed(0)
    cfg = get_preset(spec["preset"]).with_heads(spec["heads"], spec["k"])
    model = GPT(cfg).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    B, T = spec["batch"], spec["T"]
    x = torch.randint(0, 256, (B, T + 1), device=dev)
    base_rss = peak_rss_bytes()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(spec["steps"] + 1):
        t0 = now(dev)
        train_step(model, x, freeze_trunk=False, lam=0.3, memory_efficient=spec["efficient"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i:
            times.append(now(dev) - t0)
    peak = (torch.cuda.max_memory_allocated() if dev.type == "cuda"
            else _grown(base_rss, peak_rss_bytes()))
    return {"tokens_per_s": B * T / statistics.median(times), "peak_bytes": peak}


def run_train(a) -> dict:
    quick = a.quick
    common = {"preset": "tiny" if quick else a.preset, "device": a.device, "batch": 8 if quick else 16,
              "T": 64 if quick else 256, "steps": 2 if quick else 4}
    configs = [("next-token", "none", 1, True), ("stern k=4", "stern", 4, True),
               ("meta k=4, head-by-head backward", "meta", 4, True), ("meta k=4, joint backward", "meta", 4, False),
               ("deepseek D=3 (k=4 depths)", "deepseek", 4, True)]
    rows = []
    from tqdm.auto import tqdm
    for label, heads, k, eff in tqdm(configs, desc="bench train"):
        spec = dict(common, heads=heads, k=k, efficient=eff)
        r = subprocess.run([sys.executable, "-c", "import json,sys; from mtplab.bench.costs import _train_probe; "
                            "print(json.dumps(_train_probe(json.loads(sys.argv[1]))))", json.dumps(spec)],
                           capture_output=True, text=True, check=True)
        rows.append({"config": label, **json.loads(r.stdout.strip().splitlines()[-1])})
    base = rows[0]
    for r in rows:
        r["speed vs next-token"] = r["tokens_per_s"] / base["tokens_per_s"]
        known = r["peak_bytes"] is not None and base["peak_bytes"] is not None  # None: not readable on this system
        r["memory vs next-token"] = r["peak_bytes"] / max(1, base["peak_bytes"]) if known else None
        r["peak MiB"] = r["peak_bytes"] / 2**20 if r["peak_bytes"] is not None else None
    data = {"setup": common, "device": describe(pick(a.device)), "rows": rows}
    _write(Path(a.out), "train", data, f"training cost, {common}\n\n" + _md(
        rows, ["config", "tokens_per_s", "peak MiB", "speed vs next-token", "memory vs next-token"]), device=pick(a.device))
    return data


# ------------------------------------------------------------------------------------ crossover
def run_crossover(a) -> dict:
    from tqdm.auto import tqdm

    dev = pick(a.device)
    widths = [128, 256, 512] if a.quick else [128, 256, 512, 768, 1024, 1536]
    alphas = [0.6, 0.8, 0.95]
    m, k, reps = (32, 4, 3) if a.quick else (64, 4, 3)
    prompt = list(range(40, 72))
    rows = []
    for d in tqdm(widths, desc="crossover"):
        cfg = replace(get_preset("classroom"), n_embd=d, n_head=max(1, d // 64))
        torch.manual_seed(0)
        model = GPT(cfg).to(dev, DTYPES[a.dtype]).eval()
        ref = autoregressive(model, prompt, max_new_tokens=m).tokens
        contenders = {"ar": lambda p, model=model: autoregressive(model, p, max_new_tokens=m)}
        for al in alphas:
            contenders[str(al)] = (lambda p, model=model, al=al, ref=ref:
                                   speculative(model, OracleDrafter(ref, al, seed=0), p, max_new_tokens=m, k=k))
        res = race(contenders, [prompt], baseline="ar", rounds=reps, device=dev)
        ar = statistics.median(res.round_totals("ar"))
        for al in alphas:
            rows.append({"method": "oracle", "k": k, "width": d, "params_M": model.num_params() / 1e6, "alpha": al,
                         "tokens_per_forward": res.outputs[str(al)][0].tokens_per_forward,
                         "speedup_wall": res.row(str(al))["speedup"], "ar_ms_per_token": ar / m * 1e3,
                         "valid": res.valid, "busy": res.busy})
    data = {"device": describe(dev), "dtype": a.dtype, "k": k, "m": m, "rows": rows}
    from mtplab import viz
    _write(Path(a.out), f"crossover-{a.dtype}", data,
           f"crossover: oracle drafts, k={k}, m={m}, {a.dtype}, {describe(dev)}\n\n"
           + _md(rows, ["width", "params_M", "alpha", "tokens_per_forward", "ar_ms_per_token", "speedup_wall"]),
           viz.crossover(rows), device=dev)
    return data
