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
    return LOSS.get(heads, _mean)(ces, lam)


def _mean(ces: list[torch.Tensor], lam: float) -> torch.Tensor:
    return torch.stack(ces).mean()  # Gloeckle et al. 2024 / Stern et al. 2018: every depth weighted alike


LOSS = {"deepseek": deepseek_loss}  # family -> its objective over per-depth losses (others: the mean)


# ---------------------------------------------------------------------------------- on a cached trunk
# The same objectives when the trunk ran once, ahead of training (`mtplab.distill.pipeline`): each batch holds the last
# layer's hidden states (B, T, C), the tokens (B, T), which positions are answer tokens (B, T), and the target's
# top-k next-token ids and probabilities (B, T, TOPK). The heads draft over a draft vocabulary of N ids.
def sub_vocab_index(vocab: torch.Tensor, V: int) -> torch.Tensor:
    """(V,) position of each token id in the draft vocabulary, -1 outside it."""
    where = torch.full((V,), -1, dtype=torch.long)
    where[vocab] = torch.arange(len(vocab))
    return where


def soft_ce(x: torch.Tensor, W: torch.Tensor, top_i: torch.Tensor, top_p: torch.Tensor, where: torch.Tensor,
            mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of the draft logits x W^T over the draft vocabulary (x: (B, T, C), W: (N, C)) against the
    target's top-k probabilities (B, T, TOPK) renormalized inside it, at the positions mask (B, T) picks; the N-wide
    projection is computed at those positions only (no padding, no prompt). Returns (loss, top-1 hits)."""
    idx = where[top_i[mask]]  # (P, TOPK), -1 outside the draft vocabulary
    p = top_p[mask] * (idx >= 0)
    keep = p.sum(-1) > 0
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-9)
    logits = F.linear(x[mask], W)  # (P, N)
    logp = torch.log_softmax(logits.float(), -1).gather(-1, idx.clamp_min(0))  # (P, TOPK)
    loss = -(p * logp).sum(-1)[keep].mean() if keep.any() else x.sum() * 0
    hits = (logits.argmax(-1) == idx[:, 0]) & keep  # the draft equals the target's argmax
    return loss, torch.stack([hits.sum(), keep.sum()])


def _deepseek_cached(model, batch: dict, where: torch.Tensor, W: torch.Tensor, unroll: int) -> list:
    """One module, reused as the drafter reuses it: depth d+1 runs it on depth d's hidden states and Emb(t_{i+d})
    (teacher forcing on tokens, free running on hidden states, as EAGLE-3 trains), up to `unroll` depths."""
    h, tok, ans = batch["hidden"], batch["tokens"], batch["answer"]
    T, out, prev = h.shape[1], [], h
    for d in range(1, unroll + 1):
        if T - d <= 1:
            break
        prev = model.mtp.layers[0](model, prev[:, :T - d], model.wte(tok[:, d:]))  # (B, T-d, C) predicts t_{i+d+1}
        # the target's distribution for t_{i+d+1} sits at position i+d; count it where t_{i+d+1} is an answer token
        out.append(soft_ce(model.norm(prev[:, :T - d - 1]), W, batch["top_i"][:, d:T - 1], batch["top_p"][:, d:T - 1],
                           where, ans[:, d + 1:]))
        prev = F.pad(prev, (0, 0, 0, d))  # keep positions aligned with the trunk's
    return out


def _stern_cached(model, batch: dict, where: torch.Tensor, W: torch.Tensor, unroll: int) -> list:
    """Depth d reads the trunk's hidden state at i and predicts t_{i+d}."""
    h, ans = batch["hidden"], batch["answer"]
    T, out = h.shape[1], []
    hs = model.mtp.hidden(h)  # (B, T, K-1, C)
    for j in range(hs.shape[2]):
        d = j + 2  # depth d at position i predicts t_{i+d}: the target's distribution sits at position i+d-1
        if T - d <= 0:
            break
        out.append(soft_ce(model.norm(hs[:, :T - d, j]), W, batch["top_i"][:, d - 1:T - 1],
                           batch["top_p"][:, d - 1:T - 1], where, ans[:, d:]))
    return out


CACHED_LOSSES = {"deepseek": _deepseek_cached, "stern": _stern_cached}  # family -> its loss on a cached trunk


def head_losses(model, batch: dict, where: torch.Tensor, vocab: torch.Tensor, *, unroll: int = 3) -> list:
    """Per-depth (loss, top-1 hits) of `model.mtp` on a cached batch, over the draft vocabulary `vocab` (N ids)."""
    fn = CACHED_LOSSES.get(model.config.heads)
    if fn is None:
        raise MtplabError(f"heads on a trunk cache are one of {', '.join(CACHED_LOSSES)} (got {model.config.heads!r})")
    return fn(model, batch, where, model.lm_head.weight[vocab], unroll)  # W: (N, C)
