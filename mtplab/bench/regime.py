"""`python -m mtplab bench regime`: where speculative decoding pays on this machine.

Part 1, cost against size: t(1) and t(q)/t(1) of random models from 2 x 256 to 24 x 768, with their weight
bytes against the last-level cache. Part 2, the regime alone: the cache-resident 4-layer family's trained
heads (`*-l4`) on trunks grown with `deepen` to 8, 12 and 16 layers (identity blocks: same output, same
acceptance), wall clock against AR of the same grown trunk. Run alone.
"""
from __future__ import annotations

from pathlib import Path

import torch

from mtplab.bench.report import _md, _write
from mtplab.decoding.drafters import default_for_family, pairs
from mtplab.data import held_out_ids
from mtplab.device import machine_line, pick
from mtplab.measuring.regime import cost_by_size, speedup_by_depth
from mtplab.model import checkpoint as ckpt

SHAPES = [(2, 256), (4, 256), (8, 256), (12, 256), (16, 256), (4, 512), (8, 512), (12, 512), (4, 768), (12, 768),
          (24, 768)]
QUICK_SHAPES = [(2, 128), (4, 256), (12, 256)]
# label -> (method, the cache-resident 4-layer family's checkpoint): every shipped pair of a family's default method
HEADS = {p.label: (p.method, f"{p.checkpoint}-l4") for p in pairs() if p.family and p.method == default_for_family(p.family).name}


def run_regime(a) -> dict:
    from mtplab import viz  # matplotlib

    dev = pick(a.device)
    quick = a.quick
    by_size = cost_by_size(QUICK_SHAPES if quick else SHAPES, repeats=3 if quick else 7, device=dev, progress=True)
    models = {label: (method, ckpt.load(name, device=dev)) for label, (method, name) in HEADS.items()}
    names = {label: name for label, (_, name) in HEADS.items()}
    if quick:
        models = dict(list(models.items())[:2])
    prompts = held_out_ids(2 if quick else 4)
    by_depth = speedup_by_depth(models, prompts, (4, 8) if quick else (4, 8, 12, 16),
                                max_new_tokens=32 if quick else 128, repeats=1 if quick else 3, progress=True,
                                checkpoints=names)
    line = machine_line(dev)
    data = {"threads": torch.get_num_threads(), "by_size": by_size, "by_depth": by_depth}
    size_rows = [{**r, "t2/t1": r["ratio"]["2"], "t4/t1": r["ratio"]["4"], "t8/t1": r["ratio"].get("8")}
                 for r in by_size]
    table = ("regime map: random models, one cached forward over q tokens at 128 cached tokens (median of "
             f"interleaved rounds), fp32, {line}\n\n"
             + _md(size_rows, ["n_layer", "n_embd", "weight_mb", "fits_in_llc", "t1_ms", "ms_per_layer", "t2/t1",
                               "t4/t1", "t8/t1"])
             + "\n\nthe same trained heads (the 4-layer family) on trunks grown with identity blocks: greedy, m = "
             f"{32 if quick else 128}, {len(prompts)} held-out prompts, interleaved with AR of the same trunk, median "
             "(range) over rounds; `identical` counts prompts whose output equals AR's\n\n"
             + _md(by_depth, ["label", "n_layer", "k", "tokens_per_forward", "ar_ms_per_token", "speedup",
                              "speedup_min", "speedup_max", "identical", "prompts"]))
    # viz.regime_map draws one series per row 'method' (a label in older rows): give it the label
    fig = viz.regime_map(by_size, [{**r, "method": r["label"]} for r in by_depth], machine=line)
    _write(Path(a.out), "regime-quick" if quick else "regime", data, table, fig, device=dev)
    return data
