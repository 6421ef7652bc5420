"""One metric converter (mtplab.measuring.acceptance and .theory): the conventions agree on random traces."""
import math
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtplab.measuring import theory
from mtplab.measuring import acceptance
from mtplab import viz
from mtplab.teaching.acceptance_lab import view as lab_view
from mtplab.errors import MtplabError
from mtplab.decoding.trace import Step, Trace


@st.composite
def traces(draw, fixed: bool):
    """A Trace of drafting steps; fixed=True: every step drafts n tokens, else some draft fewer (text end)."""
    n = draw(st.integers(1, 5))
    steps = [Step(drafted=[], accepted=0, emitted=[0], bonus=0, bonus_source="target", forwards=1)]  # prefill
    for _ in range(draw(st.integers(1, 40))):
        m = n if fixed else draw(st.integers(1, n))
        a = draw(st.integers(0, m))
        steps.append(Step(drafted=[1] * m, accepted=a, emitted=[1] * (a + 1), bonus=1,
                          bonus_source="target" if a == m else "correction", forwards=1))
    return Trace(method="x", prompt=[0], steps=steps, k=n + 1, schedule="overlap")


def _same(xs, ys):
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys):
        assert (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, abs=1e-12)


@settings(max_examples=80, deadline=None)
@given(traces(fixed=False))
def test_mean_accepted_length_rebuilds_from_unconditional_rates_on_any_trace(tr):
    acc = acceptance.convert(tr)
    assert acc.mean_accepted_length == pytest.approx(tr.mean_accepted_length, abs=1e-12)
    assert acc.mean_accepted == pytest.approx(tr.num_accepted_tokens / tr.num_drafts, abs=1e-12)
    rebuilt = acceptance.convert(acc.unconditional, "unconditional")
    assert rebuilt.mean_accepted_length == pytest.approx(tr.mean_accepted_length, abs=1e-12)


@settings(max_examples=80, deadline=None)
@given(traces(fixed=True))
def test_conditional_and_unconditional_convert_into_each_other(tr):
    acc = acceptance.convert(tr)
    _same(acceptance.to_unconditional([0.0 if math.isnan(c) else c for c in acc.conditional]), acc.unconditional)
    _same(acceptance.to_conditional(acc.unconditional), acc.conditional)
    assert acc.draft_acceptance_rate == pytest.approx(tr.num_accepted_tokens / tr.num_draft_tokens, abs=1e-12)
    from_cond = acceptance.convert([0.0 if math.isnan(c) else c for c in acc.conditional], "conditional")
    assert from_cond.mean_accepted_length == pytest.approx(tr.mean_accepted_length, abs=1e-12)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.just(0.0), st.just(1.0), st.floats(1e-3, 1)), min_size=1, max_size=6))
def test_round_trip_from_conditional_rates(cond):
    acc = acceptance.convert(cond, "conditional")
    back = acceptance.convert(acc.unconditional, "unconditional")
    _same(back.unconditional, acc.unconditional)
    for c, b, a_prev in zip(cond, back.conditional, [1.0] + acc.unconditional[:-1]):
        if a_prev > 0:  # where no step reached draft j, its conditional rate is unknown (NaN)
            assert b == pytest.approx(c, rel=1e-9, abs=1e-12)
        else:
            assert math.isnan(b)


def test_a_trace_whose_last_steps_draft_less_breaks_the_product_but_not_the_mean():
    steps = [Step(drafted=[1, 1], accepted=2, emitted=[1] * 3, bonus=1, bonus_source="target", forwards=1),
             Step(drafted=[1], accepted=1, emitted=[1] * 2, bonus=1, bonus_source="target", forwards=1)]
    tr = Trace(method="x", prompt=[0], steps=steps, k=3)
    acc = acceptance.from_trace(tr)
    assert acc.unconditional == [1.0, 0.5] and acc.conditional == [1.0, 1.0]
    assert acceptance.to_unconditional(acc.conditional) != acc.unconditional
    assert acc.mean_accepted_length == tr.mean_accepted_length == 2.5


@settings(max_examples=60, deadline=None)
@given(st.floats(0.0, 1.0), st.integers(1, 7))
def test_alpha_from_length_inverts_the_expected_tokens_per_step(alpha, n):
    length = theory.expected_tokens_per_step(alpha, n)
    assert acceptance.alpha_from_length(length, n) == pytest.approx(alpha, abs=1e-6)
    assert acceptance.alpha_from_length(length - 1, n, bonus=False) == pytest.approx(alpha, abs=1e-6)


def test_bad_input_names_the_fix():
    with pytest.raises(MtplabError, match="percentages"):
        acceptance.convert([80, 60])
    with pytest.raises(MtplabError, match="pass kind='conditional'"):
        acceptance.convert([0.5, 0.9])
    with pytest.raises(MtplabError, match="unknown kind"):
        acceptance.convert([0.5], "per-token")
    with pytest.raises(MtplabError, match="impossible with 3 drafts"):
        acceptance.alpha_from_length(5.0, 3)
    with pytest.raises(MtplabError, match="list of numbers"):
        acceptance.convert("0.5")
    with pytest.raises(MtplabError, match=r"\[0, 1\]"):
        acceptance.convert([float("nan")])


def test_table_lists_every_convention():
    text = viz.table(acceptance.convert([0.8, 0.4]))
    assert "0.800" in text and "0.500" in text and "1.200" in text and "2.200" in text


def test_widget_converts_and_metrics_does_not_import_ipywidgets():
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    code = "import sys, mtplab.measuring.acceptance; assert 'ipywidgets' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], env=env, check=False).returncode == 0
    pytest.importorskip("ipywidgets")
    box = lab_view.converter_widget([0.9, 0.5], "conditional")
    text, _, out = box.children
    assert "0.450" in out.value
    text.value = "0.9, 2"
    assert "error" in out.value and "[0, 1]" in out.value


def test_conventions_figure_draws_both_rates_per_position():
    from mtplab.viz import stats as viz_metrics

    fig = viz_metrics.conventions(acceptance.convert([0.8, 0.5, 0.2]))
    ax = fig.axes[0]
    heights = sorted(round(p.get_height(), 6) for p in ax.patches)
    assert heights == sorted([0.8, 0.5, 0.2, 0.8, 0.625, 0.4])
    assert "2.50" in ax.get_title() and "1.50" in ax.get_title()
