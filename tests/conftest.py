import os

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

from mtplab.model import toy as toys  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread_after_each_test(request):
    """Every test leaves torch on the thread count it found (one). A test left on two threads makes the rest of its
    worker's file run OpenMP teams of two, whose waiting thread spins beside the other worker's on 2 cores: the
    statistical tests then ran 10-25x slower than alone and `make test` took 21 minutes instead of 9."""
    before = torch.get_num_threads()
    yield
    after = torch.get_num_threads()
    if after != before:
        torch.set_num_threads(before)
        pytest.fail(f"{request.node.nodeid} left torch on {after} threads (it found {before}); restore them", pytrace=False)


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
