"""The choices engines make (issue 22): one DeepSeek module reused for many drafts, adaptive k, and typical
acceptance as the lossy contrast. Exact methods equal greedy AR and keep the target's distribution; the lossy
rule is caught by the same chi-square test that passes the exact ones."""
import pytest
import torch

from mtplab.decoding import adaptive
from mtplab.decoding.accept import typical
from mtplab.decoding.drafters import Draft, DeepSeekDrafter, SternDrafter
from mtplab.decoding.generate import decode_with
from mtplab.decoding.loop import autoregressive, speculative
from mtplab.errors import MtplabError
from tests.conftest import random_model
from tests.decoding.test_sampling import PROMPT, V, chi2_pvalue, exact_joint

N = 2000


@pytest.mark.parametrize("k", [2, 4, 8])
def test_one_module_reused_for_k_minus_1_drafts_equals_greedy_ar(k):
    model = random_model("deepseek", 2, seed=31).eval()  # D = 1 module
    prompt = [3, 1, 4, 1, 5]
    ar = autoregressive(model, prompt, max_new_tokens=40).tokens
    tr = decode_with("deepseek-reuse", model, prompt, max_new_tokens=40, k=k)
    assert tr.tokens == ar
    assert max(len(s.drafted) for s in tr.steps) == k - 1  # module 1 ran k-1 times a step
    assert tr.draft_forwards >= len(tr.steps) - 2  # every step but the prefill and a last one-token step


def test_reuse_is_bounded_and_d_separate_modules_still_work():
    model = random_model("deepseek", 2, seed=32)
    with pytest.raises(MtplabError, match="reuse must be an integer in 1..16"):
        DeepSeekDrafter(model, reuse=10 ** 6)
    with pytest.raises(MtplabError, match="use k <= 8"):
        decode_with("deepseek-reuse", model, [1, 2], max_new_tokens=4, k=9)
    assert DeepSeekDrafter(model).max_drafts == 1


@pytest.mark.parametrize("name", ["schedule", "confidence"])
@pytest.mark.parametrize("family,method", [("stern", "blockwise-overlap"), ("deepseek", "deepseek-reuse")])
def test_adaptive_k_keeps_greedy_output_identical(name, family, method):
    model = random_model(family, 4 if family == "stern" else 2, seed=33).eval()
    prompt = [2, 7, 1, 8]
    ar = autoregressive(model, prompt, max_new_tokens=40).tokens
    tr = decode_with(method, model, prompt, max_new_tokens=40, k=4, adapt=name, threshold=0.2)
    assert tr.tokens == ar


def test_the_schedule_grows_after_a_full_accept_and_shrinks_after_a_rejection():
    s = adaptive.Schedule()
    assert s.drafts(5) == 5
    s.after(5, 2)
    assert s.drafts(5) == 4
    s.after(4, 4)
    assert s.drafts(5) == 5  # +2, clamped to k-1
    for _ in range(10):
        s.after(s.drafts(5), 0)
    assert s.drafts(5) == 1  # never fewer than one draft


def test_the_confidence_stop_keeps_the_drafts_before_the_first_unsure_one():
    stop = adaptive.ConfidenceStop(0.5)
    d = stop.cut(Draft([4, 5, 6], confidence=[0.9, 0.4, 0.95], calls=1))
    assert d.tokens == [4] and d.confidence == [0.9]
    assert stop.cut(Draft([4, 5], confidence=[0.3, 0.9])).tokens == []
    assert stop.cut(Draft([1], confidence=None)).tokens == [1]  # a drafter without confidences is left alone
    with pytest.raises(MtplabError, match="probability in"):
        adaptive.ConfidenceStop(2.0)
    with pytest.raises(MtplabError, match="unknown adaptive policy"):
        adaptive.policy("bogus")


def test_a_drafter_that_drafts_in_turn_stops_at_the_first_unsure_draft_and_drafts_what_the_cut_keeps():
    model = random_model("deepseek", 2, seed=34).eval()
    prompt = [5, 3, 5, 8, 9]
    ar = autoregressive(model, prompt, max_new_tokens=40).tokens
    early = speculative(model, DeepSeekDrafter(model, reuse=5), prompt, max_new_tokens=40, k=6,
                        adapt=adaptive.ConfidenceStop(0.3))
    full = DeepSeekDrafter(model, reuse=5)
    made = []
    propose = full.propose
    full.propose = lambda n, stop=None: made.append(propose(n)) or made[-1]  # every depth, never told to stop
    late = speculative(model, full, prompt, max_new_tokens=40, k=6, adapt=adaptive.ConfidenceStop(0.3))
    assert early.tokens == late.tokens == ar
    assert [s.drafted for s in early.steps] == [s.drafted for s in late.steps]
    cut = [s for s, d in zip(late.steps[1:], made) if len(s.drafted) < len(d.tokens)]
    assert cut, "no step was cut: pick a threshold the random drafter falls below"
    assert early.draft_forwards < late.draft_forwards  # the deeper drafts after an unsure one were never made
    # a step made the drafts it kept, and the unsure one it stopped at when it stopped early
    assert all(s.draft_forwards - len(s.drafted) in (0, 1) for s in early.steps[1:])


@pytest.mark.parametrize("family,make,adapt,cuts", [
    ("stern", SternDrafter, adaptive.Schedule, False),
    ("stern", SternDrafter, lambda: adaptive.ConfidenceStop(threshold=0.2), True),  # cuts drafts short here (09 §2)
    ("deepseek", lambda m: DeepSeekDrafter(m, reuse=3), adaptive.Fixed, False),  # module 1 reused for both drafts
], ids=["schedule", "confidence", "deepseek-reuse"])
def test_engine_choices_keep_the_target_distribution_when_sampling(family, make, adapt, cuts):
    """09 says every exact method it studies samples from the target's distribution: the joint of the first two
    sampled tokens against the target's exact joint, chi-square, for adaptive k (both policies) and a reused module."""
    target = random_model(family, 2 if family == "deepseek" else 3, vocab_size=V, seed=23, noise=2.0)
    g = torch.Generator().manual_seed(5)
    counts, cut = torch.zeros(V, V), False
    for _ in range(N):
        tr = speculative(target, make(target), PROMPT, max_new_tokens=4, k=3, temperature=1.0, generator=g,
                         adapt=adapt())
        t = tr.tokens
        counts[t[1], t[2]] += 1
        done = 0
        for s in tr.steps:  # a step's room: k-1 drafts, at most the new tokens left but one (the overlap schedule)
            if not s.prefill:
                cut = cut or len(s.drafted) < min(2, 4 - done - 1)
            done += len(s.emitted)
    assert chi2_pvalue(counts, N * exact_joint(target, 1.0, None)) > 0.01
    assert cut == cuts  # only the confidence stop drafts fewer than a step has room for


def test_typical_acceptance_is_greedy_at_temperature_0():
    model = random_model("stern", 4, seed=34).eval()
    ar = autoregressive(model, [5, 4, 3], max_new_tokens=30).tokens
    assert decode_with("blockwise-overlap", model, [5, 4, 3], max_new_tokens=30, k=4, rule="typical").tokens == ar


def test_typical_acceptance_is_lossy_and_the_chi_square_test_sees_it():
    """The exact rule passes this test (test_sampling); typical acceptance, on the same model, fails it."""
    target = random_model("stern", 3, vocab_size=V, seed=23, noise=2.0)
    g = torch.Generator().manual_seed(6)
    counts = torch.zeros(V, V)
    for _ in range(N):
        t = speculative(target, SternDrafter(target), PROMPT, max_new_tokens=4, k=3, temperature=1.0, generator=g,
                        rule="typical").tokens
        counts[t[1], t[2]] += 1
    expected = N * exact_joint(target, 1.0, None)
    assert chi2_pvalue(counts, expected) < 1e-3
    tv = 0.5 * float((counts / N - expected / N).abs().sum())
    assert tv > 0.02  # total variation between the typical rule's (t2, t3) and the target's


def test_typical_keeps_a_likely_draft_and_rejects_an_unlikely_one():
    p = torch.tensor([[0.7, 0.2, 0.1], [0.34, 0.33, 0.33]])
    g = torch.Generator().manual_seed(0)
    assert typical([0], p, generator=g)[0] == 1  # p = 0.7 > min(0.09, 0.3 e^-H)
    assert typical([2], p[:1], generator=g)[0] == 1  # 0.1 > 0.09: still typical enough
    n, tok, src = typical([1], torch.tensor([[0.95, 0.02, 0.03], [1 / 3] * 3]), generator=g)
    assert n == 0 and src == "correction"


@pytest.mark.parametrize("prompt,words", [(1.5, "list of token ids"), ("hello", "not str"), (None, "not NoneType"),
                                          ([1, 2.5], "must be integers"), ([True, 2], "must be integers"),
                                          (torch.zeros(2, 3, dtype=torch.long), "1-D tensor"),
                                          (torch.tensor([1.0, 2.0]), "1-D tensor")])
def test_a_bad_prompt_gets_one_line(prompt, words):
    model = random_model(seed=40)
    with pytest.raises(MtplabError, match=words):
        autoregressive(model, prompt, max_new_tokens=2)


@pytest.mark.parametrize("kw,words", [({"max_new_tokens": True}, "max_new_tokens must be"),
                                      ({"temperature": "hot"}, "temperature must be >= 0 and finite"),
                                      ({"temperature": float("nan")}, "temperature must be >= 0 and finite"),
                                      ({"top_k": 2.5}, "top_k must be an integer"), ({"top_k": True}, "top_k must be"),
                                      ({"generator": 7}, "generator must be a torch.Generator")])
def test_bad_decoder_options_get_one_line(kw, words):
    model = random_model("stern", 3, seed=41)
    args = {"max_new_tokens": 3, **kw}
    with pytest.raises(MtplabError, match=words):
        speculative(model, SternDrafter(model), [1, 2], k=3, **args)
    assert torch.tensor([1, 2]).dim() == 1 and autoregressive(model, torch.tensor([1, 2]), max_new_tokens=2).tokens
