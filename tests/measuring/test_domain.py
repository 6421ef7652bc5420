"""Code against prose (`mtplab.measuring.domain`, `bench domain`): every decode row reproduces AR's greedy
output, acceptance by position is a rate with its interval, and teacher-forced agreement is the same number
training's own `evaluate` computes (two implementations, one quantity). Timings here are read by nobody."""
import pytest

from mtplab.data import held_out_prompts, load_corpus, val_windows
from mtplab.measuring.domain import domain_study, teacher_forced
from mtplab.tokenizer import encode
from mtplab.training.steps import evaluate
from tests.conftest import random_model


@pytest.fixture(scope="module")
def pair():
    # depths 2 = D = 1: what the shipped pair has
    return {"code": random_model("deepseek", 2, seed=3, block_size=128),
            "prose": random_model("deepseek", 2, seed=4, block_size=128)}


def test_teacher_forced_agreement_equals_trainings_evaluate(pair):
    w = val_windows(load_corpus("prose", "val"), 64, 6)
    for m in pair.values():
        tf = teacher_forced(m, w, batch_size=4)
        ev = evaluate(m, w, batch_size=4)
        assert tf["agree_by_depth"][0] == pytest.approx(ev["val_agree_depth"][1], abs=1e-9)
        assert tf["bpb"] == pytest.approx(ev["val_bpb"], rel=1e-5)


def test_every_row_is_exact_and_every_rate_a_rate(pair):
    prompts = {c: [encode(p) for p in held_out_prompts(c, 2, 40)] for c in ("code", "prose")}
    windows = {c: val_windows(load_corpus(c, "val"), 48, 4) for c in prompts}
    rows = domain_study(pair, prompts, windows, max_new_tokens=12, repeats=1)
    assert len(rows) == 2 * 2 * 3
    for r in rows:
        assert r["identical"] == r["prompts"] == 2, r
        assert len(r["acceptance_by_position"]) == r["k"] - 1 or r["method"] == "ngram"
        for a, (lo, hi) in zip(r["acceptance_by_position"], r["acceptance_interval"]):
            assert 0 <= lo <= a <= hi <= 1
        assert r["acceptance_by_position"] == sorted(r["acceptance_by_position"], reverse=True)  # unconditional
        assert r["tokens_per_forward"] >= 1 - 1e-9 and r["speedup_min"] <= r["speedup"] <= r["speedup_max"]
        assert 0 <= r["looping"] <= r["prompts"]


def test_domain_figure_draws_the_rows(pair):
    from mtplab import viz

    prompts = {"code": [encode("def f(x):\n")]}
    windows = {"code": val_windows(load_corpus("code", "val"), 32, 2)}
    rows = domain_study({"code": pair["code"]}, prompts, windows, max_new_tokens=8, repeats=1)
    fig = viz.domain_panels(rows, machine="test machine")
    left, right = fig.axes[:2]
    assert len(left.lines) >= 1 and len(right.patches) == len(rows)
