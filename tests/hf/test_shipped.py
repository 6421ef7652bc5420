"""The shipped checkpoints: present, small, loadable, and every decoder on them is exact."""
import pytest
import torch

from mtplab.model import checkpoint as ckpt
from mtplab.data import held_out_prompts
from mtplab.decoding.loop import autoregressive
from mtplab.decoding.drafters import METHODS
from mtplab.decoding.generate import decode_with, max_k
from mtplab.tokenizer import encode

SHIPPED = ["ntp", "draft", "stern-k4", "meta-k4", "deepseek-d1", "deepseek-d3"]
EXPECTED = {"ntp": ("none", 1), "draft": ("none", 1), "stern-k4": ("stern", 4), "meta-k4": ("meta", 4),
            "deepseek-d1": ("deepseek", 2), "deepseek-d3": ("deepseek", 4)}


@pytest.mark.parametrize("name", SHIPPED)
def test_checkpoint_is_there_small_and_loads(name):
    path = ckpt.resolve(name)
    assert path.stat().st_size <= 20 * 2**20
    info = ckpt.read_info(name)
    assert (info["config"]["heads"], info["config"].get("n_depths", info["config"].get("k"))) == EXPECTED[name]
    assert info["meta"]["tokens"] > 0 and info["meta"]["val"]["val_bpb"] > 0
    m = ckpt.load(name)
    assert m.config.heads == EXPECTED[name][0]


@pytest.fixture(scope="module")
def loaded():
    models = {n: ckpt.load(n) for n in SHIPPED}
    prompts = [encode(p)[:40] for p in held_out_prompts("code", 3, 40)]
    return models, prompts


@pytest.mark.parametrize("method", ["blockwise", "blockwise-overlap", "meta", "deepseek", "deepseek-d3",
                                    "draft-model", "ngram", "oracle"])
def test_greedy_methods_on_shipped_checkpoints_equal_ar(loaded, method):
    models, prompts = loaded
    real = "deepseek" if method == "deepseek-d3" else method  # deepseek-d3: the deepseek method on another checkpoint
    model = models["deepseek-d3" if method == "deepseek-d3" else METHODS[real].checkpoint]
    top = max_k(real, model) or 5
    for p in prompts:
        ref = autoregressive(model, p, max_new_tokens=48).tokens
        for k in range(1, top + 1):
            tr = decode_with(real, model, p, max_new_tokens=48, k=k, draft_model=models["draft"], alpha=0.8)
            assert tr.tokens == ref, (method, k)


def test_heads_share_the_shipped_trunk(loaded):
    models, _ = loaded
    base = models["ntp"].state_dict()
    for name in ["stern-k4", "meta-k4", "deepseek-d1", "deepseek-d3"]:
        sd = models[name].state_dict()
        assert all(torch.equal(base[n], sd[n]) for n in base), name


DOMAIN = {"domain-code-d1": "code", "domain-prose-d1": "prose"}


@pytest.mark.parametrize("name", list(DOMAIN))
def test_domain_pair_is_one_recipe_and_exact(name):
    """The code/prose pair: same shape and training settings but the corpus, and greedy decoding is exact."""
    info = ckpt.read_info(name)
    base = ckpt.read_info(info["base"]["file"].removesuffix(".safetensors"))
    other = ckpt.read_info(f"domain-{'prose' if DOMAIN[name] == 'code' else 'code'}")
    assert base["meta"]["corpus"] == info["meta"]["corpus"] == DOMAIN[name]
    same = ("preset", "steps", "batch_size", "lr", "seed", "autocast")
    assert {k: base["meta"][k] for k in same} == {k: other["meta"][k] for k in same}
    assert base["config"] == other["config"]
    m = ckpt.load(name)
    for p in held_out_prompts(DOMAIN[name], 2, 40):
        ids = encode(p)[:40]
        ref = autoregressive(m, ids, max_new_tokens=32).tokens
        for method, k in (("deepseek", 2), ("deepseek-reuse", 4)):
            assert decode_with(method, m, ids, max_new_tokens=32, k=k).tokens == ref


def test_the_labs_own_hugging_face_models():
    """data/hf: the Llama and its draft, trained here in at most 30 minutes, small enough to ship, with records;
    every method on them reproduces transformers' own greedy generate."""
    pytest.importorskip("transformers")
    from mtplab import paths, tokenizer
    from tests.hf.reference import reference_generate
    from mtplab.teaching import peers

    real = paths.HF_DIR / "smollm2"  # the real model's heads: their own budget (tests/hf/test_real.py)
    total = sum(p.stat().st_size for p in paths.HF_DIR.rglob("*") if p.is_file() and real not in p.parents)
    assert total <= 20 * 2**20, f"data/hf holds {total / 2**20:.1f} MiB besides smollm2/"
    own = peers.load_own()
    target, draft = own["target"], own["draft"]
    for folder in (peers.TARGET, peers.DRAFT):
        card = peers.card(paths.HF_DIR / folder)
        assert card["architecture"] == "LlamaForCausalLM" and card["corpus"] == "code"
        assert 0 < card["train minutes"] <= 30 and card["tokens"] > 0
    assert draft.config.n_layer < target.config.n_layer
    text = "def f(x):\n\treturn x  # é\n"
    assert target.encode(text) == draft.encode(text) == tokenizer.encode(text)
    for p in held_out_prompts("code", 2, 80):
        ids = target.encode(p)
        ref = reference_generate(target, ids, max_new_tokens=32)
        for method, kw in (("ar", {}), ("ngram", {"k": 4}), ("draft-model", {"k": 4, "draft_model": draft}),
                           ("deepseek", {"k": 2})):
            assert decode_with(method, target, ids, max_new_tokens=32, **kw).tokens == ref, method
