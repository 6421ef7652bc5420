"""Notebook 04's D = 1 against D = 3 in words: when the live run separates them and the shipped benchmark ranks them
the other way, the words say so (the student's finding 9: the live and the record rankings flipped, unsaid)."""
from mtplab.teaching.deepseek import d1_against_d3



def _live(m, lo, hi):  # a live race row, in the fields of both race readers (median/min/max and speedup_*)
    return dict(busy=None, valid=True, speedup=m, speedup_min=lo, speedup_max=hi, median=m, min=lo, max=hi)


L1, L3 = _live(1.23, 1.22, 1.25), _live(1.15, 1.04, 1.20)


def test_a_record_that_ranks_them_the_other_way_is_named():
    b1 = dict(speedup_wall=1.47, speedup_wall_reps=[1.45, 1.47, 1.50])
    b3 = dict(speedup_wall=1.63, speedup_wall_reps=[1.60, 1.63, 1.66])
    text = d1_against_d3((164, 105), (L1, L3), (b1, b3))
    assert "live, gained less time" in text and "ranks them the other way (1.63x for D = 3 against 1.47x" in text


def test_a_record_that_agrees_or_cannot_rank_says_so():
    b1 = dict(speedup_wall=1.47, speedup_wall_reps=[1.45, 1.50])
    assert "ranks them the same way" in d1_against_d3((164, 105), (L1, L3), (b1, dict(speedup_wall=1.2)))
    assert "does not rank them" in d1_against_d3((164, 105), (L1, L3), (b1, dict(speedup_wall=1.48)))
    assert "no row for both" in d1_against_d3((164, 105), (L1, L3), (b1, None))


def test_notebook_03s_target_times_are_read_against_the_records_own_curve(tmp_path):
    """Finding 26: three k = 4 rows on one trunk with different target times, and no sentence; now the words name the
    spread and the side of the record's t(4) they lie on, from the record."""
    import json
    from mtplab.teaching import meta
    rec = {"t1_ms": 8.0, "cost_curve": {"1": 1.0, "4": 1.5}, "rows": []}
    (tmp_path / "decode.json").write_text(json.dumps(rec))
    fams = [{"method": "a", "k": 4, "step_ms_target": 10.0}, {"method": "b", "k": 4, "step_ms_target": 8.0}]
    text = meta.target_time_words(fams, tmp_path / "decode.json")
    assert "a 10.00, b 8.00 (25% apart)" in text and "t(4) = 12.00 ms, every row below it" in text
    fams[0]["step_ms_target"] = 13.0
    assert "the rows on both sides" in meta.target_time_words(fams, tmp_path / "decode.json")
