"""bench peers: mtplab's loop and Hugging Face's own generate, on the same tiny models built here, give the same
tokens on every row (greedy). Timings here are not read by anyone."""
import argparse
import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from mtplab.bench.peers import peer_rows  # noqa: E402
from mtplab.hf.target import load_hf  # noqa: E402
from tests.test_hf import _gpt2, _tokenizer  # noqa: E402


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
    assert {r["method"] for r in rows} >= {"HF generate, greedy", "mtplab AR", "mtplab n-gram, k=4",
                                           "HF prompt lookup, 3 drafts", "HF assisted, draft model",
                                           "mtplab draft-model, k=4"}
    for r in rows:
        assert r["identical_to_hf_greedy"] == len(prompts), r
        assert r["tokens_per_forward"] >= 1.0 - 1e-9
    ar = next(r for r in rows if r["method"] == "mtplab AR")
    assert ar["tokens_per_forward"] == pytest.approx(20 * 3 / (20 * 3), rel=0.1)  # one forward a token (+ prefill)


def test_bench_peers_writes_its_record(models, tmp_path):
    from mtplab import bench

    a = argparse.Namespace(what="peers", quick=True, json=True, device="cpu", dtype="fp32", out=str(tmp_path),
                           preset="tiny", hf=str(models / "target"), draft_hf=str(models / "draft"))
    bench.main(a)
    data = json.loads((tmp_path / "peers-quick.json").read_text())
    assert data["machine"]["torch"] and all(r["identical_to_hf_greedy"] == r["prompts"] for r in data["rows"])
