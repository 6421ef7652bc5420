"""Benchmarks (run alone: two torch processes on 2 cores slow each other down 30-200x).

    python -m mtplab bench train       tokens/s and peak memory of training, next-token vs each family at k=4
    python -m mtplab bench cost-curve  t(q)/t(1) of one cached forward over q new tokens, q = 1..16
    python -m mtplab bench decode      every method on the shipped checkpoints, against AR of the same model
    python -m mtplab bench crossover   oracle drafts on random models of growing width: where MTP starts to pay
    python -m mtplab bench batch       throughput and latency against batch size (mtplab.bench_batch)
    python -m mtplab bench tree        chain vs token trees (mtplab.bench_batch)

Compared runs are interleaved and reported as medians and ratios. Each writes OUT/NAME.json and
OUT/NAME.md (and a PNG where there is a figure).
"""
from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from .config import preset as get_preset
from .device import describe, pick
from .errors import MtplabError
from .generate import DTYPES
from .lab import measure_cost_curve, sync
from .model import GPT



def _write(out: Path, name: str, data: dict, table: str, fig=None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / f"{name}.md").write_text(table + "\n")
    if fig is not None:
        fig.savefig(out / f"{name}.png", dpi=110, bbox_inches="tight")


def _md(rows: list[dict], cols: list[str]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
        if isinstance(v, list):
            return " ".join(fmt(x) for x in v)
        return str(v)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ cost curve
def run_cost_curve(a) -> dict:
    dev = pick(a.device)
    cfg = get_preset(a.preset)
    torch.manual_seed(0)
    model = GPT(cfg).to(dev, DTYPES[a.dtype]).eval()
    res = measure_cost_curve(model, qs=range(1, 17), context=min(300, cfg.block_size - 16),
                             repeats=5 if a.quick else 15, progress=True)
    data = {"preset": a.preset, "dtype": a.dtype, "device": describe(dev), "threads": torch.get_num_threads(),
            "context": res.context, "t_s": {str(q): v for q, v in res.seconds.items()},
            "ratio": {str(q): v for q, v in res.ratio.items()}}
    rows = [{"q": q, "t (ms)": res.seconds[q] * 1e3, "t(q)/t(1)": res.ratio[q]} for q in res.ratio]
    from . import viz
    _write(Path(a.out), f"cost-curve-{a.preset}-{a.dtype}", data,
           f"cost curve, preset {a.preset}, {a.dtype}, {describe(dev)}, cache {res.context} tokens\n\n"
           + _md(rows, ["q", "t (ms)", "t(q)/t(1)"]), viz.cost_curve({a.dtype: res}, title=f"cost curve, preset {a.preset}"))
    return data


# ------------------------------------------------------------------------------------ training
def _train_probe(spec: dict) -> dict:
    """One configuration, in this (fresh) process: median step time and peak memory."""
    from .train import train_step
    dev = pick(spec["device"])
    torch.manual_seed(0)
    cfg = get_preset(spec["preset"]).with_heads(spec["heads"], spec["k"])
    model = GPT(cfg).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    B, T = spec["batch"], spec["T"]
    x = torch.randint(0, 256, (B, T + 1), device=dev)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(spec["steps"] + 1):
        sync(dev)
        t0 = time.perf_counter()
        train_step(model, x, freeze_trunk=False, lam=0.3, memory_efficient=spec["efficient"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(dev)
        if i:
            times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated() if dev.type == "cuda"
            else (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_rss) * 1024)
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
        r = subprocess.run([sys.executable, "-c", "import json,sys; from mtplab.bench import _train_probe; "
                            "print(json.dumps(_train_probe(json.loads(sys.argv[1]))))", json.dumps(spec)],
                           capture_output=True, text=True, check=True)
        rows.append({"config": label, **json.loads(r.stdout.strip().splitlines()[-1])})
    base = rows[0]
    for r in rows:
        r["speed vs next-token"] = r["tokens_per_s"] / base["tokens_per_s"]
        r["memory vs next-token"] = r["peak_bytes"] / max(1, base["peak_bytes"])
        r["peak MiB"] = r["peak_bytes"] / 2**20
    data = {"setup": common, "device": describe(pick(a.device)), "rows": rows}
    _write(Path(a.out), "train", data, f"training cost, {common}\n\n" + _md(
        rows, ["config", "tokens_per_s", "peak MiB", "speed vs next-token", "memory vs next-token"]))
    return data


# ------------------------------------------------------------------------------------ crossover
def run_crossover(a) -> dict:
    from tqdm.auto import tqdm

    from .drafters import OracleDrafter
    from .decoding import autoregressive, speculative

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
        walls = {"ar": []} | {al: [] for al in alphas}
        fws = {}
        for r in range(reps):
            t0 = time.perf_counter()
            autoregressive(model, prompt, max_new_tokens=m)
            walls["ar"].append(time.perf_counter() - t0)
            for al in alphas:
                t0 = time.perf_counter()
                tr = speculative(model, OracleDrafter(ref, al, seed=r), prompt, max_new_tokens=m, k=k)
                walls[al].append(time.perf_counter() - t0)
                fws[al] = tr.tokens_per_forward
        ar = statistics.median(walls["ar"])
        for al in alphas:
            rows.append({"width": d, "params_M": model.num_params() / 1e6, "alpha": al,
                         "tokens_per_forward": fws[al], "speedup_wall": ar / statistics.median(walls[al]),
                         "ar_ms_per_token": ar / m * 1e3})
    data = {"device": describe(dev), "dtype": a.dtype, "k": k, "m": m, "rows": rows}
    from . import viz
    _write(Path(a.out), f"crossover-{a.dtype}", data,
           f"crossover: oracle drafts, k={k}, m={m}, {a.dtype}, {describe(dev)}\n\n"
           + _md(rows, ["width", "params_M", "alpha", "tokens_per_forward", "ar_ms_per_token", "speedup_wall"]),
           viz.crossover(rows))
    return data


def main(a) -> None:
    if a.what == "cost-curve":
        data = run_cost_curve(a)
    elif a.what == "train":
        data = run_train(a)
    elif a.what == "decode":
        from .bench_decode import run_decode
        data = run_decode(a)
    elif a.what == "crossover":
        data = run_crossover(a)
    elif a.what in ("batch", "tree"):  # batches and token trees: mtplab.bench_batch
        from . import bench_batch
        data = (bench_batch.run_batch if a.what == "batch" else bench_batch.run_tree)(a)
    else:
        raise MtplabError(f"unknown benchmark {a.what!r}")
    if a.json:
        print(json.dumps(data))
    else:
        decode = ("decode-quick" if a.quick else "decode") + ("" if a.dtype == "fp32" else f"-{a.dtype}")
        name = {"cost-curve": f"cost-curve-{a.preset}-{a.dtype}", "decode": decode,
                "crossover": f"crossover-{a.dtype}", "train": "train",
                "batch": "batch-quick" if a.quick else "batch", "tree": "tree-quick" if a.quick else "tree"}[a.what]
        print(Path(a.out, f"{name}.md").read_text())
