"""The exact kernels (mtplab.model.kernels) and the classroom GPT's row-invariant verify.

Row i of a q-row call must be bit for bit the one-row call on that row (torch.equal, not allclose), for random
shapes, q <= 16, on one and two threads, under both block plans (kernels.ROWS = 8 for AVX-512, 3 for AVX2: each is
run here whatever the CPU); and a q-row cached forward of the whole model must give, row by row, the
logits of the one-token forward at that position. The stock kernel's mismatches are printed, never asserted: they
depend on the CPU and on torch's GEMM.
"""
import contextlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from mtplab.model import checkpoint as ckpt
from mtplab.model import kernels
from mtplab.model.gpt import GPT
from mtplab.model.config import ModelConfig

pytestmark = pytest.mark.skipif(not kernels.EXACT, reason="numba is missing: " + kernels.status())


@contextlib.contextmanager
def block_plan(rows):
    """kernels.ROWS = rows within the block (the plan is read at each call)."""
    old = kernels.ROWS
    kernels.ROWS = rows
    try:
        yield
    finally:
        kernels.ROWS = old


def rows_equal_one_row_calls(f, x):
    """How many rows of f(x) differ (any bit) from f on that row alone."""
    y = f(x)
    return sum(not torch.equal(y[i], f(x[i:i + 1])[0]) for i in range(x.shape[0]))


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 300), n=st.integers(1, 300), q=st.integers(1, kernels.MAX_ROWS), threads=st.sampled_from([1, 2]),
       bias=st.booleans(), seed=st.integers(0, 2**31 - 1), rows=st.sampled_from([3, 8]))
def test_each_row_is_the_one_row_call(m, n, q, threads, bias, seed, rows):
    g = torch.Generator().manual_seed(seed)
    w, x = torch.randn(m, n, generator=g), torch.randn(q, n, generator=g) * 3
    b = torch.randn(m, generator=g) if bias else None
    with block_plan(rows):
        y = kernels.linear(x, w, b, threads=threads)
    for i in range(q):
        for t in (1, 2):  # the one-row call on either thread count
            assert torch.equal(y[i], kernels.linear(x[i:i + 1], w, b, threads=t)[0]), (i, t)
    torch.testing.assert_close(y, F.linear(x, w, b), rtol=1e-4, atol=1e-4)  # and it is a linear


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 200), n=st.integers(1, 200), q=st.integers(1, kernels.MAX_ROWS), threads=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**31 - 1), rows=st.sampled_from([3, 8]))
def test_compact_panels_give_the_float32_panels_bits(m, n, q, threads, seed, rows):
    """A weight whose values are all bf16 values (heads shipped in bf16) is packed as bf16 bits: half the bytes,
    the same sums, bit for bit, whatever the rows, blocks and threads; each row is still the one-row call."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(m, n, generator=g) * 0.1).to(torch.bfloat16).float()
    x = torch.randn(q, n, generator=g)
    assert kernels.compact(w) and kernels.compact(w.to(torch.bfloat16))
    assert kernels.panels(w).dtype == np.uint16
    with block_plan(rows):
        small = kernels.linear(x, w, threads=threads)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(kernels, "compact", lambda _: False)
            wide = w.clone()
            assert kernels.panels(wide).dtype == np.float32
            assert torch.equal(small, kernels.linear(x, wide, threads=threads))
    assert rows_equal_one_row_calls(lambda z: kernels.linear(z, w), x) == 0


def test_what_compact_means():
    w = torch.randn(40, 30)
    assert not kernels.compact(w) and kernels.panels(w).dtype == np.float32
    assert not kernels.compact(w.half()) and kernels.compact(w.bfloat16()) and kernels.compact(w.bfloat16().float())
    w2 = w.bfloat16().float()
    w2[3, 4] = torch.nextafter(w2[3, 4], torch.tensor(float("inf")))  # one value off bf16's grid: float32 panels
    assert not kernels.compact(w2) and kernels.panels(w2).dtype == np.float32


def test_block_plans():
    """`blocks` is `_panel`'s loop: AVX-512 blocks of 8 while more than 8 rows remain, then one block of 2, 3, 4 or 8;
    AVX2 blocks of 3 while more than 4 or exactly 3 rows remain, then blocks of 2 (one or two rows one block of 2, four
    rows two)."""
    assert kernels.ROWS in (3, 8)
    assert [kernels.blocks(q, 8) for q in (1, 2, 3, 4, 5, 8, 9, 11, 12, 13, 16)] == [
        [2], [2], [3], [4], [8], [8], [8, 2], [8, 3], [8, 4], [8, 8], [8, 8]]
    assert [kernels.blocks(q, 3) for q in (1, 2, 3, 4, 5, 6, 7, 8, 16)] == [
        [2], [2], [3], [2, 2], [3, 2], [3, 3], [3, 2, 2], [3, 3, 2], [3, 3, 3, 3, 2, 2]]
    assert all(sum(kernels.blocks(q, r)) - q in range(0, 4) for q in range(1, 17) for r in (3, 8))  # every row, once
    assert kernels.blocks(7) == kernels.blocks(7, kernels.ROWS)
    g = torch.Generator().manual_seed(4)
    w, x = torch.randn(100, 70, generator=g), torch.randn(16, 70, generator=g)
    for q in range(1, 17):  # both plans, whole calls: the same bits
        with block_plan(3):
            a = kernels.linear(x[:q], w, threads=1)
        with block_plan(8):
            assert torch.equal(a, kernels.linear(x[:q], w, threads=2)), q


def test_leading_axes_bf16_weights_and_what_stock_does():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(576, 1536, generator=g)
    x = torch.randn(1, 8, 1536, generator=g)
    y = kernels.linear(x, w)
    assert y.shape == (1, 8, 576)
    assert rows_equal_one_row_calls(lambda z: kernels.linear(z, w), x[0]) == 0
    wb = w.to(torch.bfloat16)  # weights in bf16: computed as their float32 values
    assert torch.equal(kernels.linear(x, wb), kernels.linear(x, wb.float()))
    stock = {q: rows_equal_one_row_calls(lambda z: F.linear(z, w), x[0, :q]) for q in (2, 4, 8)}
    print(f"stock F.linear, rows differing from the one-row call (576x1536): {stock}")


def test_stock_paths_and_fallback(monkeypatch):
    w = torch.randn(32, 16, requires_grad=True)
    x = torch.randn(4, 16)
    y = kernels.linear(x, w)  # autograd recording: the stock kernel, and a gradient
    y.sum().backward()
    assert w.grad is not None and torch.equal(y, F.linear(x, w))
    x17 = torch.randn(kernels.MAX_ROWS + 1, 16)  # a prefill: the stock kernel
    assert torch.equal(kernels.linear(x17, w.detach()), F.linear(x17, w.detach()))
    with kernels.use_stock():
        assert "observed, not guaranteed" in kernels.status() and not kernels.active()
        assert torch.equal(kernels.linear(x, w.detach()), F.linear(x, w.detach()))
    assert kernels.active() and "exact" in kernels.status()
    monkeypatch.setattr(kernels, "EXACT", False)
    assert "observed, not guaranteed" in kernels.status() and "numba" in kernels.status()
    assert torch.equal(kernels.linear(x, w.detach()), F.linear(x, w.detach()))


def test_the_split_runs_only_on_a_layer_whose_split_pays(monkeypatch):
    """Two threads split a large weight on numba's OpenMP or TBB layer; where only workqueue loads (its per-call
    wake-up made a 2-thread forward slower than a 1-thread one), the default is one thread and an explicit count
    still splits. The status line names the layer."""
    big = torch.zeros(4 * kernels.JB, kernels.PARALLEL_MIN // (4 * kernels.JB))
    assert kernels.split_layer() in ("omp", "tbb", "workqueue") and kernels.split_layer() in kernels.status()
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        for layer, want in (("omp", 2), ("tbb", 2), ("workqueue", 1)):
            monkeypatch.setitem(kernels._state, "layer", layer)
            assert kernels._threads(None, big) == min(want, kernels.numba.config.NUMBA_NUM_THREADS)
            assert kernels._threads(2, big) == min(2, kernels.numba.config.NUMBA_NUM_THREADS)
        assert "on one thread" in kernels.status()
        x = torch.randn(3, big.shape[1])
        w = torch.randn_like(big)
        assert torch.equal(kernels.linear(x, w), kernels.linear(x, w, threads=1))  # the serial path, same bits
    finally:
        torch.set_num_threads(saved)


def test_a_weight_changed_in_place_is_packed_again():
    w = torch.randn(70, 20)
    x = torch.randn(3, 20)
    before = kernels.linear(x, w)
    w.mul_(2)  # an optimizer step or load_state_dict writes in place
    torch.testing.assert_close(kernels.linear(x, w), 2 * before)
    with torch.no_grad():
        p = torch.nn.Parameter(torch.randn(70, 20))
        a = kernels.linear(x, p)
        p.copy_(torch.randn(70, 20))
        assert not torch.equal(kernels.linear(x, p), a)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 600), q=st.integers(1, kernels.MAX_ROWS), seed=st.integers(0, 2**31 - 1))
def test_rms_norm_each_row_alone(n, q, seed):
    g = torch.Generator().manual_seed(seed)
    x, gain = torch.randn(q, n, generator=g) * 5, torch.rand(n, generator=g) + 0.5
    f = lambda z: kernels.rms_norm(z, gain, 1e-6)
    assert rows_equal_one_row_calls(f, x) == 0
    torch.testing.assert_close(f(x), F.rms_norm(x, (n,), gain, 1e-6), rtol=1e-5, atol=1e-6)


def verify_mismatches(model, prompt, fed):
    """Rows of one cached forward over `fed` (after the prompt) whose hidden state or logits differ in any bit from
    the one-token forwards that plain decoding runs at those positions."""
    with torch.inference_mode():
        cache = model.new_cache()
        model(prompt, cache)
        n = len(cache)
        many = model(fed, cache)
        cache.crop(n)
        bad = 0
        for t in range(fed.shape[1]):
            one = model(fed[:, t:t + 1], cache)
            bad += not (torch.equal(many.logits[:, t], one.logits[:, 0]) and torch.equal(many.hidden[:, t], one.hidden[:, 0])
                        and torch.equal(many.pre_last[:, t], one.pre_last[:, 0]))
        return bad


@pytest.mark.parametrize("threads", [1, 2])
def test_classroom_verify_rows_are_the_one_token_forward(threads):
    model = ckpt.load("ntp").eval()
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, model.config.vocab_size, (1, 37), generator=g)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for q in (2, 3, 4, 8, 16):
            fed = torch.randint(0, model.config.vocab_size, (1, q), generator=g)
            assert verify_mismatches(model, prompt, fed) == 0, q
        with kernels.use_stock():
            stock = {q: verify_mismatches(model, prompt, torch.randint(0, 256, (1, q), generator=g)) for q in (4, 8)}
    finally:
        torch.set_num_threads(old)
    print(f"stock kernels, {threads} thread(s): verify rows differing from the one-token forward: {stock}")


@pytest.mark.parametrize("rows", [3, 8])
def test_every_head_family_trunk_and_a_small_random_model(rows):
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=48, vocab_size=97, block_size=64, heads="deepseek", n_depths=3)
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    prompt = torch.randint(0, 97, (1, 20))
    with block_plan(rows):
        for q in (2, 5, 16):
            assert verify_mismatches(model, prompt, torch.randint(0, 97, (1, q))) == 0, q
        assert verify_mismatches(model, torch.randint(0, 97, (1, 5)), torch.randint(0, 97, (1, 7))) == 0  # short prefill


def test_training_keeps_the_stock_path():
    cfg = ModelConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=50, block_size=32)
    model = GPT(cfg)
    idx = torch.randint(0, 50, (1, 8))
    out = model(idx)
    out.logits.sum().backward()  # autograd runs through F.linear and F.rms_norm
    assert model.lm_head.weight.grad is not None
    assert np.isfinite(model.lm_head.weight.grad.numpy()).all()


def test_notebook_01_kernel_race_reports_both_kernels():
    from mtplab.teaching import bottleneck
    kc = bottleneck.kernel_curves(layers=1, qs=(1, 4), rounds=2)
    assert set(kc["ratio"]) == {"stock", "exact"} and set(kc["ratio"]["exact"]) == {1, 4}
    assert kc["ratio"]["exact"][1] == (1.0, 1.0, 1.0) and kc["t1_ms"]["exact"] > 0
    assert kc["row0"]["exact"] == (True, 0.0)  # the exact kernel's row 0 is the one-row call's
    lines = bottleneck.kernel_lines(kc)
    assert lines[0].startswith("these kernel timings:") and "equals the one-row call" in lines[-2]
    print("\n".join(lines))


def test_notebook_01_kernel_words_follow_the_numbers(monkeypatch):
    """A dip in t(q)/t(1) is called noise only when the ranges overlap; the exact curve's shape is put down to its
    blocks (2 rows one block of 2, 4 one of 4; q = 16 under the AVX-512 plan: two blocks of 8, two reads of the
    weights), not called flat."""
    from mtplab.teaching import bottleneck
    monkeypatch.setattr(kernels, "ROWS", 8)
    kc = {"busy": None, "status": "exact kernel (numba x)", "t1_ms": {"stock": 4.5, "exact": 3.0},
          "ratio": {"stock": {1: (1, 1, 1), 2: (1.58, 1.55, 1.63), 4: (1.35, 1.15, 1.48), 16: (1.57, 1.29, 1.78)},
                    "exact": {1: (1, 1, 1), 2: (0.94, 0.90, 1.01), 4: (0.93, 0.86, 1.01), 16: (1.31, 1.16, 1.38)}},
          "row0": {"stock": (False, 1e-6), "exact": (True, 0.0)}}
    lines = bottleneck.kernel_lines(kc)
    dips = [ln for ln in lines if "below t(" in ln]
    assert len(dips) == 3 and "lie apart" in dips[0]  # stock: 4 below 2, ranges apart
    assert all("noise" in d for d in dips[1:])  # exact: 2 below 1 and 4 below 2, ranges overlap
    words = next(ln for ln in lines if ln.startswith("exact kernel, the linears alone"))
    assert "q = 2..4 each run as one block (of 2 or 4 rows" in words and "read 2 times: t(16)/t(1) = 1.31" in words
    assert "attention" not in words.split(":", 1)[1] and "flat" not in words
    assert "one query row at a time" in bottleneck.exact_curve_words({1: 1.0, 4: 1.24, 8: 1.52})


def test_token_tree_rows_are_the_one_token_forward_along_their_path():
    from mtplab.decoding.tree import build_tree, verify_tree
    model = ckpt.load("ntp").eval()
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, 256, (1, 30), generator=g)
    tree = build_tree([torch.randint(0, 256, (3,), generator=g).tolist() for _ in range(3)], (2, 2, 1))
    root = 65
    with torch.inference_mode():
        cache = model.new_cache()
        model(prompt, cache)
        L = len(cache)
        out = verify_tree(model, cache, root, tree)
        bad = 0
        for row in range(len(tree) + 1):  # row 0 is the root, row i + 1 node i
            path = []
            node = row - 1
            while node >= 0:
                path.append(tree.tokens[node])
                node = tree.parent[node]
            cache.crop(L)
            for tok in [root] + path[::-1]:
                one = model(torch.tensor([[tok]]), cache)
            bad += not torch.equal(out.logits[0, row], one.logits[0, 0])
    assert bad == 0


def test_ragged_batch_rows_are_each_sequence_decoded_alone():
    from mtplab.model.layers import RaggedKVCache
    model = ckpt.load("ntp").eval()
    g = torch.Generator().manual_seed(3)
    seqs = torch.randint(0, 256, (2, 6), generator=g)
    new = torch.randint(0, 256, (2, 3), generator=g)
    lengths = [6, 4]  # row 1 keeps only its first 4 tokens: the rows are ragged
    with torch.inference_mode():
        cache = RaggedKVCache.for_model(model, 2)
        pos, mask = cache.plan(6)
        model(seqs, cache, positions=pos, mask=mask)
        cache.lengths = list(lengths)
        pos, mask = cache.plan(3)
        batch = model(new, cache, positions=pos, mask=mask).logits  # (2, 3, V)
        for b, n in enumerate(lengths):
            alone = model.new_cache()
            model(seqs[b:b + 1, :n], alone)
            for t in range(3):
                one = model(new[b:b + 1, t:t + 1], alone).logits[0, 0]
                assert torch.equal(batch[b, t], one), (b, t)


@pytest.mark.parametrize("name,method", [("deepseek-d1", "deepseek-reuse"), ("stern-k4", "blockwise")])
def test_speculative_decoding_runs_through_the_exact_kernel_and_equals_ar(monkeypatch, name, method):
    from mtplab.data import held_out_prompts
    from mtplab.decoding.generate import decode_with
    from mtplab.decoding.loop import autoregressive
    from mtplab.tokenizer import encode
    model = ckpt.load(name).eval()
    rows = []
    serial = kernels._serial
    monkeypatch.setattr(kernels, "_serial", lambda x, wp, out, plan: (rows.append(x.shape[0]), serial(x, wp, out, plan)))
    for p in held_out_prompts("code", 2, 40):
        ids = encode(p)[:40]
        ref = autoregressive(model, ids, max_new_tokens=32).tokens
        assert decode_with(method, model, ids, max_new_tokens=32, k=4).tokens == ref
    assert max(rows) > 1 and 1 in rows  # verify forwards of several rows and one-token forwards both went through it
