"""The acceptance lab's state machine, driven without a browser, on small random models.

The models are injected into the lab's ModelCache under the checkpoint names the methods ask for, so
these tests need no trained checkpoint; one test loads a saved checkpoint by name through the cache.
"""
import html
import statistics
import types
import os
import subprocess
import sys

import pytest
import torch

from mtplab.model import checkpoint as ckpt
from mtplab.teaching.acceptance_lab import session, state as lab_state
from mtplab.teaching.acceptance_lab.session import decoded
from mtplab import viz
from mtplab.teaching.acceptance_lab import view as lab_view
from mtplab.decoding import generate
from mtplab.decoding.trace import Step
from tests.conftest import random_model

PROMPT = "def add(a, b):\n"


@pytest.fixture(scope="module")
def models():
    # noisy random models, seeds picked so that on PROMPT some steps keep every draft and others reject
    return session.ModelCache(models={
        ("ntp", "cpu"): random_model(seed=0),
        ("draft", "cpu"): random_model(seed=5),
        ("stern-k4", "cpu"): random_model("stern", 4, seed=4, noise=2.0),
        ("meta-k4", "cpu"): random_model("meta", 4, seed=5, noise=1.0),
        ("deepseek-d1", "cpu"): random_model("deepseek", 2, seed=3),
    })


def state(**kw):
    base = dict(method="blockwise-overlap", k=4, prompt=PROMPT, device="cpu", max_new_tokens=24)
    base.update(kw)
    return lab_state.LabState(**base)


def check_matches_trace(st):
    """Every revealed record says what the trace's step says, and its labels follow the accept rule."""
    assert len(st.records) == st.shown
    for i, (r, s) in enumerate(zip(st.records, st.trace.steps)):
        assert r.index == i
        assert list(r.drafted) == s.drafted and r.accepted == s.accepted and list(r.emitted) == s.emitted
        assert r.rejected == len(s.drafted) - s.accepted
        drafts = [t for t in r.tokens if t.kind in ("accepted", "rejected", "discarded")]
        assert [t.token for t in drafts] == s.drafted
        assert [t.kind for t in drafts] == (["accepted"] * s.accepted + ["rejected"] * (s.accepted < len(s.drafted))
                                            + ["discarded"] * max(0, len(s.drafted) - s.accepted - 1))
        bonus = [t for t in r.tokens if t.kind.startswith("bonus") or t.kind == "prefill"]
        if s.bonus is None:
            assert bonus == []
        elif i == 0:  # the prefill's token has its own colour: no draft was checked, it is no bonus
            assert [t.kind for t in r.tokens] == ["prefill"] and r.tokens[0].token == s.bonus
        else:
            assert [t.token for t in bonus] == [s.bonus]
            assert bonus[0].kind == {"target": "bonus-target", "correction": "bonus-correction"}[s.bonus_source]
        # the chips, in order, are exactly what the step committed plus what it threw away
        kept = [t.token for t in r.tokens if t.kind in ("prefill", "predict", "accepted") or t.kind.startswith("bonus")]
        assert kept == s.emitted
    so_far = st.trace_so_far
    assert so_far.tokens == [t for s in st.trace.steps[:st.shown] for t in s.emitted]
    assert so_far.num_accepted_tokens == sum(r.accepted for r in st.records)


def test_import_does_not_pull_ipywidgets():
    code = "import sys, mtplab, mtplab.teaching.acceptance_lab.view; sys.exit('ipywidgets' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], env={**os.environ, "OMP_NUM_THREADS": "1"}).returncode == 0


def test_step_record_labels():
    rejected = viz.step_record(3, Step(drafted=[10, 11, 12, 13], accepted=1, emitted=[10, 99], bonus=99,
                                            bonus_source="correction", forwards=1))
    assert rejected.kinds == ["accepted", "rejected", "discarded", "discarded", "bonus-correction"]
    assert rejected.rejected == 3 and rejected.tokens[-1].token == 99
    all_kept = viz.step_record(1, Step(drafted=[32, 10], accepted=2, emitted=[32, 10, 65], bonus=65,
                                            bonus_source="target", forwards=1))
    assert all_kept.kinds == ["accepted", "accepted", "bonus-target"]
    assert [t.label for t in all_kept.tokens] == ["␣", "\\n", "A"]
    plain = viz.step_record(2, Step(drafted=[1, 2], accepted=2, emitted=[7, 1, 2], bonus=None, bonus_source="none",
                                         forwards=2, predict_token=7))
    assert plain.kinds == ["predict", "accepted", "accepted"]


def test_stepping_reveals_the_trace_one_step_at_a_time(models):
    st = state()
    assert st.trace is None and st.records == [] and st.shown == 0
    st = lab_state.step(decoded(st, models))
    assert st.error == "" and st.shown == 1 and st.total_steps > 3
    assert st.device_name == "cpu" and st.checkpoint_name == "stern-k4" and st.model_k == 4
    check_matches_trace(st)
    trace = st.trace
    for n in range(2, 5):
        st = lab_state.step(st)
        assert st.trace is trace and st.shown == n  # stepping reveals; it does not decode again
        check_matches_trace(st)
    st = lab_state.run_all(st)
    assert st.trace is not None and st.shown == st.total_steps
    check_matches_trace(st)
    assert lab_state.step(st).shown == st.total_steps  # past the end stays at the end
    assert lab_state.step(state()).shown == 0 and lab_state.run_all(state()).trace is None  # nothing to reveal
    # the lab shows the same decode the CLI glue produces, and greedy speculative output equals AR
    direct = generate.decode_with("blockwise-overlap", models.get("stern-k4", "cpu"), list(PROMPT.encode()),
                                  max_new_tokens=24, k=4)
    assert st.trace.tokens == direct.tokens
    assert [s.accepted for s in st.trace.steps] == [s.accepted for s in direct.steps]
    assert st.baseline.method == "ar" and st.baseline.tokens == st.trace.tokens
    kinds = {k for r in st.records for k in r.kinds}
    assert {"accepted", "rejected", "discarded", "bonus-correction"} <= kinds  # the noisy heads do get rejected
    st = lab_state.reset(st)
    assert st.trace is None and st.shown == 0 and st.k == 4 and st.prompt == PROMPT


def test_changing_k_or_method_starts_a_fresh_decode(models):
    st = lab_state.step(decoded(state(), models), 3)
    assert st.trace.k == 4
    same = lab_state.configure(st, k=4)
    assert same is st  # no change, nothing dropped
    st2 = lab_state.configure(st, k=2)
    assert st2.trace is None and st2.shown == 0
    st2 = lab_state.run_all(decoded(st2, models))
    assert st2.trace.k == 2 and max(len(s.drafted) for s in st2.trace.steps) == 1
    check_matches_trace(st2)
    st3 = lab_state.run_all(decoded(lab_state.configure(st2, method="meta", k=3), models))
    assert st3.trace.method == "meta" and st3.checkpoint_name == "meta-k4"
    assert max(len(s.drafted) for s in st3.trace.steps) == 2
    check_matches_trace(st3)
    plain = lab_state.run_all(decoded(lab_state.configure(st3, method="blockwise", k=4), models))
    assert plain.trace.schedule == "plain" and any(r.predict_token is not None for r in plain.records)
    check_matches_trace(plain)
    ar = lab_state.run_all(decoded(lab_state.configure(st3, method="ar"), models))
    assert ar.baseline is ar.trace and all(r.kinds == ["bonus-target"] for r in ar.records[1:])
    assert ar.records[0].kinds == ["prefill"]
    ds = lab_state.run_all(decoded(lab_state.configure(st3, method="deepseek", k=2), models))
    assert ds.model_k == 2 and ds.checkpoint_name == "deepseek-d1"
    dm = lab_state.configure(st3, method="draft-model", k=3, temperature=0.8, seed=1)
    dm = lab_state.run_all(decoded(dm, models))
    assert dm.error == "" and dm.trace.method == "draft-model"
    check_matches_trace(dm)


@pytest.mark.parametrize("change, words", [
    (dict(prompt=""), "prompt is empty"),
    (dict(k=5), "k=5 is larger than stern-k4 supports for blockwise-overlap (at most 4)"),
    (dict(k=0), "k must be"),
    (dict(temperature=-0.5), "temperature must be >= 0"),
    (dict(temperature=float("nan")), "temperature must be >= 0"),
    (dict(method="meta", checkpoint="stern-k4"), "needs a checkpoint with meta heads"),
    (dict(method="deepseek", k=3), "at most 2"),
    (dict(method="oracle", temperature=0.5), "greedy-only"),
    (dict(method="nope"), "unknown method"),
    (dict(max_new_tokens=0), "max_new_tokens must be"),
    (dict(max_new_tokens=500), "context window"),
    (dict(checkpoint="no-such-checkpoint"), "not found"),
    (dict(device="tpu"), "unknown device"),
    (dict(prompt="x" * (lab_state.MAX_PROMPT_CHARS + 1)), f"more than the lab takes ({lab_state.MAX_PROMPT_CHARS}"),
    (dict(prompt="def f(\ud800"), "not text (at position 6)"),
    (dict(seed=2 ** 64), "seed must be an integer from 0 to 2**63 - 1"),
    (dict(seed=-1), "seed must be an integer from 0 to 2**63 - 1"),
    (dict(temperature=float("inf")), "temperature must be >= 0 and finite"),
])
def test_bad_input_gives_a_message_not_an_exception(models, change, words):
    good = lab_state.run_all(decoded(state(), models))
    bad = lab_state.step(decoded(lab_state.configure(good, **change), models))
    assert words in bad.error
    assert bad.trace is None and bad.records == [] and bad.shown == 0
    assert lab_view.status_text(bad).startswith("⚠") and words in lab_view.status_text(bad)
    fixed = lab_state.configure(bad, **{n: getattr(good, n) for n in change})
    fixed = lab_state.step(decoded(fixed, models))
    assert fixed.error == "" and fixed.shown == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present, so device='cuda' is not an error here")
def test_missing_cuda_is_a_message(models):
    st = lab_state.step(decoded(state(device="cuda"), models))
    assert "CUDA is not available" in st.error and st.trace is None


def test_model_cache_loads_checkpoints_by_name(tmp_path, monkeypatch):
    monkeypatch.setattr(ckpt, "CHECKPOINT_DIR", tmp_path)
    ckpt.save(random_model("meta", 3, seed=4), tmp_path / "meta-k4")
    cache = session.ModelCache()
    st = lab_state.run_all(decoded(state(method="meta", k=3), cache))
    assert st.error == "" and st.model_k == 3 and list(cache.models) == [("meta-k4", "cpu")]
    assert cache.get("meta-k4", "cpu") is cache.models[("meta-k4", "cpu")]  # loaded once


def test_figures_follow_the_revealed_steps(models):
    st = lab_state.step(decoded(state(), models), 4)
    fig = viz.acceptance_figure(st.trace_so_far, max_drafts=3)
    steps_ax, cond_ax = fig.axes
    accepted_bars = steps_ax.containers[1]
    assert [b.get_height() for b in accepted_bars] == [s.accepted for s in st.trace.steps[:4]]
    cond = st.trace_so_far.conditional_acceptance
    assert [b.get_height() for b in cond_ax.containers[0]][:len(cond)] == pytest.approx(
        [0.0 if c != c else c for c in cond])
    st = lab_state.run_all(st)
    speed = viz.speed_figure(st.trace, st.baseline, device_name="cpu")
    tpf_ax, wall_ax, split_ax = speed.axes
    assert [b.get_height() for b in tpf_ax.containers[0]] == pytest.approx(
        [st.baseline.tokens_per_forward, st.trace.tokens_per_forward])
    assert [b.get_height() for b in wall_ax.patches] == pytest.approx(
        [1000 * st.baseline.wall_s, 1000 * st.trace.wall_s])
    assert "cpu" in wall_ax.get_title() and "median of 1" in wall_ax.get_title()


def test_timing_is_the_median_of_interleaved_repeats_with_its_range(models):
    st = lab_state.run_all(decoded(state(repeats=3), models))
    assert st.error == "" and [len(v) for v in st.walls.values()] == [3, 3]
    assert set(st.walls) == {"ar", "blockwise-overlap"} and set(st.splits) == {"ar", "blockwise-overlap"}
    for who, split in st.splits.items():
        assert set(split) == {"target_s", "draft_s", "rest_s"} and split["target_s"] > 0
        assert sum(split.values()) <= max(st.walls[who]) * 1.01  # the parts lie inside the synced wall clock
    assert st.splits["ar"]["draft_s"] == 0 and st.splits["blockwise-overlap"]["draft_s"] > 0
    speed = viz.speed_figure(st.trace, st.baseline, device_name="cpu", walls=st.walls, splits=st.splits)
    tpf_ax, wall_ax, split_ax = speed.axes
    assert [b.get_height() for b in wall_ax.patches] == pytest.approx(
        [1000 * statistics.median(st.walls[n]) for n in ("ar", "blockwise-overlap")])
    assert "median of 3" in wall_ax.get_title()
    lo, hi = wall_ax.containers[0].lines[2][0].get_segments()[0][:, 1]  # the range bar of AR: min .. max
    assert (lo, hi) == pytest.approx((1000 * min(st.walls["ar"]), 1000 * max(st.walls["ar"])))
    stacked = [b.get_height() for b in split_ax.patches]  # ar, method for target, drafter, rest in turn
    assert stacked[:2] == pytest.approx([1000 * st.splits[n]["target_s"] for n in ("ar", "blockwise-overlap")])
    assert [t.get_text() for t in split_ax.get_legend().get_texts()] == ["target", "drafter", "rest"]
    bad = lab_state.step(decoded(state(repeats=0), models))
    assert "repeats must be" in bad.error


def test_the_lab_syncs_the_device_before_every_clock_read(models, monkeypatch):
    """On a GPU a forward returns before its kernels finish: each of the lab's own clock reads comes after a
    sync of the decode's device (counted here with a fake sync on the CPU)."""
    import mtplab.device as device_mod
    calls = []
    monkeypatch.setattr(device_mod, "sync", lambda dev: calls.append(str(dev)))
    reads = []
    real = device_mod.time.perf_counter  # the one clock (mtplab.device.now), used by the race and the loop alike
    monkeypatch.setattr(device_mod, "time", types.SimpleNamespace(perf_counter=lambda: reads.append(len(calls)) or real()))
    st = lab_state.run_all(decoded(state(repeats=2), models))
    assert st.error == "" and len(reads) >= 2 * 4  # at least two clock reads a decode, 2 pairs
    assert all(n > 0 for n in reads) and reads == sorted(reads)
    assert len(calls) == len(reads) and set(calls) == {"cpu"}  # one sync right before every read


def test_widget_renders_state_and_shows_errors(models):
    pytest.importorskip("ipywidgets")
    lab = lab_view.AcceptanceLab(models=models, method="blockwise-overlap", k=4, prompt=PROMPT, device="cpu",
                          max_new_tokens=24)
    assert "not decoded yet" in lab.status.value and "mtplab-tok" not in lab.tokens.value
    empty_chart = lab.accept_chart.value
    lab.buttons["step"].click()
    lab.buttons["step"].click()
    assert lab.state.shown == 2 and "step 2/" in lab.status.value and "device cpu" in lab.status.value
    n_chips = sum(len(r.tokens) for r in lab.state.records)
    assert lab.tokens.value.count("class='mtplab-tok ") == n_chips
    assert lab.tokens.value.count("mtplab-step-row") == 2
    assert lab.accept_chart.value != empty_chart and lab.speed_chart.value
    lab.controls["k"].value = 9  # what typing into the k box does
    assert lab.state.trace is None and lab.state.k == 9
    lab.buttons["step"].click()
    assert "⚠" in lab.status.value and "at most 4" in lab.status.value
    assert "mtplab-tok" not in lab.tokens.value
    lab.set(k=2).buttons["run"].click()
    assert lab.state.error == "" and lab.state.trace is not None and lab.state.shown == lab.state.total_steps
    assert lab.controls["k"].value == 2
    assert lab.tokens.value.count("mtplab-step-row") == lab.state.total_steps  # every row, in a scroll box
    lab.controls["prompt"].value = ""
    lab.buttons["run"].click()
    assert "prompt is empty" in lab.status.value
    lab.buttons["reset"].click()
    assert lab.state.error == "" and "not decoded yet" in lab.status.value


def test_back_hides_steps_and_forward_shows_the_same_records(models):
    st = lab_state.step(decoded(state(), models), 5)
    ahead = st.records
    st = lab_state.back(st, 2)
    assert st.shown == 3 and st.records == ahead[:3]
    check_matches_trace(st)
    st = lab_state.step(st, 2)
    assert st.records == ahead  # the same decode: stepping back then forward changes nothing
    assert lab_state.back(st, 99).shown == 0 and lab_state.back(st, 99).trace is st.trace


def test_sampled_steps_record_p_q_and_u_that_explain_every_verdict(models):
    st = lab_state.run_all(decoded(state(method="draft-model", k=4, temperature=1.0, seed=1, max_new_tokens=40), models))
    assert st.error == ""
    verdicts = []
    for r in st.records[1:]:
        drafts = [t for t in r.tokens if t.kind in ("accepted", "rejected", "discarded")]
        for t in drafts:
            if t.kind == "discarded":  # never examined: no draw
                assert t.draw is None
                continue
            p, q, u = t.draw
            assert 0 <= p <= 1 and 0 < q <= 1 and 0 <= u < 1
            assert (u < min(1.0, p / q)) == (t.kind == "accepted")
            verdicts.append(t.kind)
        if r.drafted:
            assert "p(d)=" in lab_view.draws_text(r)
    assert "accepted" in verdicts and "rejected" in verdicts  # the seed shows both verdicts
    greedy = lab_state.run_all(decoded(state(), models))
    assert all(t.draw is None for r in greedy.records for t in r.tokens)


@pytest.mark.parametrize("settings, words", [
    (dict(method="bogus"), "unknown method 'bogus'"),
    (dict(prompt=""), "prompt is empty"),
    (dict(k=2.5), "k must be an integer >= 1 (got 2.5)"),
    (dict(checkpoint="/no/such/dir/x.safetensors"), "not found"),
    (dict(temperature="hot"), "temperature must be >= 0"),
])
def test_the_lab_built_with_bad_settings_shows_the_message_and_does_not_raise(models, settings, words):
    pytest.importorskip("ipywidgets")
    base = dict(method="blockwise-overlap", k=4, prompt=PROMPT, device="cpu", max_new_tokens=24)
    lab = lab_view.AcceptanceLab(models=models, **{**base, **settings})
    lab.step(2)
    assert words in lab.state.error and words in html.unescape(lab.status.value) and lab.state.trace is None
    good = {**base, "temperature": 0.0, "checkpoint": "default"}
    lab.set(**{n: good[n] for n in settings}).step()
    assert lab.state.error == "" and lab.state.shown == 1


def test_the_lab_loads_a_checkpoint_given_by_path(models, tmp_path):
    pytest.importorskip("ipywidgets")
    from mtplab.model.toy import random_model as make
    path = tmp_path / "mine.safetensors"
    ckpt.save(make(vocab_size=256, seed=0), path)
    lab = lab_view.AcceptanceLab(method="ar", k=1, prompt=PROMPT, device="cpu", max_new_tokens=8, checkpoint=str(path))
    lab.step()
    assert lab.state.error == "" and lab.state.checkpoint_name == str(path) and lab.state.shown == 1


def test_projector_mode_draws_larger_chips_and_charts(models):
    pytest.importorskip("ipywidgets")
    lab = lab_view.AcceptanceLab(models=models, method="blockwise-overlap", k=4, prompt=PROMPT, device="cpu",
                          max_new_tokens=24).step(2)
    small_html, small_png = lab.tokens.value, lab.accept_chart.value
    lab.projector_toggle.value = True
    assert "font-size:24px" in lab.tokens.value and "font-size:24px" not in small_html
    assert len(lab.accept_chart.value) > len(small_png)


def test_token_colours_are_one_distinct_map():
    assert set(viz.COLORS) == set(viz.KINDS) == set(viz.LEGEND)
    assert len(set(viz.COLORS.values())) == len(viz.KINDS)
    # the widget's chips draw from the same map as the figures (this assert was `COLORS is COLORS`, which cannot fail)
    for kind in viz.KINDS:
        chip = lab_view._chip(viz.TokenView(token=104, label="h", kind=kind), projector=False)
        assert f"background:{viz.COLORS[kind]};" in chip and f"mtplab-{kind}'" in chip


def test_wilson_interval_contains_the_rate_and_narrows_with_n():
    from mtplab.measuring.acceptance import wilson
    lo, hi = wilson(3, 4)
    assert lo < 0.75 < hi
    lo2, hi2 = wilson(300, 400)
    assert lo < lo2 < 0.75 < hi2 < hi
    assert wilson(0, 5)[0] == 0.0 and wilson(5, 5)[1] == 1.0


def test_steps_table_and_step_kinds_number_steps_as_the_trace(models):
    tr = lab_state.run_all(decoded(state(method="blockwise", k=4), models)).trace
    table = viz.steps_table(tr).splitlines()
    assert len(table) == 2 + len(tr.steps) and "prefill" in table[2]
    for line, s in zip(table[2:], tr.steps):
        assert line.split()[:2] == [str(tr.steps.index(s)), str(s.forwards)]
    assert any("(correction)" in line for line in table)  # the glossary's word, never 'fix'
    fig = viz.step_kinds(tr)
    ax = fig.axes[0]
    totals = [0] * len(tr.steps)
    for bars in ax.containers:
        totals = [t + b.get_height() for t, b in zip(totals, bars)]
    assert totals == [len(s.emitted) + len(s.drafted) - s.accepted for s in tr.steps]  # nothing clipped or lost
    assert ax.get_ylim()[1] > max(totals)


# ---------------------------------------------------------------------------------- issue 20: a lecture hall
def test_a_new_sample_changes_a_sampled_decode_and_reset_replays_it(models):
    st = lab_state.step(decoded(state(method="draft-model", temperature=1.0, seed=3), models), 5)
    again = lab_state.step(decoded(lab_state.reset(st), models), 5)
    assert again.trace.tokens == st.trace.tokens and again.seed == 3  # Reset: the same seed, the same sample
    new = lab_state.new_sample(st)
    assert new.seed == 4 and new.trace is None and new.shown == 0  # the next seed; the view decodes it
    new = decoded(new, models)
    assert new.error == "" and new.trace.tokens != st.trace.tokens  # another sample
    greedy = lab_state.step(decoded(state(), models), 3)
    assert decoded(lab_state.new_sample(greedy), models).trace.tokens == greedy.trace.tokens  # T = 0: the same


def test_jump_shows_exactly_n_steps(models):
    st = lab_state.jump(decoded(state(), models), 3)
    assert st.shown == 3 and st.trace is not None
    assert lab_state.jump(decoded(st, models), 10**6).shown == st.total_steps
    assert lab_state.jump(decoded(st, models), -4).shown == 0


def test_k_is_clamped_with_a_note_when_the_method_changes(models):
    st = session.change(state(method="meta", k=4), models, method="deepseek")
    assert st.k == 2 and "k set to 2" in st.note and "deepseek-d1" in st.note and st.error == ""
    st = lab_state.run_all(decoded(st, models))
    assert st.error == "" and st.trace.k == 2 and st.note  # the note stays with the decode it explains
    same = session.change(state(method="meta", k=3), models, method="blockwise-overlap")
    assert same.k == 3 and same.note == ""  # k fits: nothing to say
    assert "not found" in lab_state.step(decoded(session.change(state(), models, checkpoint="nope"), models)).error


def test_an_absurd_k_is_refused_before_anything_is_drawn_or_allocated(models):
    pytest.importorskip("ipywidgets")
    import tracemalloc
    tracemalloc.start()
    for method in ("meta", "ngram"):  # a head limit, and no limit but the context window
        lab = lab_view.AcceptanceLab(models=models, method=method, k=10**9, prompt=PROMPT, device="cpu",
                                     max_new_tokens=24)
        assert "k=1000000000 is larger than" in lab.state.error and lab.state.trace is None
        lab.step()
        assert "k=1000000000" in lab.state.error and "⚠" in lab.status.value
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 200 * 2**20  # it used to ask for 24 GB (a chart with k-1 bars)
    fig = viz.acceptance_figure(None, max_drafts=10**9)
    assert len(fig.axes[1].patches) <= 16


def test_method_auto_is_read_from_the_benchmark_record():
    from pathlib import Path
    from mtplab.measuring.record import Record
    data = {"device": "cpu", "threads": 1, "rows": [  # flat rows: method, checkpoint and k as fields
        {"method": "meta", "checkpoint": "meta-k4", "k": 4, "speedup_wall": 0.85, "tokens_per_forward": 2.1},
        {"method": "deepseek", "checkpoint": "deepseek-d3", "k": 4, "speedup_wall": 1.4, "tokens_per_forward": 2.0},
        {"method": "oracle", "checkpoint": "ntp", "k": 4, "speedup_wall": 3.0, "tokens_per_forward": 3.0},
        {"method": "blockwise-overlap", "checkpoint": "stern-k4", "k": 4, "speedup_wall": 1.3,
         "tokens_per_forward": 2.6}]}
    record = Record("decode", Path("decode.json"), data)
    d = session.choose_demo(record, "cpu")
    assert (d["method"], d["k"], d["checkpoint"]) == ("deepseek", 4, "deepseek-d3")  # the oracle is no demo
    assert "1.40x" in d["note"] and "cpu, 1 thread" in d["note"]
    d = session.choose_demo(record, "cuda (NVIDIA H200)")  # measured elsewhere: wall clock says nothing here
    assert d["method"] == "blockwise-overlap" and "not on cuda" in d["note"]
    data["machine"] = {"cpu": "Some CPU", "device": "cuda (NVIDIA H200)", "threads": 16}
    assert session.choose_demo(record, "cuda (NVIDIA H200)")["method"] == "deepseek"
    assert "Some CPU" in session.choose_demo(record, "cuda (NVIDIA H200)")["note"]
    # the shipped record, read at start-up: its fastest row on its own device
    shipped = Record.load("decode")
    d = session.default_demo("cpu")
    if shipped.device().startswith("cpu"):
        best = max((r for r in shipped.rows if r["method"] not in ("oracle", "ar")), key=lambda r: r["speedup_wall"])
        assert (d["method"], d["k"], d["checkpoint"]) == (best["method"], best["k"], best["checkpoint"])
    st = session.resolve_auto(lab_state.LabState(method="auto", device="cpu"))
    assert st.method == d["method"] and st.k == d["k"] and st.note == d["note"]
    broken = session.default_demo("cpu", path="/no/such/decode.json")
    assert broken["method"] == lab_state.DEMO["method"] and "/no/such/decode.json" in broken["note"]


def test_the_recorded_decode_is_the_decode_and_explains_each_rejection(models):
    st = lab_state.run_all(decoded(state(), models))
    direct = generate.decode_with("blockwise-overlap", models.get("stern-k4", "cpu"), list(PROMPT.encode()),
                                  max_new_tokens=24, k=4)
    assert st.trace.tokens == direct.tokens and direct.steps[1].verify_row is None  # probe off: nothing kept
    assert all(s.verify_row is not None for s in st.trace.steps[1:])  # the lab decodes with probe=True
    seen = 0
    model = models.get("stern-k4", "cpu")
    for i, s in enumerate(st.trace.steps):
        ins = lab_state.inside(st, i)
        if i == 0 or s.accepted == len(s.drafted):
            assert ins is None
            continue
        seen += 1
        (t1, l1), (t2, l2) = ins.top2
        assert t1 == s.bonus and ins.gap == pytest.approx(l1 - l2) and ins.gap >= 0  # the correction is the argmax
        assert ins.draft == s.drafted[s.accepted] and ins.draft_rank >= 2
        # the recorded row is what a fresh forward over the same tokens gives
        before = st.trace.prompt + [t for x in st.trace.steps[:i] for t in x.emitted] + s.drafted[:s.accepted]
        with torch.no_grad():
            fresh = model(torch.tensor([before])).logits[0, -1]
        assert torch.allclose(fresh, s.verify_row, atol=1e-4)
    assert seen >= 2
    row = lab_view.tokens_html(st)
    assert row.count("mtplab-top2") == seen and "logit gap" in row


@pytest.mark.parametrize("method, name, k", [("blockwise", "stern-k4", 4), ("meta", "meta-k4", 4),
                                             ("deepseek", "deepseek-d1", 2)])
def test_the_probe_keeps_the_decisive_verify_row_in_both_schedules(models, method, name, k):
    """iter_steps(probe=True): each verifying step keeps the verify forward's row that predicts its rejected draft,
    or the bonus (plain schedule, every draft kept: the row of its last draft), as a fresh forward computes it;
    the tokens are AR's."""
    model = models.get(name, "cpu")
    ids = list(PROMPT.encode())
    tr = generate.decode_with(method, model, ids, max_new_tokens=20, k=k, probe=True)
    assert tr.tokens == generate.decode_with("ar", model, ids, max_new_tokens=20).tokens
    done, checked = list(ids), 0
    for i, s in enumerate(tr.steps):
        if i == 0 or (not s.drafted and s.bonus is None):  # the prefill, plain's predict-only step: no verify
            assert s.verify_row is None
        else:
            plain_all_kept = tr.schedule == "plain" and s.drafted and s.accepted == len(s.drafted)
            head = done + ([s.predict_token] if s.predict_token is not None else [])
            before = head + s.drafted[:s.accepted - 1 if plain_all_kept else s.accepted]
            with torch.no_grad():
                fresh = model(torch.tensor([before])).logits[0, -1]
            assert s.verify_row is not None and torch.allclose(fresh, s.verify_row, atol=1e-4)
            assert s.q is None  # greedy heads: one-hot on their drafts
            checked += 1
        done += s.emitted
    assert checked >= 3


def test_a_sampled_correction_shows_p_q_u_large_and_the_residual(models):
    st = lab_state.run_all(decoded(state(method="draft-model", temperature=1.0, seed=1, max_new_tokens=40), models))
    corrections = [i for i, s in enumerate(st.trace.steps) if s.bonus_source == "correction"]
    assert corrections
    for i in corrections:
        ins = lab_state.inside(st, i)
        assert ins is not None and not ins.greedy and ins.residual
        rows = {t: (p, q, r) for t, p, q, r in ins.rows}
        s = st.trace.steps[i]
        assert s.bonus in rows and rows[s.bonus][2] > 0  # the correction lies in the residual's support
        assert all(r >= 0 and (r == 0) == (p <= q) for p, q, r in rows.values())  # norm(max(0, p - q))
        p_d, q_d = rows[ins.draft][:2]
        assert (p_d, q_d) == pytest.approx(s.draws[s.accepted][:2], abs=1e-5)  # the same p(d), q(d) the rule used
    page = lab_view.tokens_html(st, projector=True)
    assert page.count("mtplab-residual") == len(corrections) and "font-size:22px" in page
    assert "u=<b>" in page and "p(d)=<b>" in page  # large and bold, not a hover title


def test_the_view_has_seed_slider_keys_and_per_step_time(models):
    pytest.importorskip("ipywidgets")
    lab = lab_view.AcceptanceLab(models=models, method="draft-model", k=4, prompt=PROMPT, device="cpu",
                                 max_new_tokens=24, temperature=1.0, repeats=2)
    lab.buttons["step"].click()
    assert lab.slider.value == 1 and lab.slider.max == lab.state.total_steps
    lab.slider.value = 4  # the slider (or its typed readout) jumps
    assert lab.state.shown == 4 and "step 4/" in lab.status.value
    first = lab.state.trace.tokens
    lab.buttons["new_sample"].click()
    assert lab.state.seed == 1 and lab.controls["seed"].value == 1 and lab.state.trace.tokens != first
    assert lab.state.shown == 4 and lab.slider.value == 4
    lab.controls["seed"].value = 0
    lab.step(4)
    assert lab.state.trace.tokens == first
    assert "ms (target" in lab.tokens.value and "mtplab-prefill" in lab.tokens.value
    assert "overflow-y:auto" in lab.tokens.value and "onerror" in lab.keys.value and "ArrowRight" in lab.keys.value
    assert {"mtplab-step", "mtplab-back", "mtplab-reset", "mtplab-new-sample"} <= {
        c for b in lab.buttons.values() for c in b._dom_classes}
    lab.set(method="deepseek")  # k=4 > deepseek-d1's 2: clamped, the control follows, a note says so
    assert lab.state.k == 2 and lab.controls["k"].value == 2 and "k set to 2" in lab.note.value


def test_prefill_has_its_own_colour():
    assert viz.COLORS["prefill"] not in {v for k, v in viz.COLORS.items() if k != "prefill"}
    r = viz.step_record(0, Step(drafted=[], accepted=0, emitted=[65], bonus=65, bonus_source="target", forwards=1))
    assert r.kinds == ["prefill"]


def test_projector_chips_are_legible():
    """Projector mode: chips of at least 24 px, every text/background pair of the token kinds at 4.5:1 or more
    (WCAG 2, computed), and a one-character rejected or discarded chip outlined rather than struck through."""
    import re
    from mtplab.viz.kinds import COLORS, KINDS, TEXT_COLORS, TokenView, contrast
    for k in KINDS:
        assert contrast(TEXT_COLORS[k], COLORS[k]) >= 4.5, k
    assert contrast("#ffffff", "#000000") == pytest.approx(21.0)
    for kind in KINDS:
        chip = lab_view._chip(TokenView(65, "A", kind), projector=True)
        assert int(re.search(r"font-size:(\d+)px", chip).group(1)) >= 24
        if kind in ("rejected", "discarded"):
            assert "outline" in chip and "line-through" not in chip
    long_chip = lab_view._chip(TokenView(65, "word", "rejected"), projector=True)
    assert "line-through" in long_chip


def test_the_one_demo_shows_every_kind_in_its_first_four_steps(models):
    """The lab's one demo (widget default, notebook 05, the offline page): its first four steps on the default
    prompt hold accepted, rejected, discarded and bonus tokens."""
    demo = lab_state.DEMO
    assert lab_state.LabState().method == demo["method"]
    st = lab_state.run_all(session.decode(lab_state.LabState(method=demo["method"], k=demo["k"], device="cpu",
                                                             repeats=1, max_new_tokens=48), session.ModelCache()))
    kinds = {t.kind for r in st.records[1:5] for t in r.tokens}
    assert {"accepted", "rejected", "discarded"} <= kinds and kinds & {"bonus-target", "bonus-correction"}


def test_changing_the_method_takes_the_reader_to_step_0_of_the_new_decode(models):
    """Issue 31: a method change does not leave the reader at step n of a decode they have not seen (the offline
    page once landed on "step 6 of 23"): the rows, the slider and the status start again, and Step shows the new
    method's first step."""
    pytest.importorskip("ipywidgets")
    lab = lab_view.AcceptanceLab(models=models, method="blockwise-overlap", k=4, prompt=PROMPT, device="cpu",
                                 max_new_tokens=24).step(5)
    assert lab.state.shown == 5 and lab.slider.value == 5
    lab.controls["method"].value = "meta"  # what choosing in the menu does
    assert lab.state.method == "meta" and lab.state.trace is None and lab.state.shown == 0
    assert lab.slider.value == 0 and "not decoded yet" in lab.status.value and "mtplab-step-row" not in lab.tokens.value
    lab.step()
    assert lab.state.trace.method == "meta" and lab.state.shown == 1 and lab.slider.value == 1
    assert lab.slider.max == lab.state.total_steps and "meta k=4" in lab.status.value and "step 1/" in lab.status.value
    lab.slider.value = 3  # the slider moves through the new decode
    assert lab.state.shown == 3 and lab.tokens.value.count("mtplab-step-row") == 3


@pytest.mark.parametrize("edit, words", [
    ({"num_hidden_layers": 0}, "num_hidden_layers = 0 is not an integer"),
    ({"hidden_act": "bogus"}, "KeyError"),
])
def test_a_crafted_hugging_face_folder_is_one_line_in_the_lab(tmp_path, edit, words):
    """Issue 32: the widget and notebook 05 take CHECKPOINT = a Hugging Face folder; a crafted config.json is a
    one-line message in the status line, from the constructor and from Step, never a traceback."""
    pytest.importorskip("transformers")
    pytest.importorskip("ipywidgets")
    import json
    import shutil
    from mtplab.paths import ROOT
    src = ROOT / "data" / "hf" / "mtplab-llama"
    if not (src / "config.json").is_file():
        pytest.skip("the shipped Hugging Face model is not here")
    folder = tmp_path / "crafted"
    shutil.copytree(src, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **edit}))
    lab = lab_view.AcceptanceLab(method="ar", k=1, prompt=PROMPT, device="cpu", max_new_tokens=8, repeats=1,
                                 checkpoint=str(folder), models=session.ModelCache())
    lab.step()
    assert words in lab.state.error and "\n" not in lab.state.error and lab.state.trace is None
    assert "⚠" in lab.status.value


def test_anything_a_hugging_face_folder_raises_while_loading_is_one_line(tmp_path, monkeypatch):
    """The lab's guard at the model's door: whatever transformers raises for a crafted folder (IndexError for
    num_hidden_layers 0 before the loader checked sizes) becomes one MtplabError that names the folder."""
    import mtplab.hf.target as target
    (tmp_path / "config.json").write_text("{}")

    def crafted(*a, **k):
        raise IndexError("index -1 is out of range")
    monkeypatch.setattr(target, "load_target", crafted)
    st = decoded(state(method="ar", k=1, checkpoint=str(tmp_path)), session.ModelCache())
    assert st.error == (f"{tmp_path} could not be loaded as a Hugging Face model (IndexError: index -1 is out of "
                        "range); restore the folder that transformers saved")


def test_an_unknown_setting_is_a_note_and_the_others_apply(models):
    pytest.importorskip("ipywidgets")
    lab = lab_view.AcceptanceLab(models=models, method="meta", k=3, prompt=PROMPT, device="cpu", max_new_tokens=24,
                                 colour="red").step()
    assert lab.state.error == "" and lab.state.trace.method == "meta" and lab.state.k == 3
    assert "unknown lab settings ['colour'] ignored" in html.unescape(lab.note.value)
