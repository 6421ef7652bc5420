"""Benchmarks and measurements for batches and trees (run alone: they time things).

    python -m mtplab bench batch [--quick] [--json]  throughput and per-token latency against batch size,
                                                     AR and each head family, t(q)/t(1) at each batch size
    python -m mtplab bench tree  [--quick] [--json]  chain vs token trees at equal verify width, and wider

B batch size, q tokens per row in one forward, m new tokens per row.

Each writes OUT/batch.json + OUT/batch.md (OUT/tree.*; `-quick` appended with --quick). The notebook
`07_batches_and_trees` calls the same measuring functions with small settings.
"""
from __future__ import annotations

from pathlib import Path
import torch

from mtplab.measuring.race import race
from mtplab.decoding.loop import autoregressive
from mtplab.device import describe
from mtplab.decoding.drafters import FAMILIES, METHODS, default_for_family
from mtplab.decoding.generate import load_for, max_k
from mtplab.decoding.tree import nodes_per_depth, tree_speculative
from mtplab.measuring.timing import batch_cost_ratio, measure_batch
from mtplab.data import held_out_ids
from mtplab.bench.report import _md, _write
from mtplab.model import kernels

BATCH_METHODS = tuple(default_for_family(f).name for f in FAMILIES)  # one per head family, each against AR of its model
BATCH_SIZES = (1, 2, 4, 8, 16, 32)
TREE_WIDTHS = {  # name -> widths; nodes = verify width - 1
    "chain (1,1,1)": (1, 1, 1), "tree (3)": (3,), "tree (2,1)": (2, 1),
    "tree (2,2,1)": (2, 2, 1), "tree (3,2,2)": (3, 2, 2), "tree (4,3,2)": (4, 3, 2)}


def run_batch(a) -> dict:
    sizes, m, reps = ((1, 4, 16), 24, 3) if a.quick else (BATCH_SIZES, 64, 3)
    prompts = held_out_ids(max(sizes))
    rows, dev = [], None
    for meth in BATCH_METHODS:
        model, name, dev = load_for(meth, device=a.device, dtype=a.dtype)
        k = max_k(meth, model)
        make = METHODS[meth].make
        for r in measure_batch(model, make, prompts, batch_sizes=sizes, max_new_tokens=m, k=k,
                               repeats=reps):
            r.update(method="ar" if r["kind"] == "ar" else meth, checkpoint=name, n_layer=model.config.n_layer,
                     k=1 if r["kind"] == "ar" else k,
                     t_q_over_t1=batch_cost_ratio(model, r["batch_size"], k, repeats=3 if a.quick else 7)["ratio"])
            rows.append(r)
    data = {"device": describe(dev), "dtype": a.dtype, "threads": torch.get_num_threads(), "max_new_tokens": m,
            "repeats": reps, "rows": rows}
    cols = ["method", "checkpoint", "n_layer", "k", "batch_size", "kernel", "tokens_per_s", "latency_ms_per_token",
            "tokens_per_forward", "speedup", "t_q_over_t1"]
    table = (f"batch benchmark: {m} new tokens per row, held-out code prompts, median of {reps}, {a.dtype}, "
             f"{describe(dev)}, {torch.get_num_threads()} threads; AR rows are AR of the same checkpoint, "
             f"t(q)/t(1) at q = k (the k of the row below an AR row); kernel: of the row's forwards (exact up to "
             f"{kernels.MAX_ROWS} rows a call: B for AR, B x k for a verify; stock above), so where AR's and the "
             f"verify's differ, the speedup and t(q)/t(1) compare two kernels\n\n" + _md(rows, cols))
    _write(Path(a.out), "batch-quick" if a.quick else "batch", data, table, device=dev)
    return data


def run_tree(a) -> dict:
    n_prompts, m, reps = (3, 32, 3) if a.quick else (12, 128, 3)
    widths = {n: w for n, w in TREE_WIDTHS.items() if not a.quick or n in ("chain (1,1,1)", "tree (3)",
                                                                           "tree (2,2,1)")}
    prompts = held_out_ids(n_prompts)
    rows, dev = [], None
    for meth in ("blockwise-overlap", "meta"):
        model, name, dev = load_for(meth, device=a.device, dtype=a.dtype)
        make = METHODS[meth].make
        contenders = {"ar": lambda p, model=model: autoregressive(model, p, max_new_tokens=m)}
        for n, w in widths.items():
            contenders[n] = (lambda p, model=model, make=make, w=w:
                             tree_speculative(model, make(model), p, max_new_tokens=m, widths=w))
        res = race(contenders, prompts, baseline="ar", rounds=reps, device=dev)
        for n, w in widths.items():
            if res.identical(n) != len(prompts):
                raise AssertionError(f"{meth} {n}: tree output differs from AR")
            toks = sum(len(t.tokens) for t in res.outputs[n])
            fwds = sum(t.forwards for t in res.outputs[n])
            rows.append({"method": meth, "checkpoint": name, "n_layer": model.config.n_layer, "tree": n,
                         "nodes": sum(nodes_per_depth(w)),
                         "verify_width": sum(nodes_per_depth(w)) + 1, "tokens_per_forward": toks / fwds,
                         "tokens_per_s": toks * reps / sum(res.round_totals(n)), **res.row(n)})
    data = {"device": describe(dev), "dtype": a.dtype, "threads": torch.get_num_threads(), "max_new_tokens": m,
            "prompts": n_prompts, "repeats": reps, "rows": rows}
    table = (f"tree benchmark: {n_prompts} held-out code prompts, {m} new tokens, {reps} repeats, {a.dtype}, "
             f"{describe(dev)}; verify width = nodes + 1 (the chain of k-1 = 3 drafts has width 4)\n\n"
             + _md(rows, ["method", "checkpoint", "n_layer", "tree", "nodes", "verify_width", "tokens_per_forward",
                          "tokens_per_s", "speedup"]))
    _write(Path(a.out), "tree-quick" if a.quick else "tree", data, table, device=dev)
    return data
