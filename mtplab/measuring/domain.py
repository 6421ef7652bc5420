"""Code against prose: how the text a model reads changes how often its drafts survive.

Two trunks of one shape trained by one recipe, one on each shipped corpus, each with the same head family
(`bench domain`). Every model reads both held-out texts, so a row separates what the text does from what the
training did:

* teacher-forced agreement by depth: how often depth d drafts what the trunk itself would pick (no decoding);
* in decode: unconditional acceptance by draft position, tokens per forward and the wall clock against AR of the
  same trunk (interleaved rounds, medians and ranges, greedy output compared with AR's), and how many of the
  greedy continuations loop (`quality.loop_period`): a trunk that repeats itself makes its own drafts easy, so
  acceptance in decode measures the text the trunk writes as much as the text it was given.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mtplab.decoding.trace import pooled
from mtplab.measuring.acceptance import wilson
from mtplab.measuring.quality import loop_period
from mtplab.measuring.timing import interleaved_race

LN2 = math.log(2)
# (method, k): the trained head family; the same module reused for deeper drafts; prompt lookup (no training)
DOMAIN_METHODS = (("deepseek", 2), ("deepseek-reuse", 4), ("ngram", 4))


@torch.inference_mode()
def teacher_forced(model, windows: torch.Tensor, batch_size: int = 16) -> dict:
    """The trunk's bits per byte on `windows` (B, T+1) and, for each draft depth d >= 2, how often the depth-d
    prediction at row i is the trunk's own greedy choice at row i+d-1 (greedy acceptance without decoding)."""
    dev = model.wte.weight.device
    nll, n_tok = 0.0, 0
    agree: list[list[int]] = []
    for i in range(0, len(windows), batch_size):
        x = windows[i:i + batch_size].to(dev)
        logits = model.depth_logits(x[:, :-1]).float()  # (B, T, K, V)
        T, K = logits.shape[1], logits.shape[2]
        nll += F.cross_entropy(logits[:, :, 0].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                               reduction="sum").item()
        n_tok += x[:, 1:].numel()
        top = logits.argmax(-1)  # (B, T, K)
        if not agree:
            agree = [[0, 0] for _ in range(K - 1)]
        for d in range(2, K + 1):
            n = T - d + 1
            same = top[:, :n, d - 1] == top[:, d - 1:d - 1 + n, 0]
            agree[d - 2][0] += int(same.sum())
            agree[d - 2][1] += same.numel()
    return {"bpb": nll / n_tok / LN2, "agree_by_depth": [a / max(1, n) for a, n in agree],
            "agree_counts": [tuple(a) for a in agree]}


def decode_row(model, prompts: list[list[int]], method: str, k: int, *, max_new_tokens: int, repeats: int,
               bar=None) -> dict:
    """One method against AR of the same model on `prompts` (`interleaved_race`), with pooled acceptance by
    position and its Wilson interval."""
    r = interleaved_race(method, model, prompts, max_new_tokens=max_new_tokens, k=k, repeats=repeats, bar=bar)
    t = pooled(r["traces"])
    loops = sum(loop_period(a.tokens) is not None for a in r["ar_traces"])  # greedy text that repeats itself
    acc = t.accepted_per_position
    n = max(1, t.num_drafts)
    return {"method": method, "k": r["k"], "acceptance_by_position": [a / n for a in acc],
            "acceptance_interval": [list(wilson(a, n)) for a in acc], "drafting_steps": t.num_drafts,
            "tokens_per_forward": r["tokens_per_forward"], "speedup": r["speedup"], "speedup_min": r["speedup_min"],
            "speedup_max": r["speedup_max"], "identical": r["identical"], "prompts": r["prompts"],
            "looping": loops, "repeats": repeats}


def domain_study(models: dict, prompts: dict, windows: dict, *, max_new_tokens: int = 128, repeats: int = 3,
                 methods=DOMAIN_METHODS, bar=None, checkpoints: dict | None = None) -> list[dict]:
    """models: trained-on -> model with heads; prompts / windows: text -> held-out prompt ids / windows;
    checkpoints: trained-on -> the checkpoint's name, stored in each row. One row per (model, text, method)."""
    rows = []
    for trained_on, model in models.items():
        for text in prompts:
            tf = teacher_forced(model, windows[text])
            for method, k in methods:
                row = decode_row(model, prompts[text], method, k, max_new_tokens=max_new_tokens, repeats=repeats,
                                 bar=bar)
                rows.append({"trained_on": trained_on, "checkpoint": (checkpoints or {}).get(trained_on),
                             "text": text, "bpb": tf["bpb"],
                             "teacher_forced_agree": tf["agree_by_depth"][0], **row})
    return rows
