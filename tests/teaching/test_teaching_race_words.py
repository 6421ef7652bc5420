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
    assert len(busy) == 2 and "not valid" in busy[0]  # the verify line is still printed, marked busy
    assert busy[1].startswith("the verify forward") and "c q=4 0.90" in busy[1] and "busy race" in busy[1]


def test_the_exact_kernel_blocks_and_its_dips_are_its_own(monkeypatch):
    from mtplab.model import kernels
    from mtplab.teaching import bottleneck
    monkeypatch.setattr(kernels, "ROWS", 3)  # a CPU without AVX-512
    assert [bottleneck.kernel_blocks(q) for q in (1, 4, 5, 8, 12, 13, 16)] == [
        [2], [2, 2], [3, 2], [3, 3, 2], [3] * 4, [3, 3, 3, 2, 2], [3, 3, 3, 3, 2, 2]]
    assert "q = 8 runs as 3 blocks (3 + 3 + 2 rows)" in bottleneck.exact_curve_words({1: 1.0, 4: 1.1, 8: 1.3})
    assert "q = 2..3 each run as one block (of 2 or 3 rows" in bottleneck.exact_curve_words({1: 1.0, 2: 1.0, 3: 1.1})
    monkeypatch.setattr(kernels, "ROWS", 8)  # AVX-512
    assert [bottleneck.kernel_blocks(q) for q in (1, 4, 5, 8, 12, 13, 16)] == [
        [2], [4], [8], [8], [8, 4], [8, 8], [8, 8]]
    text = bottleneck.exact_curve_words({1: 1.0, 2: 1.1, 4: 1.2, 8: 1.3, 16: 2.1})
    assert "q = 2..8 each run as one block (of 2, 4 or 8 rows" in text and "q = 16 runs as 2 blocks (8 + 8" in text
    wide = bottleneck.exact_curve_words({1: 1.0, 8: 1.3, 16: 2.1, 64: 5.0})
    assert "q = 16 runs as 2 blocks" in wide and "q = 64, above 16 rows, run the stock kernel" in wide
    kc = {"busy": None, "ratio": {k: {1: (1.0, 1.0, 1.0), 2: (0.92, 0.9, 0.94), 4: (1.1, 1.0, 1.2)}
                                  for k in ("stock", "exact")},
          "t1_ms": {"stock": 1.0, "exact": 1.0}, "row0": {}, "status": "stock kernel"}
    lines = bottleneck.kernel_lines(kc)
    dips = [line for line in lines if "below t(1)/t(1)" in line]
    assert "blocking depends on the number of rows" in dips[0]  # the stock kernel
    assert "not the kernel's blocking" in dips[1] and "blocking depends" not in dips[1]  # the exact one


def test_a_busy_exact_curve_gets_its_blocking_but_no_cause():
    """Issue 40: 01 §6 explained SmolLM2's busy-run t(2)/t(1) = 1.76 as per-row work, above all attention; on a
    busy machine the rise is not read, so the words keep the blocking and give it no cause."""
    from mtplab.teaching import bottleneck
    ratio = {1: 1.0, 2: 1.76, 4: 1.75, 8: 1.91}
    assert "per-row work: the block's multiply-adds, and attention" in bottleneck.exact_curve_words(ratio)
    busy = bottleneck.exact_curve_words(ratio, busy="other processes used 1.2 cores")
    assert "each run as one block" in busy and "per-row work" not in busy
    assert busy.endswith("the rise itself is given no cause here: the curve was timed on a busy machine")


def test_t1_words_say_how_much_the_context_explains():
    from mtplab.model.config import ModelConfig
    from mtplab.teaching import bottleneck
    cfg = ModelConfig()
    want = bottleneck.t1_words(cfg, 1.0, 256, 1.0, 40)  # measured 1.00x: nothing to explain
    assert "does not explain" in want
    bytes_x = float(want.split("adds bytes for ")[1][:4])
    half = bottleneck.t1_words(cfg, 1 + 2 * (bytes_x - 1), 256, 1.0, 40)  # twice the gap the bytes give
    import re
    share = int(re.search(r"explains about (\d+)% of the gap from 1", half).group(1))
    assert 45 <= share <= 55  # bytes_x is rounded to 2 decimals, so about half, not exactly
    assert "explains it (about" in bottleneck.t1_words(cfg, bytes_x, 256, 1.0, 40)


def test_forwards_not_seconds_finds_a_pair_that_shows_it():
    from mtplab.teaching import bottleneck
    rows = [{"label": "a", "tokens_per_forward": 2.4}, {"label": "b", "tokens_per_forward": 2.1},
            {"label": "c", "tokens_per_forward": 1.5}]
    speed = {"a": (1.6, 1.5, 1.7), "b": (1.7, 1.65, 1.8), "c": (1.2, 1.1, 1.3)}
    text = bottleneck.forwards_not_seconds(rows, speed)
    assert text.startswith("in the benchmark a made 2.40 tokens per forward at 1.60x, b fewer, 2.10, at 1.70x")
    assert "overlap" in text
    speed["b"] = (1.5, 1.45, 1.55)  # now speed follows tokens per forward
    assert "does not show it" in bottleneck.forwards_not_seconds(rows, speed)


def test_apart_words_name_the_kernel_and_the_machine_from_the_record():
    rec = {"machine": {"cpu": "Some Other CPU", "llc": "1 MiB"}}  # no kernel field: an old record, stock
    text = words.apart_words(rec, live="2 prompts x 24 tokens", recorded="8 prompts x 128 tokens")
    assert text.startswith("what differs: the decodes (2 prompts x 24 tokens here, 8 prompts x 128 tokens")
    assert "Some Other CPU" in text
    from mtplab.model import kernels
    assert ("stock in the record" in text) == kernels.active()
    b = 1.6
    assert words.agree({"speedup_min": 1.0, "speedup_max": 1.2}, {"speedup_wall": b}, text).endswith(text)


def test_the_step_time_climb_is_read_from_the_steps():
    """01 §2: the sentence under the step-time figure is computed from the figure's own traces (first quarter of the
    steps against the last, the prefill left out), so a run in which the no-cache decode did not climb says so."""
    from mtplab.decoding.trace import Step, Trace
    from mtplab.teaching import bottleneck

    def trace(times):
        tr = Trace(method="ar", prompt=[1], k=1, schedule="ar")
        one = dict(drafted=[], accepted=0, emitted=[1], bonus=1, bonus_source="target", forwards=1)
        tr.steps = [Step(**one, prefill=True, wall_s=9.0)] + [Step(**one, wall_s=t) for t in times]
        return tr
    runs = {"no cache": trace([0.001 * (10 + i) for i in range(8)]), "KV cache": trace([0.002] * 8)}
    words = bottleneck.climb_words(runs)
    assert "no cache 10.50 -> 16.50 ms (+57%)" in words and "KV cache 2.00 -> 2.00 ms (+0%)" in words
    assert "9000" not in words  # the prefill is left out
    assert "too few steps (3)" in bottleneck.climb_words({"short": trace([0.001] * 3)})
    assert "its first steps were not timed" in bottleneck.climb_words({"untimed": trace([0.0] * 8)})
    assert "busy machine: others used 1.2 cores" in bottleneck.climb_words(runs, "others used 1.2 cores")
