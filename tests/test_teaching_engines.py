"""Notebook 09's companion (mtplab.teaching.engines): pooled acceptance with n, intervals and loops; typical
acceptance caught by the lab's one test level; the two benchmark records reconciled from their own fields."""
import pytest

from mtplab.decoding.trace import Step, Trace, pooled
from mtplab.errors import MtplabError
from mtplab.measuring import quality
from mtplab.measuring.record import Record
from mtplab.teaching import engines
from mtplab.teaching.find_the_bug import ALPHA


class _Fixed(Trace):
    """A trace whose new tokens are given (to test the loop count without decoding)."""

    def __init__(self, accepted, tokens, k=4):
        steps = [Step(drafted=[1] * (k - 1), accepted=a, emitted=[1] * (a + 1), bonus=1, bonus_source="correction",
                      forwards=1) for a in accepted]
        super().__init__(method="m", prompt=[], steps=steps, k=k)
        self._given = tokens

    @property
    def tokens(self):
        return self._given


def test_acceptance_rows_pool_the_traces_with_n_and_an_interval():
    a = _Fixed([3, 0, 1], list(range(40)))
    b = _Fixed([2, 2], list(range(40)))
    rows = engines.acceptance_rows([a, b])
    assert [r["rate"] for r in rows] == pytest.approx(pooled([a, b]).acceptance_rate_per_position)
    assert rows[0]["n"] == 5 and rows[0]["accepted"] == 4
    assert all(r["low"] <= r["rate"] <= r["high"] for r in rows)
    with pytest.raises(MtplabError, match="no traces"):
        engines.acceptance_rows([])


def test_looping_continuations_are_counted():
    loop = _Fixed([1], [5, 6, 7] * 14)            # period 3 over 42 tokens
    fresh = _Fixed([1], list(range(42)))
    assert engines.looping([loop, fresh])[:2] == (1, 2)
    text = engines.acceptance_text([loop, fresh])
    assert "1 of 2 continuations looping" in text and "n = 2 drafting steps over 2 prompts" in text
    assert quality.loop_window(128) == (48, 24) and quality.loop_window(32) == (16, 8)


def test_typical_acceptance_is_caught_and_the_exact_rule_is_not():
    toy = engines.typical_toy()
    study = engines.typical_study(toy, [1, 5, 2], 450, seed=0)
    assert study["typical"]["rejected"] == 3 and all(p < ALPHA for p in study["typical"]["pvalues"])
    assert study["exact"]["rejected"] <= 1  # a correct rule: 3 runs reject it at least once with probability 14%
    assert study["typical"]["kept"] > study["exact"]["kept"] and study["typical"]["tv"] > study["exact"]["tv"]
    assert "rejected the typical rule on 3 of 3 runs" in study["verdict"]
    with pytest.raises(MtplabError, match="at least 50 decodes each"):
        engines.typical_study(toy, [1, 5, 2], 100, seeds=3)


def test_rule_counts_refuses_too_few_decodes():
    with pytest.raises(MtplabError, match="n must be an integer >= 50"):
        engines.rule_counts(engines.typical_toy(), [1, 5, 2], 10, rule="exact")


def test_the_benchmark_story_reads_both_records():
    """Issue 30: decode.json and k.json disagree on Meta and Stern; the sentence says why from their fields."""
    decode, k = Record.load("decode"), Record.load("k")
    pairs = [(name, decode.row(method=m, checkpoint=c), k.row(method=m, checkpoint=c, k=4, adapt="fixed"))
             for name, m, c in (("Meta", "meta", "meta-k4"), ("Stern", "blockwise-overlap", "stern-k4"))]
    text = engines.benchmark_story(decode.data, k.data, name_a="decode.json", name_b="k.json", pairs=pairs)
    for _, a, b in pairs:
        assert f"{a['speedup_wall']:.2f}x in decode.json" in text and f"{b['speedup']:.2f}x in k.json" in text
        assert f"{a['tokens_per_forward']:.2f} against {b['tokens_per_forward']:.2f}" in text
    assert f"{decode['prompts']} prompts x {decode['max_new_tokens']}" in text
    assert f"{k['prompts']} x {k['max_new_tokens']}" in text
    with pytest.raises(MtplabError, match="lacks prompts"):
        engines.benchmark_story({}, k.data, name_a="a", name_b="k.json", pairs=[])


def test_the_story_words_follow_the_numbers():
    rec = {"prompts": 4, "max_new_tokens": 64, "repeats": 3, "cost_curve": {"4": 1.3}}
    a = {"k": 4, "speedup_wall": 1.2, "tokens_per_forward": 2.0, "acceptance_per_position": [0.5]}
    b = {"k": 4, "speedup": 1.0, "tokens_per_forward": 1.3, "acceptance_per_position": [0.4]}
    text = engines.benchmark_story(rec, rec, name_a="a", name_b="b", pairs=[("x", a, b)])
    assert "acceptance makes all of the gap" in text  # 2.0 / 1.3 = 1.54 against 1.2 / 1.0 = 1.2
    b2 = dict(b, tokens_per_forward=1.9)
    assert "acceptance makes little of the gap" in engines.benchmark_story(rec, rec, name_a="a", name_b="b",
                                                                          pairs=[("x", a, b2)])
