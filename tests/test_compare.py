"""Teacher-forced agreement counts position by position, on one shared text."""
from matplotlib.figure import Figure

from mtplab.compare import teacher_forced_agreement
from mtplab.lab import random_model
from mtplab.viz_lessons import robust_ylim


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
