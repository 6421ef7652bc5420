"""viz returns Figures built from the data it is given, and never touches pyplot's global state."""
import io

import matplotlib
import pytest
import torch
from matplotlib.figure import Figure

from mtplab.measuring import theory
from mtplab import viz
from mtplab.training.losses import label_layout
from mtplab.measuring import timing
from mtplab.teaching import deepseek
from mtplab.teaching import meta
from mtplab.teaching import blockwise
from mtplab.viz import decode as viz_decode
from mtplab.decoding.loop import autoregressive, speculative
from mtplab.decoding.drafters import OracleDrafter
from tests.conftest import random_model

matplotlib.use("Agg")


def _renders(fig):
    assert isinstance(fig, Figure)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    assert buf.getvalue()[:4] == b"\x89PNG"


@pytest.fixture(scope="module")
def traces():
    model = random_model(seed=5)
    prompt = [7, 8, 9]
    ref = autoregressive(model, prompt, max_new_tokens=40).tokens
    return {a: speculative(model, OracleDrafter(ref, a, seed=1), prompt, max_new_tokens=40, k=4, method=f"alpha {a}")
            for a in (0.5, 0.9)}


def test_no_pyplot_figures_are_left_open(traces):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    viz.acceptance_bars(traces)
    viz.cost_curve({1: 1.0, 2: 1.1})
    assert plt.get_fignums() == before


def test_forwards_vs_m_plots_the_counts_and_formulas():
    ms, ks = list(range(1, 9)), (2, 4)
    plain = {k: [theory.plain_forwards(m, k) for m in ms] for k in ks}
    over = {k: [theory.overlap_forwards(m, k) for m in ms] for k in ks}
    fig = viz.forwards_vs_m(ms, plain, over)
    _renders(fig)
    axes = fig.axes
    assert len(axes) == len(ks)
    for ax, k in zip(axes, ks):
        by_label = {line.get_label(): list(line.get_ydata()) for line in ax.lines}
        assert by_label["measured, plain"] == plain[k]
        assert by_label["measured, overlap"] == over[k]
        assert by_label["2m/k"] == [2 * m / k for m in ms]
        assert by_label["1 + m/k"] == [1 + m / k for m in ms]


def test_cost_curve_accepts_a_measured_curve():
    curve = timing.CostCurve(seconds={1: 0.002, 4: 0.0025, 16: 0.006}, context=32, device="cpu")
    fig = viz.cost_curve(curve)
    _renders(fig)
    measured = [ln for ln in fig.axes[0].lines if ln.get_label().startswith("measured")][0]
    assert list(measured.get_ydata()) == pytest.approx([1.0, 1.25, 3.0])


def test_acceptance_bars_show_the_trace_counters(traces):
    fig = viz.acceptance_bars(traces)
    _renders(fig)
    cond_ax, uncond_ax = fig.axes
    heights = [p.get_height() for p in cond_ax.patches]
    want = [x for t in traces.values() for x in t.conditional_acceptance]
    assert heights == pytest.approx(want)
    heights = [p.get_height() for p in uncond_ax.patches]
    want = [x for t in traces.values() for x in t.acceptance_rate_per_position]
    assert heights == pytest.approx(want)


def test_step_times(traces):
    _renders(viz.step_times({"a": traces[0.5], "b": traces[0.9]}))


def test_other_figures_render():
    _renders(viz.roofline([1, 2, 4], [0.5, 1.0, 2.0], ridge=1.5))
    _renders(viz.bars({"a": 1.0, "b": 2.0}, ylabel="x", reference=(0.5, 0.7), reference_label="band"))
    _renders(viz.memory_curve({"x": {2: 1.0, 4: 1.5}, "y": {2: 2.0, 4: 4.0}}))
    _renders(viz.block_size_curve([2, 3, 4], {"m": [1.8, 2.4, 2.9]}))
    fig = viz.depth_accuracy({"a": [0.5, 0.3], "b": [0.4, 0.2, 0.1]}, first_offset=2)
    _renders(fig)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["+2", "+3", "+4"]
    counts = torch.tensor([10.0, 30.0, 60.0])
    fig = viz.sampling_histogram({"run": counts}, torch.tensor([0.1, 0.3, 0.6]), others={"q": torch.ones(3) / 3})
    _renders(fig)
    assert [p.get_height() for p in fig.axes[0].patches] == pytest.approx([0.1, 0.3, 0.6])


def test_training_curves_from_a_real_history():
    from mtplab.training.fit import fit

    hist = fit(preset="tiny", heads="meta", n_depths=2, steps=2, batch_size=2, eval_windows=2, eval_every=1, progress=False,
               device="cpu")
    fig = viz.training_curves({"meta": hist})
    _renders(fig)
    assert len(fig.axes[1].lines) == 2  # one validation curve per depth


def test_bars_with_intervals_write_each_value_beside_its_whisker():
    fig = viz.bars({"a": 1.0, "b": 0.6}, ylabel="x", fmt="{:.2f}x", errors={"b": (0.3, 2.2)})
    _renders(fig)
    ax = fig.axes[0]
    beside = [t for t in ax.texts if t.get_text() == "0.60x"]
    assert len(beside) == 1 and beside[0].xy == (1, 2.2)  # at the whisker's top, offset to its side
    assert [t.get_text() for t in ax.texts].count("0.60x") == 1  # not also on the bar, under the whisker


def test_training_lineage_draws_every_phase_of_a_shipped_record():
    phases = blockwise.heads_history("stern-k4")
    assert list(phases)[-1] == "stern-k4" and len(phases) >= 2  # started from stern-k4-l4's heads
    fig = viz.training_lineage(phases)
    _renders(fig)
    n_points = sum(len(h) for h in phases.values())
    loss = [line for line in fig.axes[1].lines if line.get_marker() == "o"]
    assert sum(len(line.get_xdata()) for line in loss) == n_points  # every loss point, all phases
    assert any(line.get_linestyle() == ":" for line in fig.axes[0].lines)  # where a phase started from the last


def test_label_layout_follows_eq_24():
    """Module k reads t_(i+k) and is scored against t_(i+k+1) for i = 1..T-k: labels t_(2+k)..t_(T+1)."""
    T, D = 10, 3
    rows = label_layout(T, D)
    assert [r["k"] for r in rows] == [0, 1, 2, 3]
    for row in rows:
        k = row["k"]
        assert sorted(row["reads"]) == list(range(1, T - k + 1))
        assert [row["labels"][i] for i in sorted(row["labels"])] == list(range(2 + k, T + 2))
        assert all(row["labels"][i] == row["reads"][i] + 1 for i in row["reads"])
    text = viz.label_layout_text(T, 2)
    lines = text.splitlines()
    assert lines[0].split("|")[1].split() == [str(i) for i in range(1, 11)]
    label1 = next(ln for ln in lines if ln.startswith("module 1: label"))
    assert label1.split("|")[1].split() == [f"t{j}" for j in range(3, 12)]
    _renders(viz.label_layout_table(T, 2))


def test_label_layout_matches_the_model_and_the_check_can_fail(monkeypatch):
    model = random_model("deepseek", 4, seed=3)
    assert deepseek.layout_matches_model(model, T=10)
    real = label_layout

    def off_by_one(T, D):  # claims each depth is scored against the token it reads
        rows = real(T, D)
        for r in rows:
            r["labels"] = dict(r["reads"])
        return rows
    monkeypatch.setattr(deepseek, "label_layout", off_by_one)  # where layout_matches_model looks it up
    assert not deepseek.layout_matches_model(model, T=10)


def _texts(fig):
    return " ".join([t.get_text() for ax in fig.axes for t in ax.texts + [ax.title]] + [t.get_text() for t in fig.texts])


def test_verify_forward_lines_predictions_up_with_drafts_and_marks_verdicts():

    ex = {"context": "(", "fed": ["i", ")", "n", "e"], "predicted": [")", ":", "a", "t"], "drafts": [")", "n", "e"]}
    assert viz_decode._verdicts(ex["predicted"], ex["drafts"]) == ["accepted", "rejected", "discarded", "discarded"]
    assert viz_decode._verdicts(["a", "b"], ["a"]) == ["accepted", "bonus-target"]
    fig = viz.verify_forward(ex)
    _renders(fig)
    text = _texts(fig)
    assert "predicts ':'" in text and "!= draft 2 'n': rejected" in text and "= draft 1 ')': accepted" in text
    ax = fig.axes[0]
    blue = [p for p in ax.patches if p.get_facecolor()[:3] == matplotlib.colors.to_rgb(viz.COLORS["predict"])]
    assert len(blue) == 4 * 5 // 2  # the causal mask: row j attends to fed tokens 0..j


def test_head_families_labels_come_from_the_rows():

    rows = [{"family": f, "checkpoint": f"{f}-x", "method": f"m-{f}", "head_params": hp, "trunk_params": 4_000_000,
             "step_ms_drafter": d, "step_ms_target": 2.0, "source": "docs/bench/test.json"}
            for f, hp, d in [("stern", 1_000_000, 0.5), ("meta", 3_000_000, 1.5), ("deepseek", 2_000_000, 3.0)]]
    fig = viz.head_families(rows)
    _renders(fig)
    text = _texts(fig)
    assert "1.00M params = 25% of the trunk's 4.00M" in text and "3.00M params = 75%" in text
    assert "drafter 1.50 ms per step = 75% of the target's 2.00 ms" in text and "= 150% of" in text
    assert "docs/bench/test.json" in text and "'m-deepseek'" in text
    assert len(fig.axes) == 3


def test_head_families_data_from_checkpoints_and_bench(tmp_path):
    import json

    from mtplab.errors import MtplabError

    rows = [{"method": m, "checkpoint": c, "k": 4, "step_ms_drafter": 1.0 + i, "step_ms_target": 3.0}  # flat rows
            for i, (m, c) in enumerate([("blockwise-overlap", "stern-k4"), ("meta", "meta-k4"),
                                        ("deepseek", "deepseek-d3")])]
    (tmp_path / "d.json").write_text(json.dumps({"rows": rows}))
    got = meta.head_families(tmp_path / "d.json")
    assert [r["family"] for r in got] == ["stern", "meta", "deepseek"]
    assert [r["step_ms_drafter"] for r in got] == [1.0, 2.0, 3.0]
    assert len({r["trunk_params"] for r in got}) == 1  # one shared trunk (ntp) under every family
    assert all(0 < r["head_params"] < r["trunk_params"] for r in got)
    (tmp_path / "e.json").write_text(json.dumps({"rows": rows[:1]}))
    with pytest.raises(MtplabError, match="no row for method 'meta'"):
        meta.head_families(tmp_path / "e.json")


def test_verify_example_is_one_forward_of_greedy_decoding():
    from mtplab.model import checkpoint
    from mtplab.tokenizer import encode, token_repr

    model = checkpoint.load("stern-k4")
    prompt = encode("for i in range(")
    ex = blockwise.verify_example(model, prompt, 4)
    ref = [token_repr(t) for t in autoregressive(model, prompt, max_new_tokens=6).tokens]
    assert ex["fed"][0] == ref[0] and len(ex["predicted"]) == 4 and len(ex["drafts"]) == 3
    n_ok = next((j for j, (p, d) in enumerate(zip(ex["predicted"], ex["drafts"])) if p != d), 3)
    # rows up to the first rejection (its correction, or the bonus) read only greedy tokens: they are greedy's
    assert ex["predicted"][: n_ok + 1] == ref[1: n_ok + 2]


def test_verify_example_refuses_a_model_without_enough_depths():
    from mtplab.errors import MtplabError

    with pytest.raises(MtplabError, match="at least k = 4 depths"):
        blockwise.verify_example(random_model(), [1, 2, 3], 4)
    with pytest.raises(MtplabError, match="at least k = 4 depths"):
        blockwise.verify_example(random_model(heads="stern", n_depths=2), [1, 2, 3], 4)
    ex = blockwise.verify_example(random_model(heads="meta", n_depths=3), [1, 2, 3], 3)
    assert len(ex["fed"]) == len(ex["predicted"]) == 3 and len(ex["drafts"]) == 2
