"""One mechanism for every file the lab reads but did not write in this process (checkpoint configs, run
manifests, model configs, benchmark records): a regular file, opened without blocking, read up to a bound. A link to
/dev/zero, a FIFO with no writer, a file over the bound and JSON nested too deeply are each one line, at once."""
import json
import os
import sys
import time

import pytest

from mtplab.errors import MtplabError
from mtplab.measuring.speedup import read_decode_bench
from mtplab.model.checkpoint import read_json
from mtplab.training import runs


def _plant(path, kind):
    if kind == "devzero":
        os.symlink("/dev/zero", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "huge":
        path.write_text(json.dumps({"x": "a" * (20 << 20)}))
    elif kind == "nested":
        path.write_text("[" * 100000 + "]" * 100000)


READERS = {
    "read_json": lambda p: read_json(p, limit=1 << 20, what="a test file", fix="restore it"),
    "decode bench": lambda p: read_decode_bench(p),
    "run manifest": lambda p: runs.read_manifest(p.parent, p.name.removesuffix(".state.json")),
}


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs and /dev/zero")
@pytest.mark.parametrize("kind", ["devzero", "fifo", "huge", "nested"])
@pytest.mark.parametrize("reader", list(READERS))
def test_special_and_oversized_files_are_one_line(tmp_path, reader, kind):
    name = "run.state.json" if reader == "run manifest" else "x.json"
    path = tmp_path / name
    if reader == "run manifest" and not runs.paths(tmp_path, "run")["manifest"].name == name:
        pytest.skip("the manifest has another name")
    _plant(path, kind)
    t0 = time.monotonic()
    with pytest.raises(MtplabError) as e:
        READERS[reader](path)
    assert time.monotonic() - t0 < 10 and "\n" not in str(e.value)
    if kind in ("devzero", "fifo"):
        assert "not a regular file" in str(e.value)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    pytest.importorskip("transformers")
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from test_hf import _llama_config, _tokenizer
    from transformers import LlamaForCausalLM
    d = tmp_path_factory.mktemp("llama")
    LlamaForCausalLM(_llama_config()).save_pretrained(d)
    _tokenizer().save_pretrained(d)
    return d


@pytest.mark.parametrize("key,value", [("num_hidden_layers", 100000), ("num_hidden_layers", 2000),
                                       ("num_hidden_layers", 0), ("num_hidden_layers", -1),
                                       ("num_attention_heads", 0), ("vocab_size", -1), ("hidden_act", "bogus"),
                                       ("hidden_size", 63)])
def test_crafted_model_configs_are_one_line_before_any_allocation(tiny_llama, tmp_path, key, value):
    import shutil
    from mtplab.hf.target import load_hf
    d = tmp_path / "m"
    shutil.copytree(tiny_llama, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg[key] = value
    (d / "config.json").write_text(json.dumps(cfg))
    t0 = time.monotonic()
    with pytest.raises(MtplabError) as e:
        load_hf(d)
    assert time.monotonic() - t0 < 20 and "\n" not in str(e.value)


def test_a_huge_corpus_is_one_line_before_tokenizing(tmp_path):
    from mtplab.hf import run
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.truncate(run.MAX_CORPUS + 1)  # sparse: nothing is written
    with pytest.raises(MtplabError, match="give at most 64 MiB of text"):
        run.corpus_ids(None, str(big))


@pytest.mark.parametrize("bench,prompts", [("peers", 10**8), ("peers", 0), ("domain", -1), ("domain", 10**8)])
def test_bench_prompt_counts_are_bounded(bench, prompts):
    import argparse
    from mtplab.bench import domain, peers
    a = argparse.Namespace(prompts=prompts, quick=False, device="cpu", dtype="fp32", hf="x", out="build/x")
    with pytest.raises(MtplabError, match=r"--prompts must be in 1\.\.20"):
        (peers.run_peers if bench == "peers" else domain.run_domain)(a)


def test_train_hf_model_checks_memory_first(tmp_path):
    pytest.importorskip("transformers")
    from mtplab.hf.own import train_own
    with pytest.raises(MtplabError, match="lower --batch-size|--seq-len"):
        train_own(preset="hf-draft", steps=2, batch_size=100000, seq_len=256, out=str(tmp_path / "o"))
    assert not (tmp_path / "o").exists()  # refused before the folder or the lock were made
