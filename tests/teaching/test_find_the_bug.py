"""Find the bug (mtplab.teaching.find_the_bug): the chi-square test catches every planted bug and passes the correct
rules; the answer key stays hidden until the student's verdicts pass."""
import pytest
import torch

from mtplab.teaching import find_the_bug as bugs
from mtplab.decoding.accept import accept
from mtplab.errors import MtplabError
answer_key = pytest.importorskip("instructor.find_the_bug_key", reason="the student copy has no answer key")

ANSWERS = answer_key.ANSWERS  # rule: (what it is, broken, why); the package holds only digests
BROKEN = [name for name, a in ANSWERS.items() if a[1]]
CORRECT = [name for name, a in ANSWERS.items() if not a[1]]
WHAT = {a[0]: bugs.RULES[name] for name, a in ANSWERS.items()}


def test_the_lab_plants_six_bugs_and_two_correct_rules():
    planted = {ANSWERS[n][0] for n in BROKEN}
    assert planted == {"ignores_temperature", "p_in_bf16", "argmax_residual", "first_unverified", "residual_is_p",
                       "top_k_on_p"}
    assert len(CORRECT) == 2 and list(ANSWERS) == list(bugs.RULES)


def test_the_package_holds_a_digest_of_the_key_not_the_key():
    """Issue 39: the answer key lived one attribute away (find_the_bug.ANSWERS) and the module docstring described
    every bug. The package's one digest and sealed explanations are made from instructor/'s key."""
    assert (bugs._KEY, bugs._SEALED) == answer_key.sealed()
    assert not hasattr(bugs, "ANSWERS")
    for what, broken, why in ANSWERS.values():
        if broken:
            assert what not in bugs.__doc__ and why.split(":")[0] not in bugs.__doc__
            assert what not in str(vars(bugs)) and why.split(":")[0] not in str(vars(bugs))
    assert {f.__name__ for f in bugs.RULES.values()} == set(bugs.RULES)  # the functions carry neutral names
    assert all(f.__doc__ is None for f in bugs.RULES.values())
    with pytest.raises(MtplabError, match="do not open"):  # the explanations stay sealed under wrong verdicts
        bugs._open(dict(answer_key.BROKEN, rule_a=False))


@pytest.mark.parametrize("name", BROKEN)
def test_every_planted_bug_is_caught_at_the_default_sample_size(name):
    # 3 seeds here; the notebook and the lead's command run more (bugs.power_table)
    assert bugs.power(bugs.RULES[name], seeds=3) == 1.0


@pytest.mark.parametrize("name", CORRECT)
def test_the_correct_rules_pass(name):
    """At ALPHA = 0.05 a correct rule is rejected on about 1 seed in 20: over 10 seeds, at most 2 (P(> 2) ~ 1%)."""
    runs = [bugs.judge(bugs.RULES[name], s) for s in range(10)]
    assert sum(r["broken"] for r in runs) <= 2, [r["pvalue"] for r in runs]
    assert all(r["counts"].sum() == bugs.N_DRAWS for r in runs)


def test_ratio_free_is_decoding_accept_draw_for_draw():
    """u * q(d) < p(d) is u < p(d) / q(d): with the same random numbers, the same verdicts and tokens."""
    g = torch.Generator().manual_seed(1)
    for trial in range(200):
        n = 1 + trial % 4
        p = torch.softmax(2 * torch.randn(n + 1, 8, generator=g), -1)
        q = torch.softmax(2 * torch.randn(n, 8, generator=g), -1)
        drafts = torch.multinomial(q, 1, generator=g)[:, 0].tolist()
        ours = WHAT["ratio_free"](drafts, p, q, greedy=False, generator=torch.Generator().manual_seed(trial))
        want = accept(drafts, p, q, greedy=False, generator=torch.Generator().manual_seed(trial))
        assert ours == want


def test_first_unverified_keeps_a_draft_that_p_never_gives():
    p = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    q = torch.tensor([[0.0, 1.0]])
    assert WHAT["first_unverified"]([1], p, q, greedy=False, generator=torch.Generator())[0] == 1
    assert WHAT["reference"]([1], p, q, greedy=False, generator=torch.Generator())[:2] == (0, 0)


def test_bf16_rule_changes_p_only_through_rounding():
    p, _ = bugs.toy(0)
    logits = (torch.log(p.double()) + bugs.LOGIT_LEVEL).to(torch.bfloat16).float()
    assert (logits - logits.round()).abs().max() == 0  # bf16 steps by 1 between 128 and 256


def test_check_verdicts_grades_the_set_and_says_nothing_about_one_rule():
    """Issue 39 B5: the package kept one digest per rule, and a wrong set was told how many verdicts were off, so
    one guess at one rule (or flipping one verdict) revealed that rule. Now one digest covers the whole set, and
    every wrong set, whichever and however many verdicts are off, gets the same words."""
    import itertools
    right = dict(answer_key.BROKEN)
    assert bugs.check_verdicts(right)
    wrongs = [bugs.check_verdicts(dict(right, **{name: not right[name]})) for name in bugs.RULES]  # one flipped
    wrongs += [bugs.check_verdicts(dict(right, **{a: not right[a], b: not right[b]}))  # two flipped
               for a, b in itertools.islice(itertools.combinations(bugs.RULES, 2), 3)]
    wrongs.append(bugs.check_verdicts({name: not v for name, v in right.items()}))  # every one flipped
    assert not any(wrongs)
    assert len({w.why for w in wrongs}) == 1, {w.why for w in wrongs}  # the same words for every wrong set
    assert not any(name in wrongs[0].why for name in bugs.RULES) and "the set" in wrongs[0].why
    assert not any(ch.isdigit() for ch in wrongs[0].why.replace(str(len(bugs.RULES)), "").replace("20", "")
                   .replace(str(bugs.ALPHA), ""))  # no count of what is off
    assert isinstance(bugs._KEY, str) and not hasattr(bugs, "_right")  # one digest, no per-rule test to call
    assert "no verdict yet for rule_h" in bugs.check_verdicts({n: v for n, v in right.items() if n != "rule_h"}).why
    assert not bugs.check_verdicts(["rule_a"])
    assert "unknown rule" in bugs.check_verdicts(dict(right, rule_z=True)).why


def test_the_key_is_earned_only_by_a_passing_check():
    right = dict(answer_key.BROKEN)
    assert bugs.earned(bugs.check_verdicts({n: None for n in bugs.RULES})) is None
    assert bugs.earned(bugs.check_verdicts(dict(right, rule_a=False))) is None
    assert bugs.earned(bugs.check_verdicts(right)) == right
    assert bugs.label("rule_a") == "rule_a"
    assert "broken" in bugs.label("rule_a", right) and "correct" in bugs.label("rule_b", right)


def test_nothing_drawn_or_printed_shows_the_key_before_it_is_earned():
    """Review finding: 08's power figure was coloured from ANSWERS two cells after the exercise."""
    right = dict(answer_key.BROKEN)
    power = {n: (1.0 if a[1] else 0.5) for n, a in ANSWERS.items()}
    before = bugs.power_figure(power, seeds=2)
    assert len({b.get_facecolor() for b in before.axes[0].patches}) == 1
    after = bugs.power_figure(power, seeds=2, key=right)
    assert len({b.get_facecolor() for b in after.axes[0].patches}) == 2
    text = bugs.power_text(power, seeds=2, n=300)
    assert "6 of 8 rules were rejected on every one of 2 seeds" in text
    assert "broken" not in text and "correct rules" not in text
    runs = {n: bugs.judge(r, 0, n=60) for n, r in bugs.RULES.items()}
    revealed = bugs.power_text(power, seeds=2, n=300, key=right, runs=runs)
    assert "rule_b and rule_f emitted the same tokens draw for draw" in revealed and "1 of 2 seeds, counted once" \
        in revealed


def test_bad_input_names_the_fix():
    with pytest.raises(MtplabError, match="n must be an integer >= 50"):
        bugs.judge(WHAT["reference"], n=10)
    with pytest.raises(MtplabError, match="rule must be a function"):
        bugs.judge("rule_a")
    with pytest.raises(MtplabError, match="seeds must be"):
        bugs.power(WHAT["reference"], seeds=0)


def test_power_bars_colour_the_answers():
    from mtplab.viz import stats as viz_metrics

    power = {n: (1.0 if a[1] else 0.0) for n, a in ANSWERS.items()}
    fig = viz_metrics.power_bars(power, alpha=bugs.ALPHA, broken=dict(answer_key.BROKEN))
    bars = fig.axes[0].patches
    assert [b.get_height() for b in bars] == list(power.values())
    assert len({b.get_facecolor() for b in bars}) == 2


def test_the_power_command_prints_every_rule_and_refuses_bad_input(tmp_path, capsys):
    out = tmp_path / "power.json"
    assert bugs.main(["--seeds", "1", "--draws", "60", "--json", str(out)]) == 0  # the command, not the statistics
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 8 and lines[0].startswith("rule_a: rejected on")
    assert not any(w in "".join(lines) for w in ("broken", "correct", "residual_is_p"))
    import json
    saved = json.loads(out.read_text())
    assert set(saved["power"]) == set(bugs.RULES) and saved["n_draws"] == 60
    assert bugs.main(["--seeds", "0"]) == 2
    assert "seeds must be" in capsys.readouterr().err
    assert bugs.main(["--seeds", "1", "--draws", "10"]) == 2
    assert "n must be an integer >= 50" in capsys.readouterr().err


def test_each_rule_draws_its_own_random_numbers():
    """Review finding: 08's two correct rules sat at the same power and p-value because they were judged on the same
    random numbers, which gave the pair away; judge_all and power_table give each rule its own stream."""
    runs = bugs.judge_all(0, n=300)
    assert set(runs) == set(bugs.RULES)
    assert not torch.equal(runs[CORRECT[0]]["counts"], runs[CORRECT[1]]["counts"])
    same = [bugs.judge(bugs.RULES[n], 0, n=300) for n in CORRECT]  # one stream: identical, as documented
    assert torch.equal(same[0]["counts"], same[1]["counts"])


def test_tracker_shapes_are_described_as_the_rules_do_them():
    """Review finding (citations B42, B44): rule_e rounds the target p, rule_h filters p; the trackers' bugs were on
    the draft side. The key says what the rule does and that it is of the tracker bug's shape."""
    e, h = ANSWERS["rule_e"][2], ANSWERS["rule_h"][2]
    assert "target p" in e and "of the shape of DeepSpec#31" in e and "draft side" in e
    assert "target p" in h and "of the shape of vllm PR #10198" in h and "top-p filtered q" in h
    assert bugs.check_verdicts(dict(answer_key.BROKEN)).why.count("of the shape of") == 4  # opened after a pass
