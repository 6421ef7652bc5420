"""Teacher-forced agreement counts position by position, on one shared text."""
from matplotlib.figure import Figure

from mtplab.measuring.teacher_forced import teacher_forced_agreement
from mtplab.model.toy import random_model
from mtplab.viz.style import robust_ylim


def test_agreement_counts_each_position_once():
    a, b = random_model(vocab_size=8, seed=0), random_model(vocab_size=8, seed=1)
    ids = [1, 2, 3, 4, 5, 6, 7, 0, 1, 2]
    assert teacher_forced_agreement(a, a, ids, start=3) == (7, 7)
    same, n = teacher_forced_agreement(a, b, ids, start=1)
    assert n == 9 and 0 <= same < 9  # two different random models disagree somewhere on 9 positions


def test_robust_ylim_ignores_one_spike():
    fig = Figure()
    ax = fig.subplots()
    ax.plot(range(100), [1.0] * 99 + [350.0])
    ax.set_title("t")
    robust_ylim(fig)
    assert ax.get_ylim()[1] < 2 and "1 of 100 points above" in ax.get_title()


def test_forced_and_free_against_the_greedy_path_counts_positions():
    import torch

    from mtplab.teaching.deepseek import forced_and_free_greedy
    from mtplab.measuring.teacher_forced import greedy_windows
    from mtplab.decoding.loop import autoregressive

    m = random_model(vocab_size=8, heads="deepseek", n_depths=3, seed=2)
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
        m = random_model(vocab_size=8, heads="stern", n_depths=4, seed=4, noise=2.0)
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
