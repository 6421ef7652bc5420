"""Issue 40, round 5: notebook 05 called the real model's k = 2 "the fastest" where the record's ranges overlap the
other k's, and `best_row` fell back to rows of other heads without a word. The words now say what the ranges carry
(`words.fastest_words`: the fastest only when the range lies apart, else the fastest by median within the rows it
overlaps), and a row of other heads is returned flagged (`other_heads`), a flag every caller prints."""
import re

import pytest

from mtplab.teaching import real, words

SHIPPED = "b" * 64


def _row(label, k, speedup, lo, hi, *, sha=SHIPPED, family="deepseek", tps=1.4, draft_ms=5.0):
    return {"label": label, "method": "deepseek" if k == 2 else "deepseek-reuse", "family": family, "k": k,
            "draft_vocab": "reduced", "dtype": "fp32", "kernel": "exact", "threads": 1, "heads_sha256": sha,
            "speedup": speedup, "speedup_min": lo, "speedup_max": hi, "tokens_per_forward": tps,
            "split": {"target_ms": 70.0, "draft_ms": draft_ms, "overhead_ms": 1.0}, "identical_to_ar": 6,
            "prompts": 6}


def _record(k2=(1.27, 1.11, 1.33), k3=(1.22, 1.15, 1.40), sha=SHIPPED):
    ar = _row("AR", None, 1.0, 1.0, 1.0, sha=None, family=None, tps=1.0, draft_ms=0.0)
    ng = {**_row("n-gram, k=4", 4, 1.39, 1.38, 1.49, sha=None, family=None, tps=1.54, draft_ms=0.1), "method": "ngram"}
    return {"m": 128, "threads": {"1": {}}, "rows": [
        {**ar, "method": "ar"}, ng, _row("DeepSeek D=1, k=2, reduced vocab", 2, *k2, sha=sha, tps=1.5),
        _row("DeepSeek D=1 reused, k=3, reduced vocab", 3, *k3, sha=sha, tps=1.6, draft_ms=9.0)]}


@pytest.fixture()
def shipped(monkeypatch):
    """The lab ships deepseek heads of sha256 'bbbb...' (the tiny records' rows name them, or other ones)."""
    monkeypatch.setattr(real, "shipped_sha256", lambda family: SHIPPED if family == "deepseek" else None)


def test_fastest_words_call_a_row_the_fastest_only_when_its_range_lies_apart():
    name = lambda r: r["label"]  # noqa: E731
    a, b, c = ({"label": x, "speedup": m, "speedup_min": lo, "speedup_max": hi}
               for x, m, lo, hi in (("a", 1.27, 1.11, 1.33), ("b", 1.22, 1.15, 1.40), ("c", 1.00, 0.95, 1.05)))
    tie = words.fastest_words(a, [b, c], name, among="row")
    assert tie.startswith("the fastest row by median (a: 1.27x AR, range 1.11-1.33), within the range of b (1.22x AR")
    assert "of c" not in tie and tie.endswith("the record does not rank the two")
    apart = words.fastest_words(a, [c], name, among="row")
    assert apart.startswith("the fastest row (a: 1.27x AR") and "apart from every other's (c: 1.00x AR" in apart
    alone = words.fastest_words(a, [], name, among="row")
    assert alone.startswith("the only row (a:") and "fastest" not in alone
    assert "range" not in words.fastest_words({"label": "x", "speedup": 1.1}, [], name, among="row")  # no range: none


def test_best_words_say_by_median_where_the_ranges_overlap(shipped):
    rec = _record()
    text = real.best_words(rec)
    assert "the fastest exact chain row with trained heads at 1 thread by median (DeepSeek D=1, k=2" in text
    assert "within the range of DeepSeek D=1 reused, k=3, reduced vocab (1.22x AR, range 1.15-1.40)" in text
    rec = _record(k3=(1.05, 1.00, 1.10))
    assert "by median" not in real.best_words(rec) and "its range apart" in real.best_words(rec)


def test_best_words_name_a_token_tree_above_the_chains(shipped):
    """A token tree is an exact row with trained heads too; `best_row` ranks the chains (what `generate` decodes by
    default), so a tree of a higher median is said beside it, with whether the ranges set it apart."""
    rec = _record()
    assert "token tree" not in real.best_words(rec)
    tree = {**_row("DeepSeek D=1 tree 2, k=2, reduced vocab", 2, 1.30, 1.20, 1.36), "widths": [2]}
    rec["rows"].append(tree)
    assert real.best_row(rec)["label"] == "DeepSeek D=1, k=2, reduced vocab"  # the chains' best, as before
    text = real.best_words(rec)
    assert ("a token tree beside the chains, DeepSeek D=1 tree 2, k=2, reduced vocab, has a higher median: 1.30x AR, "
            "range 1.20-1.36, overlapping the chain's range") in text
    tree.update(speedup=1.6, speedup_min=1.5, speedup_max=1.7)
    assert "1.60x AR, range 1.50-1.70, above the chain's range" in real.best_words(rec)
    tree.update(speedup=1.1, speedup_min=1.0, speedup_max=1.2)
    assert "token tree" not in real.best_words(rec)  # below the chain's median: nothing to say


def test_best_words_read_the_shipped_record_from_its_ranges():
    """The student's case: whether the row of the highest median in docs/bench/real.json is 'the fastest'
    depends on whether any other exact row's range overlaps its own, computed here from the record, not assumed."""
    rec = real.record()
    if rec is None:
        pytest.skip("no bench real record")
    from mtplab.hf.real import shipped_heads
    if shipped_heads(real.REAL, "deepseek") is None:
        pytest.skip("no shipped heads")
    best = real.best_row(rec)
    others = [r for r in real.exact_rows(rec) if r["label"] != best["label"] and real.heads_note(r) is None]
    ties = [r for r in others if words.overlap(r, best)]
    text = real.best_words(rec)
    assert ("by median" in text) == bool(ties) and all(r["label"] in text for r in ties)


def test_best_row_flags_rows_of_other_heads_and_every_caller_prints_it(shipped):
    rec = _record()
    best = real.best_row(rec)
    assert best["label"] == "DeepSeek D=1, k=2, reduced vocab" and best["other_heads"] is None
    assert "other heads" not in real.best_words(rec) and "other heads" not in real.untrained_words(rec)
    assert real.speedup_parts(rec)["other_heads"] is None and real.record_heads_note(rec, best["label"]) is None
    rec = _record(sha="a" * 64)  # the heads were retrained; the record was not rerun
    best = real.best_row(rec)
    flag = best["other_heads"]
    assert best["label"] == "DeepSeek D=1, k=2, reduced vocab"  # the record's highest, as measured ...
    assert flag == ("DeepSeek D=1, k=2, reduced vocab was measured with other heads (sha256 aaaaaaaaaaaa; the lab "
                    "ships bbbbbbbbbbbb): re-run python -m mtplab bench real --out docs/bench to measure the shipped ones")
    assert flag in real.best_words(rec)  # ... and said, by every caller
    assert flag in real.untrained_words(rec)
    assert real.parts_words(real.speedup_parts(rec)).startswith(flag)
    assert real.record_heads_note(rec, real.label_of("best", rec)) == flag
    rec["rows"][3]["heads_sha256"] = SHIPPED  # one row of the shipped heads: it wins, unflagged, over a faster one
    assert real.best_row(rec)["label"] == "DeepSeek D=1 reused, k=3, reduced vocab"
    assert real.best_row(rec)["other_heads"] is None
    unnamed = _record(sha=None)  # an older record that names no heads
    assert "the record does not name them" in real.best_row(unnamed)["other_heads"]


def test_k_words_add_the_ranges_verdict_to_choose_ks_facts(shipped):
    from types import SimpleNamespace
    rows = tuple(_record()["rows"][2:])
    choice = SimpleNamespace(k=2, source="record", why="k=2, the highest median of the 2 exact rows", rows=rows)
    assert real.k_words(choice) == (choice.why + ": the fastest k by median (k=2: 1.27x AR, range 1.11-1.33), "
                                    "within the range of k=3 (1.22x AR, range 1.15-1.40): the record does not rank the two")
    one = SimpleNamespace(k=2, source="record", why="k=2, the only exact row", rows=rows[:1])
    assert real.k_words(one) == one.why
    assert real.k_words(SimpleNamespace(k=4, source="default", why="k=4, the default", rows=())) == "k=4, the default"


def test_the_answer_line_names_the_row_by_its_median_not_as_the_best():
    from types import SimpleNamespace
    tr = SimpleNamespace(tokens=[1] * 16, forwards=11, tokens_per_forward=16 / 11, num_accepted_tokens=5,
                         num_draft_tokens=10, steps=[])
    line = real.answer_line(tr, None, "deepseek", 2, from_record=True)
    assert line.startswith("deepseek, k=2 (") and "with the highest median" in line and "best" not in line
    line = real.answer_line(tr, None, "deepseek-reuse", 4, from_record=True, stop=0.3)
    assert line.startswith("deepseek-reuse, k=4, confidence stop 0.3 (as generate --hf takes them")


def test_gap_words_print_a_gap_equal_to_the_printed_figures():
    """05 §5 printed 'on 56% ... and on 52% ...: 3 points lower' (0.555 and 0.524): the figures now carry a tenth of
    a point, and the gap is the gap of the figures printed."""
    rec = {"rows": [], "acceptance_all": {"DeepSeek D=1, k=2, reduced vocab": {
        "prompts": 24, "acceptance": {"pooled": {"steps": 1561, "accepted": [735], "rate": [0.4709],
                                                 "interval": [[0.45, 0.50]]}}}}}
    for back, out in ((0.5550725936547768, 0.5239884393063584), (0.5554, 0.5236), (0.73, 0.41)):
        train = {"heads": {"deepseek-d1": {"agreement": {"held_back": [back], "held_out": [out],
                                                          "held_back_prompts": 128, "held_out_prompts": 24}}}}
        text = real.gap_words(real.training_gap(rec, train))
        a, b, gap = map(float, re.search(r"on ([\d.]+)% of the positions.*? on ([\d.]+)% of the 24 .*?: ([\d.]+) points "
                                         r"lower", text).groups())
        assert round(a - b, 1) == gap, text


def test_untrained_words_rank_the_ngram_row_above_every_trained_row_only_where_the_ranges_allow(shipped):
    """The shipped record's n-gram row (1.39x, 1.38-1.49) lies above the best trained row (1.27x, 1.11-1.33), but
    the reused k = 3 row's range (1.15-1.40) reaches into it: 'beats the trained heads' was more than the record
    carries."""
    rec = _record(k3=(1.22, 1.15, 1.40))
    text = real.untrained_words(rec)
    assert "ran 1.39x AR (range 1.38-1.49)" in text and "1.27x with 1.50 (range 1.11-1.33)" in text
    assert "beats that row" in text and "beats the trained heads" not in text
    assert text.endswith("DeepSeek D=1 reused, k=3, reduced vocab (1.22x, range 1.15-1.40) reaches into the n-gram "
                         "row's range, so the record does not rank the drafter that needs no training above every "
                         "trained row")
    rec = _record(k3=(1.22, 1.15, 1.30))  # every trained row's range below the n-gram row's
    assert "beats the trained heads" in real.untrained_words(rec)


def test_study_row_falls_back_to_the_same_heads_at_the_nearest_k_and_says_so():
    """05's default row (the record's best, DeepSeek reused at k=3) was not in the acceptance study (k=2 and k=4),
    and the cell printed a miss: it now reads the same method and vocabulary at the nearest k, with a note."""
    def row(method, k, vocab="reduced", kernel="exact"):
        return {"label": f"{method} k={k} {vocab} {kernel}", "method": method, "k": k, "draft_vocab": vocab,
                "kernel": kernel, "threads": 1}
    rows = [row("deepseek", 2), row("deepseek-reuse", 3), row("deepseek-reuse", 4), row("deepseek-reuse", 6),
            row("deepseek-reuse", 3, kernel="stock"), row("stern", 4)]
    rec = {"rows": rows, "acceptance_all": {rows[0]["label"]: {"prompts": 24}, rows[2]["label"]: {"prompts": 24},
                                            rows[3]["label"]: {"prompts": 24}}}
    got, note = real.study_row(rec, rows[2]["label"])
    assert got["label"] == rows[2]["label"] and note == ""
    got, note = real.study_row(rec, rows[1]["label"])  # k=3: k=4 is nearer than k=6
    assert got["label"] == rows[2]["label"] and "not deepseek-reuse k=3" in note and "k=4" in note
    for miss in (rows[4]["label"], rows[5]["label"], "no such row"):  # another kernel, another method, no row
        got, note = real.study_row(rec, miss)
        assert got is None and "is not in the record's acceptance study" in note


def test_study_row_of_the_shipped_record_answers_05s_default():
    rec = real.record()  # docs/bench/real.json
    got, note = real.study_row(rec, real.label_of("best", rec))
    assert got is not None and got["prompts"] == 24


def test_the_record_caption_speaks_of_bf16_rows_only_where_the_record_has_them():
    """A fresh read (session 56): 01 §6's caption explained 'the bf16 rows' of a record that has none."""
    rec = real.record()
    row = next(r for r in rec["rows"] if r["threads"] == 1)
    caption, rows = real.record_table({**rec, "rows": [row]})
    assert "bf16 rows" not in caption and rows[0]["dtype"] == row.get("dtype", "fp32") != "bf16"
    caption, _ = real.record_table({**rec, "rows": [row, {**row, "dtype": "bf16", "label": row["label"] + ", bf16"}]})
    assert "The bf16 rows give up exactness" in caption


def test_best_words_name_a_confidence_stop_above_the_chains(shipped):
    """A row whose drafts end at the first unsure one is not ranked among the chains (`exact_rows`: k-1 drafts every
    step, whose costs the notebooks take apart); one of a higher median is said beside the best chain."""
    rec = _record()
    stop = {**_row("DeepSeek D=1 reused, k=4, reduced vocab, confidence stop 0.3", 4, 1.45, 1.41, 1.48),
            "adapt": "confidence", "threshold": 0.3}
    rec["rows"].append(stop)
    assert real.best_row(rec)["label"] == "DeepSeek D=1, k=2, reduced vocab"
    assert ("with a confidence stop, DeepSeek D=1 reused, k=4, reduced vocab, confidence stop 0.3, has a higher "
            "median: 1.45x AR, range 1.41-1.48, above the chain's range") in real.best_words(rec)
    stop.update(speedup=1.0, speedup_min=0.9, speedup_max=1.1)
    assert "confidence stop" not in real.best_words(rec)
