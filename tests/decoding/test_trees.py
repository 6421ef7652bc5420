import pytest
import torch
from hypothesis import given, settings, strategies as st

from mtplab.errors import MtplabError
from mtplab import viz
from mtplab.decoding.loop import autoregressive
from mtplab.decoding.drafters import BaseDrafter, DeepSeekDrafter, MetaDrafter, SternDrafter
from mtplab.decoding.tree import Tree, build_tree, iter_tree_steps, longest_path, tree_speculative

TREE_DRAFTERS = {"stern": SternDrafter, "meta": MetaDrafter}


class TreeOracle(BaseDrafter):
    """Candidates for depth d: the target's true token at a random rank, or missing, among wrong tokens.
    Makes trees whose winning branch is often not the first one, so pruning and compaction are exercised."""
    name = "tree-oracle"

    def __init__(self, reference, seed):
        self.reference = reference
        self.rng = torch.Generator().manual_seed(seed)

    def candidates(self, n, widest):
        V = self.model.config.vocab_size
        pos = len(self.tokens) - self.prompt_len
        out = []
        for d in range(n):
            right = self.reference[pos + d] if pos + d < len(self.reference) else 0
            wrong = [(right + 1 + i) % V for i in range(widest)]
            rank = int(torch.randint(widest + 1, (1,), generator=self.rng))  # == widest: the right one is missing
            out.append(wrong[:rank] + [right] + wrong[rank:widest - 1] if rank < widest else wrong)
        return out


def assert_cache_is_recompute(model, cache, tokens):
    """The cache holds exactly tokens[:-1]: the same keys and values as a fresh forward over them."""
    fresh = model.new_cache()
    model(torch.tensor([tokens[:-1]]), fresh)
    L = len(tokens) - 1
    assert cache.length == L == fresh.length
    torch.testing.assert_close(cache.k[:, :, :, :L], fresh.k[:, :, :, :L], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(cache.v[:, :, :, :L], fresh.v[:, :, :, :L], atol=1e-5, rtol=1e-4)


@torch.inference_mode()
def run_checked(model, drafter, prompt, m, widths):
    """Tree decode with a cache-versus-recompute check after every commit; returns (tokens, tree steps)."""
    cache = model.new_cache()
    tokens, steps = [], []
    for ts in iter_tree_steps(model, drafter, prompt, max_new_tokens=m, widths=widths, cache=cache):
        tokens.extend(ts.step.emitted)
        steps.append(ts)
        assert_cache_is_recompute(model, cache, list(prompt) + tokens)
    return tokens, steps


widths_st = st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple)


@settings(max_examples=6, deadline=None)
@given(prompt=st.lists(st.integers(0, 255), min_size=1, max_size=12), m=st.integers(1, 20), widths=widths_st)
def test_head_trees_equal_autoregressive(family_models, prompt, m, widths):
    for fam, cls in TREE_DRAFTERS.items():
        model = family_models[fam]
        ref = autoregressive(model, prompt, max_new_tokens=m).tokens
        tokens, _ = run_checked(model, cls(model), prompt, m, widths)
        assert tokens == ref, (fam, widths)


@settings(max_examples=6, deadline=None)
@given(prompt=st.lists(st.integers(0, 255), min_size=1, max_size=12), m=st.integers(1, 16), widths=widths_st,
       seed=st.integers(0, 1000))
def test_oracle_trees_prune_and_still_equal_autoregressive(family_models, prompt, m, widths, seed):
    model = family_models["none"]
    ref = autoregressive(model, prompt, max_new_tokens=m).tokens
    tokens, steps = run_checked(model, TreeOracle(ref, seed), prompt, m, widths)
    assert tokens == ref
    for ts in steps[1:]:  # the path is a branch of the tree: each node's parent is the previous node
        nodes = [r - 1 for r in ts.path[1:]]
        assert [ts.tree.parent[n] for n in nodes] == ([-1] + nodes)[:len(nodes)]
        assert ts.step.accepted == len(nodes)


def test_oracle_trees_take_non_first_branches(family_models):
    """Not only the first child ever wins: the walk really chooses among siblings."""
    model = family_models["none"]
    prompt = [5, 6, 7]
    ref = autoregressive(model, prompt, max_new_tokens=40).tokens
    _, steps = run_checked(model, TreeOracle(ref, 3), prompt, 40, (3, 3))
    firsts = {ts.tree.children(-1)[0] for ts in steps[1:] if len(ts.path) > 1}
    won = {ts.path[1] - 1 for ts in steps[1:] if len(ts.path) > 1}
    assert won - firsts, "every accepted path began with the first candidate"


def test_chain_tree_matches_chain_forward_count(family_models):
    """widths (1,)*(k-1) is the chain: a step per forward, as many forwards as the overlap schedule."""
    from mtplab.decoding.loop import speculative
    model = family_models["stern"]
    chain = speculative(model, SternDrafter(model), [1, 2, 3], max_new_tokens=30, k=4)
    tree = tree_speculative(model, SternDrafter(model), [1, 2, 3], max_new_tokens=30, widths=(1, 1, 1))
    assert tree.tokens == chain.tokens and tree.forwards == chain.forwards


def test_build_tree_and_longest_path():
    t = build_tree([[10, 11], [20, 21]], (2, 2))
    assert t.tokens == [10, 11, 20, 21, 20, 21] and t.parent == [-1, -1, 0, 0, 1, 1] and t.depth == [1, 1, 2, 2, 2, 2]
    anc = t.ancestry()
    assert anc[5].tolist() == [True, False, True, False, False, True, False]  # node 4 (row 5): root, node 1, itself
    # rows: 0 root, 1..6 nodes. Target says 11 after root, then 21 after node 1 (row 2), then 7 after node 5
    top = [11, 0, 21, 0, 0, 0, 7]
    assert longest_path(t, top) == ([0, 2, 6], 7, "target")
    assert longest_path(t, [12] + [0] * 6) == ([0], 12, "correction")
    assert longest_path(Tree([], [], []), [4]) == ([0], 4, "target")


def test_trees_refuse_sampling_and_bad_input(family_models):
    model = family_models["stern"]
    with pytest.raises(MtplabError, match="greedy-only"):
        tree_speculative(model, SternDrafter(model), [1], max_new_tokens=4, widths=(2,), temperature=0.7)
    with pytest.raises(MtplabError, match="widths"):
        tree_speculative(model, SternDrafter(model), [1], max_new_tokens=4, widths=(2, 0))
    with pytest.raises(MtplabError, match="at most 6 widths"):
        tree_speculative(model, SternDrafter(model), [1], max_new_tokens=4, widths=(1,) * 7)
    ds = family_models["deepseek"]
    with pytest.raises(MtplabError, match="one depth deep"):
        tree_speculative(ds, DeepSeekDrafter(ds), [1], max_new_tokens=4, widths=(2, 2))


@settings(max_examples=6, deadline=None)
@given(prompt=st.lists(st.integers(0, 255), min_size=1, max_size=12), m=st.integers(1, 20), width=st.integers(1, 4),
       reuse=st.sampled_from([None, 2]))
def test_deepseek_trees_one_depth_deep_equal_autoregressive(family_models, prompt, m, width, reuse):
    """A DeepSeek module's top-w at depth 1 as a tree: AR's tokens, the cache exactly the committed tokens, and the
    module's own caches kept in step (the next step's candidates read them)."""
    model = family_models["deepseek"]
    ref = autoregressive(model, prompt, max_new_tokens=m).tokens
    tokens, steps = run_checked(model, DeepSeekDrafter(model, reuse=reuse), prompt, m, (width,))
    assert tokens == ref
    assert {len(ts.tree) for ts in steps[1:-1]} <= {width}  # every step but the last (which may draft none) is full


def test_deepseek_tree_of_width_one_is_its_chain(family_models):
    """widths (1,) is DeepSeek's k=2 chain: the same tokens, drafts and forwards."""
    from mtplab.decoding.loop import speculative
    model = family_models["deepseek"]
    chain = speculative(model, DeepSeekDrafter(model), [1, 2, 3], max_new_tokens=30, k=2)
    tree = tree_speculative(model, DeepSeekDrafter(model), [1, 2, 3], max_new_tokens=30, widths=(1,))
    assert tree.tokens == chain.tokens and tree.forwards == chain.forwards
    assert [s.drafted for s in tree.steps] == [s.drafted for s in chain.steps]


def test_tree_figures_are_figures(family_models):
    from matplotlib.figure import Figure

    model = family_models["none"]
    ref = autoregressive(model, [5, 6, 7], max_new_tokens=12).tokens
    _, steps = run_checked(model, TreeOracle(ref, 4), [5, 6, 7], 12, (3, 2))
    for ts in steps[1:]:
        assert isinstance(viz.tree_step(ts), Figure)
    rows = [{"kind": kind, "batch_size": b, "tokens_per_s": 10.0 * b, "latency_ms_per_token": 5.0,
             "speedup": 1.2 / b} for kind in ("ar", "spec") for b in (1, 2, 4)]
    fig = viz.batch_tradeoff({"blockwise": rows})
    assert isinstance(fig, Figure) and len(fig.axes) == 3


def test_a_tree_ends_at_the_stop_token_with_ars_tokens():
    """A chat answer ends at its end of turn: the tree decoder stops at `stop` as the chain does, with AR's tokens
    up to it, whether the stop is the bonus or a token on the accepted path."""
    from mtplab.model import checkpoint
    model = checkpoint.load("stern-k4")
    prompt = list(b"import os\nimport sys\n\ndef main():\n    ")
    ref = autoregressive(model, prompt, max_new_tokens=40).tokens
    firsts = {}
    for i, tok in enumerate(ref):
        firsts.setdefault(tok, i)
    for stop, i in sorted(firsts.items(), key=lambda kv: kv[1])[1::3]:
        for widths in ((2, 1, 1), (2, 2)):
            tr = tree_speculative(model, SternDrafter(model), prompt, max_new_tokens=40, widths=widths, stop=stop)
            assert tr.tokens == ref[:i + 1] == autoregressive(model, prompt, max_new_tokens=40, stop=stop).tokens
            assert sum(len(s.emitted) for s in tr.steps) == i + 1
