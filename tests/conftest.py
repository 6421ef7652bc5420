import os

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

from mtplab import GPT, ModelConfig  # noqa: E402


def random_model(heads="none", k=1, seed=0, vocab_size=256, n_layer=2, n_embd=32, n_head=2, block_size=96, noise=0.3):
    """A small random model whose heads disagree with the trunk often enough to exercise rejection."""
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab_size, n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size,
                      heads=heads, k=k)
    m = GPT(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * noise * p.std().clamp(min=0.02))
    return m


@pytest.fixture(scope="session")
def family_models():
    return {
        "none": random_model(),
        "stern": random_model("stern", 7, seed=1),
        "meta": random_model("meta", 7, seed=2),
        "deepseek": random_model("deepseek", 7, seed=3),
    }
