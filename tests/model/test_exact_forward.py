"""The lab's own Llama forward (mtplab.model.llama) through the exact kernel: a verify's rows are the one-token forward's
rows bit for bit, so greedy speculative output equals greedy AR by construction; transformers stays the reference
(logits within a tolerance, greedy `generate` counted).

A tiny Llama built here (GQA: 6 query and 2 key/value heads, as SmolLM2 shares 3 query heads per key/value head) runs
in the fast lane; SmolLM2 itself where its package is installed (slow, left to make test)."""

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from mtplab.decoding.generate import decode_with  # noqa: E402
from mtplab.errors import MtplabError  # noqa: E402
from mtplab.hf.target import load_hf  # noqa: E402
from mtplab.model import kernels  # noqa: E402

from tests.hf.reference import reference_generate  # noqa: E402
from tests.hf.test_hf import V, _gpt2, _tokenizer  # noqa: E402
from tests.hf.test_real import needs_smollm2, smollm2  # noqa: E402,F401 (a fixture)

exact_only = pytest.mark.skipif(not kernels.EXACT, reason=f"no exact kernel here: {kernels.status()}")
METHODS = ("ngram", "blockwise-overlap", "deepseek", "deepseek-reuse", "meta", "oracle")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM
    d = tmp_path_factory.mktemp("llama-gqa")
    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=V, hidden_size=96, intermediate_size=136, num_hidden_layers=2, num_attention_heads=6,
                      num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2, bos_token_id=0,
                      eos_token_id=0, tie_word_embeddings=True)
    LlamaForCausalLM(cfg).save_pretrained(d)
    _tokenizer().save_pretrained(d)
    return d


@pytest.fixture
def threads(request):
    old = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(old)


def _one_by_one(t, cache, new):
    """The one-token forward at each position of `new` (1, q), cache cropped back afterwards."""
    start = cache.length
    outs = [t(new[:, i:i + 1], cache) for i in range(new.shape[1])]
    cache.crop(start)
    return outs


@exact_only
@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_verify_rows_are_the_one_token_rows_bit_for_bit(tiny, threads):
    t = load_hf(tiny)
    assert t.lab_forward is not None, t.forward_path
    g = torch.Generator().manual_seed(threads)
    with torch.inference_mode():
        cache = t.new_cache()
        t(torch.randint(V, (1, 37), generator=g), cache)  # the prompt: a prefill, shared by AR and every method
        for q in (2, 3, 4, 5, 6, 7, 8, 16):
            start = cache.length
            new = torch.randint(V, (1, q), generator=g)
            ver = t(new, cache)  # one verify over q rows
            cache.crop(start)
            ones = _one_by_one(t, cache, new)
            for name in ("logits", "hidden", "pre_last"):
                one = torch.cat([getattr(o, name) for o in ones], dim=1)  # (1, q, ...)
                assert torch.equal(getattr(ver, name), one), (q, name, (getattr(ver, name) - one).abs().max())
            t(new[:, :1], cache)  # the cache moves on by one committed token, as decoding does
    assert cache.length == 37 + 8


def test_the_lab_forward_is_transformers_forward_within_a_tolerance(tiny):
    lab, ref = load_hf(tiny), load_hf(tiny, kernel="stock")
    assert lab.lab_forward is not None and ref.lab_forward is None
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(V, (1, 60), generator=g)
    with torch.inference_mode():
        full = ref(seq)
        cache = lab.new_cache()
        outs = [lab(seq[:, :40], cache)] + [lab(seq[:, i:i + 5], cache) for i in range(40, 60, 5)]
    for name in ("logits", "hidden", "pre_last"):
        mine = torch.cat([getattr(o, name) for o in outs], dim=1)
        torch.testing.assert_close(mine, getattr(full, name), atol=1e-4, rtol=1e-4)
    # hidden is the last layer's output before the final norm: unembed(hidden) gives the model's logits
    torch.testing.assert_close(lab.unembed(full.hidden), full.logits, atol=1e-4, rtol=1e-4)


def test_greedy_speculative_decoding_equals_ar_and_generate_is_counted(tiny):
    t = load_hf(tiny)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(V, (12,), generator=g).tolist() for _ in range(3)] + [t.encode("def main(x):\n    return")]
    same_as_generate, accepted = 0, 0
    for ids in prompts:
        ar = decode_with("ar", t, ids, max_new_tokens=32).tokens
        same_as_generate += ar == reference_generate(t, ids, max_new_tokens=32)
        for name in METHODS:  # untrained heads: exactness holds whatever they draft
            fam = {"blockwise-overlap": ("stern", 4), "deepseek": ("deepseek", 3), "deepseek-reuse": ("deepseek", 2),
                   "meta": ("meta", 3)}.get(name)
            if fam:
                t.attach(*fam)
            tr = decode_with(name, t, ids, max_new_tokens=32)
            assert tr.tokens == ar, name
            accepted += tr.num_accepted_tokens
    assert accepted > 0  # drafts were accepted, and rejected ones cropped from the lab's cache
    # transformers' kernels differ from the lab's: equality with its generate is observed, and counted here
    print(f"lab AR = transformers' generate on {same_as_generate} of {len(prompts)} prompts")
    assert same_as_generate == len(prompts)  # a tiny model with clear argmaxes: no near-ties to flip


def test_heads_and_the_draft_vocabulary_go_through_the_kernel(tiny, monkeypatch):
    t = load_hf(tiny).attach("deepseek", 2)
    calls = []
    real = kernels.linear
    monkeypatch.setattr(kernels, "linear", lambda x, w, b=None: calls.append(tuple(w.shape)) or real(x, w, b))
    h = torch.randn(1, 3, 96)
    with torch.inference_mode():
        full = t.unembed(h)
        t.mtp.layers[0](t, h, t.wte(torch.tensor([[1, 2, 3]])))
        ids = torch.tensor([5, 9, 17, 200, 300])
        small = t.lab_forward.unembed(h, t.lm_head.weight[ids])  # what a draft vocabulary's projection computes
    assert (V, 96) in calls and (96, 192) in calls and (5, 96) in calls  # output head, module's M_k, draft rows
    assert torch.equal(small, full[..., ids])  # each output is one sum in one order, whatever the other outputs


def test_other_architectures_and_the_stock_kernel_name_their_forward(tiny, tmp_path):
    _gpt2(0).save_pretrained(tmp_path / "gpt2")
    _tokenizer().save_pretrained(tmp_path / "gpt2")
    gpt2 = load_hf(tmp_path / "gpt2")
    assert gpt2.lab_forward is None and "'gpt2' is not Llama-family" in gpt2.forward_path
    assert "observed, not guaranteed" in gpt2.forward_path
    stock = load_hf(tiny, kernel="stock")
    assert stock.lab_forward is None and "kernel='stock'" in stock.forward_path
    assert "lab's Llama forward" in load_hf(tiny).forward_path
    with pytest.raises(MtplabError, match="unknown kernel 'fast'; choose one of exact, stock"):
        load_hf(tiny, kernel="fast")
    t = load_hf(tiny)
    for kernel in ("stock", "exact"):  # a cache belongs to the forward that made it
        cache = t.new_cache()
        t.use_kernel(kernel)
        with pytest.raises(MtplabError, match="made for the other forward"):
            t(torch.tensor([[1, 2]]), cache)


@needs_smollm2
@exact_only
@pytest.mark.usefixtures("smollm2")  # converted once from its package
def test_smollm2_verify_rows_are_bit_for_bit_and_its_logits_are_transformers():
    from mtplab.hf.real import chat_ids
    t = load_hf("smollm2")
    ids = chat_ids(t, "Write a short poem about the sea.")
    g = torch.Generator().manual_seed(0)
    saved = torch.get_num_threads()
    try:
        with torch.inference_mode():
            for threads in (1, 2):
                torch.set_num_threads(threads)
                cache = t.new_cache()
                t(torch.tensor([ids]), cache)
                for q in range(2, 9):
                    new = torch.randint(t.config.vocab_size, (1, q), generator=g)
                    ver = t(new, cache)
                    cache.crop(len(ids))
                    one = torch.cat([o.logits for o in _one_by_one(t, cache, new)], dim=1)
                    assert torch.equal(ver.logits, one), (threads, q)
                    if threads == 1:  # transformers' forward, the reference: close, not equal (its kernels differ)
                        ref = t.hf(input_ids=torch.tensor([ids + new[0].tolist()])).logits[:, len(ids):]
                        torch.testing.assert_close(ver.logits, ref, atol=2e-3, rtol=1e-3)
    finally:
        torch.set_num_threads(saved)
    same = 0
    prompts = [ids] + [chat_ids(t, p) for p in ("Translate to French: the cat sleeps.", "What is 12 times 7?")]
    for ids in prompts:
        ar = decode_with("ar", t, ids, max_new_tokens=24).tokens
        assert decode_with("ngram", t, ids, max_new_tokens=24).tokens == ar  # by construction
        ref = reference_generate(t, ids, max_new_tokens=24)  # transformers 5 stops it at the config's end of text
        same += ar[:len(ref)] == ref
    print(f"lab AR = transformers' generate on {same} of {len(prompts)} prompts")  # observed: its kernels differ


def test_generate_runs_the_exact_forward_by_default_and_the_old_path_with_kernel_stock(tiny, capsys):
    import json

    from mtplab.cli import main as cli_main
    runs = {}
    for flags in ([], ["--kernel", "stock"]):
        rc = cli_main(["generate", "--hf", str(tiny), "--method", "ngram", "--prompt", "def main(x):\n    return",
                       "--max-new-tokens", "12", "--json", *flags])
        out = capsys.readouterr()
        assert rc == 0, out.err
        runs[flags[-1] if flags else "exact"] = json.loads(out.out)
    assert "lab's Llama forward" in runs["exact"]["forward"] and runs["exact"]["kernel"] == "exact"
    assert "transformers' forward" in runs["stock"]["forward"]
    assert runs["exact"]["tokens"] == runs["stock"]["tokens"]  # a tiny model with clear argmaxes
    assert kernels.active() == kernels.EXACT  # the stock switch was put back
