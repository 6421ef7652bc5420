"""The real model's result explained (`mtplab.teaching.real`): the speedup split into acceptance and cost with
what-if rows, the training against held-out gap and the rejections outside the draft vocabulary, all read from
the records, so a record with other numbers gives other words (no torch model is loaded here)."""
import copy

import pytest

from mtplab.decoding.trace import Step, Trace
from mtplab.teaching import real


def _row(label, k, tps, speedup, split, family="deepseek", vocab="reduced", dtype="fp32"):
    return {"label": label, "method": "deepseek", "family": family, "k": k, "draft_vocab": vocab, "dtype": dtype,
            "speedup": speedup, "speedup_min": speedup - 0.02, "speedup_max": speedup + 0.02,
            "tokens_per_forward": tps, "split": dict(zip(("target_ms", "draft_ms", "overhead_ms"), split)),
            "identical_to_ar": 6, "prompts": 6}


def _record():
    ar = _row("AR", None, 1.0, 1.0, (70.0, 0.0, 0.0), family=None, vocab="full")
    rows = [ar, _row("DeepSeek D=1, k=2, reduced vocab", 2, 1.3, 1.08, (80.0, 5.0, 1.0)),
            _row("DeepSeek D=1 reused, k=4, reduced vocab", 4, 1.4, 0.78, (110.0, 14.0, 1.0)),
            _row("fast but lossy", 4, 1.5, 1.5, (80.0, 5.0, 1.0), dtype="bf16")]
    study = {"acceptance": {"pooled": {"steps": 2000, "accepted": [700], "rate": [0.35],
                                       "interval": [[0.33, 0.37]]}}, "prompts": 24}
    return {"m": 128, "threads": {"1": {}}, "rows": [{**r, "threads": 1} for r in rows],
            "acceptance_all": {"DeepSeek D=1, k=2, reduced vocab": study}}


TRAIN = {"heads": {"deepseek-d1": {"history": [{"val_agree_depth": [0.2]}, {"val_agree_depth": [0.65, 0.6]}]}}}


def test_the_best_row_is_the_fastest_exact_one_and_names_the_default():
    rec = _record()
    assert real.best_row(rec)["label"] == "DeepSeek D=1, k=2, reduced vocab"  # not the bf16 row
    assert real.label_of("best", rec) == "DeepSeek D=1, k=2, reduced vocab"
    rec["rows"][2]["speedup"] = 1.2
    assert real.label_of("best", rec) == "DeepSeek D=1 reused, k=4, reduced vocab"


def test_speedup_parts_adds_up_from_the_time_split():
    p = real.speedup_parts(_record())
    assert p["step_cost"] == pytest.approx(86 / 70) and p["predicted"] == pytest.approx(1.3 * 70 / 86)
    cases = {w["case"]: w["speedup"] for w in p["what_if"]}
    assert cases["this acceptance, a flat verify (t(k) = t(1))"] == pytest.approx(1.3 / (1 + 6 / 70))
    assert cases["this acceptance, flat verify and free drafter"] == pytest.approx(1.3)
    assert p["what_if"][3]["tokens_per_step"] == pytest.approx(1.85)  # 1 + 0.85 for one draft
    k4 = real.speedup_parts(_record(), "DeepSeek D=1 reused, k=4, reduced vocab")
    assert k4["what_if"][3]["tokens_per_step"] == pytest.approx(1 + 0.85 + 0.85 ** 2 + 0.85 ** 3)
    assert "(each draft alike)" in k4["what_if"][3]["case"]


def test_a_verify_cheaper_than_one_step_keeps_its_cost_in_the_flat_case():
    rec = _record()
    rec["rows"][1]["split"]["target_ms"] = 62.0  # verify 62/70 of an AR step: already below a flat curve's t(1)
    p = real.speedup_parts(rec)
    measured, flat, free = (w["speedup"] for w in p["what_if"][:3])
    assert flat == pytest.approx(measured) and free == pytest.approx(1.3 / (62 / 70)) and free > measured
    assert "already at most t(1)" in p["what_if"][1]["case"]
    words = real.parts_words(p)
    assert "already costs less than one AR step (0.89)" in words and "would give" not in words.split("Acceptance")[0]


def test_untrained_words_set_the_ngram_row_beside_the_heads():
    rec = _record()
    rec["rows"].append({**_row("n-gram, k=4", 4, 1.5, 1.37, (70.0, 1.0, 1.0), family=None, vocab="full"),
                        "method": "ngram", "threads": 1})
    text = real.untrained_words(rec)
    assert "n-gram, k=4 (n-gram prompt lookup, no training) ran 1.37x" in text and "1.08x with 1.30" in text
    assert "beats the trained heads (more of its drafts are accepted" in text
    rec["rows"][-1]["speedup"] = 1.0
    assert real.untrained_words(rec).endswith("the trained heads beat the drafter that needs no training")


def test_the_words_follow_the_numbers():
    words = real.parts_words(real.speedup_parts(_record()))
    assert "1.30 tokens per step" in words and "acceptance holds it back more" in words
    assert "the record's race (" in words and " kernel) measured " in words  # its machine and kernel, not a live one
    import re
    cost, *parts = map(float, re.search(r"costs ([\d.]+) AR steps \(verify ([\d.]+) \+ drafter ([\d.]+) \+ the rest "
                                        r"([\d.]+)\)", words).groups())
    assert round(sum(parts), 2) == cost  # the printed parts add up to the printed step
    for xs in ([1.137, 0.068, 0.008], [1.1449, 0.0749, 0.0049], [0.333, 0.333, 0.333]):
        cents = real._cents(xs)  # each part off by less than a cent, and the sum is the rounded total
        assert sum(cents) == pytest.approx(round(sum(xs), 2)) and all(abs(c - x) < 0.01 for c, x in zip(cents, xs))
    rec = _record()  # a verify that costs 3 AR steps: now the cost holds it back more
    rec["rows"][1]["split"]["target_ms"] = 210.0
    assert "the cost of a step holds it back more" in real.parts_words(real.speedup_parts(rec))


def test_training_gap_reads_both_records():
    gap = real.training_gap(_record(), TRAIN)
    assert gap["train_agreement"] == 0.65 and gap["heldout_rate"] == 0.35 and "outside" not in gap
    words = real.gap_words(gap)
    assert "65%" in words and "35%" in words and "54% of the training figure" in words
    rec = copy.deepcopy(_record())
    rec["acceptance_all"]["DeepSeek D=1, k=2, reduced vocab"].update(rejections=149, rejected_outside_vocab=26)
    assert "26 of 149 rejections" in real.gap_words(real.training_gap(rec, TRAIN))
    assert real.training_gap({}, TRAIN) is None and "no training agreement" in real.gap_words(None)


def test_rejections_outside_the_draft_vocabulary_are_counted():
    pytest.importorskip("transformers")

    def step(drafted, accepted, bonus, source):
        return Step(drafted=drafted, accepted=accepted, emitted=drafted[:accepted] + [bonus], bonus=bonus,
                    bonus_source=source, forwards=1)
    tr = Trace(method="x", prompt=[1], steps=[step([5], 0, 9, "correction"), step([5], 1, 7, "target"),
                                             step([6], 0, 5, "correction")])
    assert real.outside_vocab(tr, [5, 6, 7]) == (1, 2)
    assert real.outside_vocab(tr, None) == (0, 2)


def test_two_readings_of_one_quantity_say_how_far_apart_and_which_to_read():
    assert "within 5%, the two readings agree" in real.two_readings("t(1)", 84.9, 86.0, "above", unit=" ms")
    text = real.two_readings("SmolLM2's t(1)", 84.9, 99.8, "in the cost curve above", unit=" ms")
    assert "84.9 ms here, 99.8 ms in the cost curve above: 18% apart" in text and "shipped record" in text
