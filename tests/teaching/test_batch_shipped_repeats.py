"""Notebook 07 names the shipped batch row's repeats from the record, not a fixed "(1 repeat)" (issue 40)."""
from mtplab.teaching import batches


def _row(B, repeats=None):
    row = {"kind": "spec", "batch_size": B, "speedup": 1.2, "speedup_min": 1.1, "speedup_max": 1.3,
           "tokens_per_forward": 2.0, "valid": True, "busy": None}
    return row if repeats is None else dict(row, repeats=repeats)


def test_the_shipped_row_says_its_own_repeats():
    line = lambda shipped: batches.batch_lines([_row(4)], {}, "m", shipped={4: shipped})[0]  # noqa: E731
    assert "batch-quick.json: 1.44x (3 repeats)" in line({"speedup": 1.44, "repeats": 3})
    assert "(1 repeat)" in line({"speedup": 1.44, "repeats": 1})
    assert "(repeats not recorded)" in line({"speedup": 1.44})
