"""The companions' measurement helpers (mtplab.teaching.*) measure what they say."""
import pytest
import torch
from scipy.stats import chisquare

from mtplab.model.gpt import GPT
from mtplab.model.config import preset
from mtplab.measuring import theory
from mtplab.teaching import sampling
from mtplab.measuring import timing
from mtplab.teaching import meta
from mtplab.teaching import blockwise
from mtplab import viz
from mtplab.decoding.trace import pooled
from mtplab.teaching import deepseek
from mtplab.teaching import bottleneck
from mtplab.teaching import words
from mtplab.decoding.generate import run_prompts
from mtplab.decoding.accept import accept, distribution
from mtplab.decoding.loop import autoregressive
from mtplab.decoding.drafters import DraftModelDrafter
from mtplab.training.losses import multi_token_loss
from tests.conftest import random_model


def test_chi_square_matches_scipy():
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(6, generator=g), -1)
    counts = torch.bincount(torch.multinomial(probs, 500, replacement=True, generator=g), minlength=6).float()
    ours = sampling.chi_square(counts, probs)
    theirs = chisquare(counts.numpy(), (probs * 500).double().numpy())
    assert ours["stat"] == pytest.approx(theirs.statistic)
    assert ours["pvalue"] == pytest.approx(theirs.pvalue, rel=1e-6)
    assert sampling.chi_square(torch.tensor([500.0, 0, 0, 0, 0, 0]), probs)["pvalue"] < 1e-6


def test_cost_curve_is_a_ratio_to_one_token():
    model = GPT(preset("tiny")).eval()
    curve = timing.measure_cost_curve(model, (2, 8), context=16, repeats=3)
    assert set(curve.seconds) == {1, 2, 8}
    assert curve.ratio[1] == 1.0
    assert all(len(s) == 3 for s in curve.samples.values())
    assert all(t > 0 for t in curve.seconds.values())


def test_forward_cost_grows_in_flops_not_in_weight_bytes():
    cfg = preset("classroom")
    a, b = timing.forward_cost(cfg, 1, context=0), timing.forward_cost(cfg, 8, context=0)
    assert b["flops"] > 7 * a["flops"]
    assert b["bytes"] - a["bytes"] < 0.01 * a["bytes"]
    n_weights = sum(p.numel() for p in GPT(cfg).parameters())  # the tied matrix counts once
    assert a["weights"] == pytest.approx(n_weights, rel=0.01)  # norms are left out


def test_peak_memory_sees_torch_allocations():
    small = timing.peak_memory(lambda: torch.ones(2 ** 16), "cpu")
    big = timing.peak_memory(lambda: torch.ones(2 ** 22), "cpu")
    assert big >= 4 * 2 ** 22 > small


def test_memory_efficient_backward_uses_less_memory_and_same_gradients():
    mem = meta.meta_backward_memory((2, 6), batch_size=2)
    assert mem["memory-efficient"][6] < mem["joint backward"][6]
    grow_eff = mem["memory-efficient"][6] - mem["memory-efficient"][2]
    grow_joint = mem["joint backward"][6] - mem["joint backward"][2]
    assert grow_eff < grow_joint
    assert meta.meta_gradients_agree(batch_size=2) < 1e-5


def test_oracle_counts_and_step_table():
    model = random_model(seed=4)
    counts = blockwise.oracle_forward_counts(model, [1, 2], [5, 9], (3,), schedule="plain")
    assert counts == {3: [theory.plain_forwards(5, 3), theory.plain_forwards(9, 3)]}
    tr = run_prompts("oracle", model, [[1, 2]], max_new_tokens=12, k=3, alpha=0.5)[0]
    table = viz.steps_table(tr)
    assert len(table.splitlines()) == 2 + len(tr.steps)
    both = pooled([tr, tr])
    assert both.num_drafts == 2 * tr.num_drafts and both.tokens == tr.tokens + tr.tokens


def test_accept_counts_follow_p_and_keep_the_overlap():
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(5, generator=g), -1)
    q = torch.softmax(torch.randn(5, generator=g), -1)
    r = sampling.accept_counts(p, q, 3000, generator=g)
    assert sampling.chi_square(r["counts"], p)["pvalue"] > 1e-3
    assert abs(r["kept"] - float(torch.minimum(p, q).sum())) < 0.04
    always = sampling.accept_counts(p, q, 3000, generator=g, rule=lambda d, p, q, **kw: (1, -1, "none"))
    assert sampling.chi_square(always["counts"], p)["pvalue"] < 1e-6


def test_second_token_marginal_is_exact():
    model = random_model(vocab_size=5, seed=9, noise=2.0)
    prompt = [1, 2]
    got = sampling.second_token_marginal(model, prompt)
    want = torch.zeros(5)
    with torch.no_grad():
        p1 = distribution(model(torch.tensor([prompt])).logits[0, -1:], 1.0, None)[0]
        for a in range(5):
            p2 = distribution(model(torch.tensor([prompt + [a]])).logits[0, -1:], 1.0, None)[0]
            want += p1[a] * p2
    assert torch.allclose(got, want, atol=1e-6) and got.sum() == pytest.approx(1.0, abs=1e-5)
    draft = random_model(vocab_size=5, seed=10, noise=2.0)
    run = sampling.second_token_counts(model, lambda: DraftModelDrafter(draft, model), prompt, 400, seed=3)
    assert run["counts"].sum() == 400 and 0 < run["kept"] < 1
    assert sampling.chi_square(run["counts"], got)["pvalue"] > 1e-3


def test_acceptance_by_rule_extremes():
    model = random_model(seed=6)
    x = torch.randint(256, (2, 17), generator=torch.Generator().manual_seed(0))
    same = sampling.acceptance_by_rule(model, model, x, temperatures=(0.5, 1.0))
    assert same["greedy"] == 1.0 and all(v == pytest.approx(1.0) for v in same["sampling"].values())
    other = sampling.acceptance_by_rule(model, random_model(seed=7), x)
    assert 0 <= other["sampling"][1.0] < 1


def test_forced_and_free_agree_at_depth_two_when_the_main_guess_is_right():
    """Module 1 reads the main model's guess when free running; where that guess is the true token,
    its prediction must equal the teacher-forced one. A model scored on its own greedy text has a right
    guess everywhere, so the two accuracies of module 1 are identical."""
    model = random_model("deepseek", 3, seed=3)
    prompt = [3, 1, 4, 1, 5]
    text = torch.tensor([autoregressive(model, prompt, max_new_tokens=40).tokens])
    windows = torch.cat([torch.tensor([prompt]), text], dim=1)
    ff = deepseek.forced_and_free(model, windows, (8, 16, 24))
    assert ff["main"] == [1.0]
    assert ff["teacher-forced"][0] == ff["free-running"][0]
    assert ff["n"] == 3


def test_peaked_logits_and_shift_table():
    x = torch.tensor([[0, 1, 2, 3, 4, 5, 6]])
    right = meta.peaked_logits(x, 3, 7, shift=1)
    assert multi_token_loss(right, x[:, 1:], 3) < 0.01
    assert multi_token_loss(right, x[:, :-1], 3) > 5
    table = meta.shift_table(4, 2).splitlines()
    assert table[1].split()[1:] == ["x[1]", "x[2]", "x[3]", "x[4]"]
    assert table[2].split()[1:] == ["x[2]", "x[3]", "x[4]", "."]


def test_quantize_int8_keeps_greedy_output_close():
    model = random_model(seed=2)
    qm, note = bottleneck.quantize_int8(model)
    if qm is None:
        pytest.skip(note)
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    quantized = sum(type(m).__module__.startswith("torch.ao.nn.quantized.dynamic") and type(m).__name__ == "Linear"
                    for m in qm.modules())
    assert quantized == linears > 0 and note.split(": ")[1].startswith(f"{quantized} nn.Linear")  # the lab's Linear too
    assert all(not isinstance(m, torch.nn.Linear) for m in qm.modules())  # no float linear left behind
    assert any(isinstance(m, torch.nn.Linear) for m in model.modules())  # the model itself is untouched
    a = autoregressive(model, [1, 2, 3], max_new_tokens=10).tokens
    b = autoregressive(qm, [1, 2, 3], max_new_tokens=10).tokens
    assert len(b) == 10 and "int8" in note
    assert sum(x == y for x, y in zip(a, b)) >= 1


def test_raced_decodes_and_ms_per_token():
    model = random_model(seed=2)
    runs, ms, _ = bottleneck.raced_decodes({"c": (model, True), "n": (model, False)}, [1, 2], max_new_tokens=6,
                                           repeats=3)
    assert runs["c"].tokens == runs["n"].tokens
    assert all(bottleneck.ms_per_token(t) > 0 for t in runs.values())
    assert [len(v) for v in ms.values()] == [3, 3] and bottleneck.ms_per_token(runs["c"]) in ms["c"]
    assert words.spread([3.0, 1.0, 2.0]) == "2.00 (range 1.00-3.00, n = 3)"


def test_accept_rule_is_the_one_the_loop_uses():
    """accept_counts calls decoding.accept with one-row p and q: a kept draft ends the step."""
    p = torch.tensor([[0.0, 1.0]])
    q = torch.tensor([[0.0, 1.0]])
    assert accept([1], p, q, greedy=False, generator=torch.Generator())[0] == 1
    assert sampling.accept_counts(p[0], q[0], 5, generator=torch.Generator())["counts"].tolist() == [0.0, 5.0]
