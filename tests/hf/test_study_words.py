"""Issue 40, round 5: `choose_k`'s line called k = 2 "the fastest exact row of deepseek" (notebook 05, the widget,
`generate --hf`) where the record held one such row, and would call the highest median "the fastest" where the
other k's ranges overlap it. The line now states what the record holds (the only row, or the highest median of
several with every one's range), and the teaching layer adds the ranges' verdict (`teaching.real.k_words`)."""
import json

import pytest

pytest.importorskip("transformers")

from mtplab.decoding.drafters import real_label  # noqa: E402


def _row(method, k, sha, speedup, lo, hi, threads=1):
    return {"label": real_label(method, k, "reduced"), "method": method, "k": k, "draft_vocab": "reduced",
            "dtype": "fp32", "kernel": "exact", "threads": threads, "heads_sha256": sha, "speedup": speedup,
            "speedup_min": lo, "speedup_max": hi, "identical_to_ar": 6, "prompts": 6, "valid": True, "widths": None,
            "family": "deepseek", "checkpoint": "x"}


@pytest.fixture()
def setup(tmp_path):
    from mtplab.measuring.choice import heads_sha256
    heads = tmp_path / "heads.safetensors"
    heads.write_bytes(b"heads")
    sha = heads_sha256(heads)
    rows = [_row("deepseek", 2, sha, 1.27, 1.11, 1.33), _row("deepseek-reuse", 3, sha, 1.22, 1.15, 1.40),
            _row("deepseek-reuse", 4, sha, 1.16, 1.11, 1.34), _row("deepseek-reuse", 5, sha, 1.50, 1.45, 1.55, threads=2)]
    rec = tmp_path / "real.json"
    rec.write_text(json.dumps({"model": "smollm2", "rows": rows, "threads": {}}))
    return heads, rec


def test_one_row_is_the_only_one_not_the_fastest(setup):
    from mtplab.measuring.choice import choose_k
    heads, rec = setup
    c = choose_k("smollm2", "deepseek", heads=heads, draft_vocab="reduced", limit=2, threads=1, record=rec)
    assert (c.k, c.source, len(c.rows)) == (2, "record", 1)
    assert c.why == ("k=2, the only exact row of deepseek in real.json with these heads at 1 thread (DeepSeek D=1, k=2, "
                     "reduced vocab: 1.27x AR, range 1.11-1.33), so the record compares no other k; deepseek drafts at "
                     "most k=2 with these heads")
    assert "fastest" not in c.why


def test_several_rows_give_the_highest_median_with_every_range_at_one_thread_count(setup):
    from mtplab.measuring.choice import choose_k
    from mtplab.teaching import real
    heads, rec = setup
    c = choose_k("smollm2", "deepseek-reuse", heads=heads, draft_vocab="reduced", limit=8, threads=1, record=rec)
    assert c.k == 3 and [r["k"] for r in c.rows] == [3, 4]  # the 2-thread k=5 row is not compared with them
    assert c.why == ("k=3, the highest median of the 2 exact rows of deepseek-reuse in real.json with these heads at 1 "
                     "thread (DeepSeek D=1 reused, k=3, reduced vocab: 1.22x AR, range 1.15-1.40; DeepSeek D=1 reused, "
                     "k=4, reduced vocab: 1.16x AR, range 1.11-1.34)")
    assert "fastest" not in c.why
    assert real.k_words(c).endswith("the fastest k by median (k=3: 1.22x AR, range 1.15-1.40), within the range of k=4 "
                                    "(1.16x AR, range 1.11-1.34): the record does not rank the two")


def test_the_default_names_the_command_that_rewrites_the_record_it_reads(setup, tmp_path):
    from mtplab.measuring.choice import RERUN, choose_k
    from mtplab.teaching import real
    heads, rec = setup
    other = tmp_path / "other.safetensors"
    other.write_bytes(b"retrained")
    c = choose_k("smollm2", "deepseek-reuse", heads=other, draft_vocab="reduced", limit=8, threads=1, record=rec)
    assert c.source == "default" and "python -m mtplab bench real --out docs/bench measures them" in c.why
    assert RERUN == real.RERUN  # bench's default --out is build/bench, which nothing reads the record from


def test_the_shipped_records_deepseek_k_is_not_called_the_fastest():
    """The student's sentence: with the shipped heads, 'deepseek' has one exact row in docs/bench/real.json."""
    from mtplab.hf.real import shipped_heads
    from mtplab.measuring.choice import choose_k
    ds = shipped_heads("smollm2", "deepseek")
    if ds is None:
        pytest.skip("no shipped DeepSeek heads")
    for threads in (1, 2):
        c = choose_k("smollm2", "deepseek", heads=ds, draft_vocab="reduced", limit=2, threads=threads)
        assert "fastest" not in c.why and (c.source == "default" or len(c.rows) >= 1)
        if len(c.rows) == 1:
            assert "the only exact row of deepseek" in c.why


def test_a_choice_stays_hashable_and_compares_by_its_k_source_and_why(setup):
    from mtplab.measuring.choice import KChoice, choose_k
    heads, rec = setup
    c = choose_k("smollm2", "deepseek-reuse", heads=heads, draft_vocab="reduced", limit=8, threads=1, record=rec)
    assert hash(c) == hash(KChoice(c.k, c.source, c.why)) and c == KChoice(c.k, c.source, c.why)
