import random

import pytest
import torch

from mtplab.model.gpt import GPT
from mtplab.model.config import ModelConfig, preset
from mtplab.errors import MtplabError
from mtplab.device import pick
from mtplab.tokenizer import decode, encode, token_repr
from tests.conftest import random_model


@pytest.mark.parametrize("heads,k", [("none", 1), ("stern", 3), ("meta", 3), ("deepseek", 3)])
def test_cache_matches_full_recompute(heads, k):
    m = random_model(heads, k, seed=4)
    idx = torch.randint(0, 256, (2, 60))
    with torch.no_grad():
        full = m(idx)
        c = m.new_cache(2)
        steps = [m(idx[:, i:i + 1], c).logits for i in range(60)]
        assert (torch.cat(steps, 1) - full.logits).abs().max() < 1e-5
        rng = random.Random(0)
        c = m.new_cache(2)
        outs, i = [], 0
        while i < 60:
            q = rng.randint(1, 9)
            outs.append(m(idx[:, i:i + q], c).logits)
            i += q
        assert (torch.cat(outs, 1) - full.logits).abs().max() < 1e-5
        assert len(c) == 60


def test_cache_crop_rolls_back():
    m = random_model()
    idx = torch.randint(0, 256, (1, 30))
    with torch.no_grad():
        full = m(idx).logits
        c = m.new_cache()
        m(idx[:, :20], c)
        m(torch.randint(0, 256, (1, 7)), c)  # rejected drafts
        c.crop(20)
        assert len(c) == 20
        tail = m(idx[:, 20:], c).logits
    assert (tail - full[:, 20:]).abs().max() < 1e-5
    with pytest.raises(ValueError):
        c.crop(31)


def test_forward_returns_hidden_and_logits():
    m = random_model()
    out = m(torch.randint(0, 256, (3, 10)))
    assert out.hidden.shape == (3, 10, 32) and out.logits.shape == (3, 10, 256)


def test_depth_logits_shape(family_models):
    for m in family_models.values():
        x = torch.randint(0, 256, (2, 12))
        assert m.depth_logits(x).shape == (2, 12, m.config.n_depths, 256)


def test_tokenizer_roundtrip_and_partial_bytes():
    s = "déf f(x): return 'π' ✓"
    assert decode(encode(s)) == s
    ids = encode("π")
    assert len(ids) == 2
    assert decode(ids[:1]) == "\ufffd"  # half a character decodes, never raises
    assert token_repr(10) == "\\n" and token_repr(ord("a")) == "a"
    with pytest.raises(TypeError):
        encode(b"bytes")


def test_presets_and_config_errors():
    assert set(["tiny", "classroom", "wide"]) <= set(__import__("mtplab").PRESETS)
    with pytest.raises(MtplabError, match="unknown preset"):
        preset("huge")
    with pytest.raises(MtplabError, match="n_depths must be"):
        ModelConfig(heads="meta", n_depths=0)
    with pytest.raises(MtplabError, match="unknown head family"):
        ModelConfig(heads="medusa", n_depths=2)
    old = ModelConfig.from_dict({"heads": "stern", "k": 3})  # configs written before the rename still load
    assert old.n_depths == 3
    assert GPT(preset("tiny")).num_params() > 0


def test_context_window_error():
    m = random_model()
    with pytest.raises(MtplabError, match="context window"):
        m(torch.zeros(1, 97, dtype=torch.long))


def test_device_pick():
    assert pick("cpu").type == "cpu"
    assert pick("auto").type in ("cpu", "cuda", "mps")
    if not torch.cuda.is_available():
        with pytest.raises(MtplabError, match="CUDA is not available"):
            pick("cuda")
    with pytest.raises(MtplabError, match="unknown device"):
        pick("tpu")


def test_stacked_meta_heads_equal_the_heads_one_by_one():
    """The drafter's stacked head layers compute what the K-1 blocks compute one after another, cache included."""
    m = random_model("meta", 4, seed=9)
    z = torch.randn(1, 7, m.config.n_embd)
    with torch.no_grad():
        one_by_one = m.mtp.new_cache(m)
        want = torch.cat([m.mtp.hidden(m, z[:, :5], one_by_one), m.mtp.hidden(m, z[:, 5:], one_by_one)], dim=1)
        stacked, cache = m.mtp.stacked(), m.mtp.new_cache(m)
        got = torch.cat([stacked(z[:, :5], m.rope(0, 5), cache), stacked(z[:, 5:], m.rope(5, 2), cache)], dim=1)
    assert torch.allclose(got.permute(1, 0, 2), want[0], atol=1e-5)  # (T, K-1, C)
    assert cache.length == one_by_one.length == 7
    assert torch.allclose(cache.k[:, :, :, :7], one_by_one.k[:, :, :, :7], atol=1e-5)


def test_data_folder_can_be_pointed_at(tmp_path):
    """After a non-editable install data/ is not beside the package: MTPLAB_DATA says where it is."""
    import subprocess
    import sys
    code = ("from mtplab.data import corpus_path\n"
            "try:\n    corpus_path('code', 'val')\nexcept Exception as e:\n    print(type(e).__name__, e)")
    env = {"MTPLAB_DATA": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env).stdout
    assert "MtplabError" in out and "MTPLAB_DATA" in out
