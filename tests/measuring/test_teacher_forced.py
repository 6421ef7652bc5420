"""Teacher-forced measurement (mtplab.measuring.teacher_forced): one forward counts what the live loop counts,
agreement counts each position once, and the figures drawn from it."""
import pytest
import torch
from matplotlib.figure import Figure

from mtplab.model import checkpoint
from mtplab.measuring import teacher_forced as estimate
from mtplab.data import held_out_prompts
from mtplab.errors import MtplabError
from mtplab.model.toy import random_model as toy_model
from mtplab.viz.style import robust_ylim
from tests.conftest import random_model

PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8], [1, 6, 1, 8, 0, 3, 3, 9, 8]]


@pytest.mark.parametrize("heads,K", [("stern", 4), ("meta", 4), ("deepseek", 3)])
def test_teacher_forced_counts_equal_the_live_loop(heads, K):
    # vocabulary 10, weak noise: drafts right often enough that every position is reached
    model = random_model(heads, K, seed=5, vocab_size=10, noise=0.3)
    live = estimate.live_acceptance(model, PROMPTS, max_new_tokens=30)
    tf = estimate.estimate_acceptance(model, PROMPTS, max_new_tokens=30)
    assert tf.unconditional == pytest.approx(live.unconditional, abs=1e-12)
    assert tf.conditional == pytest.approx(live.conditional, abs=1e-12, nan_ok=True)
    assert tf.mean_accepted_length == pytest.approx(live.mean_accepted_length, abs=1e-12)
    assert len(tf.unconditional) == K - 1


def test_on_a_shipped_checkpoint_the_estimate_matches_and_both_controls_fail():
    model = checkpoint.load("stern-k4")
    prompts = held_out_prompts("code", 6, 32)  # six varied prompts: two short ones can loop into a tie
    r = estimate.compare(model, prompts, max_new_tokens=40)
    assert estimate.largest_gap(r["teacher-forced"], r["live loop"]) < 1e-12
    assert estimate.largest_gap(r["control: target shifted by one"], r["live loop"]) > 0.05
    assert estimate.largest_gap(r["control: no causal mask"], r["live loop"]) > 0.02
    assert sum(r["live loop"].unconditional) > 0.3  # the live loop accepts drafts: the test is not 0 == 0


@pytest.mark.parametrize("name", ["meta-k4", "deepseek-d1"])
def test_shipped_meta_and_deepseek_checkpoints_match_their_live_loop(name):
    model = checkpoint.load(name)
    tf = estimate.estimate_acceptance(model, ["def main("], max_new_tokens=24)
    live = estimate.live_acceptance(model, ["def main("], max_new_tokens=24)
    assert tf.unconditional == pytest.approx(live.unconditional, abs=1e-12)
    assert len(tf.unconditional) == model.config.n_depths - 1


def test_no_causal_mask_lets_early_positions_see_the_future_and_is_undone():
    model = random_model("stern", 3, seed=2, vocab_size=16, n_layer=1)  # one layer: keys are the inputs
    idx = torch.randint(0, 16, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model.depth_logits(idx)
        with estimate.no_causal_mask(model):
            open_ = model.depth_logits(idx)
        after = model.depth_logits(idx)
    assert torch.equal(before, after)
    assert (open_[0, :-1] - before[0, :-1]).abs().max() > 1e-3  # earlier positions now see later tokens
    assert torch.allclose(open_[0, -1], before[0, -1], atol=1e-5)  # the last one saw every key anyway


def test_every_position_counts_more_steps_than_the_live_loop():
    model = random_model("stern", 4, seed=5, vocab_size=10)
    paths = estimate.greedy_paths(model, PROMPTS[:1], max_new_tokens=30)
    seq, P = paths[0]
    steps = estimate.match_counts(model, seq, P, 3)["steps"]
    every = estimate.match_counts(model, seq, P, 3, positions="all")["steps"]
    assert every == 30 - 1 and steps <= every


def test_bad_input_names_the_fix():
    plain = random_model()
    with pytest.raises(MtplabError, match="use stern-k4, meta-k4"):
        estimate.estimate_acceptance(plain, PROMPTS, max_new_tokens=8)
    stern = random_model("stern", 3, vocab_size=10)
    with pytest.raises(MtplabError, match=r"k must be an integer in 2..3"):
        estimate.estimate_acceptance(stern, PROMPTS, max_new_tokens=8, k=5)
    with pytest.raises(MtplabError, match="positions must be"):
        estimate.estimate_acceptance(stern, PROMPTS, max_new_tokens=8, positions="some")
    with pytest.raises(MtplabError, match="shift must be 0"):
        estimate.estimate_acceptance(stern, PROMPTS, max_new_tokens=8, shift=2)
    with pytest.raises(MtplabError, match="give at least one prompt"):
        estimate.estimate_acceptance(stern, [], max_new_tokens=8)


def test_estimate_vs_live_figure_has_one_line_per_estimate():
    from mtplab.viz import stats as viz_metrics
    from mtplab.measuring.acceptance import convert

    results = {"live loop": convert([0.6, 0.3]), "teacher-forced": convert([0.6, 0.3]), "control": convert([0.2, 0.1])}
    fig = viz_metrics.estimate_vs_live(results, title="x")
    assert len(fig.axes) == 2 and all(len(ax.lines) == 3 for ax in fig.axes)
    assert list(fig.axes[0].lines[2].get_ydata()) == [0.2, 0.1]


def test_verdict_rows_count_what_the_live_loop_counts_and_the_shuffle_keeps_marginals():
    """Full verdict rows at the live step starts give the live loop's conditional counts (where every step drafted
    k-1 tokens); shuffling across steps keeps each position's marginal and breaks the within-step link."""
    model = random_model("stern", 4, seed=5, vocab_size=10, noise=0.3)
    paths = estimate.greedy_paths(model, PROMPTS, max_new_tokens=30, k=4)
    rows = estimate.verdict_rows(model, paths, 4)
    assert rows and all(len(r) == 3 for r in rows)
    obs = estimate.within_step_rates(rows)
    full = [(ids, n) for ids, n in paths]
    counts = [estimate.match_counts(model, ids, n, 3) for ids, n in full]
    assert obs["steps"] <= sum(c["steps"] for c in counts)
    shu = estimate.within_step_rates(estimate.shuffled_across_steps(rows, seed=1))
    assert shu["marginal"] == obs["marginal"] and shu["steps"] == obs["steps"]
    assert shu["accepted"][0] == obs["accepted"][0]


def test_within_step_rates_on_hand_made_rows():
    rows = [[True, True, True], [True, True, False], [False, True, True], [False, False, False]]
    r = estimate.within_step_rates(rows)
    assert r["reached"] == [4, 2, 2] and r["accepted"] == [2, 2, 1] and r["marginal"] == [2, 3, 2]
    assert r["conditional"] == [0.5, 1.0, 0.5] and r["unconditional"] == [0.5, 0.5, 0.25]
    pair = estimate.kept_given_previous(rows)
    assert pair == {"after_kept": (2, 2), "after_rejected": (1, 2)}
    assert estimate.within_step_rates([])["steps"] == 0


def test_agreement_counts_each_position_once():
    a, b = toy_model(vocab_size=8, seed=0), toy_model(vocab_size=8, seed=1)
    ids = [1, 2, 3, 4, 5, 6, 7, 0, 1, 2]
    assert estimate.teacher_forced_agreement(a, a, ids, start=3) == (7, 7)
    same, n = estimate.teacher_forced_agreement(a, b, ids, start=1)
    assert n == 9 and 0 <= same < 9  # two different random models disagree somewhere on 9 positions


def test_robust_ylim_ignores_one_spike():
    fig = Figure()
    ax = fig.subplots()
    ax.plot(range(100), [1.0] * 99 + [350.0])
    ax.set_title("t")
    robust_ylim(fig)
    assert ax.get_ylim()[1] < 2 and "1 of 100 points above" in ax.get_title()


def test_forced_and_free_against_the_greedy_path_counts_positions():
    from mtplab.teaching.deepseek import forced_and_free_greedy
    from mtplab.measuring.teacher_forced import greedy_windows
    from mtplab.decoding.loop import autoregressive

    m = toy_model(vocab_size=8, heads="deepseek", n_depths=3, seed=2)
    windows = torch.randint(8, (3, 20), generator=torch.Generator().manual_seed(0))
    g = greedy_windows(m, windows, 5, 3)
    assert g.shape == (3, 8) and g[0, 5:].tolist() == autoregressive(m, windows[0, :5].tolist(), max_new_tokens=3).tokens
    ff = forced_and_free_greedy(m, windows, (5, 9))
    assert ff["n"] == 6 and len(ff["teacher-forced"]) == 2
    assert all(0 <= c <= n == 6 for c, n in ff["teacher-forced"] + ff["free-running"])


def test_cache_lengths_are_measured_and_crop_keeps_exactly_the_committed_tokens():
    from mtplab.teaching.blockwise import cache_lengths
    from mtplab.viz.decode import kv_cache_crop

    for method in ("blockwise-overlap", "blockwise"):
        m = toy_model(vocab_size=8, heads="stern", n_depths=4, seed=4, noise=2.0)
        recs = cache_lengths(m, method, [1, 2, 3, 4], k=4, max_new_tokens=20)
        committed = len([1, 2, 3, 4])
        for r in recs:
            s = r["step"]
            committed += len(s.emitted)
            assert r["after_crop"] == committed - 1  # the cache holds every committed token but the newest
            assert r["after_verify"] >= r["after_crop"] >= r["before"]
        assert any(r["after_verify"] > r["after_crop"] for r in recs)  # some step cropped rejected drafts
        rec = next(r for r in recs if r["after_verify"] > r["after_crop"])
        assert kv_cache_crop(rec).axes[0].get_xlim()[1] == rec["after_verify"] + 0.5
