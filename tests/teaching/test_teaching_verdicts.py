"""Notebooks 01-05 choose their verdict words from the numbers: a busy machine first and no verdict, overlapping
ranges or intervals say the run cannot tell, and only separated ones get a word like faster, rises or cheaper."""
from mtplab.decoding.trace import Step, Trace
from mtplab.measuring.timing import CostCurve
from mtplab.measuring.record import Record
from mtplab.teaching import blockwise, bottleneck, deepseek, real

BUSY = "other processes used 1.50 cores on average while it ran"


def _race(valid: bool, lo: float, mid: float, hi: float) -> dict:
    return {"valid": valid, "verdict": "valid: 5 rounds" if valid else f"not valid here: the machine was busy ({BUSY})",
            "speedup": mid, "speedup_min": lo, "speedup_max": hi, "rounds": [lo, mid, hi]}


def test_compare_ms_needs_a_quiet_machine_and_separated_ranges():
    apart = {"int8": [8.0, 9.0, 10.0], "fp32": [12.0, 13.0, 14.0]}
    assert "int8 was faster than fp32" in bottleneck.compare_ms(apart, None)
    busy = bottleneck.compare_ms(apart, BUSY)
    assert busy.startswith("not valid here") and "faster" not in busy
    overlap = {"int8": [8.0, 12.0, 16.0], "fp32": [11.0, 13.0, 14.0]}
    assert "cannot tell them apart" in bottleneck.compare_ms(overlap, None)


def test_race_and_claim_words_put_the_busy_verdict_first():
    bad = bottleneck.race_line(_race(False, 0.6, 0.65, 0.7), 3)
    assert bad.startswith("not valid here") and "slower" not in bad and "faster" not in bad
    assert "faster than plain decoding" in bottleneck.race_line(_race(True, 1.1, 1.2, 1.3), 3)
    assert "within noise" in bottleneck.race_line(_race(True, 0.9, 1.1, 1.3), 3)
    cuts = {"seed article's claim": 0.75, "predicted from measurements": 0.2, "measured wall clock": 0.1}
    words = bottleneck.claim_words(cuts, 1.25, _race(False, 1.0, 1.1, 1.2))
    assert "not valid here" in words and "within 10%" not in words and "below" not in words
    assert "within 10%" in bottleneck.claim_words(cuts, 1.25, _race(True, 1.2, 1.2, 1.3))


def test_curve_flags_name_the_points_where_more_tokens_cost_less():
    assert bottleneck.curve_flags({1: 1.0, 2: 1.1, 4: 1.3}) == ""
    flag = bottleneck.curve_flags({1: 1.0, 2: 1.30, 4: 1.23, 8: 1.73}, "ntp")
    assert "not monotonic" in flag and "t(4)/t(1) = 1.23 below t(2)/t(1) = 1.30" in flag


def _curve(rounds_q4: list[float], busy=None) -> CostCurve:
    samples = {1: [1.0] * len(rounds_q4), 4: rounds_q4}
    return CostCurve({1: 1.0, 4: sorted(rounds_q4)[len(rounds_q4) // 2]}, 128, "cpu", samples, busy)


def test_cheaper_to_verify_only_when_rounds_separate_and_no_curve_is_busy():
    a, b = _curve([1.1, 1.2, 1.3]), _curve([1.6, 1.7, 1.8])
    assert "a is the cheaper one" in bottleneck.cheaper_to_verify({"a": a, "b": b}, 4)
    assert "cannot tell" in bottleneck.cheaper_to_verify({"a": a, "b": _curve([1.25, 1.7, 1.8])}, 4)
    busy = bottleneck.cheaper_to_verify({"a": a, "b": _curve([1.6, 1.7, 1.8], busy=BUSY)}, 4)
    assert busy.startswith("not valid here") and "cheaper one" not in busy


def _size(n_layer, n_embd, mb, ratio, fits=True):
    return {"n_layer": n_layer, "n_embd": n_embd, "weight_bytes": int(mb * 1e6), "weight_mb": mb, "fits_in_llc": fits,
            "ratio": {"4": ratio}}


def test_regime_lines_compare_every_row_and_flag_noise():
    live = [_size(4, 256, 13, 3.51), _size(12, 256, 38, 1.19), _size(12, 768, 341, 1.90, fits=False)]
    shipped = [_size(4, 256, 13, 1.32), _size(12, 256, 38, 1.30), _size(12, 768, 341, 1.77, fits=False),
               _size(24, 768, 680, 1.49, fits=False)]
    lines = bottleneck.regime_lines(live, shipped, None, shipped_kernel="stock", live="stock")
    assert lines[0].startswith("the race's guard passed") and "is not monotonic in the weights" in lines[1]
    assert any("13 MB row (3.51)" in ln and "noisy" in ln for ln in lines)
    assert not any("38 MB row" in ln for ln in lines)  # 1.19 against 1.30: within a quarter
    assert "the models that fit were cheaper to verify" in lines[-1] and "stock kernel" in lines[-1]
    other = bottleneck.regime_lines(live, shipped, None, shipped_kernel="stock", live="exact")
    row = next(ln for ln in other if "13 MB row (3.51)" in ln)  # another kernel is named, not called noise
    assert "noisy" not in row and "the record ran the stock kernel, this run the exact one" in row
    busy = bottleneck.regime_lines(live, shipped, BUSY)
    assert busy[0].startswith("not valid here") and "monotonic" not in busy[1]


def test_depth_words():
    row = lambda n, m, lo, hi: {"n_layer": n, "tokens_per_forward": 2.37, "speedup": m, "speedup_min": lo,
                                "speedup_max": hi}
    apart = [row(4, 1.0, 0.8, 1.2), row(12, 1.6, 1.5, 1.8)]
    assert "deeper trunk is where these heads pay more" in bottleneck.depth_words(apart, None)
    assert "cannot tell" in bottleneck.depth_words([row(4, 1.0, 0.7, 1.3), row(12, 1.4, 1.2, 1.6)], None)
    assert "pay" not in bottleneck.depth_words(apart, BUSY)


def test_rise_count_counts_only_separated_intervals():
    counts = {"a": [(50, 100), (95, 100)], "b": [(50, 100), (12, 20)], "c": [(80, 100), (10, 40)]}
    line = blockwise.rise_count(counts)
    assert "for 1 of 3 (method, k): a" in line and "falls, intervals apart, for 1 (c)" in line
    assert "for 1 the two intervals overlap" in line


def test_bench_rise_line_does_not_call_prompt_lookup_trained():
    line = blockwise.bench_rise_line()
    assert "trained drafters" not in line and "ngram is prompt lookup, not trained" in line


def _step(n_drafted, accepted):
    return Step(drafted=list(range(n_drafted)), accepted=accepted, emitted=[0] * (accepted + 1), bonus=0,
                bonus_source="correction", forwards=1)


def test_length_from_conditionals_explains_short_steps():
    prefill = Step(drafted=[], accepted=0, emitted=[0], bonus=None, bonus_source="target", forwards=1)
    full = Trace(method="x", prompt=[1], steps=[prefill, _step(3, 3), _step(3, 1), _step(3, 0)])
    assert "so the two agree" in deepseek.length_from_conditionals(full)
    cut = Trace(method="x", prompt=[1], steps=[prefill, _step(3, 3), _step(3, 1), _step(1, 1)])
    line = deepseek.length_from_conditionals(cut)
    assert "1 of 3 drafting steps drafted fewer than 3" in line


def test_05_live_lines_rank_nothing_when_busy_or_tied():
    live = lambda m, lo, hi, ok=True: ({"speedup": m, "speedup_min": lo, "speedup_max": hi, "valid": ok,
                                        "busy": None if ok else "x"}, None)
    lives = {"a": live(1.5, 0.8, 2.4), "b": live(1.2, 1.1, 1.3, ok=False)}
    assert "ranks no method" in bottleneck.live_fastest_line(lives)
    assert "is read against its prediction" in bottleneck.prediction_line(lives, {"a": 1.2, "b": 1.0})
    assert "NOT VALID" in bottleneck.busy_marker(lives)
    quiet = {"a": live(1.5, 1.4, 1.6), "b": live(1.2, 1.1, 1.3)}
    assert "the fastest was a" in bottleneck.live_fastest_line(quiet)
    assert "above it (the prediction's inputs, timed apart from the race, were off): a" in \
        bottleneck.prediction_line(quiet, {"a": 1.2, "b": 1.2})
    tie = bottleneck.fastest_line({"ngram": (1.65, 1.48, 1.68), "deepseek D=3": (1.63, 1.57, 1.76),
                                   "meta": (1.31, 1.25, 1.33)}, "In the benchmark")
    assert "ties within the ranges with deepseek D=3" in tie and "meta" not in tie


def test_bench_speedups_leave_the_oracle_out():
    rows = [{"label": "oracle", "method": "oracle alpha=0.8", "speedup_wall": 2.1},
            {"label": "ngram", "method": "ngram", "speedup_wall": 1.6, "speedup_wall_reps": [1.5, 1.7]}]
    assert bottleneck.bench_speedups(rows) == {"ngram": (1.6, 1.5, 1.7)}


def test_real_live_words_invalidation_first():
    row = {"speedup": 0.65, "speedup_min": 0.61, "speedup_max": 0.69}
    bad = real.live_words({"valid": False, "verdict": "not valid here: busy"}, row)
    assert bad.startswith("not valid here") and "slower" not in bad
    assert "slower than AR" in real.live_words({"valid": True, "verdict": "valid"}, row)


def test_why_shipped_differs_reads_the_record():
    line = bottleneck.why_shipped_differs(prompts=3, tokens=32, rounds=5)
    assert "this run 3 x 32" in line
    gap = bottleneck.kernel_gap(Record.load("decode").kernel())  # decode.json predates the exact kernel: 'stock'
    assert (gap in line) and (gap == "") == (bottleneck.live_kernel() == Record.load("decode").kernel())


def test_the_shared_words_live_in_one_module():
    """Review finding (design-3, 6.2): busy_line, _busy, _overlap, spread, NOT_VALID and three 'is the range above 1'
    verdicts were written per companion. They live in `teaching.words`, and no companion defines them again."""
    import ast
    from pathlib import Path
    from mtplab.measuring.race import NOT_VALID
    from mtplab.teaching import words
    # (classroom.spread is another function: one row's speedup across machines' records, not a timing's range)
    shared = {"busy_line", "overlap", "_overlap", "NOT_VALID", "rate_text", "compare_rates", "verdict_words",
              "range_text", "live_text", "range_words"}
    for path in Path(words.__file__).parent.rglob("*.py"):
        if path.name == "words.py":
            continue
        tree = ast.parse(path.read_text())
        names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        names |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        assert not names & shared, (path.name, names & shared)
    assert words.NOT_VALID is NOT_VALID and not hasattr(bottleneck, "spread")
    assert words.overlap({"speedup_min": 1.0, "speedup_max": 1.2}, (1.1, 1.5)) and not words.overlap([1, 2], [3, 4])
    assert words.range_words(1.2, 1.1, 1.3).startswith("faster than AR here")
    assert words.range_words(0.9, 0.8, 0.95).startswith("slower than AR here")
    assert "spans 1" in words.range_words(1.0, 0.9, 1.1)
    assert words.busy_line("x", "t") == "t: " + NOT_VALID.format(why="x")


def test_busy_line_never_says_no_other_load_where_the_load_was_not_read(monkeypatch):
    """Review of 07 (session 56): a valid race whose load could not be read (no psutil) printed 'the guard saw no
    other load'; it now says the load was not measured."""
    from mtplab.measuring.race import NOT_MEASURED
    from mtplab.teaching import words
    monkeypatch.setattr(words, "cpu_seconds", lambda: (1.0, 2.0))  # a machine whose load can be read
    assert words.busy_line(None, "t") == "t: valid (the busy-machine guard saw no other load)"
    monkeypatch.setattr(words, "cpu_seconds", lambda: None)  # one whose load cannot (no psutil)
    line = words.busy_line(None, "t")
    assert NOT_MEASURED in line and "no other load" not in line and line.startswith("t: valid by the rounds' spread")


def test_lineage_words_count_the_last_phase_and_the_whole_record():
    from mtplab.model import checkpoint
    words = blockwise.lineage_words("stern-k4")
    metas = [checkpoint.read_info(p)["meta"] for p in ("stern-k4-l4", "stern-k4")]
    assert words.startswith(f"{metas[1]['steps']} steps on {metas[1]['tokens']:,} tokens in its last phase")
    assert "continuing the heads of 'stern-k4-l4'" in words
    assert f"{sum(m['tokens'] for m in metas):,} tokens over the whole record" in words
    assert "whole record" not in blockwise.lineage_words("draft")  # trained from scratch: one phase


def test_03_head_comparison_says_apart_only_when_the_numbers_separate(tmp_path):
    import json
    from mtplab import paths
    from mtplab.teaching import meta
    pairs = {"stern-k4": "blockwise-overlap", "meta-k4": "meta"}
    data = json.loads((paths.BENCH_DIR / "decode.json").read_text())
    rows = [r for r in data["rows"] if (r.get("checkpoint"), r.get("method")) in pairs.items()]
    assert len(rows) == 2
    for r, (acc, reps) in zip(rows, (([400, 300, 200], [1.6, 1.7, 1.8]), ([100, 50, 20], [1.1, 1.2, 1.3]))):
        r.update(drafting_steps=410, accepted=acc, speedup_wall_reps=reps, speedup_wall=reps[1])
    apart = tmp_path / "apart.json"
    apart.write_text(json.dumps(data))
    text = "\n".join(meta.compare_lines(pairs, apart))
    assert text.count("(95% intervals apart)") == 3 and "the ranges are apart" in text
    for r in rows:
        r.update(accepted=[200, 150, 100], speedup_wall_reps=[1.1, 1.5, 1.9])
    tied = tmp_path / "tied.json"
    tied.write_text(json.dumps(data))
    text = "\n".join(meta.compare_lines(pairs, tied))
    assert "apart" not in text and text.count("(95% intervals overlap)") == 3 and "the ranges overlap" in text
    assert "a size, not a verdict" in text


def test_04_first_draft_words_give_a_direction_only_when_intervals_separate():
    from mtplab.measuring.acceptance import wilson
    row = lambda k, n: {"all steps": {"kept": k, "n": n, "rate": k / n if n else float("nan"), "interval": wilson(k, n)}}
    tied = deepseek.first_draft_words({"d1": row(51, 70), "d3": row(30, 48)}, "d1", "d3")
    assert "cannot tell the two apart" in tied and "lower" not in tied
    assert "d3's is lower, the 95% intervals apart" in deepseek.first_draft_words(
        {"d1": row(90, 100), "d3": row(30, 100)}, "d1", "d3")
    assert "no drafting step" in deepseek.first_draft_words({"d1": row(0, 0), "d3": row(3, 5)}, "d1", "d3")


def test_06_loop_story_names_the_loops_only_when_there_are_some(monkeypatch):
    from mtplab.teaching import sampling
    runs, est = {"T=0.0": [], "T=1.0": []}, {"T=0.0": 0.6, "T=1.0": 0.6}
    for side, looping, want, never in (
            ("inside", 0, "none of the 6 continuations loops", "although"),
            ("inside", 2, "although 2 of 6 continuations loop", "none of"),
            ("above", 0, "not one the loops made", "inflation is measured"),
            ("above", 2, "with 2 of 6 continuations looping: the inflation is measured here", "none of")):
        monkeypatch.setattr(sampling, "_side", lambda trs, e, side=side: side)
        monkeypatch.setattr(sampling, "loop_split", lambda trs, n=looping: {"looping": n, "continuations": 6})
        line = sampling.loop_story_line(runs, est, "T=0.0", "T=1.0")
        assert want in line and never not in line
