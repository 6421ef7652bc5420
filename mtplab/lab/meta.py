"""Meta heads (Gloeckle et al. 2024): memory of the head-by-head backward, and the packed loss's shift.

B batch, T time, K depths, V vocabulary.
"""
from __future__ import annotations


import torch

from .timing import peak_memory



def meta_backward_memory(ks=(2, 4, 8), *, preset: str = "tiny", batch_size: int = 8, device="cpu",
                         seed: int = 0, progress: bool = False) -> dict[str, dict[int, float]]:
    """Peak memory (MiB) of one `train.meta_step` for K heads, memory-efficient against joint backward."""
    from ..config import preset as get_preset
    from ..data import get_batch, load_corpus
    from ..model import GPT
    from ..train import meta_step

    data = load_corpus("code", "train")
    out: dict[str, dict[int, float]] = {"memory-efficient": {}, "joint backward": {}}
    if progress:
        from tqdm.auto import tqdm
        ks = tqdm(list(ks), desc="peak memory", unit="K")
    for K in ks:
        cfg = get_preset(preset).with_heads("meta", K)
        torch.manual_seed(seed)
        model = GPT(cfg).to(device).train()
        x = get_batch(data, batch_size, cfg.block_size, torch.Generator().manual_seed(seed)).to(device)
        for label, eff in (("memory-efficient", True), ("joint backward", False)):
            model.zero_grad(set_to_none=True)
            step = lambda m=model, x=x, e=eff: meta_step(m, x, freeze_trunk=False, memory_efficient=e)
            out[label][K] = peak_memory(step,
                                        device) / 2 ** 20
    return out


def meta_gradients_agree(*, preset: str = "tiny", K: int = 4, batch_size: int = 4, seed: int = 0) -> float:
    """Largest absolute difference between the gradients of the two `meta_step` backward orders."""
    from ..config import preset as get_preset
    from ..data import get_batch, load_corpus
    from ..model import GPT
    from ..train import meta_step

    cfg = get_preset(preset).with_heads("meta", K)
    torch.manual_seed(seed)
    model = GPT(cfg).train()
    x = get_batch(load_corpus("code", "train"), batch_size, cfg.block_size, torch.Generator().manual_seed(seed))
    grads = []
    for eff in (True, False):
        model.zero_grad(set_to_none=True)
        meta_step(model, x, freeze_trunk=False, memory_efficient=eff)
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    return max(float((a - b).abs().max()) for a, b in zip(*grads))


# ---------------------------------------------------------------------------------- the losses' shift
def shift_table(T: int, K: int) -> str:
    """Which token each head is scored against in `losses.multi_token_loss` (targets = next-token shift).

    Rows are heads k = 0..K-1, columns positions i = 0..T-1; a cell names the input token x[j]
    that head k at position i must predict (j = i + k + 1), or '.' where the target lies past the window.
    """
    lines = ["head  " + " ".join(f"i={i:<3}" for i in range(T))]
    for k in range(K):
        cells = [f"x[{i + k + 1}]" if i + k + 1 <= T else "." for i in range(T)]
        lines.append(f"k={k:<3} " + " ".join(f"{c:<5}" for c in cells))
    return "\n".join(lines)


def peaked_logits(x: torch.Tensor, K: int, V: int, *, shift: int, strength: float = 8.0) -> torch.Tensor:
    """Packed (B, T, K*V) logits for x of shape (B, T+1) in which head k at position i puts its mass
    on x[i + k + shift] (uniform where that lies past the window): a model that is perfect at `shift`."""
    B, T1 = x.shape
    T = T1 - 1
    logits = torch.zeros(B, T, K, V)
    for k in range(K):
        for i in range(T):
            j = i + k + shift
            if j < T1:
                logits[torch.arange(B), i, k, x[:, j]] = strength
    return logits.view(B, T, K * V)  # (B, T, K*V)
