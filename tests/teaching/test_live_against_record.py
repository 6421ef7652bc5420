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
