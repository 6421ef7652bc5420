import pytest
import torch
from hypothesis import given, settings, strategies as st

from mtplab.errors import MtplabError
from mtplab import bench
from mtplab.model.layers import RaggedKVCache
from mtplab.decoding.batch import batched_autoregressive, batched_speculative
from mtplab.decoding.loop import autoregressive
from mtplab.decoding.drafters import DeepSeekDrafter, MetaDrafter, SternDrafter
from tests.conftest import random_model

HEAD_DRAFTERS = {"stern": SternDrafter, "meta": MetaDrafter, "deepseek": DeepSeekDrafter}

prompts_st = st.lists(st.lists(st.integers(0, 255), min_size=1, max_size=14), min_size=1, max_size=5)


@settings(max_examples=8, deadline=None)
@given(prompts=prompts_st, data=st.data(), k=st.integers(1, 5))
def test_batched_rows_equal_each_row_alone(family_models, prompts, data, k):
    """Prompts of different lengths, rows finishing at different steps: every row equals AR of that row alone."""
    ms = data.draw(st.lists(st.integers(1, 18), min_size=len(prompts), max_size=len(prompts)))
    for fam, cls in [("none", None)] + list(HEAD_DRAFTERS.items()):
        model = family_models[fam]
        refs = [autoregressive(model, p, max_new_tokens=m).tokens for p, m in zip(prompts, ms)]
        res = batched_speculative(model, cls, prompts, max_new_tokens=ms, k=1 if cls is None else k)
        assert res.tokens == refs, fam
        assert [len(t) for t in res.tokens] == ms  # nothing padded into any row's output
        if fam in ("stern", "meta"):  # the batched heads draft exactly what each row's own drafter drafts
            alone = batched_speculative(model, cls, prompts, max_new_tokens=ms, k=k, per_row=True)
            assert [[s.drafted for s in t.steps] for t in alone.traces] == \
                [[s.drafted for s in t.steps] for t in res.traces], fam


def test_rows_accept_different_numbers_of_drafts_and_leave_when_done():
    model = random_model("stern", 4, seed=5)
    prompts = [[1, 2, 3], [9, 9, 9, 9, 9, 9, 9, 9], [4], [7, 3, 1, 2, 5]]
    ms = [30, 5, 22, 12]
    res = batched_speculative(model, SternDrafter, prompts, max_new_tokens=ms, k=4)
    assert res.tokens == [autoregressive(model, p, max_new_tokens=m).tokens for p, m in zip(prompts, ms)]
    assert res.batch_sizes[0] == 4 and res.batch_sizes[-1] < 4  # rows left the batch as they finished
    assert sorted(res.batch_sizes, reverse=True) == res.batch_sizes
    # in one batched forward, rows that each drafted 3 tokens kept different numbers of them
    kept: dict[int, set] = {}
    for t in res.traces:
        for j, s in enumerate(t.steps[1:]):
            if len(s.drafted) == 3:
                kept.setdefault(j, set()).add(s.accepted)
    assert any(len(v) > 1 for v in kept.values()), kept


def test_batched_ar_forward_count():
    model = random_model(seed=4)
    res = batched_autoregressive(model, [[1], [2, 3], [4, 5, 6]], max_new_tokens=[3, 7, 5])
    assert res.forwards == 7 and res.batch_sizes == [3, 3, 3, 2, 2, 1, 1]
    assert res.new_tokens == 15


def test_ragged_cache_rows_see_only_their_own_prefix():
    """Garbage beyond a row's length is never seen: overwriting it does not change the logits."""
    model = random_model(seed=6)
    with torch.inference_mode():
        outs = []
        for junk in (0.0, 1e3):
            cache = RaggedKVCache.for_model(model, 2)
            cache.k.fill_(junk)
            cache.v.fill_(junk)
            cache.lengths = [0, 0]
            pos, mask = cache.plan(3)
            model(torch.tensor([[1, 2, 3], [4, 5, 6]]), cache, positions=pos, mask=mask)
            cache.lengths = [1, 3]  # row 0 keeps one token: its positions 1, 2 are now dead
            pos, mask = cache.plan(2)
            outs.append(model(torch.tensor([[8, 9], [8, 9]]), cache, positions=pos, mask=mask).logits)
        torch.testing.assert_close(outs[0], outs[1])
        alone = model(torch.tensor([[1, 8, 9]])).logits[0, 1:]
        torch.testing.assert_close(outs[0][0], alone, atol=1e-5, rtol=1e-4)


def test_batched_bad_input(family_models):
    model = family_models["stern"]
    with pytest.raises(MtplabError, match="no prompts"):
        batched_speculative(model, SternDrafter, [], max_new_tokens=4, k=2)
    with pytest.raises(MtplabError, match="one per prompt"):
        batched_speculative(model, SternDrafter, [[1], [2]], max_new_tokens=[4], k=2)
    with pytest.raises(MtplabError, match="k <= 7"):
        batched_speculative(model, SternDrafter, [[1]], max_new_tokens=4, k=9)
    with pytest.raises(MtplabError, match="stern heads"):
        batched_speculative(family_models["none"], SternDrafter, [[1]], max_new_tokens=4, k=2)


def test_batch_and_tree_benchmarks_run_on_tiny_models(tmp_path, monkeypatch):
    """The benchmark code runs end to end (random models stand in for the checkpoints; nothing is timed here
    that anyone reads). Output files and the --json row fields are checked."""
    import argparse
    import json

    from mtplab.bench import batch as bench_batch
    from mtplab.decoding.drafters import METHODS

    def fake_load(meth, checkpoint=None, *, device="auto", dtype="fp32"):
        fam = METHODS[meth].family
        return random_model(fam, 4, seed=1) if fam else random_model(), f"random-{fam}", torch.device("cpu")

    monkeypatch.setattr(bench_batch, "load_for", fake_load)
    monkeypatch.setattr(bench_batch, "held_out_ids", lambda n, length=48: [[1 + i, 2, 3][: 1 + i % 3] for i in range(n)])
    for what in ("batch", "tree"):
        a = argparse.Namespace(what=what, quick=True, json=True, device="cpu", dtype="fp32", out=str(tmp_path),
                               preset="tiny")
        bench.main(a)
        data = json.loads((tmp_path / f"{what}-quick.json").read_text())
        assert (tmp_path / f"{what}-quick.md").exists()
        for r in data["rows"]:
            assert r["tokens_per_s"] > 0 and r["tokens_per_forward"] >= 1
    batch = json.loads((tmp_path / "batch-quick.json").read_text())["rows"]
    assert {r["method"] for r in batch} == {"ar", "blockwise-overlap", "meta", "deepseek"}
    assert {r["batch_size"] for r in batch} == {1, 4, 16}
    assert all(r["latency_ms_per_token"] > 0 and r["t_q_over_t1"] > 0 for r in batch)
    from mtplab.model import kernels  # each row names its forwards' kernel: exact up to 16 rows a call
    by = {(r["method"], r["k"], r["batch_size"]): r["kernel"] for r in batch}
    assert by[("ar", 1, 16)] == kernels.kernel_for(16) and by[("meta", 4, 16)] == "stock"
    assert by[("meta", 4, 4)] == kernels.kernel_for(16)
    for what in ("batch", "tree"):  # each record says which model it measured and on which machine
        data = json.loads((tmp_path / f"{what}-quick.json").read_text())
        assert all(r["n_layer"] == 2 for r in data["rows"]) and data["machine"]["cpu"]
