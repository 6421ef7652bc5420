"""Multi-token losses.

B batch, T time, K depths, V vocabulary.

Two conventions meet here. `depth_logits` returns (B, T, K, V) where depth d (1-based)
at position i predicts token x[i+d] of the input sequence x. The sources' packed loss
takes (B, T, K*V) and next-token targets y[i] = x[i+1]; its head k (0-based) is scored
against y[i+k] = x[i+k+1], which is the same token: depth d = k+1.
"""
from __future__ import annotations

import torch
from mtplab.errors import MtplabError
import torch.nn.functional as F


# ---------------------------------------------------------------------------------- DeepSeek
def label_layout(T: int = 10, D: int = 1) -> list[dict]:
    """DeepSeek-V3's training layout for a sequence t_1..t_{T+1} (1-based token numbers).

    Row 'main': position i reads t_i and is scored against t_{i+1}, i = 1..T.
    Row 'module k': position i (i = 1..T-k) reads the depth-(k-1) hidden state at i and Emb(t_{i+k}),
    and is scored against t_{i+k+1}: labels t_{2+k..T+1}, eq. (24).
    Each row maps position i -> (token read, label).
    """
    if T < 1 or D < 0:
        raise MtplabError(f"need T >= 1 and D >= 0 (got T={T}, D={D})")
    rows = [{"name": "main model", "k": 0, "reads": {i: i for i in range(1, T + 1)},
             "labels": {i: i + 1 for i in range(1, T + 1)}}]
    for k in range(1, D + 1):
        rows.append({"name": f"MTP module {k}", "k": k, "reads": {i: i + k for i in range(1, T - k + 1)},
                     "labels": {i: i + k + 1 for i in range(1, T - k + 1)}})
    return rows


def multi_token_loss(logits: torch.Tensor, targets: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """The sources' MultiTokenLoss, in our own code: mean over heads of each head's mean cross-entropy.

    logits: (B, T, K*V) packed head outputs; targets: (B, T) next-token targets, targets[:, i] = x[i+1].
    Head k (0-based) at position i is scored against targets[:, i+k] = x[i+k+1], for i = 0..T-1-k:
    head 0 is the next token, head k the (k+1)-th token ahead. The last k positions of head k are
    dropped because their target lies past the window, not by mistake.

    The shift is only right if `targets` is already the next-token shift of the input. Pass the
    input ids themselves and head 0 is scored against the token it reads: it learns to copy.
    """
    B, T = targets.shape
    if logits.shape[:2] != (B, T) or logits.shape[2] % num_tokens:
        raise MtplabError(f"logits {tuple(logits.shape)} do not pack {num_tokens} heads over targets {tuple(targets.shape)}")
    if T < num_tokens:
        raise MtplabError(f"a window of T={T} targets is too short for {num_tokens} heads: head k (0-based) scores "
                          f"positions 0..T-1-k, so T must be at least {num_tokens}; use longer windows or fewer heads")
    logits = logits.view(B, T, num_tokens, -1)  # (B, T, K, V)
    per_head = []
    for k in range(num_tokens):
        n = T - k  # positions whose target x[i+k+1] is inside the window
        per_head.append(F.cross_entropy(logits[:, :n, k].reshape(-1, logits.shape[-1]), targets[:, k:].reshape(-1)))
    return torch.stack(per_head).mean()


def depth_cross_entropies(logits: torch.Tensor, x: torch.Tensor) -> list[torch.Tensor]:
    """Per-depth mean cross-entropy (nats). logits: (B, T, K, V) from `depth_logits(x[:, :T])`;
    x: (B, T+1) the window including its next-token target. Depth d at position i is scored
    against x[:, i+d] for i = 0..T-d (DeepSeek eq. 24 uses labels t_{2+k..T+1} for module k = d-1)."""
    B, T, K, V = logits.shape
    if x.shape != (B, T + 1):
        raise MtplabError(f"x must be (B, T+1) = {(B, T + 1)}, got {tuple(x.shape)}")
    out = []
    for d in range(1, K + 1):
        n = T - d + 1
        out.append(F.cross_entropy(logits[:, :n, d - 1].reshape(-1, V).float(), x[:, d:d + n].reshape(-1)))
    return out


def self_distill_cross_entropies(logits: torch.Tensor, target_logits: torch.Tensor, *,
                                 hard: bool = False) -> list[torch.Tensor]:
    """Per-depth cross-entropy against the frozen target's own predictions (self-distillation).

    logits: (B, T, K, V) depth logits; target_logits: (B, T, V) the target's next-token logits over the
    same (teacher-forced) input. Depth d at position i drafts token i+d; the target predicts that token at
    position i+d-1, so depth d is scored against target row i+d-1 for i = 0..T-d. Greedy verification keeps
    a draft only when it equals the target's argmax, so that, not the corpus token, is what a head should
    learn. hard=False uses the whole distribution softmax(target) as a soft label (also what sampling
    verification needs); hard=True uses its argmax. Depth 1 is the target itself (scored for the record).
    """
    B, T, K, V = logits.shape
    if target_logits.shape != (B, T, V):
        raise MtplabError(f"target logits must be (B, T, V) = {(B, T, V)}, got {tuple(target_logits.shape)}")
    out = []
    for d in range(1, K + 1):
        n = T - d + 1
        teacher = target_logits[:, d - 1:d - 1 + n].float()  # (B, n, V) the target's view of token i+d
        student = logits[:, :n, d - 1].reshape(-1, V).float()
        if hard:
            out.append(F.cross_entropy(student, teacher.argmax(-1).reshape(-1)))
        else:
            out.append(F.cross_entropy(student, torch.softmax(teacher, -1).reshape(-1, V)))
    return out


def deepseek_loss(ces: list[torch.Tensor], lam: float) -> torch.Tensor:
    """DeepSeek-V3 eq. (24)-(25): L = L_main + (lambda / D) * sum_k L_MTP^k, with ces[0] the main loss."""
    if lam < 0:
        raise MtplabError(f"lambda must be >= 0 (got {lam}); DeepSeek-V3 used 0.3 early in training, then 0.1")
    D = len(ces) - 1
    if D == 0:
        return ces[0]
    return ces[0] + (lam / D) * torch.stack(ces[1:]).sum()


def family_loss(heads: str, ces: list[torch.Tensor], *, lam: float = 0.3, freeze_trunk: bool = False) -> torch.Tensor:
    """The training objective of each family. With a frozen trunk, depth 1 has no trainable path and is left out."""
    if freeze_trunk:
        extra = ces[1:]
        if not extra:
            raise MtplabError("a frozen trunk with no heads has nothing to train; add --heads and --k")
        return torch.stack(extra).mean()
    if heads == "deepseek":
        return deepseek_loss(ces, lam)
    return torch.stack(ces).mean()  # Gloeckle et al. 2024 / Stern et al. 2018: every depth weighted alike
