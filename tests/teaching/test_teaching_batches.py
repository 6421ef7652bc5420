"""Notebook 07's companion (mtplab.teaching.batches): verdict words computed from the rows, checkers that never
print the expected value."""
import pytest

from mtplab.decoding.tree import nodes_per_depth
from mtplab.errors import MtplabError
from mtplab.teaching import batches


def _row(B, median, lo, hi, tpf=2.0, kind="spec"):
    return {"kind": kind, "batch_size": B, "speedup": median, "speedup_min": lo, "speedup_max": hi,
            "tokens_per_forward": tpf, "valid": True, "busy": None}


def test_trend_words_follow_the_numbers():
    assert batches.trend(0.78, 0.86) == "grew"
    assert batches.trend(0.90, 0.75) == "shrank"
    assert batches.trend(0.85, 0.86) == "stayed about the same"
    with pytest.raises(MtplabError, match="must be positive"):
        batches.trend(0.0, 1.0)


def test_a_speedup_that_grew_is_never_called_shrinking():
    """Review finding: 'why the speedup shrinks' beside 0.78x -> 0.86x. The verdict now reads the rows."""
    rows = [_row(1, 0.78, 0.75, 0.80), _row(8, 0.86, 0.84, 0.90), _row(1, 1.0, 1.0, 1.0, kind="ar")]
    last = batches.batch_lines(rows, {1: 1.34, 8: 1.37}, "blockwise-overlap")[-1]
    assert "grew (0.78x -> 0.86x)" in last and "shrank" not in last and "do not overlap" in last
    noisy = batches.batch_lines([_row(1, 0.90, 0.83, 0.94), _row(8, 0.75, 0.69, 0.89)], {}, "m")[-1]
    assert "shrank" in noisy and "cannot tell" in noisy


def test_batch_lines_give_the_rule_and_the_shipped_row():
    lines = batches.batch_lines([_row(4, 1.2, 1.1, 1.3, tpf=2.4)], {4: 1.2}, "meta",
                                shipped={4: {"speedup": 1.44}}, predict=True)
    assert "predicts 2.00x" in lines[0] and "batch-quick.json: 1.44x" in lines[0]
    hidden = batches.batch_lines([_row(4, 1.2, 1.1, 1.3, tpf=2.4)], {4: 1.2}, "meta")
    assert "predicts" not in hidden[0] and "t(k)/t(1)" not in hidden[0]  # exercise 2's answer stays hidden
    assert "paid in every round: 4" in lines[1]
    with pytest.raises(MtplabError, match="no speculative rows"):
        batches.batch_lines([_row(1, 1.0, 1.0, 1.0, kind="ar")], {}, "meta")


def test_ratio_text_flags_a_ratio_below_one():
    assert "barely moves" in batches.ratio_text({1: 1.34, 8: 1.37})
    assert "climbs" in batches.ratio_text({1: 1.1, 8: 1.6})
    assert "busy" in batches.ratio_text({1: 0.42, 8: 1.32})
    assert "busy" not in batches.ratio_text({1: 1.34, 8: 1.37})
    with pytest.raises(MtplabError, match="no cost ratios"):
        batches.ratio_text({})


def test_a_ratio_below_one_across_the_kernel_switch_is_named_as_two_kernels_not_a_busy_machine():
    """bench batch --quick on a Xeon (session 56): t(4)/t(1) 0.58-0.73 at B = 16 on every trunk, run alone. One token
    a row is 16 rows (the exact kernel), four tokens a row 64 (the stock one): two kernels, not a disturbed timing."""
    from mtplab.model import kernels
    assert kernels.kernel_for(16) == ("exact" if kernels.active() else "stock") and kernels.kernel_for(64) == "stock"
    text = batches.ratio_text({1: 1.5, 16: 0.66}, {1: ("exact", "exact"), 16: ("exact", "stock")})
    assert "At B = 16 the two forwards ran different kernels" in text and "busy" not in text
    assert "busy" in batches.ratio_text({1: 0.66, 16: 0.7}, {1: ("exact", "exact"), 16: ("exact", "stock")})
    spec, ar = {**_row(16, 1.3, 1.2, 1.4), "kernel": "stock"}, {**_row(16, 1, 1, 1, kind="ar"), "kernel": "exact"}
    assert "part of this speedup is the kernel" in batches.batch_lines([spec, ar], {}, "m")[0]
    assert "kernel" not in batches.batch_lines([{**spec, "kernel": "exact"}, ar], {}, "m")[0]


def test_tree_lines_say_within_noise_when_the_ranges_overlap():
    t = {"chain": {"speedup": 0.92, "speedup_min": 0.55, "speedup_max": 1.50, "rounds": [1.0] * 5, "busy": None},
         "tree": {"speedup": 0.94, "speedup_min": 0.61, "speedup_max": 1.72, "rounds": [1.0] * 5, "busy": None}}
    lines = batches.tree_lines({"chain": 1.1, "tree": 1.65}, {"chain": 4, "tree": 16}, t, widths=(3, 2, 1),
                               prompts=1, tokens=24)
    assert "within noise of the chain" in lines[-1] and "1.50x the chain's tokens per forward" in lines[-1]
    t["tree"] = {"speedup": 1.3, "speedup_min": 1.2, "speedup_max": 1.4, "rounds": [1.0] * 5, "busy": None}
    t["chain"] = {"speedup": 1.0, "speedup_min": 0.9, "speedup_max": 1.1, "rounds": [1.0] * 5, "busy": None}
    assert "faster than" in batches.tree_lines({"chain": 1.1, "tree": 1.65}, {"chain": 4, "tree": 16}, t,
                                               widths=(3, 2, 1), prompts=2, tokens=24)[-1]


def test_checkers_accept_the_right_answers():
    assert batches.check_tree_width(lambda w: 1 + sum(nodes_per_depth(w)))
    assert batches.check_batch_speedup(lambda tpf, c: tpf / c)


@pytest.mark.parametrize("fn, words", [
    (lambda w: 1 + sum(w), "wrong on a case like widths (3, 2, 1)"),
    (lambda w: sum(nodes_per_depth(w)), "count it"),
    (lambda w: None, "return a number"),
    (lambda w: 1 / 0, "ZeroDivisionError"),
])
def test_tree_width_checker_names_the_case_not_the_answer(fn, words):
    verdict = batches.check_tree_width(fn)
    assert not verdict and words in verdict.why
    for w in batches.TREES:  # the expected value of the failing case is never printed
        assert f"expected {1 + sum(nodes_per_depth(w))}" not in verdict.why


@pytest.mark.parametrize("fn, words", [
    (lambda tpf, c: tpf * c, "multiplied by the cost"),
    (lambda tpf, c: tpf - c, "wrong on a case like 2.0 tokens per row-forward at t(k)/t(1) = 1.5"),
    (lambda tpf, c: "fast", "return a number"),
])
def test_batch_checker_names_the_case_not_the_answer(fn, words):
    verdict = batches.check_batch_speedup(fn)
    assert not verdict and words in verdict.why
    for tpf, c in batches.BATCH_CASES:
        assert f"{tpf / c:.3f}" not in verdict.why and f"{tpf / c:.2f}" not in verdict.why


def test_a_busy_race_says_so():
    rows = [_row(1, 0.9, 0.8, 1.0), dict(_row(8, 0.7, 0.6, 0.8), valid=False, busy="x")]
    assert any("not valid here" in line and "B = 8" in line for line in batches.batch_lines(rows, {}, "m"))
    assert not any("not valid" in line for line in batches.batch_lines(rows[:1], {}, "m"))
    t = {"chain": {"speedup": 1.0, "speedup_min": 0.9, "speedup_max": 1.1, "rounds": [1.0] * 5, "busy": None},
         "tree": {"speedup": 1.2, "speedup_min": 0.5, "speedup_max": 1.9, "rounds": [1.0] * 5, "busy": "x"}}
    assert batches.tree_lines({"chain": 1.1, "tree": 1.6}, {"chain": 4, "tree": 16}, t, widths=(3, 2, 1), prompts=1,
                              tokens=24)[-1].startswith("not valid here: the machine was busy (x)")


def test_the_prediction_waits_for_exercise_2_and_says_busy_first():
    """Review finding: 07 printed exercise 2's formula before the exercise, and blamed a gap on the drafter's cost
    while the race was marked busy."""
    rows = [_row(1, 0.82, 0.73, 1.20, tpf=1.14), dict(_row(8, 0.67, 0.55, 0.74, tpf=1.97), valid=False, busy="x")]
    ratios = {1: 1.43, 8: 1.33}
    before = batches.prediction_lines(rows, ratios, "m", lambda tpf, c: None)
    assert len(before) == 1 and "not solved" in before[0] and "0.80" not in before[0]
    after = batches.prediction_lines(rows, ratios, "m", lambda tpf, c: tpf / c)
    assert after[0].startswith("not valid here") and "B = 8" in after[0]
    assert "predicts 0.80x" in after[1] and "inside the measured range" in after[1]
    assert "predicts 1.48x" in after[2] and "above the measured range" in after[2] and "busy" in after[2]
    assert "leaves out" not in after[2]
    calm = batches.prediction_lines([dict(r, valid=True, busy=None) for r in rows], ratios, "m", lambda tpf, c: tpf / c)
    assert "leaves out" in calm[-1] and not any("not valid" in x for x in calm)


def test_the_summary_carries_the_verdicts_of_its_sections():
    """Review finding: 07's summary said 'shrank' without the overlap and the busy flag, and dropped the tree's flag."""
    rows = [_row(1, 0.82, 0.73, 1.20), dict(_row(8, 0.67, 0.55, 0.74), valid=False, busy="x")]
    t = {"chain": {"speedup": 0.93, "speedup_min": 0.80, "speedup_max": 1.20, "rounds": [1.0] * 5, "busy": "x"},
         "tree": {"speedup": 1.21, "speedup_min": 0.82, "speedup_max": 1.34, "rounds": [1.0] * 5, "busy": "x"}}
    kw = dict(summary={"chain": 1.26, "tree": 1.85}, width={"chain": 4, "tree": 16}, timed=t, widths=(3, 2, 1))
    batch, tree = batches.summary_lines(rows, {1: 1.43, 8: 1.33}, "m", show_width=False, **kw)
    assert batch.startswith("m: not valid here") and "cannot tell the two batch sizes apart" in batch
    assert tree.startswith("not valid here") and "within noise of the chain" in tree and "16" not in tree
    assert "a verify width of 16" in batches.summary_lines(rows, {1: 1.43, 8: 1.33}, "m", show_width=True, **kw)[1]
    hidden = batches.tree_lines(kw["summary"], kw["width"], t, widths=(3, 2, 1), prompts=1, tokens=24, show_width=False)
    assert "16" not in hidden[1] and "verify width of 4" in hidden[0] and hidden[2].startswith("not valid here")
