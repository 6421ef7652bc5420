"""bench peers: mtplab's loop and Hugging Face's own generate, on the same tiny models built here, give the same
tokens on every row (greedy). Timings here are not read by anyone."""
import argparse
import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from mtplab.bench.peers import peer_rows  # noqa: E402
from mtplab.hf.target import load_hf  # noqa: E402
from tests.hf.test_hf import _gpt2, _tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("peers")
    tok = _tokenizer()
    for name, m in {"target": _gpt2(0, n_layer=2), "draft": _gpt2(2, n_layer=1)}.items():
        m.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return root


def test_every_peer_row_equals_hf_greedy(models):
    target, draft = load_hf(models / "target"), load_hf(models / "draft")
    prompts = [target.encode(p) for p in ("def main(x):\n    return", "import os\nimport sys\n", "class A:\n    x = 1")]
    rows = peer_rows(target, draft, prompts, m=20, k=4, repeats=1)
    by = {r["method"]: r for r in rows}
    assert set(by) == {"HF generate, greedy", "mtplab AR", "HF prompt lookup, 3 drafts", "mtplab n-gram, HF's rule, k=4",
                       "mtplab n-gram, k=4", "HF assisted, 3 drafts", "HF assisted, its defaults",
                       "mtplab draft-model, k=4"}
    for r in rows:
        assert r["identical_to_hf_greedy"] == len(prompts), r
        assert r["tokens_per_forward"] >= 1.0 - 1e-9
    assert by["mtplab AR"]["tokens_per_forward"] == pytest.approx(1.0, rel=0.1)  # one forward a token (+ prefill)
    # the same drafts make the same number of target forwards, HF's loop or mtplab's
    assert by["mtplab n-gram, HF's rule, k=4"]["tokens_per_forward"] == pytest.approx(
        by["HF prompt lookup, 3 drafts"]["tokens_per_forward"], rel=0.15)
    assert by["mtplab draft-model, k=4"]["tokens_per_forward"] == pytest.approx(
        by["HF assisted, 3 drafts"]["tokens_per_forward"], rel=0.15)


def test_forwards_are_counted_on_the_lab_forward_of_a_llama(tmp_path):
    """For a Llama-family model the target runs the lab's own forward, never transformers': the mtplab rows still
    count one forward a verify (issue 39: a hook on transformers' forward counted none, 192 tokens a forward)."""
    from transformers import LlamaForCausalLM
    from tests.hf.test_hf import _llama_config
    torch.manual_seed(1)
    LlamaForCausalLM(_llama_config()).save_pretrained(tmp_path / "llama")
    _tokenizer().save_pretrained(tmp_path / "llama")
    target = load_hf(tmp_path / "llama")
    assert target.lab_forward is not None, target.forward_path  # the case under test: the lab's forward
    prompts = [target.encode("def main(x):\n    return x + x + x")]
    rows = peer_rows(target, None, prompts, m=12, k=4, repeats=1)
    for r in rows:
        assert 1.0 - 1e-9 <= r["tokens_per_forward"] <= 4, r
    by = {r["method"]: r for r in rows}
    assert by["mtplab AR"]["tokens_per_forward"] == pytest.approx(1.0, rel=0.1)
    assert by["mtplab n-gram, HF's rule, k=4"]["tokens_per_forward"] == pytest.approx(
        by["HF prompt lookup, 3 drafts"]["tokens_per_forward"], rel=0.15)


def test_heads_row_equals_hf_greedy(models, tmp_path):
    from mtplab.distill.live import train_heads
    from mtplab.hf.heads_file import load_heads, save_heads

    t = load_hf(models / "target")
    train_heads(t, heads="deepseek", n_modules=1, steps=3, batch_size=2, seq_len=32)
    save_heads(t, tmp_path / "d1.safetensors")
    target = load_heads(load_hf(models / "target"), tmp_path / "d1.safetensors")
    prompts = [target.encode("def main(x):\n    return")]
    rows = peer_rows(target, None, prompts, m=16, k=4, repeats=1, heads=target)
    heads_row = next(r for r in rows if "heads" in r["method"])
    assert heads_row["method"] == "mtplab deepseek heads, k=2 (no HF peer)"
    assert all(r["identical_to_hf_greedy"] == 1 for r in rows)


def test_earliest_rule_takes_the_first_occurrence():
    from mtplab.decoding.drafters import NgramDrafter

    toks = [1, 2, 7, 1, 2, 8, 5, 1, 2]
    for earliest, want in ((True, [7, 1]), (False, [8, 5])):
        d = NgramDrafter(max_ngram=2, earliest=earliest)
        d.tokens = toks
        assert d.propose(2).tokens == want


def test_bench_peers_writes_its_record(models, tmp_path):
    from mtplab import bench

    a = argparse.Namespace(what="peers", quick=True, json=True, device="cpu", dtype="fp32", out=str(tmp_path),
                           preset="tiny", hf=str(models / "target"), draft_hf=str(models / "draft"), prompts=None,
                           heads_checkpoint=None)
    bench.main(a)
    data = json.loads((tmp_path / "peers-quick.json").read_text())
    assert data["machine"]["torch"] and all(r["identical_to_hf_greedy"] == r["prompts"] for r in data["rows"])


def _record():
    rows = [{"method": "HF generate, greedy", "speedup_vs_hf_greedy": 1.0, "tokens_per_forward": 1.0},
            {"method": "mtplab AR", "speedup_vs_hf_greedy": 1.1, "tokens_per_forward": 1.0},
            {"method": "HF prompt lookup, 3 drafts", "speedup_vs_hf_greedy": 1.5, "tokens_per_forward": 2.0},
            {"method": "mtplab n-gram, HF's rule, k=4", "speedup_vs_hf_greedy": 1.2, "tokens_per_forward": 2.0}]
    for r in rows:
        r.update(identical_to_hf_greedy=8, prompts=8, speedup_min=r["speedup_vs_hf_greedy"] - 0.1,
                 speedup_max=r["speedup_vs_hf_greedy"] + 0.1, ms_per_token=2.0 / r["speedup_vs_hf_greedy"],
                 rest_share=0.2)
    return {"rows": rows, "profile": {"HF prompt lookup, 3 drafts": {"top_own_time": [
        {"function": "copy.py:deepcopy", "own_s": 0.002, "calls": 100}]}}}


def test_notebook_10_reads_the_pairs_off_the_record():
    from mtplab.teaching import peers

    rec = _record()
    assert peers.loop_ratios(rec) == pytest.approx({"mtplab AR": 1.1, "mtplab n-gram, HF's rule, k=4": 0.8})
    said = peers.peer_sentences(rec)
    assert said[0].startswith("mtplab AR is faster than HF generate, greedy: 1.10x")
    assert said[1].startswith("mtplab n-gram, HF's rule, k=4 is slower than HF prompt lookup, 3 drafts: 0.80x")
    assert "copy.py:deepcopy 2.0 ms in 100 calls" in peers.split_sentences(rec)[1]


def test_notebook_10_finds_the_pairs_of_a_live_race_at_another_k():
    """10's exercise 2 reruns the race at k=3: its pairs are 'HF prompt lookup, 2 drafts' beside 'mtplab n-gram,
    HF's rule, k=3', which the k=4 table (`PAIRS`) missed, so the lookup pair dropped out of the printout."""
    from mtplab.teaching import peers

    assert peers.pairs(3)[1] == ("HF prompt lookup, 2 drafts", "mtplab n-gram, HF's rule, k=3") and peers.PAIRS == peers.pairs(4)
    rec = _record()
    for r in rec["rows"]:
        r["method"] = r["method"].replace("3 drafts", "2 drafts").replace("k=4", "k=3")
    assert peers.pair_speedups(rec) == {"mtplab AR": (1.0, 1.1), "mtplab n-gram, HF's rule, k=3": (1.5, 1.2)}
    assert [s.split(" is ")[0] for s in peers.peer_sentences(rec)] == ["mtplab AR", "mtplab n-gram, HF's rule, k=3"]


def test_notebook_10_checker():
    from mtplab.teaching import peers

    assert peers.check_loop_ratios(peers.loop_ratios)
    assert not peers.check_loop_ratios(lambda rec: {r["method"]: r["speedup_vs_hf_greedy"] for r in rec["rows"]})
    assert not peers.check_loop_ratios(lambda rec: 1 / 0)
    wrong = peers.check_loop_ratios(lambda rec: {"mtplab AR": 1.0, "mtplab n-gram, HF's rule, k=4": 1.0})
    assert not wrong and "wrong on a case like" in wrong.why and "1.25" not in wrong.why  # never the answer
