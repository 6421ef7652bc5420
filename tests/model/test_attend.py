"""The exact attention kernel (mtplab.model.attend): row r of an R-row call is bit for bit the one-row call on that
row, for random shapes, key lists (causal prefixes, tree-like gathers, several sequences) and R <= 16; close to
torch's attention; and the lab's Llama forward runs its verify and its one-token decode through it."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from mtplab.model import attend, kernels

pytestmark = pytest.mark.skipif(not kernels.EXACT, reason="numba is missing: " + kernels.status())


def _reference(q, k, v, rows, scale):
    """torch's attention, one row at a time over its keys: (R, H*D)."""
    R, H, D = q.shape
    Hkv = k.shape[1]
    out = []
    for r in range(R):
        ks = torch.from_numpy(rows.keys[rows.start[r]:rows.start[r + 1]])
        b = int(rows.batch[r])
        y = F.scaled_dot_product_attention(q[r].view(1, Hkv, H // Hkv, D), k[b:b + 1, :, ks], v[b:b + 1, :, ks],
                                           scale=scale)
        out.append(y.reshape(H * D))
    return torch.stack(out)


@settings(max_examples=40, deadline=None)
@given(hkv=st.integers(1, 3), g=st.integers(1, 3), d16=st.integers(1, 4), B=st.integers(1, 2), S=st.integers(1, 90),
       R=st.integers(1, 16), seed=st.integers(0, 2**31 - 1))
def test_each_row_is_the_one_row_call(hkv, g, d16, B, S, R, seed):
    rng = np.random.default_rng(seed)
    H, D = hkv * g, 16 * d16
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(R, H, D, generator=gen) * 2
    k, v = torch.randn(B, hkv, S, D, generator=gen) * 2, torch.randn(B, hkv, S, D, generator=gen)
    keys = []
    for _ in range(R):  # a prefix (a causal row), or any ordered subset of the slots (a tree node, a ragged row)
        n = int(rng.integers(1, S + 1))
        keys.append(np.arange(n) if rng.random() < 0.5 else np.sort(rng.choice(S, n, replace=False)))
    batch = rng.integers(0, B, R).tolist()
    rows = attend.Rows.of(keys, batch)
    y = attend.attend(q, k, v, rows, D ** -0.5)
    for r in range(R):
        one = attend.attend(q[r:r + 1], k, v, attend.Rows.of([keys[r]], [batch[r]]), D ** -0.5)
        assert torch.equal(y[r], one[0]), r
    torch.testing.assert_close(y, _reference(q, k, v, rows, D ** -0.5), rtol=1e-5, atol=1e-5)


def test_extreme_scores_and_the_exp():
    """Scores far apart (a softmax that is one-hot) stay finite and exact-ish; a row of one key returns its value."""
    q = torch.zeros(2, 1, 16)
    q[0, 0, 0] = 200.0
    k = torch.zeros(1, 1, 3, 16)
    k[0, 0, 1, 0] = 1.0
    v = torch.arange(48, dtype=torch.float32).view(1, 1, 3, 16)
    rows = attend.Rows.of([np.arange(3), np.array([2])], [0, 0])
    y = attend.attend(q, k, v, rows, 1.0)
    assert torch.equal(y[0], v[0, 0, 1]) and torch.equal(y[1], v[0, 0, 2])
    x = torch.linspace(-87, 0, 2001)
    e = torch.stack([attend.attend(torch.ones(1, 1, 16), torch.stack([torch.zeros(16), torch.full((16,), t / 16)])
                                   .view(1, 1, 2, 16), torch.eye(2, 16).view(1, 1, 2, 16), attend.Rows.of(
                                       [np.array([0, 1])], [0]), 1.0)[0, 1] for t in x[::100].tolist()])
    torch.testing.assert_close(e, torch.exp(x[::100]) / (1 + torch.exp(x[::100])), rtol=2e-6, atol=1e-30)


def test_the_llama_forward_runs_its_rows_through_the_kernel(monkeypatch):
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    from mtplab.model.llama import LlamaForward
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    lab = LlamaForward(LlamaForCausalLM(cfg).eval(), 64)
    calls = []
    real = attend._attend
    monkeypatch.setattr(attend, "_attend", lambda *a: (calls.append(len(a[7])), real(*a))[1])
    with torch.inference_mode():
        cache = lab.new_cache()
        lab(torch.randint(50, (1, 20)), cache)  # a prefill of 20 rows: one batched torch call, not the kernel
        assert calls == []
        lab(torch.tensor([[3]]), cache)
        lab(torch.tensor([[4, 5, 6]]), cache)
        with kernels.use_stock():  # the stock switch runs torch's attention, one row at a time
            lab(torch.tensor([[7]]), cache)
    assert calls == [1, 1, 3, 3]  # rows per call, one call per layer
