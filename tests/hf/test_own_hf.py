"""Your own Hugging Face model (`scripts/train_hf_model.py`): the byte tokenizer's ids are the lab's byte ids, a trained
folder loads in `--hf` and transformers alike and decodes as HF's own generate does, a killed run resumes to the
uninterrupted run's weights, a failed write keeps the old folder, and bad options are refused in one line."""
import json
import math

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from mtplab import tokenizer  # noqa: E402
from mtplab.errors import MtplabError  # noqa: E402
from scripts import train_hf_model as own  # noqa: E402
from mtplab.hf.target import load_hf  # noqa: E402
from tests.hf.reference import reference_generate  # noqa: E402

TEXT = "def f(x):\n\treturn x  # é ✓ 漢字\r\n"
SMALL = dict(preset="hf-draft", corpus="code", batch_size=2, seq_len=32, log=None, device="cpu")


def test_byte_tokenizer_ids_are_the_labs_byte_ids():
    tok = own.byte_tokenizer()
    assert tok.encode(TEXT, add_special_tokens=False) == tokenizer.encode(TEXT)
    assert tok.decode(tokenizer.encode(TEXT)) == TEXT
    assert len(tok) == own.VOCAB and tok.eos_token_id == own.EOS == 256
    assert tok.encode("".join(chr(b) for b in range(128)), add_special_tokens=False) == list(range(128))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("own")
    rec = own.train_own(out=str(out), name="m", steps=12, eval_every=6, save_every=6, **SMALL)
    return out, rec


def test_trained_folder_loads_and_decodes_as_hf_generate(trained):
    out, rec = trained
    assert rec["steps"] == 12 and rec["tokens"] == 12 * 2 * 32 and rec["machine"]["torch"] == torch.__version__
    assert math.isfinite(rec["val_bpb"]) and rec["history"][-1]["val_bpb"] < rec["history"][0]["val_bpb"] + 1e-9
    assert rec["history"][0]["val_bpb"] < 8.0  # learned something: a uniform guess over 257 ids is 8.0 bits
    saved = json.loads((out / "m" / own.RECORD).read_text())
    assert saved["steps"] == 12 and saved["architecture"] == "LlamaForCausalLM"
    t = load_hf(out / "m")
    assert t.encode(TEXT) == tokenizer.encode(TEXT)
    from mtplab.decoding.generate import decode_with

    ids = tokenizer.encode("import os\n")
    assert decode_with("ar", t, ids, max_new_tokens=12).tokens == reference_generate(t, ids, max_new_tokens=12)


def test_killed_run_resumes_to_the_uninterrupted_weights(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    own.train_own(out=str(a), name="m", steps=6, save_every=2, save_dtype="fp32", **SMALL)
    own.train_own(out=str(b), name="m", steps=6, save_every=2, save_dtype="fp32", stop_after=3, **SMALL)
    assert json.loads((b / "m" / own.RECORD).read_text())["steps"] == 3
    own.train_own(out=str(b), name="m", steps=6, save_every=2, save_dtype="fp32", resume=True, **SMALL)
    wa, wb = load_hf(a / "m").hf.state_dict(), load_hf(b / "m").hf.state_dict()
    assert all(torch.equal(wa[n], wb[n]) for n in wa)


def test_a_failed_write_keeps_the_old_folder(tmp_path, monkeypatch):
    own.train_own(out=str(tmp_path), name="m", steps=2, save_every=2, **SMALL)
    before = (tmp_path / "m" / "model.safetensors").read_bytes()

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(own.LlamaForCausalLM, "save_pretrained", full)
    with pytest.raises(MtplabError, match="could not write .* last complete save is still there"):
        own.train_own(out=str(tmp_path), name="m", steps=4, save_every=2, resume=True, **SMALL)
    assert (tmp_path / "m" / "model.safetensors").read_bytes() == before
    load_hf(tmp_path / "m")


@pytest.mark.parametrize("kw, msg", [
    (dict(preset="huge"), "unknown preset 'huge'; choose one of hf-target, hf-draft"),
    (dict(corpus="poems"), "--corpus must be one of"),
    (dict(steps=0), r"steps must be a positive integer \(got 0\)"),  # the lab trainer's own check (config.check_loop)
    (dict(save_every=0), r"--save-every must be an integer >= 1 \(got 0\)"),
    (dict(seq_len=4096), "--seq-len"),
    (dict(resume=True, overwrite=True), "give one of them"),
    (dict(save_dtype="fp8"), "--save-dtype must be fp32 or bf16"),
])
def test_bad_options(tmp_path, kw, msg):
    args = {**SMALL, "steps": 2, **kw}
    with pytest.raises(MtplabError, match=msg):
        own.train_own(out=str(tmp_path), **args)


def test_an_existing_folder_needs_resume_or_overwrite(tmp_path):
    own.train_own(out=str(tmp_path), name="m", steps=1, **SMALL)
    with pytest.raises(MtplabError, match="already exists; continue it with --resume or replace it with --overwrite"):
        own.train_own(out=str(tmp_path), name="m", steps=1, **SMALL)
    own.train_own(out=str(tmp_path), name="m", steps=1, overwrite=True, **SMALL)
