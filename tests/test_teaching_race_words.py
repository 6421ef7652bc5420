"""Notebook 05 §3's prediction read against its own race (`sections.prediction_lines`), and the differences between
a live race and a record named from the record's fields (`words.apart_words`, notebooks 04 and 09)."""
from mtplab.teaching.acceptance_lab import sections
from mtplab.teaching import words


def _row(name, predicted, round0, lo, hi, verify=1.3, overhead=0.1):
    return {"method": name, "predicted": predicted, "round0": round0, "live_range": f"{lo:.2f}-{hi:.2f}",
            "target_ms": 4.0, "draft_ms": 1.0, "overhead_ms": overhead, "q": 4, "verify_cost": verify}


def _lives(rows, valid=True):
    return {r["method"]: ({"valid": valid, "busy": None if valid else "load", "verdict": "v",
                           "speedup_min": float(r["live_range"][:4]), "speedup_max": float(r["live_range"][5:])}, None)
            for r in rows}


def test_prediction_lines_say_why_from_their_own_numbers():
    rows = [_row("a", 1.20, 1.19, 1.10, 1.30),            # inside
            _row("b", 1.60, 1.58, 1.20, 1.40),            # above, and its own round was fast: round against rounds
            _row("c", 1.60, 1.20, 1.10, 1.30, verify=0.9)]  # above, its own round far off: an untimed cost
    lines = sections.prediction_lines(rows, _lives(rows))
    assert lines[0] == "prediction inside the live range of 1 of 3 rows (a)"
    assert "b: predicted 1.60x above" in lines[1] and "faster than the race's other rounds" in lines[1]
    assert "c: predicted 1.60x above" in lines[2] and "a cost in that round the split does not time" in lines[2]
    assert "at or below 1 for c" in lines[3]
    busy = sections.prediction_lines(rows, _lives(rows, valid=False))
    assert len(busy) == 1 and "not valid" in busy[0]


def test_apart_words_name_the_kernel_and_the_machine_from_the_record():
    rec = {"machine": {"cpu": "Some Other CPU", "llc": "1 MiB"}}  # no kernel field: an old record, stock
    text = words.apart_words(rec, live="2 prompts x 24 tokens", recorded="8 prompts x 128 tokens")
    assert text.startswith("what differs: the decodes (2 prompts x 24 tokens here, 8 prompts x 128 tokens")
    assert "Some Other CPU" in text
    from mtplab.model import kernels
    assert ("stock in the record" in text) == kernels.active()
    b = 1.6
    assert words.agree({"speedup_min": 1.0, "speedup_max": 1.2}, {"speedup_wall": b}, text).endswith(text)
