"""The same guarantees on CUDA (skipped without a GPU; scripts/gpu_check.sh runs them)."""
import pytest
import torch

from mtplab.decoding.loop import autoregressive, speculative
from mtplab.decoding.drafters import DeepSeekDrafter, MetaDrafter, SternDrafter
from tests.conftest import random_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("heads,k", [("none", 1), ("meta", 3), ("deepseek", 3)])
def test_cache_matches_recompute_on_cuda(heads, k):
    m = random_model(heads, k).cuda()
    idx = torch.randint(0, 256, (1, 40), device="cuda")
    with torch.no_grad():
        full = m(idx).logits
        c = m.new_cache()
        parts = [m(idx[:, i:i + 5], c).logits for i in range(0, 40, 5)]
    assert (torch.cat(parts, 1) - full).abs().max() < 1e-4


@pytest.mark.parametrize("fam,cls", [("stern", SternDrafter), ("meta", MetaDrafter), ("deepseek", DeepSeekDrafter)])
def test_greedy_speculative_equals_ar_on_cuda(fam, cls):
    m = random_model(fam, 4, seed=3).cuda()
    ref = autoregressive(m, [1, 2, 3], max_new_tokens=40).tokens
    for k in (2, 3, 4):
        assert speculative(m, cls(m), [1, 2, 3], max_new_tokens=40, k=k).tokens == ref


def test_bf16_runs_on_cuda():
    m = random_model("stern", 4).cuda().to(torch.bfloat16)
    tr = speculative(m, SternDrafter(m), [5, 6], max_new_tokens=20, k=4)
    assert len(tr.tokens) == 20
