import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from mtplab.model.layers import KVCache
from mtplab.errors import MtplabError
from mtplab.measuring import theory
from mtplab.decoding.loop import autoregressive, iter_steps, speculative
from mtplab.decoding.drafters import (Draft, DeepSeekDrafter, DraftModelDrafter, MetaDrafter, NgramDrafter, OracleDrafter,
                                      SternDrafter)
from tests.conftest import random_model

HEAD_DRAFTERS = {"stern": SternDrafter, "meta": MetaDrafter, "deepseek": DeepSeekDrafter}


@settings(max_examples=12, deadline=None)
@given(prompt=st.lists(st.integers(0, 255), min_size=1, max_size=20), k=st.integers(1, 6),
       m=st.integers(1, 30), schedule=st.sampled_from(["plain", "overlap"]))
def test_greedy_speculative_equals_autoregressive(family_models, prompt, k, m, schedule):
    refs = {name: autoregressive(model, prompt, max_new_tokens=m).tokens for name, model in family_models.items()}
    for fam, cls in HEAD_DRAFTERS.items():
        model = family_models[fam]
        tr = speculative(model, cls(model), prompt, max_new_tokens=m, k=k, schedule=schedule)
        assert tr.tokens == refs[fam], (fam, k, schedule)
    plain = family_models["none"]
    for d in (NgramDrafter(), DraftModelDrafter(random_model(seed=11)), OracleDrafter(refs["none"], 0.6, seed=1)):
        tr = speculative(plain, d, prompt, max_new_tokens=m, k=k, schedule=schedule)
        assert tr.tokens == refs["none"], (d.name, k, schedule)
        assert len(tr.tokens) == m


def test_caches_are_sized_for_the_decode_not_the_window(family_models, monkeypatch):
    """A cache is zeroed when made: the decoders size theirs for the positions a decode writes (prompt, m new tokens,
    one step's drafts), not for the whole context window. At the window's edge a decode still equals AR."""
    prompt, m, k = [5, 6, 7, 8], 9, 4
    for fam in ("none", "deepseek", "meta"):
        model = family_models[fam]
        made = []
        real = type(model).new_cache
        monkeypatch.setattr(type(model), "new_cache",
                            lambda self, *a, made=made, real=real, **kw: made.append(kw["max_len"]) or real(self, *a, **kw))
        ref = autoregressive(model, prompt, max_new_tokens=m).tokens
        drafter = NgramDrafter() if fam == "none" else HEAD_DRAFTERS[fam](model)
        assert speculative(model, drafter, prompt, max_new_tokens=m, k=k).tokens == ref
        assert made == [len(prompt) + m + 1, len(prompt) + m + k + 1], fam
        monkeypatch.undo()
        if fam == "deepseek":
            assert drafter.H[0].shape[1] == drafter.caches[0].max_len == len(prompt) + 1 + m + drafter.max_drafts + 2
    target, small = family_models["none"], random_model(seed=11)  # a draft model's cache: the same fitted size
    drafter = DraftModelDrafter(small)
    for sampled in (False, True):  # greedy and sampled drafts, each at k = 2 and a k larger than the decode
        for kk in (2, m + 3):
            kw = dict(temperature=1.0, generator=torch.Generator().manual_seed(1)) if sampled else {}
            tr = speculative(target, drafter, prompt, max_new_tokens=m, k=kk, **kw)
            assert len(tr.tokens) == m and drafter.cache.max_len == drafter.max_len <= len(prompt) + m + 3
            assert sampled or tr.tokens == autoregressive(target, prompt, max_new_tokens=m).tokens
    model = family_models["deepseek"]
    edge = list(range(model.config.block_size - m - k))  # prompt + m + k = block_size: the longest allowed, clamped
    ref = autoregressive(model, edge, max_new_tokens=m).tokens
    assert speculative(model, DeepSeekDrafter(model), edge, max_new_tokens=m, k=k).tokens == ref


def test_greedy_with_and_without_cache_agree(family_models):
    m = family_models["none"]
    a = autoregressive(m, [1, 2, 3], max_new_tokens=40)
    b = autoregressive(m, [1, 2, 3], max_new_tokens=40, use_cache=False)
    assert a.tokens == b.tokens and a.forwards == 40


@pytest.mark.parametrize("k", [2, 3, 4, 5, 6])
@pytest.mark.parametrize("m", [1, 7, 12, 24, 25, 31])
def test_oracle_alpha_one_forward_counts(family_models, m, k):
    model = family_models["none"]
    prompt = [3, 1, 4, 1, 5]
    ref = autoregressive(model, prompt, max_new_tokens=m).tokens
    plain = speculative(model, OracleDrafter(ref, 1.0), prompt, max_new_tokens=m, k=k, schedule="plain")
    over = speculative(model, OracleDrafter(ref, 1.0), prompt, max_new_tokens=m, k=k, schedule="overlap")
    assert plain.forwards == theory.plain_forwards(m, k)
    assert over.forwards == theory.overlap_forwards(m, k)
    if m % k == 0:
        assert plain.forwards == theory.stern_plain_steps(m, k)  # 2m/k
        assert over.forwards == theory.stern_overlap_steps(m, k)  # 1 + m/k
    assert plain.tokens == ref == over.tokens


@pytest.mark.parametrize("m", [6, 13, 20])
def test_deepseek_forward_count_with_perfect_modules(m):
    """Modules that always agree with the main model: D drafts accepted every step."""
    model = random_model("deepseek", 3, seed=8)  # D = 2
    prompt = [9, 8, 7]
    ref = autoregressive(model, prompt, max_new_tokens=m).tokens
    drafter = DeepSeekDrafter(model)
    orig = drafter.propose

    def perfect(n):  # run the modules (keeps caches honest) but draft the main model's tokens
        orig(n)
        done = len(drafter.tokens) - len(prompt)
        return Draft(ref[done:done + n])
    drafter.propose = perfect
    tr = speculative(model, drafter, prompt, max_new_tokens=m, k=3)
    assert tr.tokens == ref
    assert tr.forwards == theory.deepseek_forwards(m, 2)


def test_oracle_acceptance_matches_theory():
    model = random_model(block_size=512)
    prompt = [1, 2]
    m, k, alpha = 400, 5, 0.8
    ref = autoregressive(model, prompt, max_new_tokens=m).tokens
    tr = speculative(model, OracleDrafter(ref, alpha, seed=3), prompt, max_new_tokens=m, k=k)
    cond = tr.conditional_acceptance
    assert all(abs(c - alpha) < 0.08 for c in cond[:3]), cond
    steps = [s for s in tr.steps if len(s.drafted) == k - 1]
    tps = sum(len(s.emitted) for s in steps) / len(steps)
    assert abs(tps - theory.expected_tokens_per_step(alpha, k - 1)) < 0.3


def _check_caches(model, prompt_len, used_modules=99):
    """A check that compares every cache with a full recompute over the committed tokens."""
    def check(cache, drafter, tokens):
        L = len(tokens) - 1
        assert cache.length == L
        fresh = model.new_cache()
        out = model(torch.tensor([tokens[:L]]), fresh)
        assert (cache.k[:, :, :, :L] - fresh.k[:, :, :, :L]).abs().max() < 1e-5
        assert (cache.v[:, :, :, :L] - fresh.v[:, :, :, :L]).abs().max() < 1e-5
        if isinstance(drafter, MetaDrafter):
            hc = model.mtp.new_cache(model)
            model.mtp.hidden(model, out.pre_last, hc)
            assert drafter.cache.length == L
            assert (drafter.cache.k[:, :, :, :L] - hc.k[:, :, :, :L]).abs().max() < 1e-5
        if isinstance(drafter, DeepSeekDrafter):
            h = out.hidden
            x = torch.tensor([tokens])
            for k, mod in enumerate(model.mtp.layers[:used_modules], start=1):
                n = L - k + 1  # positions whose token t_{j+k} is committed
                if n <= 0:
                    break
                c = KVCache(1, 1, model.config.n_head, model.config.block_size,
                            model.config.n_embd // model.config.n_head)
                h = mod(model, h[:, :n], model.wte(x[:, k:k + n]), c)
                mc = drafter.caches[k - 1]
                # modules catch up lazily at the next propose: they may lag, never run ahead of the committed tokens
                assert n - 8 <= mc.length <= n, (k, mc.length, n)
                held = mc.length
                if held == 0:
                    continue
                assert (mc.k[:, :, :, :held] - c.k[:, :, :, :held]).abs().max() < 1e-5, k
                assert (mc.v[:, :, :, :held] - c.v[:, :, :, :held]).abs().max() < 1e-5, k
    return check


@pytest.mark.parametrize("fam", ["meta", "deepseek", "stern"])
@pytest.mark.parametrize("schedule", ["plain", "overlap"])
def test_caches_equal_recompute_after_every_step(family_models, fam, schedule):
    model = family_models[fam]
    prompt = [10, 20, 30, 40]
    d = HEAD_DRAFTERS[fam](model)
    k = min(5, d.max_drafts + 1)
    orig, rng = d.propose, torch.Generator().manual_seed(0)

    def sometimes_wrong(n):  # corrupt one draft in half the steps, so that rollback is exercised
        draft = orig(n)
        drafts = draft.tokens
        if drafts and float(torch.rand(1, generator=rng)) < 0.5:
            j = int(torch.randint(len(drafts), (1,), generator=rng))
            drafts = drafts[:j] + [(drafts[j] + 1) % 256] + drafts[j + 1:]
        return Draft(drafts, draft.q, draft.calls)
    d.propose = sometimes_wrong
    check = _check_caches(model, len(prompt), used_modules=k - 1)
    cache = model.new_cache()
    tokens, steps = list(prompt), []
    with torch.inference_mode():
        for step in iter_steps(model, d, prompt, max_new_tokens=30, k=k, schedule=schedule, cache=cache):
            tokens += step.emitted
            steps.append(step)
            check(cache, d, tokens)  # after every step, the caches equal a recompute over the committed tokens
    assert any(s.accepted < len(s.drafted) for s in steps)  # rollback was exercised
    assert tokens[len(prompt):] == autoregressive(model, prompt, max_new_tokens=30).tokens


def test_trace_counters_are_consistent(family_models):
    model = family_models["none"]
    ref = autoregressive(model, [5], max_new_tokens=60).tokens
    tr = speculative(model, OracleDrafter(ref, 0.7, seed=0), [5], max_new_tokens=60, k=4)
    assert tr.num_accepted_tokens == sum(tr.accepted_per_position)
    assert tr.num_draft_tokens == sum(len(s.drafted) for s in tr.steps)
    assert math.isclose(tr.mean_accepted_length, 1 + tr.num_accepted_tokens / tr.num_drafts)
    assert tr.acceptance_rate_per_position[0] >= tr.acceptance_rate_per_position[-1]
    assert len(tr.tokens) == 60 and tr.text == bytes(tr.tokens).decode("utf-8", "replace")
    for s in tr.steps[1:]:
        if s.bonus is not None:
            assert s.emitted[-1] == s.bonus
        assert s.emitted[: s.accepted] == s.drafted[: s.accepted]
        assert s.wall_s >= s.target_s + s.draft_s > 0  # the measured split never exceeds the step


@pytest.mark.parametrize("fam,calls", [("stern", 1), ("meta", 1), ("deepseek", None)])
def test_drafter_calls_are_counted_per_step_never_carried_over(family_models, fam, calls):
    """Each step counts the drafter calls of its own propose: a step that proposes nothing counts 0
    (the last step of an overlapped decode with one token left), Stern's head pass counts 1, and
    DeepSeek counts one call per module it ran."""
    model = family_models[fam]
    tr = speculative(model, HEAD_DRAFTERS[fam](model), [3, 4], max_new_tokens=23, k=4)
    for s in tr.steps[1:]:
        want = (calls if calls is not None else len(s.drafted)) if s.drafted else 0
        assert s.draft_forwards == want, (fam, s)
    assert tr.steps[-1].drafted == [] or len(tr.tokens) == 23
    assert tr.draft_forwards == sum(s.draft_forwards for s in tr.steps)
    split = tr.time_split()
    assert split["steps"] == len(tr.steps) - 1 and split["draft_s"] > 0 and split["target_s"] > 0


def test_pooled_time_split_leaves_out_every_prefill(family_models):
    """Review finding (design-3, 6.3): `pooled` joined the prompts' steps and `time_split` left out only the first
    prefill, so the other prompts' prefills counted as decoding steps. Every prefill is marked and left out."""
    from mtplab.decoding.trace import pooled
    model = family_models["stern"]
    traces = [speculative(model, SternDrafter(model), p, max_new_tokens=9, k=3) for p in ([1, 2], [3, 4, 5], [6])]
    traces += [autoregressive(model, p, max_new_tokens=5) for p in ([1, 2], [3])]
    for tr in traces:
        assert [s.prefill for s in tr.steps] == [True] + [False] * (len(tr.steps) - 1)
    pool = pooled(traces[:3])
    want = [s for t in traces[:3] for s in t.steps[1:]]
    split = pool.time_split()
    assert split["steps"] == len(want) == len(pool.steps) - 3
    assert split["target_s"] == pytest.approx(sum(s.target_s for s in want) / len(want))


def test_propose_gives_an_empty_draft_never_none(family_models):
    """The loop never tests `draft is None`: a step that asks for no drafts gets `Draft([])`."""
    from mtplab.decoding.loop import Clock, propose, start, prefill
    from mtplab.decoding.accept import Sampling
    model = family_models["stern"]
    run = start(model, SternDrafter(model), [1, 2], max_new_tokens=2, k=3, schedule="overlap", sampling=Sampling())
    prefill(run)
    assert run.remaining == 1 and propose(run, Clock(run.device)) == Draft([])  # overlap: room for the bonus only


@pytest.mark.parametrize("kw,msg", [
    (dict(k=0), "k must be"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(temperature=-1.0), "temperature must be >= 0"),
    (dict(top_k=0), "top_k"),
    (dict(max_new_tokens=95), "context window"),
])
def test_bad_decoding_input(family_models, kw, msg):
    model = family_models["stern"]
    args = dict(max_new_tokens=10, k=3) | kw
    with pytest.raises(MtplabError, match=msg):
        speculative(model, SternDrafter(model), [1, 2], **args)


def test_bad_drafter_combinations(family_models):
    with pytest.raises(MtplabError, match="at most 6"):
        speculative(family_models["meta"], MetaDrafter(family_models["meta"]), [1], max_new_tokens=5, k=8)
    with pytest.raises(MtplabError, match="stern heads"):
        SternDrafter(family_models["meta"])
    with pytest.raises(MtplabError, match="vocabulary"):
        DraftModelDrafter(random_model(vocab_size=100), family_models["none"])
    with pytest.raises(MtplabError, match="empty"):
        autoregressive(family_models["none"], [], max_new_tokens=3)
    with pytest.raises(MtplabError, match="greedy-only"):
        speculative(family_models["none"], OracleDrafter([1] * 9, 1.0), [1], max_new_tokens=5, k=2, temperature=1.0)


def test_nan_logits_give_a_clear_error():
    model = random_model(seed=12)
    with torch.no_grad():
        model.ln_f.weight.fill_(float("nan"))
    with pytest.raises(MtplabError, match="NaN"):
        autoregressive(model, [1, 2], max_new_tokens=3)
