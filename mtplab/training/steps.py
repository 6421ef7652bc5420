"""One training step per head family, the learning-rate schedule, autocast, and per-depth validation.

B batch, T time, C channels, K depths, V vocabulary. The run around them is `mtplab.training.fit`.
"""
from __future__ import annotations

import math
from contextlib import nullcontext
import torch
import torch.nn.functional as F
from mtplab.model.gpt import GPT
from mtplab.training.losses import depth_cross_entropies, family_loss, self_distill_cross_entropies

LN2 = math.log(2.0)


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warmup, then cosine decay to lr/10."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


LABELS = ("corpus", "self", "self-argmax")
AUTOCAST = ("auto", "bf16", "off")


def bf16_pays(device: torch.device) -> bool:
    """bf16 autocast pays on CUDA and on CPUs with native bf16 matmuls (AVX512-BF16 / AMX): measured 1.8x
    the fp32 training speed of the classroom preset on this lab's Xeon; on plain AVX2 it is emulated and slower."""
    if device.type == "cuda":
        return True
    return device.type == "cpu" and bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)())


def autocast_kind(device: torch.device, mode: str = "auto") -> str:
    """'bf16' or 'off': what `mode` means on this device."""
    return "off" if mode == "off" or (mode == "auto" and not bf16_pays(device)) else "bf16"


def autocast_context(device: torch.device, mode: str = "auto"):
    if autocast_kind(device, mode) == "off":
        return nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def _head_loss(logits: torch.Tensor, x: torch.Tensor, teacher: torch.Tensor | None, d: int, labels: str):
    """Cross-entropy of one head's logits (B, T, V) at depth d (1-based): against the corpus token x[i+d],
    or against the frozen target's prediction of that token (row i+d-1 of `teacher`)."""
    T, V = logits.shape[1], logits.shape[-1]
    n = T - d + 1
    if labels == "corpus":
        return F.cross_entropy(logits[:, :n].reshape(-1, V).float(), x[:, d:d + n].reshape(-1))
    return self_distill_cross_entropies(logits[:, :n].unsqueeze(2), teacher[:, d - 1:d - 1 + n],
                                        hard=labels == "self-argmax")[0]


def meta_step(model: GPT, x: torch.Tensor, *, freeze_trunk: bool, memory_efficient: bool = True,
              labels: str = "corpus") -> float:
    """One backward pass for Meta heads (Gloeckle et al. 2024, sec. 2 'memory-efficient implementation').

    The trunk runs once; then each head's forward and backward run in turn on a detached copy
    of the trunk output z, whose gradient accumulates; finally z's gradient flows back through
    the trunk. Only one head's logits (B, T, V) are alive at a time, so peak memory does not
    grow with the number of heads. Returns the loss value.
    """
    idx = x[:, :-1]
    B, T = idx.shape
    rot = model.rope(0, T)
    heads = [model.blocks[-1]] + list(model.mtp.blocks)
    K = len(heads)
    first = 1 if freeze_trunk else 0  # a frozen trunk leaves head 1 (the original model) untouched
    n_trained = K - first
    ctx = torch.no_grad() if freeze_trunk else nullcontext()
    with ctx:
        z = model.wte(idx)
        for blk in model.blocks[:-1]:
            z = blk(z, rot)  # (B, T, C)
    teacher = None
    if labels != "corpus":  # the frozen target's own next-token logits (head 1), (B, T, V)
        with torch.no_grad():
            teacher = model.unembed(heads[0](z, rot))
    if not memory_efficient:
        total = 0.0
        for d in range(first, K):
            logits = model.unembed(heads[d](z, rot))  # (B, T, V)
            total = total + _head_loss(logits, x, teacher, d + 1, labels)
        loss = total / n_trained
        loss.backward()
        return loss.item()
    z_det = z.detach().requires_grad_(not freeze_trunk)
    total = 0.0
    for d in range(first, K):
        logits = model.unembed(heads[d](z_det, rot))  # (B, T, V) for this head only
        loss_d = _head_loss(logits, x, teacher, d + 1, labels) / n_trained
        loss_d.backward()
        total += loss_d.item()
    if not freeze_trunk:
        z.backward(z_det.grad)
    return total


STEP = {"meta": meta_step}  # families with a step of their own on the lab's GPT (the rest: the one below)


def train_step(model: GPT, x: torch.Tensor, *, freeze_trunk: bool, lam: float, memory_efficient: bool = True,
               labels: str = "corpus") -> float:
    """One backward pass of `model`'s head family on x (B, T+1); returns the loss. A frozen trunk runs once without
    gradients and only the heads learn: the lab's GPT, or a Hugging Face trunk (`mtplab.hf.target`), whose Meta heads
    take this path too (`meta_step` runs the lab's own blocks, which a Hugging Face model does not have)."""
    heads = model.config.heads
    own = STEP.get(heads) if isinstance(model, GPT) else None
    if own is not None:
        return own(model, x, freeze_trunk=freeze_trunk, memory_efficient=memory_efficient, labels=labels)
    idx = x[:, :-1]
    if freeze_trunk:
        with torch.no_grad():
            out = model(idx)
        extra = model.mtp.train_logits(model, idx, out)  # (B, T, K-1, V)
        logits = torch.cat([out.logits.unsqueeze(2), extra], dim=2)  # (B, T, K, V)
    else:
        logits = model.depth_logits(idx)  # (B, T, K, V)
    if labels == "corpus":
        ces = depth_cross_entropies(logits, x)
    else:  # self-distillation: depth d learns the frozen target's prediction of token i+d
        ces = self_distill_cross_entropies(logits, logits[:, :, 0].detach(), hard=labels == "self-argmax")
    loss = family_loss(heads, ces, lam=lam, freeze_trunk=freeze_trunk)
    loss.backward()
    return loss.item()


@torch.no_grad()
def evaluate(model: GPT, windows: torch.Tensor, batch_size: int = 16, autocast: str = "off") -> dict:
    """Teacher-forced per-depth validation: cross-entropy in bits per byte and top-1 accuracy
    of each depth against the true future token, and `val_agree_depth`: how often depth d at position i
    drafts what the target itself predicts for that token (its argmax at row i+d-1), a teacher-forced
    estimate of greedy acceptance."""
    was = model.training
    model.eval()
    K = model.config.n_depths
    sums, hits, agree, counts = torch.zeros(4, K, dtype=torch.float64)  # per depth: nats, top-1 hits, agreement, tokens
    dev = model.wte.weight.device
    for i in range(0, len(windows), batch_size):
        x = windows[i:i + batch_size].to(dev)
        with autocast_context(dev, autocast):
            logits = model.depth_logits(x[:, :-1])  # (B, T, K, V)
        T = logits.shape[1]
        target_top = logits[:, :, 0].float().argmax(-1)  # (B, T) the target's own choice at each position
        for d in range(1, K + 1):
            n = T - d + 1
            lg = logits[:, :n, d - 1].float()
            tgt = x[:, d:d + n]
            sums[d - 1] += F.cross_entropy(lg.reshape(-1, lg.shape[-1]), tgt.reshape(-1), reduction="sum").item()
            top = lg.argmax(-1)
            hits[d - 1] += (top == tgt).sum().item()
            agree[d - 1] += (top == target_top[:, d - 1:d - 1 + n]).sum().item()
            counts[d - 1] += tgt.numel()
    model.train(was)
    bpb = (sums / counts / LN2).tolist()
    return {"val_bpb": bpb[0], "val_bpb_depth": bpb, "val_acc_depth": (hits / counts).tolist(),
            "val_agree_depth": (agree / counts).tolist()}
