"""Compare two models position by position, teacher-forced: both read the same text, so one early
disagreement cannot make every later position disagree (as it does when each decodes its own text)."""
from __future__ import annotations

import torch


@torch.inference_mode()
def teacher_forced_agreement(a, b, ids: list[int], *, start: int = 1) -> tuple[int, int]:
    """(positions where a and b pick the same greedy next token, positions compared).

    ids: one text both models read in full; positions start-1 .. len(ids)-2 predict tokens start .. len(ids)-1
    (start = len(prompt) compares only the generated part)."""
    x = torch.tensor([ids], dtype=torch.long)
    pa = a(x.to(a.wte.weight.device)).logits[0, start - 1:-1].argmax(-1).cpu()  # (T - start,)
    pb = b(x.to(b.wte.weight.device)).logits[0, start - 1:-1].argmax(-1).cpu()
    return int((pa == pb).sum()), int(pa.numel())
