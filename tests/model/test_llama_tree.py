"""Token trees on the lab's Llama forward (mtplab.model.llama): `forward(idx, cache, positions=, mask=)` means what the
classroom GPT's does, so a tree verify's row for each node is, bit for bit, the one-token forward at the end of its
branch, and the tree decoder (mtplab.decoding.tree) gives greedy AR's tokens on a tiny GQA Llama."""

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from mtplab.decoding.batch import batched_speculative  # noqa: E402
from mtplab.decoding.drafters import DeepSeekDrafter, MetaDrafter, SternDrafter  # noqa: E402
from mtplab.decoding.loop import autoregressive  # noqa: E402
from mtplab.decoding.tree import build_tree, iter_tree_steps, tree_speculative, verify_tree  # noqa: E402
from mtplab.errors import MtplabError  # noqa: E402
from mtplab.hf.target import load_hf  # noqa: E402
from mtplab.model import kernels  # noqa: E402

from tests.model import test_exact_forward  # noqa: E402
tiny = test_exact_forward.tiny  # the fixture, under its own name
from tests.hf.test_hf import V  # noqa: E402
from tests.decoding.test_trees import TreeOracle  # noqa: E402

exact_only = pytest.mark.skipif(not kernels.EXACT, reason=f"no exact kernel here: {kernels.status()}")


def _branch(tree, node: int) -> list[int]:
    """The tokens from the root's first child down to `node` (-1: none)."""
    path = []
    while node >= 0:
        path.append(tree.tokens[node])
        node = tree.parent[node]
    return path[::-1]


@exact_only
@pytest.mark.parametrize("threads,widths", [(1, (2, 2, 1)), (2, (3, 2)), (1, (1, 1, 1, 1))])
def test_tree_rows_are_the_chain_forward_along_each_branch(tiny, threads, widths):
    t = load_hf(tiny)
    g = torch.Generator().manual_seed(len(widths))
    tree = build_tree([torch.randint(V, (3,), generator=g).tolist() for _ in widths], widths)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            cache = t.new_cache()
            t(torch.randint(V, (1, 41), generator=g), cache)
            L, root = cache.length, 7
            out = verify_tree(t, cache, root, tree)
            assert out.logits.shape == (1, len(tree) + 1, V) and cache.length == L + len(tree) + 1
            for row in range(len(tree) + 1):  # row 0 the root, row i + 1 node i
                cache.crop(L)
                chain = t(torch.tensor([[root] + _branch(tree, row - 1)]), cache)  # the branch as one chain verify
                for name in ("logits", "hidden", "pre_last"):
                    assert torch.equal(getattr(out, name)[0, row], getattr(chain, name)[0, -1]), (row, name)
    finally:
        torch.set_num_threads(old)


@exact_only
@pytest.mark.parametrize("family,drafter,widths", [("stern", SternDrafter, (2, 2, 1)), ("meta", MetaDrafter, (3, 1))])
def test_the_tree_decoder_on_a_llama_gives_ar(tiny, family, drafter, widths):
    t = load_hf(tiny).attach(family, len(widths) + 1)  # untrained heads: exactness holds whatever they draft
    g = torch.Generator().manual_seed(5)
    for ids in [torch.randint(V, (12,), generator=g).tolist() for _ in range(2)] + [t.encode("def main(x):\n  return")]:
        ar = autoregressive(t, ids, max_new_tokens=40).tokens
        assert tree_speculative(t, drafter(t), ids, max_new_tokens=40, widths=widths).tokens == ar


@exact_only
def test_an_oracle_tree_on_a_llama_takes_side_branches_and_gives_ar(tiny):
    """Candidates that hold AR's token at a random rank: accepted paths leave the first child, pruned branches are
    cut from the cache, and the output is still AR's."""
    t = load_hf(tiny)
    ids = [5, 6, 7, 8]
    ar = autoregressive(t, ids, max_new_tokens=48).tokens
    steps = list(iter_tree_steps(t, TreeOracle(ar, 1), ids, max_new_tokens=48, widths=(3, 2)))
    assert [tok for s in steps for tok in s.step.emitted] == ar
    assert sum(s.step.accepted for s in steps) > 10 and any(s.side_branch for s in steps[1:])


def test_a_causal_mask_and_explicit_positions_change_nothing(tiny):
    t = load_hf(tiny)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(V, (1, 30), generator=g)
    with torch.inference_mode():
        for T in (5, 20):  # a verify (rows alone) and a prefill (one batched call)
            cache = t.new_cache()
            t(ids[:, :10], cache)
            plain = t(ids[:, 10:10 + T], cache)
            cache.crop(10)
            mask = torch.ones(T, 10 + T, dtype=torch.bool).tril(10)[None, None]
            pos = torch.arange(10, 10 + T)[None]
            same = t(ids[:, 10:10 + T], cache, positions=pos, mask=mask)
            assert torch.equal(plain.logits, same.logits), T


def test_bad_positions_and_masks_are_refused(tiny):
    t = load_hf(tiny)
    idx = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        cache = t.new_cache()
        t(idx, cache)
        with pytest.raises(MtplabError, match=r"positions must be \(B, T\)"):
            t(idx, cache, positions=torch.tensor([[3, 4]]))
        with pytest.raises(MtplabError, match="context window"):
            t(idx, cache, positions=torch.tensor([[3, 4, 10_000]]))
        with pytest.raises(MtplabError, match=r"mask must be bool \(B or 1, 1, T, P\+T\)"):
            t(idx, cache, mask=torch.ones(1, 1, 3, 3, dtype=torch.bool))
        with pytest.raises(MtplabError, match="at least one key"):
            t(idx, cache, mask=torch.zeros(1, 1, 3, 6, dtype=torch.bool))
        stock = load_hf(tiny, kernel="stock")
        with pytest.raises(MtplabError, match="need the lab's forward"):
            stock(idx, stock.new_cache(), mask=torch.ones(1, 1, 3, 3, dtype=torch.bool))


@exact_only
@pytest.mark.parametrize("family,drafter,K", [("none", None, 1), ("stern", SternDrafter, 4),
                                              ("deepseek", DeepSeekDrafter, 3)])
def test_ragged_batches_on_a_llama_give_each_row_alone(tiny, family, drafter, K):
    """Batched decoding (`decoding.batch`) on the lab's Llama forward: prompts of different lengths in one batch,
    each row at its own cache length (a GQA cache of the model's own layout), rows leaving as they finish: every row
    equals AR of that row alone."""
    t = load_hf(tiny)
    if family != "none":
        t.attach(family, K)  # untrained heads: exactness holds whatever they draft
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(V, (n,), generator=g).tolist() for n in (3, 9, 1, 6)]
    ms = [14, 5, 20, 9]
    res = batched_speculative(t, drafter, prompts, max_new_tokens=ms, k=1 if drafter is None else K)
    assert res.tokens == [autoregressive(t, p, max_new_tokens=m).tokens for p, m in zip(prompts, ms)]
    assert res.batch_sizes[0] == 4 and res.batch_sizes[-1] < 4  # rows left the batch as they finished


def test_ragged_batches_need_the_lab_forward(tiny):
    stock = load_hf(tiny, kernel="stock")
    with pytest.raises(MtplabError, match="batched decoding of ragged rows needs the lab's forward"):
        batched_speculative(stock, None, [[1, 2], [3]], max_new_tokens=4, k=1)
