"""Where the speedup went: the split and the prediction are computed from the Steps, exactly."""
import json
import math
import statistics

import pytest
from matplotlib.figure import Figure

from mtplab.measuring import speedup, timing
from mtplab.measuring.race import race
from mtplab.measuring.record import Record
from mtplab.measuring.timing import untimed_output
from mtplab.teaching import words
from mtplab import viz
from mtplab.errors import MtplabError
from mtplab.decoding.trace import Step, Trace


def trace(method, k, schedule, steps):
    pre = Step(drafted=[], accepted=0, emitted=[1], bonus=None, bonus_source="none", forwards=1, wall_s=9.0,
               target_s=9.0, prefill=True)  # the prefill: left out of every per-step number
    return Trace(method=method, prompt=[0], k=k, schedule=schedule, steps=[pre] + steps)


def s(n_emit, *, target, draft, wall):
    return Step(drafted=[2] * 3, accepted=n_emit - 1, emitted=[2] * n_emit, bonus=2, bonus_source="target",
                forwards=1, wall_s=wall, target_s=target, draft_s=draft)


def test_speedup_row_splits_measured_time_and_predicts_from_the_curve():
    ar = trace("ar", 1, "ar", [Step(drafted=[], accepted=0, emitted=[3], bonus=None, bonus_source="none", forwards=1,
                                    wall_s=0.012, target_s=0.010)] * 4)
    tr = trace("meta", 4, "overlap", [s(3, target=0.015, draft=0.005, wall=0.024), s(1, target=0.015, draft=0.005,
                                                                                       wall=0.024)])
    row = speedup.speedup_row("meta", tr, ar, {1: 1.0, 4: 1.5})
    assert row["tokens_per_step"] == 2.0 and row["steps"] == 2
    assert row["target_ms"] == pytest.approx(15) and row["draft_ms"] == pytest.approx(5)
    assert row["overhead_ms"] == pytest.approx(4) and row["ar_step_ms"] == pytest.approx(12)
    assert row["draft_cost_t1"] == pytest.approx(0.5)                 # 5 ms of drafter / t(1) = 10 ms
    assert row["predicted"] == pytest.approx(2.0 / (1.5 + 0.5))       # t(4)/t(1) = 1.5, plus the drafter
    assert row["measured"] == pytest.approx(2.0 * 0.012 / 0.024)      # AR ms per token x tokens / ms per step


def test_the_shipped_bench_reads_and_bad_files_give_one_line(tmp_path):
    rows = Record.load("decode").rows
    assert rows and {"method", "speedup_wall", "speedup_predicted"} <= set(rows[0])
    bad = tmp_path / "decode.json"
    bad.write_text("{not json")
    with pytest.raises(MtplabError, match="not valid JSON"):
        Record.load(bad)
    bad.write_text(json.dumps({"rows": None}))
    with pytest.raises(MtplabError, match="no 'rows'"):
        Record.load(bad).table()
    with pytest.raises(MtplabError, match="missing; `python -m mtplab bench decode` writes it"):
        Record.load(tmp_path / "gone" / "decode.json")
    table = viz.markdown_table([{"a": 1.234, "b": [0.5, 0.25]}], ["a", "b"])
    assert "| 1.23 | 0.50 0.25 |" in table


def test_lesson_figures_are_figures():
    row = dict(method="m", target_ms=1.0, draft_ms=0.5, overhead_ms=0.1, ar_step_ms=0.8, predicted=1.2, measured=1.1)
    fig = viz.time_split([row])
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    assert [b.get_height() for b in fig.axes[0].containers[0]] == [1.0]
    fig = viz.pvalue_histogram({"right": [0.1, 0.5, 0.9], "wrong": [0.001, 0.002]})
    assert isinstance(fig, Figure) and "2/2 seeds with p < 0.05" in fig.axes[1].get_title()


def test_paper_table_names_where_each_number_is_stated_and_fills_the_lab_column():
    rows = speedup.paper_table({"meta k=4: wall-clock speedup": "0.94x"})
    assert len(rows) == len(speedup.PAPERS) >= 5
    for r in rows:
        assert r["paper"] and r["paper_value"] and r["why"] and "sources" not in r["paper"].lower()
        assert any(c.isdigit() for c in r["paper"])  # a year at least: a paper, never "the sources"
    meta = next(r for r in rows if r["lab"].startswith("meta"))
    assert meta["lab_value"] == "0.94x"
    assert all(r["lab_value"] == "not measured here" for r in rows if r is not meta)
    papers = " ".join(r["paper"] for r in rows)
    for name in ("Stern", "Gloeckle", "DeepSeek-V3", "Leviathan", "Chen"):
        assert name in papers


def test_a_race_of_calls_warms_up_and_repeats_every_callable_and_gives_one_row_shape():
    """Review finding (design-3, 6.2): one race's result came in five shapes. `RaceResult.row` is the one."""
    calls = {"ar": 0, "x": 0}

    def bump(name):
        def f():
            calls[name] += 1
        return f
    res = race({n: untimed_output(bump(n)) for n in calls}, [None], baseline="ar", rounds=5)
    assert calls == {"ar": 6, "x": 6}  # one warm-up each, then 5 rounds
    row = res.row("x")
    assert set(row) == {"speedup", "speedup_min", "speedup_max", "rounds", "identical", "prompts", "valid", "busy"}
    assert len(row["rounds"]) == 5 and res.row("ar")["speedup"] == pytest.approx(1.0)
    assert row["speedup_min"] <= row["speedup"] <= row["speedup_max"] and row["valid"] == (row["busy"] is None)
    assert "median of 5" in words.range_text(row)


def test_bench_rows_are_matched_by_method_and_checkpoint():
    rec = Record.load("decode")
    row = rec.row(method="deepseek", checkpoint="deepseek-d1")
    assert row is not None and row["label"] == "deepseek D=1"
    assert rec.row(method="deepseek", checkpoint="deepseek-d3")["label"] == "deepseek D=3"
    assert rec.row(method="meta", checkpoint="no-such-checkpoint") is None
    assert words.bench_speedup_text(None) == "not in the benchmark"
    assert "prompts" in rec.source_line()


def test_the_papers_table_names_the_setting_of_each_number():
    stern = speedup.PAPERS[0]
    assert "1.73" in stern["paper_value"] and "1.85" in stern["paper_value"] and "Both" in stern["paper_value"]
    assert "transformer_base" in stern["why"]
    assert "super-resolution" in speedup.PAPERS[1]["paper_value"]
    assert "§3.2" in speedup.PAPERS[2]["paper"]
    assert "D = 1" in speedup.PAPERS[3]["paper"] and "D=1" in speedup.PAPERS[3]["lab"]


def test_the_oracle_gets_one_stream_per_prompt_and_repeat():
    from mtplab.bench.decode import oracle_seed
    seeds = {oracle_seed(r, i) for r in range(3) for i in range(20)}
    assert len(seeds) == 60


def test_per_position_tokens_per_step_is_eq_1_for_a_constant_rate():
    from mtplab.measuring import theory
    assert theory.per_position_tokens_per_step([0.7] * 3) == pytest.approx(theory.expected_tokens_per_step(0.7, 3))
    assert theory.per_position_tokens_per_step([0.6, 0.7, 0.8]) == pytest.approx(1 + 0.6 + 0.42 + 0.336)


def test_decode_bench_row_counts_conditional_acceptance_as_the_trace_does(family_models):
    """bench decode's row reads its conditional rates from `conditional_counts`, the trace's own counts."""
    from mtplab.bench.decode import _row
    from mtplab.decoding.generate import decode_with
    from mtplab.decoding.trace import pooled
    from mtplab.measuring.timing import CostCurve

    model = family_models["stern"]
    traces = [decode_with("blockwise-overlap", model, p, max_new_tokens=24, k=4) for p in ([5, 6, 7], [9, 3, 1, 4])]
    curve = CostCurve(seconds={q: 1e-3 * (1 + 0.1 * q) for q in range(1, 9)}, context=16, device="cpu")
    ar = [decode_with("ar", model, p, max_new_tokens=24) for p in ([5, 6, 7], [9, 3, 1, 4])]
    row = _row("x", "blockwise-overlap", "stern-k4", 4, traces, [1.5], curve, 0, ar)
    assert row["ar_step_ms_target"] > 0
    assert (row["label"], row["method"], row["checkpoint"]) == ("x", "blockwise-overlap", "stern-k4")
    want = pooled(traces).conditional_acceptance
    assert len(row["conditional_acceptance"]) == 3
    for got, w in zip(row["conditional_acceptance"], want):
        assert (math.isnan(got) and math.isnan(w)) or got == pytest.approx(w)
    assert row["accepted"] == pooled(traces).accepted_per_position[:3]
    assert row["tokens_per_forward"] == pooled(traces).tokens_per_forward and row["speedup_wall"] == 1.5
    assert row["acceptance_per_position"] == (pooled(traces).acceptance_rate_per_position + [0.0] * 3)[:3]
    plain = [decode_with("blockwise", model, [5, 6, 7], max_new_tokens=24, k=4)]
    # the plain schedule verifies k-1 = 3 tokens and pays a predict forward: t(3)/t(1) + 1 in the denominator
    tps = _row("p", "blockwise", "stern-k4", 4, plain, [1.0], curve, 0, ar)["tokens_per_step"]
    ratio = curve.seconds[3] / curve.seconds[1]
    assert _row("p", "blockwise", "stern-k4", 4, plain, [1.0], curve, 0, ar)["speedup_predicted"] == pytest.approx(
        tps / (ratio + 1 + statistics.median(s.draft_s for s in plain[0].steps[1:]) / curve.seconds[1]))


def test_measure_batch_races_both_and_checks_the_tokens(monkeypatch):
    from mtplab.decoding.batch import BatchTrace
    from mtplab.decoding.drafters import SternDrafter
    from tests.conftest import random_model

    model = random_model("stern", 3, seed=5).eval()
    rows = timing.measure_batch(model, SternDrafter, [[1, 2, 3], [4, 5]], batch_sizes=(1, 2), max_new_tokens=6, k=3,
                                repeats=2)
    assert [(r["kind"], r["batch_size"]) for r in rows] == [("ar", 1), ("spec", 1), ("ar", 2), ("spec", 2)]
    for r in rows:
        assert r["speedup_min"] <= r["speedup"] <= r["speedup_max"] and r["repeats"] == 2 and "busy" in r
        assert r["tokens_per_s"] > 0 and (r["kind"] == "spec" or r["speedup"] == 1.0)
    assert rows[0]["tokens_per_forward"] == 1.0  # batched AR: one token per row per forward
    real = timing.batched_speculative

    def off_by_one(*a, **kw):
        res = real(*a, **kw)
        res.traces[0].steps[-1].emitted[-1] += 1
        return BatchTrace(res.traces, res.forwards, res.batch_sizes, res.wall_s)
    monkeypatch.setattr(timing, "batched_speculative", off_by_one)
    with pytest.raises(MtplabError, match="batch 1: batched speculative output differs"):
        timing.measure_batch(model, SternDrafter, [[1, 2, 3]], batch_sizes=(1,), max_new_tokens=6, k=3, repeats=1)


@pytest.mark.slow
def test_bench_decode_races_each_pair_against_ar_of_its_own_checkpoint(tmp_path, monkeypatch):
    from argparse import Namespace

    from mtplab.bench import decode
    from mtplab.decoding.drafters import pair
    from mtplab.measuring.record import Record

    monkeypatch.setattr(decode, "ROWS", [pair("blockwise"), pair("oracle alpha=0.8")])
    a = Namespace(device="cpu", dtype="fp32", quick=True, prompts=1, out=str(tmp_path))
    data = decode.run_decode(a)
    assert [(r["label"], r["method"], r["checkpoint"], r["k"]) for r in data["rows"]] == [
        ("blockwise", "blockwise", "stern-k4", 4), ("oracle alpha=0.8", "oracle", "ntp", 4)]
    for r in data["rows"]:
        assert r["greedy_mismatches"] == 0 and len(r["speedup_wall_reps"]) == 2
        assert min(r["speedup_wall_reps"]) <= r["speedup_wall"] <= max(r["speedup_wall_reps"])
        assert r["ar_step_ms_target"] > 0 and 0 < r["drafts_per_step"] <= r["k"] - 1
        assert r["target_over_ar_step"] == pytest.approx(r["step_ms_target"] / r["ar_step_ms_target"])
    assert data["cost_curve_context"] == 48 + 64 // 2  # the decode's mean cache length: prompt + m/2
    assert data["verdict"].startswith(("valid", "not valid here"))
    rec = Record.load(tmp_path / f"{decode.record_name(a)}.json")
    assert rec.row(method="oracle", checkpoint="ntp")["label"] == "oracle alpha=0.8"


def test_live_text_carries_the_busy_verdict():
    live = {"prompts": 2, "speedup": 1.2, "rounds": [1.0] * 5, "max_new_tokens": 16, "speedup_min": 1.0,
            "speedup_max": 1.3, "valid": True, "busy": None}
    assert words.live_text(live).endswith("range 1.00-1.30)") and "median of 5" in words.live_text(live)
    live.update(valid=False, busy="x")
    assert "not valid here: the machine was busy (x)" in words.live_text(live)
