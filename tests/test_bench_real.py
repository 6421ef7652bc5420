"""`bench real` and its study (`hf.study.study` over the real model's `PAIRS` rows) on a tiny chat Llama built here:
the record is written flat (every row found by its fields alone), every row keeps its race's busy verdict, and the
exact rows equal AR. (SmolLM2 itself runs in tests/test_real.py, where it is installed.)"""
import sys
from argparse import Namespace
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from mtplab.decoding.drafters import real_label  # noqa: E402
from mtplab.measuring.record import FIELDS, Record  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}")


@pytest.fixture(scope="module")
def chat_llama(tmp_path_factory):
    """A tiny Llama with a chat template and a window long enough for the held-out chat prompts."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_hf import _llama_config, _tokenizer
    from transformers import LlamaForCausalLM
    d = tmp_path_factory.mktemp("tiny-chat-llama")
    cfg = _llama_config()
    cfg.max_position_embeddings = 1024
    torch.manual_seed(1)
    LlamaForCausalLM(cfg).save_pretrained(d)
    tok = _tokenizer()
    tok.chat_template = TEMPLATE
    tok.save_pretrained(d)
    return d


@pytest.mark.slow
def test_bench_real_writes_flat_rows_that_keep_their_busy_verdict(chat_llama, tmp_path):
    from mtplab.bench.real import run_real
    rows = "; ".join([real_label("ngram", 4), real_label("hf-lookup", 4)])
    a = Namespace(hf=str(chat_llama), quick=False, prompts=1, dtype="fp32", device="cpu", out=str(tmp_path), rows=rows)
    data = run_real(a)  # not quick: the quick run keeps its four rows only
    assert [r["label"] for r in data["rows"] if r["threads"] == 1] == ["AR", real_label("hf-lookup", 4),
                                                                        real_label("ngram", 4)]
    rec = Record.load(tmp_path / "real.json")
    assert "rows" not in rec["threads"]["1"] and rec["threads"]["1"]["verdict"].startswith(("valid", "not valid"))
    assert {r["threads"] for r in rec.rows} == {1, 2}
    for r in rec.rows:
        assert all(f in r for f in FIELDS) and r["model"] == str(chat_llama)
        assert "busy" in r and r["valid"] == (r["busy"] is None)  # every race keeps its busy verdict
        assert rec.row(method=r["method"], k=r["k"], draft_vocab=r["draft_vocab"], dtype=r["dtype"],
                       threads=r["threads"]) == r
        assert {"speedup", "speedup_min", "speedup_max", "rounds"} <= set(r)
    ngram = rec.row(method="ngram", k=4, threads=1)
    assert ngram["identical_to_ar"] == ngram["prompts"] == 6  # greedy, fp32: prompt lookup decodes exactly AR's text
    assert rec.row(method="ar", threads=1)["speedup"] == 1.0


def test_bench_real_refuses_a_row_it_does_not_have(chat_llama, tmp_path):
    from mtplab.bench.real import run_real
    from mtplab.errors import MtplabError
    a = Namespace(hf=str(chat_llama), quick=True, prompts=1, dtype="fp32", device="cpu", out=str(tmp_path),
                  rows="Stern K=9, k=9")
    with pytest.raises(MtplabError, match="no bench real row named 'Stern K=9, k=9'; choose among: AR"):
        run_real(a)
