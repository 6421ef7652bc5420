"""`bench real` and its study (`hf.study.study` over the real model's `PAIRS` rows) on a tiny chat Llama built here:
the record is written flat (every row found by its fields alone), every row keeps its race's busy verdict, and the
exact rows equal AR. (SmolLM2 itself runs in tests/hf/test_real.py, where it is installed.)"""
from argparse import Namespace

import pytest
import torch

pytest.importorskip("transformers")

from mtplab.decoding.drafters import real_label  # noqa: E402
from mtplab.measuring.record import FIELDS, Record  # noqa: E402

TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}")


@pytest.fixture(scope="module")
def chat_llama(tmp_path_factory):
    """A tiny Llama with a chat template and a window long enough for the held-out chat prompts."""
    from tests.hf.test_hf import _llama_config, _tokenizer
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
def test_bench_real_writes_flat_rows_that_keep_their_busy_verdict(chat_llama, tmp_path, monkeypatch):
    from mtplab.bench import real
    from mtplab.bench.real import run_real
    monkeypatch.setattr(real, "ROUNDS", {1: 3, 2: 1})  # two threads fight the busy test machine: one round there
    rows = "; ".join([real_label("ngram", 4), real_label("hf-lookup", 4), real_label("ar", None, kernel="stock")])
    a = Namespace(hf=str(chat_llama), quick=False, prompts=1, dtype="fp32", device="cpu", out=str(tmp_path), rows=rows)
    data = run_real(a)  # not quick: the quick run keeps its four rows only
    want = ["AR", real_label("hf-lookup", 4), real_label("ngram", 4), real_label("ar", None, kernel="stock")]
    for n in (1, 2):  # every row on 1 and 2 threads
        assert [r["label"] for r in data["rows"] if r["threads"] == n] == want
    rec = Record.load(tmp_path / "real.json")
    assert "rows" not in rec["threads"]["1"] and rec["threads"]["1"]["verdict"].startswith(("valid", "not valid"))
    assert {r["threads"] for r in rec.rows} == {1, 2}
    assert rec.row(method="ar", kernel="stock", threads=1)["label"] == want[-1]  # stock against exact, by field
    assert rec["kernel_status"] and "estimated_s" in rec.data
    for r in rec.rows:
        assert all(f in r for f in FIELDS) and r["model"] == str(chat_llama)
        assert r["kernel"] in ("exact", "stock") and r["heads_sha256"] is None  # no heads: none to name
        assert "busy" in r and r["valid"] == (r["busy"] is None)  # every race keeps its busy verdict
        assert rec.row(method=r["method"], k=r["k"], draft_vocab=r["draft_vocab"], dtype=r["dtype"],
                       kernel=r["kernel"], widths=r["widths"], threads=r["threads"]) == r
        assert {"speedup", "speedup_min", "speedup_max", "rounds"} <= set(r)
    ngram = rec.row(method="ngram", k=4, threads=1)
    assert ngram["identical_to_ar"] == ngram["prompts"] == 6  # greedy, fp32: prompt lookup decodes exactly AR's text
    assert rec.row(method="ar", threads=1)["speedup"] == 1.0


def test_bench_real_refuses_a_row_it_does_not_have(chat_llama, tmp_path):
    from mtplab.bench.real import run_real
    from mtplab.errors import MtplabError
    a = Namespace(hf=str(chat_llama), quick=True, prompts=1, dtype="fp32", device="cpu", out=str(tmp_path),
                  rows="Stern K=9, k=9")
    with pytest.raises(MtplabError, match="no bench real row named 'Stern K=9, k=9'; choose grids .* or rows among: AR"):
        run_real(a)


class _Heads:  # what `bench.real.pick_rows` reads of `hf.study.Heads`: the families loaded and the draft vocabulary
    def __init__(self, families=("deepseek", "stern"), vocab=(1, 2, 3)):
        self.families, self.vocab = dict.fromkeys(families), vocab


def test_the_grids_name_catalogue_rows_and_the_default_covers_every_comparison():
    from mtplab.bench.real import GRIDS, pick_rows
    from mtplab.hf.study import rows_of_real
    labels = {r.label for r in rows_of_real()}
    assert all(lab in labels for g in GRIDS.values() for lab in g)
    rows = pick_rows(_Heads(), None, quick=False)
    assert rows == pick_rows(_Heads(), "default", quick=False) and rows[0].label == "AR"
    kinds = {(r.method, r.kernel, r.draft_vocab, bool(r.widths)) for r in rows}
    assert {("hf-generate", "exact", "full", False), ("hf-lookup", "exact", "full", False),
            ("ngram", "exact", "full", False)} <= kinds  # the baselines that need no training
    assert ("deepseek", "stock", "reduced", False) in kinds and ("deepseek", "exact", "reduced", False) in kinds
    assert ("deepseek", "exact", "full", False) in kinds  # full against reduced vocabulary
    assert ("blockwise-overlap", "exact", "reduced", True) in kinds  # a tree beside its chain
    assert all(r.dtype == "fp32" for r in rows)  # bf16 (lossy) only when asked: --rows bf16
    both = pick_rows(_Heads(), "k; tree", quick=False)
    assert {r.label for r in both} == {"AR", *GRIDS["k"], *GRIDS["tree"]}
    assert len(pick_rows(_Heads(), "all", quick=False)) == len(labels)
    assert all(r.family != "stern" for r in pick_rows(_Heads(families=("deepseek",)), "all", quick=False))
    assert all(r.draft_vocab == "full" for r in pick_rows(_Heads(vocab=None), "all", quick=False))
    for r in rows_of_real():
        assert not r.widths or r.k == len(r.widths) + 1  # a tree of depth d drafts d tokens: k = d + 1


def test_every_row_runs_at_every_thread_count(monkeypatch):
    """bench real races the same rows at 1 and 2 threads (`ROUNDS`), each with its own rounds."""
    from mtplab.bench import real
    from mtplab.hf import study
    from mtplab.bench.real import pick_rows
    seen = []

    def fake(heads, prompts, cats, *, rows, m, rounds, bar=None):
        seen.append((torch.get_num_threads(), [r.label for r in rows], rounds))
        return {"rows": [{"label": r.label} for r in rows]}
    monkeypatch.setattr(study, "study", fake)
    rows = pick_rows(_Heads(), None, quick=False)
    out = real.races(None, rows, [[1]], ["qa"], m=4, rounds=real.ROUNDS)
    assert [(n, r) for n, _, r in seen] == list(real.ROUNDS.items()) == [(1, 3), (2, 2)]
    assert all(labels == [r.label for r in rows] for _, labels, _ in seen) and set(out) == {"1", "2"}


def test_bench_real_estimates_its_time_from_the_shipped_record():
    from mtplab.bench.real import ROUNDS, estimate_s
    from mtplab.bench.real import pick_rows
    rows = pick_rows(_Heads(), None, quick=False)
    est = estimate_s(rows, 6, ROUNDS, acceptance_decodes=72)
    assert est is not None and 5 * 60 < est < 60 * 60
    assert estimate_s(rows[:1], 6, ROUNDS, acceptance_decodes=0) < est  # fewer rows, less time
    assert estimate_s(rows, 6, ROUNDS, acceptance_decodes=72, record="/nonexistent/real.json") is None


def test_the_real_rows_decode_a_llama_exactly_chain_tree_and_stock(chat_llama):
    """The study's lab rows on a tiny chat Llama with Stern heads (untrained: exactness holds whatever they draft) and
    a draft vocabulary: the chain, token trees through the lab's Llama forward (`HFTarget.forward(positions=, mask=)`)
    and the stock kernels give AR's tokens on every prompt, each to its end of turn."""
    from mtplab.decoding.drafters import pair
    from mtplab.hf.real import chat_ids
    from mtplab.hf.study import Heads, study
    from mtplab.hf.target import load_hf
    t = load_hf(chat_llama).attach("stern", 4)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in t.mtp.parameters():
            p.normal_(0, 0.2)
    heads = Heads(t, {"stern": (t.mtp, t.config)}, list(range(0, 320, 2)), str(chat_llama))
    labels = [real_label("blockwise-overlap", 4, "reduced"), real_label("blockwise-overlap", 4, "reduced",
                                                                       widths=(2, 1, 1)),
              real_label("blockwise-overlap", 3, "reduced", widths=(2, 2)), real_label("ar", None, kernel="stock"),
              real_label("blockwise-overlap", 4, "reduced", stop=0.3)]
    prompts = [chat_ids(t, p) for p in ("def f(x):", "Why is the sky blue?", "2 + 2 =")]
    res = study(heads, prompts, ["code", "qa", "math"], rows=[pair("AR")] + [pair(lab) for lab in labels], m=24,
                rounds=1)
    rows = {r["label"]: r for r in res["rows"]}
    for lab in labels:
        assert rows[lab]["identical_to_ar"] == 3, lab
    tree = rows[labels[1]]
    assert tree["widths"] == [2, 1, 1] and tree["k"] == 4 and "acceptance" not in tree  # a tree has no chain positions
    assert rows[labels[3]]["kernel"] == "stock" and t.kernel == "exact"  # the stock row hands the exact path back
    chain, stopped = rows[labels[0]], rows[labels[-1]]  # the same heads, drafts ended below 0.3 confidence
    assert (chain["adapt"], chain["threshold"], stopped["adapt"], stopped["threshold"]) == ("fixed", None, "confidence",
                                                                                          0.3)
