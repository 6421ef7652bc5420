import math

import pytest
import torch
import torch.nn.functional as F

from mtplab.errors import MtplabError
from mtplab.training.losses import deepseek_loss, depth_cross_entropies, multi_token_loss, soft_ce, sub_vocab_index
from mtplab.training.steps import meta_step
from tests.conftest import random_model


def reference_loss(logits, targets, K):
    """The sources' MultiTokenLoss written out position by position, independently of mtplab."""
    B, T = targets.shape
    V = logits.shape[-1] // K
    per_head = []
    for k in range(K):
        terms = []
        for b in range(B):
            for i in range(T - k):
                row = logits[b, i, k * V:(k + 1) * V]
                terms.append(-F.log_softmax(row, -1)[targets[b, i + k]])
        per_head.append(torch.stack(terms).mean())
    return sum(per_head) / K


def test_multi_token_loss_matches_reference():
    torch.manual_seed(0)
    B, T, K, V = 2, 9, 4, 11
    logits = torch.randn(B, T, K * V)
    targets = torch.randint(0, V, (B, T))
    assert torch.allclose(multi_token_loss(logits, targets, K), reference_loss(logits, targets, K), atol=1e-6)


def test_each_head_is_scored_against_token_k_plus_1_ahead():
    """With targets[i] = x[i+1], head k at position i is scored against x[i+k+1]: no position is
    lost or shifted wrongly. Logits that put all mass on x[i+k+1] give (almost) zero loss; on x[i+k], not."""
    B, T, K, V = 1, 12, 3, 50
    x = torch.randperm(V)[: T + K].unsqueeze(0)  # distinct tokens, so a wrong shift cannot hit by chance
    targets = x[:, 1:T + 1]
    right = torch.full((B, T, K, V), -30.0)
    wrong = torch.full((B, T, K, V), -30.0)
    for i in range(T):
        for k in range(K):
            right[0, i, k, x[0, i + k + 1]] = 30.0
            wrong[0, i, k, x[0, i + k]] = 30.0
    assert multi_token_loss(right.view(B, T, K * V), targets, K) < 1e-6
    assert multi_token_loss(wrong.view(B, T, K * V), targets, K) > 10


def test_unshifted_targets_make_head_zero_copy_its_input():
    """The pitfall the shift hides: pass the inputs as targets and head 0 is rewarded for copying x[i]."""
    B, T, K, V = 1, 10, 2, 40
    x = torch.randperm(V)[: T + K].unsqueeze(0)
    copy = torch.full((B, T, K, V), -30.0)
    for i in range(T):
        copy[0, i, 0, x[0, i]] = 30.0
        copy[0, i, 1, x[0, i + 1]] = 30.0
    wrong_use = multi_token_loss(copy.view(B, T, K * V), x[:, :T], K)  # inputs passed as targets
    right_use = multi_token_loss(copy.view(B, T, K * V), x[:, 1:T + 1], K)
    assert wrong_use < 1e-6 < 10 < right_use


def test_depth_ce_agrees_with_sources_loss():
    torch.manual_seed(1)
    B, T, K, V = 2, 8, 3, 13
    logits = torch.randn(B, T, K, V)
    x = torch.randint(0, V, (B, T + 1))
    ces = depth_cross_entropies(logits, x)
    assert torch.allclose(torch.stack(ces).mean(), multi_token_loss(logits.reshape(B, T, K * V), x[:, 1:], K), atol=1e-6)


def test_deepseek_loss_formula_and_lambda():
    ces = [torch.tensor(2.0), torch.tensor(3.0), torch.tensor(5.0)]
    assert math.isclose(deepseek_loss(ces, 0.3).item(), 2.0 + 0.3 / 2 * 8.0, rel_tol=1e-6)
    assert deepseek_loss(ces, 0.0).item() == 2.0
    with pytest.raises(MtplabError, match="lambda must be >= 0"):
        deepseek_loss(ces, -0.1)


def test_deepseek_labels_follow_eq24():
    """Module k's first label is t_{2+k} (1-based), i.e. x[k+1] for position 0 (0-based)."""
    m = random_model("deepseek", 3, seed=5)
    x = torch.randint(0, 256, (1, 11))  # T = 10, as in the sources' example
    logits = m.depth_logits(x[:, :10])
    for d in (2, 3):
        n = 10 - d + 1  # labels t_{2+k..T+1} with k = d-1: T-k of them
        manual = F.cross_entropy(logits[0, :n, d - 1], x[0, d:d + n])
        assert torch.allclose(depth_cross_entropies(logits, x)[d - 1], manual)
        assert n == 10 - (d - 1)


@pytest.mark.parametrize("freeze", [False, True])
def test_meta_memory_efficient_backward_equals_naive(freeze):
    x = torch.randint(0, 256, (3, 25))
    grads = []
    for eff in (True, False):
        m = random_model("meta", 4, seed=6).train()
        if freeze:
            for n, p in m.named_parameters():
                p.requires_grad_(n.startswith("mtp."))
        loss = meta_step(m, x, freeze_trunk=freeze, memory_efficient=eff)
        grads.append((loss, {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}))
    (l1, g1), (l2, g2) = grads
    assert abs(l1 - l2) < 1e-5
    assert g1.keys() == g2.keys() and len(g1) > 0
    for n in g1:
        assert torch.allclose(g1[n], g2[n], atol=1e-6), n


def test_multi_token_loss_refuses_a_window_shorter_than_its_heads():
    """Head k scores positions 0..T-1-k: with T < K the last heads have nothing to score (a clear error, not a
    bare ValueError from a negative slice)."""
    logits = torch.zeros(1, 2, 4 * 5)
    with pytest.raises(MtplabError, match="T=2 targets is too short for 4 heads"):
        multi_token_loss(logits, torch.zeros(1, 2, dtype=torch.long), 4)


def test_cached_soft_ce_projects_only_the_counted_positions_and_equals_the_dense_loss():
    """soft_ce computes the N-wide draft logits at the masked positions alone; loss and hits equal the dense
    formula's (every position projected, then masked), and its gradient too."""
    g = torch.Generator().manual_seed(0)
    B, T, C, V, K = 3, 11, 8, 40, 4
    vocab = torch.tensor([0, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37])
    where = sub_vocab_index(vocab, V)
    W = torch.randn(len(vocab), C, generator=g)
    x = torch.randn(B, T, C, generator=g, requires_grad=True)
    top_i = torch.randint(0, V, (B, T, K), generator=g)
    top_i[0, 2] = torch.tensor([1, 2, 4, 6])  # a position whose top-k lies wholly outside the draft vocabulary
    top_p = torch.softmax(torch.randn(B, T, K, generator=g), -1)
    mask = torch.rand(B, T, generator=g) > 0.4
    mask[0, 2] = True
    loss, hits = soft_ce(x, W, top_i, top_p, where, mask)
    loss.backward()
    grad, x.grad = x.grad.clone(), None
    # the dense reference: every position projected, then masked
    logits = F.linear(x, W)
    idx = where[top_i]
    p = top_p * (idx >= 0)
    keep = mask & (p.sum(-1) > 0)
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-9)
    logp = torch.log_softmax(logits, -1).gather(-1, idx.clamp_min(0))
    ref = -(p * logp).sum(-1)[keep].mean()
    ref.backward()
    assert torch.allclose(loss, ref, atol=1e-6) and torch.allclose(grad, x.grad, atol=1e-6)
    ref_hits = ((logits.argmax(-1) == idx[..., 0]) & keep).sum()
    assert hits.tolist() == [int(ref_hits), int(keep.sum())] and int(keep.sum()) < int(mask.sum())
    assert not grad[~mask].any()  # positions not counted get no gradient
