import pytest

from mtplab.errors import MtplabError
from mtplab.measuring.quality import loop_period, looping
from tests.conftest import random_model


def test_loop_period_finds_the_shortest_repeat_of_the_tail():
    line = list(b"print(x)\n")
    assert loop_period(list(b"import os\n") + line * 8, window=40) == len(line)
    assert loop_period([7] * 60) == 1
    varied = list(range(100))
    assert loop_period(varied) is None
    assert loop_period(line * 8 + [1, 2, 3], window=40) is None  # broken at the end: not (yet) a loop
    assert loop_period([1, 2] * 3, window=48) is None            # too short to judge
    with pytest.raises(MtplabError, match="window"):
        loop_period([1, 2, 3], window=1)


def test_looping_counts_greedy_continuations():
    model = random_model(seed=3)
    res = looping(model, [[1, 2, 3], [4, 5]], max_new_tokens=60, window=20)
    assert res["prompts"] == 2 and 0 <= res["looping"] <= 2 and len(res["periods"]) == 2
    assert res["looping"] == sum(p is not None for p in res["periods"])
