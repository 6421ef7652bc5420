import os

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

from mtplab.model import toy as toys  # noqa: E402


def random_model(heads="none", n_depths=1, seed=0, vocab_size=256, n_layer=2, n_embd=32, n_head=2, block_size=96, noise=0.3):
    """A small random model whose heads disagree with the trunk often enough to exercise rejection."""
    return toys.random_model(vocab_size=vocab_size, seed=seed, noise=noise, heads=heads, n_depths=n_depths, n_layer=n_layer,
                            n_head=n_head, n_embd=n_embd, block_size=block_size)


@pytest.fixture(scope="session")
def family_models():
    return {
        "none": random_model(),
        "stern": random_model("stern", 7, seed=1),
        "meta": random_model("meta", 7, seed=2),
        "deepseek": random_model("deepseek", 7, seed=3),
    }
