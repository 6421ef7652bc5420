"""`python -m mtplab bench domain`: code against prose (`mtplab.measuring.domain`).

The shipped pair `domain-code` / `domain-prose` (the 4-layer classroom shape, one recipe, only the corpus
differs) with their DeepSeek D = 1 heads; each trunk reads both held-out texts. Run alone.
"""
from __future__ import annotations

from pathlib import Path

import torch

from mtplab.bench.report import held_out_count, _md, _write
from mtplab.data import held_out_prompts, load_corpus, val_windows
from mtplab.device import machine_line, pick
from mtplab.measuring.domain import domain_study
from mtplab.model import checkpoint as ckpt
from mtplab.tokenizer import encode

PAIR = {"code": "domain-code-d1", "prose": "domain-prose-d1"}


def load_pair(device="cpu") -> dict:
    return {corpus: ckpt.load(name, device=device) for corpus, name in PAIR.items()}


def run_domain(a) -> dict:
    from mtplab import viz  # matplotlib

    dev = pick(a.device)
    n, m, reps = (2, 32, 1) if a.quick else (held_out_count(a), 128, 3)
    models = load_pair(dev)
    prompts = {c: [encode(p) for p in held_out_prompts(c, n, 160)] for c in PAIR}
    windows = {c: val_windows(load_corpus(c, "val"), 256, 8 if a.quick else 32) for c in PAIR}
    rows = domain_study(models, prompts, windows, max_new_tokens=m, repeats=reps, checkpoints=PAIR)
    line = machine_line(dev)
    data = {"checkpoints": PAIR, "prompts": n, "max_new_tokens": m, "repeats": reps,
            "threads": torch.get_num_threads(), "rows": rows}
    flat = [{**r, "acc_pos1": r["acceptance_by_position"][0] if r["acceptance_by_position"] else None,
             "acc_pos2": (r["acceptance_by_position"][1:2] or [None])[0],
             "acc_pos3": (r["acceptance_by_position"][2:3] or [None])[0]} for r in rows]
    table = (f"code against prose: two 4-layer trunks, one recipe, only the corpus differs; DeepSeek D = 1 heads; "
             f"greedy, m = {m}, {n} held-out prompts of each text, {reps} interleaved rounds against AR of the same "
             f"trunk (median, range); teacher-forced agreement of depth 2 on held-out windows; `looping`: greedy "
             f"continuations that repeat themselves\n\n"
             + _md(flat, ["trained_on", "text", "bpb", "teacher_forced_agree", "method", "k", "acc_pos1", "acc_pos2",
                          "acc_pos3", "tokens_per_forward", "speedup", "speedup_min", "speedup_max", "identical",
                          "looping", "prompts"]))
    fig = viz.domain_panels(rows, machine=line)
    _write(Path(a.out), "domain-quick" if a.quick else "domain", data, table, fig, device=dev)
    return data
