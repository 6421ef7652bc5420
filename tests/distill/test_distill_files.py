"""`distill`'s work folder and options (review 2026-12-02-reliability-3, d-*): every file a resumed run reads back,
tampered, is one line naming the file and the fix, in bounded time, and nothing outside the work folder changes.
The stages are called in this process on a small hand-made work folder (the real vocabulary size, a 16-wide
trunk), never on the real model: every check here runs before the model would be used."""
import json
import os
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from mtplab.distill import pipeline as distill, trunkcache, vocab
from mtplab.hf import real
from mtplab.distill import workfiles as wf
from scripts.make_chat_data import read_data_prompts
from tests.reliability.realcases import (chat_tokenizer, devzero, fifo, one_line_error, shipped_copy, snapshot,
                                          sparse)

V, CTX, C = 49152, 2048, 16
FAKE = types.SimpleNamespace(config=types.SimpleNamespace(vocab_size=V, block_size=CTX, n_embd=C))


def _rows(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"category": "qa", "prompt_ids": torch.randint(0, V, (6,), generator=g).tolist(),
             "answer_ids": torch.randint(0, V, (9,), generator=g).tolist()} for _ in range(n)]


def _cache(rows, **change):
    T = max(len(r["prompt_ids"]) + len(r["answer_ids"]) for r in rows)
    B = len(rows)
    t = {"tokens": torch.zeros(B, T, dtype=torch.long), "hidden": torch.randn(B, T, C).to(torch.bfloat16),
         "top_i": torch.randint(0, V, (B, T, trunkcache.TOPK), dtype=torch.int32),
         "top_p": torch.full((B, T, trunkcache.TOPK), 0.1, dtype=torch.float16),
         "length": torch.full((B,), T, dtype=torch.long), "prompt_len": torch.full((B,), 6, dtype=torch.long)}
    t.update(change)
    return {k: v for k, v in t.items() if v is not None}


@pytest.fixture
def work(tmp_path):
    """A work folder after the cache stage: two answer shards, one cache shard, a vocabulary, times; and the data
    generator's selected prompts beside them (scripts/make_chat_data.py's prompts.json, read by its prompt-list checks)."""
    w = distill.Work(tmp_path / "w").limits(FAKE)
    (w.dir / "prompts.json").write_text(json.dumps({"prompts": [{"category": "qa", "prompt": "What is rain?"}] * 3}))
    for b in range(2):
        (w.dir / "answers" / f"{b:05d}.json").write_text(json.dumps(_rows(seed=b)))
    save_file(_cache(_rows()), str(w.dir / "cache" / "00000.safetensors"))
    (w.dir / "vocab-8192.json").write_text(json.dumps({"n": 3, "ids": [1, 2, 3], "coverage": 0.5}))
    (w.dir / "vocab-study.json").write_text(json.dumps({"chosen": 8192, "sizes": []}))
    (w.dir / "heldout.json").write_text(json.dumps(_rows(3, seed=5)))
    save_file(_cache(_rows(3, seed=5)), str(w.dir / "heldout.safetensors"))
    (w.dir / "times.json").write_text(json.dumps({"prompts": [0.1, 0.2]}))
    (tmp_path / "outside.txt").write_text("untouched")
    return w


def _set(name, value):
    def edit(w):
        p = w.dir / name
        if callable(value):
            value(p)
        else:
            p.write_text(value if isinstance(value, str) else json.dumps(value))
    return edit


def _cut(name, n):
    def edit(w):
        p = w.dir / name
        p.write_bytes(p.read_bytes()[:n])
    return edit


def _cache_with(**change):
    return lambda w: save_file(_cache(_rows(), **change), str(w.dir / "cache" / "00000.safetensors"))


def _no_cache(edit):
    def both(w):
        (w.dir / "cache" / "00000.safetensors").unlink()
        edit(w)
    return both


PROMPTS = lambda w: read_data_prompts(w.dir / "prompts.json")  # noqa: E731
CACHE_STAGE = lambda w: distill.stage_cache(FAKE, w)  # noqa: E731
TRAIN_READ = lambda w: distill.TrunkCache.load(w)  # noqa: E731
VOCAB = lambda w: vocab.load_vocab(w, 8192)  # noqa: E731
CHOSEN = lambda w: vocab.chosen_vocab(w)  # noqa: E731
HELDOUT = lambda w: trunkcache.heldout_cache(w)  # noqa: E731


def _timed(w):
    with w.timed("cache"):
        pass


A0, A1 = "answers/00000.json", "answers/00001.json"
CASES = {  # review case: (edit of the work folder, the stage that reads it, what the line says)
    "d-prompts-dict": (_set("prompts.json", {"a": 1}), PROMPTS, "not the selected prompts"),
    "d-prompts-nokeys": (_set("prompts.json", {"prompts": [{"x": 1}]}), PROMPTS,
                         "prompt 0 is not an object with a category"),
    "d-prompts-int": (_set("prompts.json", {"prompts": [{"category": "qa", "prompt": 5}]}), PROMPTS, "both text"),
    "d-prompts-long": (_set("prompts.json", {"prompts": [{"category": "qa", "prompt": "word " * 20000}]}), PROMPTS,
                       "prompt 0 has 100000 characters"),
    "d-prompts-fifo": (_set("prompts.json", fifo), PROMPTS, "not a regular file"),
    "d-prompts-huge": (_set("prompts.json", lambda p: sparse(p, 1 << 36)), PROMPTS, "more than"),
    "d-answers-trunc": (_no_cache(_cut(A1, 500)), CACHE_STAGE, "is not valid JSON"),
    "d-answers-oob": (_no_cache(_set(A1, [{**_rows()[0], "answer_ids": [10 ** 6]}])), CACHE_STAGE,
                      "answer_ids holds 1000000, not a token id in 0..49151"),
    "d-answers-neg": (_no_cache(_set(A1, [{**_rows()[0], "prompt_ids": [-1]}])), CACHE_STAGE, "not a token id"),
    "d-answers-str": (_no_cache(_set(A1, [{**_rows()[0], "answer_ids": "abc"}])), CACHE_STAGE,
                      "answer_ids is a str"),
    "d-answers-long": (_no_cache(_set(A1, [{**_rows()[0], "answer_ids": [5] * 3000}])), CACHE_STAGE,
                       "row 0 has 3006 tokens; a row has 1..2048"),
    "d-answers-devzero": (_no_cache(_set(A1, devzero)), CACHE_STAGE, "not a regular file"),
    "d-answers-fifo": (_no_cache(_set(A1, fifo)), CACHE_STAGE, "not a regular file"),
    "d-answers-sparse": (_no_cache(_set(A1, lambda p: sparse(p, 1 << 36))), CACHE_STAGE, "more than an answers shard"),
    "d-answers-dict": (_no_cache(_set(A1, {"hello": 1})), CACHE_STAGE, "a non-empty JSON list"),
    "d-cache-trunc": (_cut("cache/00000.safetensors", 1000), TRAIN_READ, "corrupt or truncated"),
    "d-cache-nokey": (_cache_with(length=None), TRAIN_READ, "'length' is missing or extra"),
    "d-cache-nan": (_cache_with(hidden=torch.full((4, 15, C), float("nan")).to(torch.bfloat16)), TRAIN_READ,
                    "NaN or infinite"),
    "d-cache-oob": (_cache_with(top_i=torch.full((4, 15, trunkcache.TOPK), 10 ** 6, dtype=torch.int32)), TRAIN_READ,
                    "top_i holds ids outside 0..49151"),
    "d-cache-shape": (_cache_with(hidden=torch.zeros(4, 15, 10).to(torch.bfloat16)), TRAIN_READ,
                      "hidden has shape [4, 15, 10], want [4, 15, 16]"),
    "d-cache-dtype": (_cache_with(top_i=torch.zeros(4, 15, trunkcache.TOPK)), TRAIN_READ, "top_i is F32"),
    "d-cache-length": (_cache_with(length=torch.full((4,), 99, dtype=torch.long)), TRAIN_READ, "length"),
    "d-cache-fifo": (_set("cache/00000.safetensors", fifo), TRAIN_READ, "not a regular file"),
    "d-cache-sparse": (_set("cache/00000.safetensors", lambda p: sparse(p, 1 << 36)), TRAIN_READ, "more than"),
    "d-vocab-oob": (_set("vocab-8192.json", {"n": 1, "ids": [10 ** 6]}), VOCAB, "holds 1000000"),
    "d-vocab-str": (_set("vocab-8192.json", {"n": 1, "ids": "abc"}), VOCAB, "a non-empty list of token ids"),
    "d-vocab-bigint": (_set("vocab-8192.json", '{"n": 1, "ids": [' + "9" * 40 + "]}"), VOCAB, "not a token id"),
    "d-vocab-devzero": (_set("vocab-8192.json", devzero), VOCAB, "not a regular file"),
    "d-study-list": (_set("vocab-study.json", [1, 2]), CHOSEN, "names no draft vocabulary size in 1..49152"),
    "d-study-big": (_set("vocab-study.json", {"chosen": 10 ** 6}), CHOSEN, "names no draft vocabulary size"),
    "d-study-fifo": (_set("vocab-study.json", fifo), CHOSEN, "not a regular file"),
    "d-heldout-trunc": (_cut("heldout.json", 30), HELDOUT, "is not valid JSON"),
    "d-heldout-oob": (_set("heldout.json", [{**_rows()[0], "answer_ids": [10 ** 6]}]), HELDOUT, "holds 1000000"),
    "d-heldout-count": (_set("heldout.json", _rows(2)), HELDOUT, "2 held-out answers and 3 cached rows"),
    "d-heldout-cache": (_cut("heldout.safetensors", 1000), HELDOUT, "corrupt or truncated"),
    "d-times-list": (_set("times.json", [1, 2]), _timed, "not the stages' times"),
    "d-times-fifo": (_set("times.json", fifo), _timed, "not a regular file"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_tampered_work_file_is_one_line_naming_it(case, work):
    edit, stage, fragment = CASES[case]
    edit(work)
    outside = snapshot(work.dir.parent, skip=work.dir)
    msg = one_line_error(lambda: stage(work), fragment, "delete it", seconds=10)
    assert str(work.dir) in msg  # the file is named
    assert snapshot(work.dir.parent, skip=work.dir) == outside


def test_a_stray_json_among_the_answers_is_not_a_shard(work):
    """d-answers-stray: answers/notes.json was read as a shard (TypeError); it is left alone now."""
    (work.dir / "answers" / "notes.json").write_text(json.dumps({"hello": 1}))
    (work.dir / "answers" / ".00002.json.tmp").write_text("partial")
    assert [p.name for p in work.shards("answers")] == ["00000.json", "00001.json"]
    assert len(vocab.by_count(work)[:8]) == 8


def test_the_answers_come_from_a_data_folder_only(tmp_path):
    """The old generation stages are gone: --stages prompts is refused in one line, and the answers stage of a data
    folder without answers names scripts/make_chat_data.py, the one generation loop."""
    one_line_error(lambda: distill.run_distill("smollm2", tmp_path / "w", stages=["prompts", "answers"]),
                   "an unknown stage 'prompts'; choose among answers, grow, heldout, cache, trim, vocab, deepseek, stern, ship",
                   seconds=10)
    assert not (tmp_path / "w").exists()
    t = types.SimpleNamespace(tokenizer=chat_tokenizer(), config=FAKE.config)
    (tmp_path / "data" / "answers").mkdir(parents=True)
    one_line_error(lambda: distill.stage_import(t, distill.Work(tmp_path / "w").limits(t), tmp_path / "data"),
                   "holds no answers; run python scripts/make_chat_data.py")


def test_a_missing_held_out_set_or_vocabulary_choice_names_its_stage(work):
    (work.dir / "vocab-study.json").unlink()
    one_line_error(lambda: CHOSEN(work), "no draft vocabulary chosen yet; run the vocab stage first")
    (work.dir / "heldout.safetensors").unlink()
    one_line_error(lambda: HELDOUT(work), "no held-out answers and cache; run the heldout stage first")


def test_the_good_work_folder_reads(work):
    """The controls: every reader above accepts the untampered folder."""
    assert len(PROMPTS(work)) == 3
    assert len(TRAIN_READ(work).rows) == 4
    assert VOCAB(work).tolist() == [1, 2, 3] and CHOSEN(work) == 8192
    assert len(HELDOUT(work)[0]) == 3 and len(HELDOUT(work)[1].rows) == 3
    _timed(work)
    assert set(wf.read_times(work.dir / "times.json")) == {"prompts", "cache"}


OPTIONS = {  # review case: (options, what the line says)
    "d-stage-empty": (dict(stages=[]), "--stages names no stage"),
    "d-steps-0": (dict(steps=0), "--steps must be an integer >= 1 (got 0)"),
    "d-steps-neg": (dict(steps=-5), "--steps must be an integer >= 1 (got -5)"),
    "d-maxsec-neg": (dict(max_seconds=-1.0), "--max-seconds must be a positive number"),
    "d-maxsec-nan": (dict(max_seconds=float("nan")), "--max-seconds must be a positive number"),
    "d-device-bogus": (dict(device="tpu"), "unknown device 'tpu'"),
    "d-answers-few": (dict(answers=100), "--answers must be an integer >= 136"),
    "d-answers-float": (dict(answers=5000.0), "--answers must be an integer"),
}


@pytest.mark.parametrize("case", list(OPTIONS))
def test_a_bad_option_is_refused_before_the_work_folder_is_made(case, tmp_path):
    opts, fragment = OPTIONS[case]
    one_line_error(lambda: distill.run_distill("smollm2", tmp_path / "w", **opts), fragment, seconds=10)
    assert not (tmp_path / "w").exists()


def test_the_data_folder_is_not_a_work_folder(tmp_path):
    """d-work-data: --work data wrote prompts, answers and a cache into the lab's data folder."""
    from mtplab import paths
    for w in (paths.DATA_DIR, paths.HF_DIR / "smollm2"):
        before = sorted(os.listdir(w))  # data/ itself: a background generator may write under data/chat meanwhile
        one_line_error(lambda w=w: distill.run_distill("smollm2", w, stages=["deepseek"]),
                       "is the lab's data folder or inside what it ships")
        assert sorted(os.listdir(w)) == before


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """data/hf/smollm2 moved to a copy: ship writes there (with the opt-in)."""
    monkeypatch.setenv("MTPLAB_WRITE_SHIPPED", "1")
    return shipped_copy(tmp_path, monkeypatch)


def test_ship_with_nothing_trained_writes_nothing(shipped, tmp_path):
    """d-ship-empty: a work folder with prompts only replaced the shipped vocabulary with an empty one."""
    w = distill.Work(tmp_path / "w")
    before = snapshot(shipped)
    one_line_error(lambda: distill.ship(None, w, real.REAL_MODELS["smollm2"]), "nothing to ship")
    assert snapshot(shipped) == before


def test_ship_reads_the_record_before_it_writes(shipped, work):
    """d-ship-record-list: a record.json that is a list stopped ship half way (heads and vocabulary replaced)."""
    from mtplab.training import runs
    m = runs.paths(work.dir, "deepseek")["manifest"]
    m.parent.mkdir(parents=True, exist_ok=True)
    m.write_text("{}")
    (shipped / "record.json").write_text("[]")
    before = snapshot(shipped)
    one_line_error(lambda: distill.ship(None, work, real.REAL_MODELS["smollm2"]), "record.json is not the shipped",
                   "git checkout")
    assert snapshot(shipped) == before


CHAT = {  # mtplab.distill.chatdata's shards (scripts/make_chat_data.py, its generator, calls these readers)
    "questions-rows-str": ("questions", {"rows": "x", "tokens": 1, "cpu_s": 1.0, "wall_s": 1.0}, "a list of rows"),
    "questions-no-cpu": ("questions", {"rows": [], "tokens": 1, "wall_s": 1.0}, "cpu_s is None"),
    "questions-row-key": ("questions", {"rows": [{"category": "qa"}], "tokens": 1, "cpu_s": 1, "wall_s": 1},
                          "row 0: steer is not str"),
    "answers-oob": ("answers", {"rows": [{"category": "qa", "prompt": "x", "prompt_len": 3, "answer_ids": [V]}],
                                "tokens": 1, "cpu_s": 1, "wall_s": 1}, "not a token id in 0..49151"),
    "answers-len-bool": ("answers", {"rows": [{"category": "qa", "prompt": "x", "prompt_len": True, "answer_ids": []}],
                                     "tokens": 1, "cpu_s": 1, "wall_s": 1}, "prompt_len is not int"),
    "answers-fifo": ("answers", fifo, "not a regular file"),
}


@pytest.mark.parametrize("case", list(CHAT))
def test_a_tampered_data_shard_is_one_line(case, tmp_path):
    kind, content, fragment = CHAT[case]
    p = tmp_path / kind / "00000.json"
    p.parent.mkdir()
    content(p) if callable(content) else p.write_text(json.dumps(content))
    one_line_error(lambda: wf.data_shards(tmp_path, kind, vocab_size=V), fragment, "delete it")


def test_chatdata_prompts_are_checked(tmp_path):
    p = tmp_path / "prompts.json"
    p.write_text(json.dumps({"prompts": [{"category": "qa", "prompt": ""}]}))
    one_line_error(lambda: read_data_prompts(p), "prompt 0 has 0 characters")
    p.write_text(json.dumps({"prompts": [{"category": "qa", "prompt": "Why?"}]}))
    assert read_data_prompts(p)[0]["prompt"] == "Why?"


def test_the_real_data_shards_read(tmp_path):
    """The control: the generator's own shards (where it has written some) pass their readers."""
    d = Path(__file__).resolve().parents[2] / "data" / "chat" / "smollm2"
    found = wf.shards(d / "questions")[:2]
    if not found:
        pytest.skip("no data/chat/smollm2 shards here")
    for p in found:
        assert wf.read_data_shard(p, "questions")["rows"]
    assert os.path.isdir(d)
