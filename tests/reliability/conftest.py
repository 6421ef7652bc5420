"""The reliability tables' fixtures: small checkpoints, tiny Hugging Face folders (and the probes' crafted ones),
heads files with bad metadata."""
import json

import pytest
import torch
from safetensors.torch import save_file

from mtplab.model import checkpoint as ckpt
from tests.conftest import random_model
from tests.reliability.helpers import ROOT


@pytest.fixture(scope="module")
def heads_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("heads")
    for fam in ("stern", "meta", "deepseek"):
        ckpt.save(random_model(fam, 3, seed=1), d / fam)
    ckpt.save(random_model(), d / "ntp")
    return d


@pytest.fixture(scope="module")
def hfdirs(tmp_path_factory):
    """A tiny GPT-2 with its tokenizer (tests/hf/test_hf.py builds it), and the probe's crafted folders."""
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from tests.hf.test_hf import _gpt2, _tokenizer
    root = tmp_path_factory.mktemp("hfrel")
    tok = _tokenizer()
    m = _gpt2(0)
    m.save_pretrained(root / "gpt2")
    tok.save_pretrained(root / "gpt2")
    (root / "corpus.txt").write_text((ROOT / "data" / "corpora" / "code_train.txt").read_text(encoding="utf-8")[8000:12000])
    for name, edit in (("size-mismatch", {"n_embd": 128}), ("npos-4", {"n_positions": 4})):
        d = root / name
        m.save_pretrained(d)
        tok.save_pretrained(d)
        cfg = json.loads((d / "config.json").read_text())
        cfg.update(edit)
        (d / "config.json").write_text(json.dumps(cfg))
    m.save_pretrained(root / "no-tokenizer")
    d = root / "remote-code"  # an unknown model_type whose auto_map names the folder's own module
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "evilmodel", "auto_map": {
        "AutoConfig": "evil_config.EvilConfig", "AutoModelForCausalLM": "evil_config.EvilModel"}}))
    (d / "evil_config.py").write_text(f"open({str(root / 'PWNED')!r}, 'w').write('ran')\n")
    d = root / "pickle-weights"
    d.mkdir()
    (d / "config.json").write_text((root / "gpt2" / "config.json").read_text())
    tok.save_pretrained(d)
    torch.save({"transformer.wte.weight": torch.zeros(2), "x": _Evil()}, d / "pytorch_model.bin")
    d = root / "config-is-dir"
    (d / "config.json").mkdir(parents=True)
    return root


class _Evil:
    """A global that torch's weights_only unpickler refuses."""


@pytest.fixture(scope="module")
def hfheads(hfdirs, tmp_path_factory):
    """A valid stern heads file on gpt2, and copies whose metadata is each of the probe's bad variants."""
    from mtplab.hf.heads_file import save_heads
    from mtplab.hf.target import load_hf
    root = tmp_path_factory.mktemp("hfheads")
    t = load_hf(hfdirs / "gpt2").attach("stern", 3)
    good = save_heads(t, root / "good")
    from safetensors import safe_open
    with safe_open(str(good), "pt") as f:
        info, tensors = json.loads(f.metadata()["mtplab"]), {k: f.get_tensor(k) for k in f.keys()}
    variants = {"bad-json": "{bad", "info-list": "[1, 2]",
                "no-base": json.dumps({k: v for k, v in info.items() if k != "base"}),
                "base-str": json.dumps({**info, "base": "gpt2"}), "depths-str": json.dumps({**info, "n_depths": "3"}),
                "depths-huge": json.dumps({**info, "n_depths": 10 ** 7}), "depths-5": json.dumps({**info, "n_depths": 5})}
    for name, meta in variants.items():
        save_file(tensors, str(root / f"{name}.safetensors"), metadata={"mtplab": meta})
    for name, bad in (("int-tensors", lambda t: t.to(torch.int32)), ("nan-tensors", lambda t: t * float("nan"))):
        save_file({k: bad(t) for k, t in tensors.items()}, str(root / f"{name}.safetensors"),
                  metadata={"mtplab": json.dumps(info)})
    return root


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.hf.test_hf import _llama_config, _tokenizer
    from transformers import LlamaForCausalLM
    d = tmp_path_factory.mktemp("llama")
    LlamaForCausalLM(_llama_config()).save_pretrained(d)
    _tokenizer().save_pretrained(d)
    return d
