"""The fastest exact configuration is the default (issue 37, step 3): `generate --hf`, the widget and the notebooks
take the heads file's draft vocabulary and the best k of `bench real`'s record, from rows of the very heads loaded
(their sha256) on the same kernel; with no such row, the documented default, and they say which. An explicit k wins.
Tiny chat Llamas built here; SmolLM2 itself where it is installed (slow lane)."""
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from mtplab.decoding.drafters import real_label  # noqa: E402



def _row(method, k, *, sha=None, speedup=1.2, vocab="reduced", kernel="exact", threads=1, same=6, widths=None,
         stop=None):
    return {"label": real_label(method, k, vocab, kernel=kernel, widths=widths, stop=stop), "method": method, "k": k,
            "adapt": "fixed" if stop is None else "confidence", "threshold": stop, "draft_vocab": vocab, "dtype": "fp32",
            "kernel": kernel, "threads": threads, "heads_sha256": sha,
            "speedup": speedup, "identical_to_ar": same, "prompts": 6, "valid": True, "widths": widths,
            "family": "deepseek" if method.startswith("deepseek") else None, "checkpoint": None}


def _record(tmp_path, model, rows) -> Path:
    p = tmp_path / "real.json"
    p.write_text(json.dumps({"model": model, "rows": rows, "threads": {}}))
    return p


@pytest.fixture()
def heads_file(tmp_path):
    p = tmp_path / "heads.safetensors"
    p.write_bytes(b"some heads")
    return p


def test_choose_k_takes_the_fastest_exact_row_of_these_heads(tmp_path, heads_file):
    from mtplab.measuring.choice import choose_k, heads_sha256
    sha = heads_sha256(heads_file)
    rows = [_row("deepseek-reuse", 3, sha=sha, speedup=1.07), _row("deepseek-reuse", 4, sha=sha, speedup=0.98),
            _row("deepseek-reuse", 5, sha=sha, speedup=1.50, same=5),          # not equal to AR on every prompt
            _row("deepseek-reuse", 6, sha=sha, speedup=1.60, kernel="stock"),  # another kernel
            _row("deepseek-reuse", 7, sha=sha, speedup=1.70, vocab="full"),    # another draft vocabulary
            _row("deepseek-reuse", 4, sha=sha, speedup=1.80, widths=(2, 1, 1)),  # a tree, not the chain
            _row("deepseek-reuse", 2, sha="0" * 64, speedup=1.90)]             # other heads
    rec = _record(tmp_path, "smollm2", rows)
    c = choose_k("smollm2", "deepseek-reuse", heads=heads_file, draft_vocab="reduced", limit=8, threads=1, record=rec)
    assert (c.k, c.source) == (3, "record") and "1.07x" in c.why and "with these heads" in c.why
    # an explicit k always wins, whatever the record says
    assert choose_k("smollm2", "deepseek-reuse", k=5, heads=heads_file, draft_vocab="reduced", limit=8,
                    record=rec).source == "given"
    # the heads were retrained (another sha256), the record not yet rerun: the documented default, said so
    other = tmp_path / "other.safetensors"
    other.write_bytes(b"retrained heads")
    c = choose_k("smollm2", "deepseek-reuse", heads=other, draft_vocab="reduced", limit=8, threads=1, record=rec)
    assert (c.k, c.source) == (4, "default") and "no exact row" in c.why and "bench real" in c.why
    # the default never asks more than the heads support; another model's record is not read
    assert choose_k("smollm2", "deepseek", heads=other, limit=2, record=rec).k == 2
    assert choose_k("smol-other", "deepseek-reuse", heads=heads_file, draft_vocab="reduced", limit=8,
                    record=rec).source == "default"
    assert choose_k("smollm2", "deepseek-reuse", heads=heads_file, draft_vocab="reduced", limit=8,
                    record=tmp_path / "missing.json").source == "default"


def test_choose_k_prefers_rows_at_this_thread_count(tmp_path, heads_file):
    from mtplab.measuring.choice import choose_k, heads_sha256
    sha = heads_sha256(heads_file)
    rec = _record(tmp_path, "smollm2", [_row("deepseek-reuse", 3, sha=sha, speedup=1.3, threads=1),
                                        _row("deepseek-reuse", 4, sha=sha, speedup=1.2, threads=2),
                                        _row("deepseek-reuse", 5, sha=sha, speedup=1.1, threads=2)])
    kw = dict(heads=heads_file, draft_vocab="reduced", limit=8, record=rec)
    assert choose_k("smollm2", "deepseek-reuse", threads=1, **kw).k == 3
    assert choose_k("smollm2", "deepseek-reuse", threads=2, **kw).k == 4
    assert choose_k("smollm2", "deepseek-reuse", threads=4, **kw).k == 3  # none at 4: the fastest at any count


def test_choose_k_takes_the_confidence_stop_of_the_fastest_row(tmp_path, heads_file):
    """A row with a confidence stop competes with the rows of k-1 drafts every step; the choice carries its stop, and
    a stop given alone picks among the rows with that stop."""
    from mtplab.measuring.choice import choose_k, heads_sha256
    sha = heads_sha256(heads_file)
    rec = _record(tmp_path, "smollm2", [_row("deepseek-reuse", 3, sha=sha, speedup=1.30),
                                        _row("deepseek-reuse", 4, sha=sha, speedup=1.36, stop=0.3),
                                        _row("deepseek-reuse", 5, sha=sha, speedup=1.33, stop=0.3),
                                        _row("deepseek-reuse", 6, sha=sha, speedup=1.50, stop=0.3, same=5)])
    kw = dict(heads=heads_file, draft_vocab="reduced", limit=8, threads=1, record=rec)
    c = choose_k("smollm2", "deepseek-reuse", **kw)
    assert (c.k, c.stop, c.source) == (4, 0.3, "record") and c.why.startswith("k=4, confidence stop 0.3, the highest")
    assert "confidence stop 0.3: 1.36x" in c.why and "k=3, reduced vocab: 1.30x" in c.why
    assert (choose_k("smollm2", "deepseek-reuse", stop=0.5, **kw).stop, choose_k("smollm2", "deepseek-reuse", stop=0.5,
                                                                                  **kw).source) == (0.5, "default")
    assert choose_k("smollm2", "deepseek-reuse", k=3, **kw).stop is None  # a k given: every step drafts k-1
    c = choose_k("smollm2", "deepseek-reuse", fixed=True, **kw)  # the widget: only rows drafting k-1 every step
    assert (c.k, c.stop, c.source) == (3, None, "record")


def test_the_shipped_record_names_the_shipped_heads():
    """docs/bench/real.json: every head row names its heads file by sha256 and its kernel, and today's shipped heads
    are the record's, so `generate --hf smollm2` takes k from it (a retrained head file must rerun bench real)."""
    from mtplab.hf.real import shipped_heads
    from mtplab.measuring.choice import REAL_JSON, choose_k, heads_sha256, row_stop
    from mtplab.measuring.record import Record
    rec = Record.load(REAL_JSON)
    for r in rec.rows:
        assert r["kernel"] in ("exact", "stock")
        assert (r["heads_sha256"] is None) == (r["checkpoint"] is None)
        assert r["adapt"] in ("fixed", "confidence") and (r["threshold"] is None) == (r["adapt"] == "fixed")
    ds = shipped_heads("smollm2", "deepseek")
    if ds is None:
        pytest.skip("no shipped DeepSeek heads")
    best = max((r for r in rec.rows if r["method"] == "deepseek-reuse" and r["threads"] == 1 and r["kernel"] == "exact"
                and r["draft_vocab"] == "reduced" and r["dtype"] == "fp32" and r["identical_to_ar"] == r["prompts"]
                and r["heads_sha256"] == heads_sha256(ds)), key=lambda r: r["speedup"], default=None)
    c = choose_k("smollm2", "deepseek-reuse", heads=ds, draft_vocab="reduced", limit=8, threads=1)
    if best is None:
        assert c.source == "default"
    else:
        assert (c.k, c.stop, c.source) == (best["k"], row_stop(best), "record")


# ------------------------------------------------------------------ generate --hf on a tiny chat Llama
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Llama with a chat template, and DeepSeek heads (untrained: exactness holds whatever they draft) saved
    with a draft vocabulary."""
    from tests.bench.test_bench_real import TEMPLATE
    from tests.hf.test_hf import _llama_config, _tokenizer
    from transformers import LlamaForCausalLM
    from mtplab.hf.target import load_hf, save_heads
    d = tmp_path_factory.mktemp("tiny-defaults")
    torch.manual_seed(1)
    LlamaForCausalLM(_llama_config()).save_pretrained(d)
    tok = _tokenizer()
    tok.chat_template = TEMPLATE
    tok.save_pretrained(d)
    t = load_hf(d).attach("deepseek", 2)
    heads = save_heads(t, d / "heads", vocab=list(range(0, 320, 2)))
    return d, heads


def _generate(capsys, *args):
    from mtplab.cli import main as cli_main
    rc = cli_main(["generate", "--prompt", "def f(x):", "--max-new-tokens", "12", "--json", *args])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


def test_generate_hf_takes_k_and_vocabulary_from_the_record_of_its_heads(tiny, tmp_path, capsys, monkeypatch):
    from mtplab.measuring import choice
    d, heads = tiny
    sha = choice.heads_sha256(heads)
    monkeypatch.setattr(choice, "REAL_JSON", _record(tmp_path, str(d), [
        _row("deepseek-reuse", 3, sha=sha, speedup=1.3, threads=torch.get_num_threads()),
        _row("deepseek-reuse", 5, sha=sha, speedup=1.1, threads=torch.get_num_threads()),
        _row("ngram", 2, vocab="full", speedup=1.4, threads=torch.get_num_threads())]))
    ar = _generate(capsys, "--hf", str(d), "--method", "ar")["tokens"]
    res = _generate(capsys, "--hf", str(d), "--method", "deepseek-reuse", "--heads-checkpoint", str(heads))
    assert (res["k"], res["k_source"], res["draft_vocab"]) == (3, "record", "reduced")
    assert res["draft_vocab_size"] == 160 and res["tokens"] == ar and "1.30x" in res["k_why"]
    res = _generate(capsys, "--hf", str(d), "--method", "deepseek-reuse", "--heads-checkpoint", str(heads), "--k", "2")
    assert (res["k"], res["k_source"]) == (2, "given") and res["tokens"] == ar
    res = _generate(capsys, "--hf", str(d), "--method", "deepseek-reuse", "--heads-checkpoint", str(heads),
                    "--draft-vocab", "full")  # no row over the full vocabulary: the default, said so
    assert (res["k"], res["k_source"], res["draft_vocab"]) == (4, "default", "full") and "no exact row" in res["k_why"]
    res = _generate(capsys, "--hf", str(d), "--method", "ngram")  # no heads: rows without heads
    assert (res["k"], res["k_source"]) == (2, "record") and res["tokens"] == ar
    # a confidence stop row measured fastest: generate takes its k and its stop, and the output is still AR's
    monkeypatch.setattr(choice, "REAL_JSON", _record(tmp_path, str(d), [
        _row("deepseek-reuse", 3, sha=sha, speedup=1.3, threads=torch.get_num_threads()),
        _row("deepseek-reuse", 4, sha=sha, speedup=1.4, threads=torch.get_num_threads(), stop=0.3)]))
    res = _generate(capsys, "--hf", str(d), "--method", "deepseek-reuse", "--heads-checkpoint", str(heads))
    assert (res["k"], res["confidence_stop"], res["k_source"]) == (4, 0.3, "record") and res["tokens"] == ar
    res = _generate(capsys, "--hf", str(d), "--method", "deepseek-reuse", "--heads-checkpoint", str(heads),
                    "--confidence-stop", "0.9")  # given: no row has it, so k is the default's
    assert (res["k"], res["confidence_stop"], res["k_source"]) == (4, 0.9, "default") and res["tokens"] == ar


def test_generate_hf_verbose_says_where_k_came_from(tiny, capsys):
    from mtplab.cli import main as cli_main
    d, heads = tiny
    rc = cli_main(["generate", "--hf", str(d), "--method", "deepseek", "--heads-checkpoint", str(heads),
                   "--prompt", "def f(x):", "--max-new-tokens", "6"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "[k=2, the default (the most the heads support, at most 4)" in out  # D=1 allows k=2 at most
    assert "draft vocabulary: reduced, the heads file's" in out


# ------------------------------------------------------------------ the widget and the notebooks
def test_notebooks_best_row_is_a_default_row_of_the_shipped_heads():
    """teaching.real.best_row: the stock-kernel and tree rows are comparisons, never the default; rows of the
    shipped heads win over rows of other heads when the record names them."""
    from mtplab.teaching import real
    sha = real.shipped_sha256("deepseek")
    if sha is None:
        pytest.skip("no shipped DeepSeek heads")
    rows = [_row("ar", None, vocab="full", speedup=1.0), _row("deepseek", 2, sha=sha, speedup=1.1),
            _row("deepseek", 2, sha=sha, speedup=1.5, kernel="stock"),
            _row("deepseek-reuse", 4, sha=sha, speedup=1.6, widths=(2, 1, 1)),
            _row("deepseek-reuse", 3, sha="0" * 64, speedup=1.4)]
    rec = {"rows": rows}
    assert real.best_row(rec)["label"] == real_label("deepseek", 2, "reduced")
    rows[1]["heads_sha256"] = "1" * 64  # no row of the shipped heads: the record's best, as measured
    assert real.best_row(rec)["label"] == real_label("deepseek-reuse", 3, "reduced")


@pytest.mark.slow
def test_widget_takes_k_from_the_record_on_smollm2():
    from mtplab.teaching import real
    if real.missing():
        pytest.skip(real.missing())
    from mtplab.hf.real import shipped_heads
    from mtplab.measuring.choice import choose_k, row_stop
    from mtplab.teaching.acceptance_lab import session
    from mtplab.teaching.acceptance_lab.state import LabState
    models = session.ModelCache()
    s = session.change(LabState(), models, checkpoint="smollm2", method="deepseek-reuse")
    kw = dict(heads=shipped_heads("smollm2", "deepseek"), draft_vocab="reduced", limit=8)
    fixed = choose_k("smollm2", "deepseek-reuse", fixed=True, **kw)  # the widget shows k-1 drafts at every step
    assert s.k == fixed.k and real.k_words(fixed) in s.note and not s.error  # the choice and whether the ranges rank it
    assert fixed.stop is None and "k-1 drafts every step" in fixed.why
    assert session.change(LabState(), models, checkpoint="smollm2", method="deepseek-reuse", k=2).k == 2
    want = choose_k("smollm2", "deepseek-reuse", **kw)  # generate --hf and notebook 05 (REAL_METHOD = "best")
    assert real.default_k(real.load("cpu"), "deepseek-reuse") == want
    assert want.stop == (row_stop(want.rows[0]) if want.rows else None)
