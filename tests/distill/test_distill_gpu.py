"""scripts/distill_gpu.py: the shipped draft vocabulary kept as a work folder's choice (the GPU sitting's retraining
keeps the heads' shape), read back by the distill stages."""
import json

import pytest
import torch

from mtplab.distill import pipeline as distill
from mtplab.distill.vocab import chosen_vocab, load_vocab
from scripts.distill_gpu import keep_vocab

V = 49152
FAKE = type("T", (), {"config": type("C", (), {"vocab_size": V, "block_size": 2048, "n_embd": 16})})


def _work(tmp_path, n=200):
    w = distill.Work(tmp_path / "w").limits(FAKE)
    g = torch.Generator().manual_seed(0)
    rows = [{"category": "qa", "prompt_ids": [1, 2, 3], "answer_ids": torch.randint(0, 8, (5,), generator=g).tolist()}
            for _ in range(n)]
    (w.dir / "answers" / "00000.json").write_text(json.dumps(rows))
    return w


def _shipped(tmp_path, ids, study):
    s = tmp_path / "shipped"
    s.mkdir()
    (s / "draft-vocab.json").write_text(json.dumps({"n": len(ids), "ids": ids, "coverage": 0.9}))
    (s / "record.json").write_text(json.dumps({"heads": {}, **({"draft_vocab": study} if study else {})}))
    return s


def test_the_shipped_vocabulary_becomes_the_work_folders_choice(tmp_path):
    w = _work(tmp_path)
    study = {"goal": 0.98, "sizes": [{"size": 4, "coverage_held_out": 0.5}], "chosen": 4}
    n = keep_vocab(w, _shipped(tmp_path, [7, 0, 3, 5], study))
    assert n == 4 and chosen_vocab(w) == 4
    assert load_vocab(w, 4).tolist() == [0, 3, 5, 7]
    kept = json.loads((w.dir / "vocab-4.json").read_text())
    # answers hold tokens 0..7 evenly: ids 0, 3, 5, 7 hold about half of the held-back prompts' tokens
    assert 0.3 < kept["coverage"] < 0.7
    saved = json.loads((w.dir / "vocab-study.json").read_text())
    assert saved["sizes"] == study["sizes"] and "before this sitting" in saved["kept"]


def test_a_record_without_the_study_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="no draft vocabulary study"):
        keep_vocab(_work(tmp_path), _shipped(tmp_path, [1, 2], None))


def test_ids_outside_the_vocabulary_are_refused(tmp_path):
    with pytest.raises(Exception, match="draft vocabulary"):
        keep_vocab(_work(tmp_path), _shipped(tmp_path, [1, V + 3], {"chosen": 2}))
