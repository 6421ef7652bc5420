"""Notebook 05 §3's time split read against itself (`teaching.bottleneck.split_words`): the win rule applied to the
table's own columns, the prefill that a short decode's race counts and the split does not, the spread of AR's step
and the overhead's share decide the words."""
from mtplab.teaching.bottleneck import split_words


def _row(method, tps, target, draft, over, ar, measured, **kw):
    return dict(method=method, tokens_per_step=tps, target_ms=target, draft_ms=draft, overhead_ms=over,
                ar_step_ms=ar, measured=measured, **kw)


def test_the_rule_on_the_tables_own_columns():
    lines = split_words([_row("meta k=4", 1.57, 9.22, 1.09, 0.08, 8.75, 0.91)])
    assert "meta k=4 1.32x (race: 0.91x)" in lines[0]  # 1.57 x 8.75 / 10.39, the student's finding 8
    assert "overhead was 1% of a step" in lines[1]
    assert "larger than the overhead and than the spread" in lines[-1]


def test_the_prefill_pulls_a_short_decode_toward_one():
    rows = [_row("deepseek k=4", 2.75, 11.0, 2.81, 0.11, 9.36, 1.24, prefill_ms=60.0, ar_prefill_ms=60.0, tokens=12,
                 steps=4)]
    lines = split_words(rows)
    whole = (60 + 11 * 9.36) / (60 + 4 * 13.92)
    assert f"deepseek k=4 {whole:.2f}x" in lines[1] and "with the prefill counted" in lines[1]
    assert "prefill counted" in lines[-1]


def test_a_gap_within_the_spread_of_ars_step_is_called_timing():
    rows = [_row("a", 2.0, 8.0, 1.0, 0.1, 6.5, 1.30), _row("b", 2.0, 8.0, 1.0, 0.1, 9.4, 1.95)]
    assert "within how far one decode's timings moved" in split_words(rows)[-1]
    rows = [_row("a", 2.0, 8.0, 1.0, 0.1, 6.5, 1.428)]
    assert "the split and the race agree" in split_words(rows)[-1]
    assert split_words([]) == ["no timed row to read the split against"]
