"""Toy models for tests and small studies: random GPTs with sharp, far-from-uniform distributions."""
from __future__ import annotations

import torch
from mtplab.model.config import ModelConfig
from mtplab.model.gpt import GPT


def random_model(*, vocab_size: int = 8, seed: int = 0, noise: float = 2.0, heads: str = "none", n_depths: int = 1,
                 device="cpu", n_layer: int = 2, n_head: int = 2, n_embd: int = 32, block_size: int = 96):
    """A small random GPT whose distributions are far from uniform (for exact sampling studies and tests)."""

    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab_size, n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size,
                      heads=heads, n_depths=n_depths)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * noise * p.std().clamp(min=0.02))
    return model.to(device)
