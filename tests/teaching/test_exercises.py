"""Every checker accepts a right answer, rejects a wrong one with a reason, and survives broken code."""
import math

import pytest
import torch
import torch.nn.functional as F

from mtplab.teaching import blockwise
from mtplab.teaching import meta
from mtplab.teaching import bottleneck
from mtplab.teaching import deepseek
from mtplab.teaching import sampling
from mtplab.teaching import batches
from mtplab.teaching import check as props
from mtplab.teaching.acceptance_lab import exercises as ex5
from mtplab.measuring import theory

# the reference solutions live outside the student copy (instructor/, export-ignore): there these tests skip
sol = pytest.importorskip("instructor.solutions", reason="the student copy has no reference solutions")
plain_forwards, overlap_forwards, accepted_prefix = sol.plain_forwards, sol.overlap_forwards, sol.accepted_prefix
multi_token_loss, expected_tokens, speedup, layout = sol.multi_token_loss, sol.expected_tokens, sol.speedup, sol.layout
deepseek_forwards, acceptance_rate = sol.deepseek_forwards, sol.acceptance_rate
sampling_rule, mtplab_rule = sol.sampling_rule, sol.mtplab_rule


# ---------------------------------------------------------------------------------- wrong answers
def copy_loss(logits, x, K):
    B, T, _, V = logits.shape
    return torch.stack([F.cross_entropy(logits[:, :T - k, k].reshape(-1, V), x[:, k:T].reshape(-1))
                        for k in range(K)]).mean()


def keep_always(p, q, d, g):
    return True, d


def replace_from_p(p, q, d, g):
    if float(torch.rand(1, generator=g)) < min(1.0, float(p[d] / q[d])):
        return True, d
    return False, int(torch.multinomial(p, 1, generator=g))


def never_keep(p, q, d, g):
    return False, int(torch.multinomial(p, 1, generator=g))


def boom(*args):
    raise RuntimeError("student bug")


CASES = [
    (blockwise.check_plain_steps, plain_forwards, lambda m, k: 2 * m / k, "Stern's formula"),
    (blockwise.check_plain_steps, theory.plain_forwards, lambda m, k: 2 * math.ceil(m / k), "single token"),
    (blockwise.check_overlap_steps, overlap_forwards, lambda m, k: math.ceil(m / k), "first forward"),
    (blockwise.check_accepted_prefix, accepted_prefix, lambda d, t: sum(a == b for a, b in zip(d, t)), "prefix"),
    (meta.check_shift, multi_token_loss, copy_loss, "copy"),
    (meta.check_expected_tokens, expected_tokens, lambda a, n: 1 + a * n, "independent"),
    (bottleneck.check_speedup, speedup, lambda t, c, q: t, "step count"),
    (bottleneck.check_latency_cut, theory.sources_claim_latency_cut, lambda s: s - 1, "faster"),  # 01 §4 computes it
    (deepseek.check_deepseek_labels, layout, lambda T, k: (list(range(k + 1, T + 1)), list(range(k + 1, T + 1))), "early"),
    (deepseek.check_deepseek_forwards, deepseek_forwards, lambda m, D: theory.overlap_forwards(m, D), "D+1"),
    (sampling.check_acceptance_rate, acceptance_rate, lambda p, q: float((p * q).sum()), "independent samples"),
    (sampling.check_accept_rule, sampling_rule, keep_always, "follow the draft"),
    (sampling.check_accept_rule, mtplab_rule, replace_from_p, "the replacement is off"),
    (sampling.check_accept_rule, sampling_rule, never_keep, "wastes drafts"),
]


@pytest.mark.parametrize("checker,right,wrong,hint", CASES, ids=[f"{c[0].__name__}-{c[3]}" for c in CASES])
def test_checker_accepts_right_and_rejects_wrong(checker, right, wrong, hint):
    good = checker(right)
    assert good.ok and bool(good), str(good)
    assert str(good).startswith("right")
    bad = checker(wrong)
    assert not bad.ok and not bool(bad)
    assert str(bad).startswith("not yet")
    assert hint in bad.why, bad.why  # the reason names the mistake


@pytest.mark.parametrize("checker", sorted({c[0] for c in CASES}, key=lambda f: f.__name__), ids=lambda f: f.__name__)
def test_checker_reports_exceptions_and_stubs(checker):
    raised = checker(boom)
    assert not raised.ok and "student bug" in raised.why
    stub = checker(lambda *a: None)
    assert not stub.ok and stub.why


def test_the_package_agrees_with_the_checkers_fixed_cases():
    """The checkers hold fixed cases, not the package's functions; here the package's own functions pass them, so
    the hard-coded answers and the lab's code cannot drift apart."""
    from mtplab.decoding.trace import Step, Trace
    from mtplab.decoding.tree import nodes_per_depth
    from mtplab.training.losses import label_layout, multi_token_loss
    assert blockwise.check_plain_steps(theory.plain_forwards)
    assert blockwise.check_overlap_steps(theory.overlap_forwards)
    assert meta.check_expected_tokens(theory.expected_tokens_per_step)
    assert bottleneck.check_speedup(theory.predicted_speedup)
    assert bottleneck.check_latency_cut(lambda s: theory.sources_claim_latency_cut(s) if s >= 1 else None)
    assert deepseek.check_deepseek_forwards(theory.deepseek_forwards)
    assert sampling.check_accept_rule(mtplab_rule)
    assert meta.check_shift(lambda lg, x, K: multi_token_loss(lg.reshape(*lg.shape[:2], -1), x[:, 1:], K))

    def layout_of(T, k):
        row = label_layout(T, max(k, 1))[k]
        return [row["reads"][i] for i in sorted(row["reads"])], [row["labels"][i] for i in sorted(row["labels"])]
    assert deepseek.check_deepseek_labels(layout_of)

    def conditional_of(pairs):
        steps = [Step(drafted=[0] * n, accepted=a, emitted=[0] * (a + 1), bonus=0,
                      bonus_source="target" if a == n else "correction", forwards=1) for n, a in pairs]
        return Trace(method="exercise", prompt=[0], steps=steps, k=4).conditional_acceptance
    assert ex5.check_conditional_acceptance(conditional_of)
    assert batches.check_tree_width(lambda w: 1 + sum(nodes_per_depth(w)))


# ---------------------------------------------------------------------------------- plausible wrong answers
# Each wrong answer below gets the easy cases right (limits, the cases where k divides m, alpha in {0, 1}, ...):
# a checker that tested only those would pass it.
PLAUSIBLE_WRONG = [
    (blockwise.check_plain_steps, lambda m, k: 2 * math.ceil(m / k) - (m % k == 1)),  # right but for k = 1
    (blockwise.check_overlap_steps, lambda m, k: 1 + (m - 1) // k),                    # right when k divides m - 1
    (blockwise.check_accepted_prefix, lambda d, t: next((i for i, (a, b) in enumerate(zip(d, t)) if a != b), 0)),
    (meta.check_expected_tokens, lambda a, n: 1.0 if a == 0 else n + 1.0 if a == 1 else 1 + a * (1 - a ** n)),
    (meta.check_shift, lambda lg, x, K: sum(F.cross_entropy(lg[:, :lg.shape[1] - k, k].reshape(-1, lg.shape[-1]),
                                                            x[:, k + 1:].reshape(-1), reduction="sum")
                                            for k in range(K)) / x[:, 1:].numel() / K),  # right sums, wrong counts
    (bottleneck.check_speedup, lambda t, c, q: t / c[q] ** 0.5),          # right whenever the cost is flat
    (bottleneck.check_latency_cut, lambda s: theory.sources_claim_latency_cut(s) if s in (1.0, 2.0, 4.0) else (s - 1) / (s + 1)),
    (deepseek.check_deepseek_labels, lambda T, k: (list(range(k + 1, T + 1)), list(range(k + 2, T + 2))) if k < 2
     else (list(range(k, T + 1)), list(range(k + 1, T + 2)))),  # right for the main model and module 1 only
    (deepseek.check_deepseek_forwards, lambda m, D: 1 + (m - 1) // (D + 1)),
    (sampling.check_acceptance_rate, lambda p, q: float(torch.minimum(p, q).sum() ** 2) if not torch.equal(p, q)
     else 1.0),
    (ex5.check_conditional_acceptance, lambda steps: [
        (sum(a > i for _, a in steps) / sum(n > i for n, _ in steps)) if sum(n > i for n, _ in steps) else
        float("nan") for i in range(max(n for n, _ in steps))]),  # divides by the steps that proposed draft i
    (ex5.check_sampled_verdict, lambda p, q, u: u < min(1.0, q / p) if p > 0 else False),  # the ratio upside down
    (ex5.check_step_speedup, lambda tps, split, ar: tps * ar / (split["target_s"] + split["draft_s"])),
    (props.check_context_ratio, lambda w, a, q, c: (w + q * q * c * a) / (w + q * c * a)),  # every limit right
    (props.check_context_ratio, lambda w, a, q, c: (w + q * math.sqrt(c) * a) / (w + math.sqrt(c) * a)),
    (batches.check_tree_width, lambda w: 1 + sum(w) + (len(w) > 1) * math.prod(w)),
    (batches.check_batch_speedup, lambda t, c: t / c if c < 1.6 else t / c ** 2),
]


@pytest.mark.parametrize("checker,wrong", PLAUSIBLE_WRONG,
                         ids=[f"{c.__name__}-{i}" for i, (c, _) in enumerate(PLAUSIBLE_WRONG)])
def test_a_plausible_wrong_answer_is_caught(checker, wrong):
    verdict = checker(wrong)
    assert not verdict and verdict.why, verdict
    assert not any(w in verdict.why for w in GIVEAWAYS), verdict.why


def test_the_context_ratio_wrong_formula_passes_every_limit():
    """Issue 39: the checker of 01's exercise 3 tested limits only; this wrong formula has every limit right, and
    is now caught by the fixed cases (the reason says so)."""
    verdict = props.check_context_ratio(lambda w, a, q, c: (w + q * q * c * a) / (w + q * c * a))
    assert not verdict and "every limit holds" in verdict.why


CHECKER_MODULES = ("blockwise", "meta", "bottleneck", "deepseek", "sampling", "batches", "peers", "check")
# the package's functions that answer an exercise, or compute its answer
ANSWER_NAMES = {"theory", "accept", "label_layout", "multi_token_loss", "conditional_acceptance", "conditional_counts",
                "nodes_per_depth", "loop_ratios", "predicted_speedup", "expected_tokens_per_step", "forecast",
                "plain_forwards", "overlap_forwards", "deepseek_forwards", "sources_claim_latency_cut", "_trace"}


def _checker_functions():
    import ast
    import importlib
    import inspect
    mods = [importlib.import_module(f"mtplab.teaching.{m}") for m in CHECKER_MODULES] + [ex5]
    for mod in mods:
        tree = ast.parse(inspect.getsource(mod))
        defs = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
        for name, f in defs.items():
            if name.startswith("check_") and name not in ("check_record", "check_laptop_prediction"):
                # the checker and the module's private helpers it calls
                called = {n.func.id for n in ast.walk(f) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
                yield mod.__name__, name, [f] + [defs[c] for c in called if c in defs and c.startswith("_")]


def test_no_checker_calls_the_function_that_answers_its_exercise():
    """Issue 39 B5: checkers compared the student's answer with public functions (theory.*, accept, label_layout,
    multi_token_loss, Trace.conditional_acceptance), so the answer was one call away; now they hold fixed cases."""
    import ast
    found = list(_checker_functions())
    assert len(found) >= 18, [f[1] for f in found]
    for mod, name, fns in found:
        used = {n.id for f in fns for n in ast.walk(f) if isinstance(n, ast.Name)}
        used |= {n.attr for f in fns for n in ast.walk(f) if isinstance(n, ast.Attribute)}
        assert not used & ANSWER_NAMES, f"{mod}.{name} uses {sorted(used & ANSWER_NAMES)}"


# notebook -> what answers its exercises; none of it may be imported or named before the first exercise cell
NOTEBOOK_ANSWERS = {
    "02": ("plain_forwards", "overlap_forwards", "decoding.accept import"),
    "03": ("multi_token_loss", "expected_tokens_per_step"),
    "04": ("theory.deepseek_forwards", "import theory"),
    "05": ("conditional_counts", ".conditional_acceptance", "theory.predicted_speedup"),
    "06": ("import accept", "getsource(accept"),
    "10": ("loop_ratios(",),
}


@pytest.mark.parametrize("key", sorted(NOTEBOOK_ANSWERS))
def test_no_notebook_shows_an_answer_before_its_exercise(key):
    import json
    import re
    from pathlib import Path
    path = next((Path(__file__).resolve().parents[2] / "notebooks").glob(f"{key}_*.ipynb"))
    cells = json.loads(path.read_text())["cells"]
    first = next(i for i, c in enumerate(cells) if c["cell_type"] == "code"
                 and re.search(r"check_\w+\((my_|best_k\b|loop_ratio\b)", "".join(c["source"])))
    for i, c in enumerate(cells[:first]):
        text = "".join(c["source"])
        for name in NOTEBOOK_ANSWERS[key]:
            assert name not in text, f"{path.name} cell {i} shows {name!r} before the exercises (cell {first})"


# ---------------------------------------------------------------------------------- notebook 05


def test_nb05_checkers_accept_right_answers():
    assert ex5.check_conditional_acceptance(sol.conditional)
    assert ex5.check_sampled_verdict(sol.sampled_verdict)
    assert ex5.check_step_speedup(sol.step_speedup)


def test_nb05_checkers_reject_wrong_answers_with_a_reason():
    unconditional = ex5.check_conditional_acceptance(
        lambda steps: [sum(a > i for _, a in steps) / len(steps) for i in range(max(d for d, _ in steps))])
    assert not unconditional and "unconditional" in unconditional.why
    only_p = ex5.check_sampled_verdict(lambda p, q, u: u < p)
    assert not only_p and "p/q" in only_p.why
    target_only = ex5.check_step_speedup(lambda tps, split, ar: tps * ar / split["target_s"])
    assert not target_only and "drafter" in target_only.why


def test_nb05_checkers_survive_broken_code():
    def boom(*a):
        raise ZeroDivisionError("x")
    for check in (ex5.check_conditional_acceptance, ex5.check_sampled_verdict, ex5.check_step_speedup):
        c = check(boom)
        assert not c and "ZeroDivisionError" in c.why
    assert not ex5.check_conditional_acceptance(lambda s: "text")


def test_nb05_verdict_checker_asks_for_a_bool_when_given_none():
    c = ex5.check_sampled_verdict(lambda p, q, u: None)
    assert not c and "returned None" in c.why


def test_the_shift_checker_names_the_pooled_mean():
    """03 exercise 1 states its reduction; the one tempting wrong reduction gets its own hint."""
    from mtplab.teaching.meta import _pooled_mean, check_shift
    verdict = check_shift(_pooled_mean)
    assert not verdict and "mean over the K heads" in verdict.why


GIVEAWAYS = ("expected", "want ", "mtplab gives", "the rule says")  # wordings that hand over the answer


@pytest.mark.parametrize("checker,wrong", [(c[0], c[2]) for c in CASES] + [
    (ex5.check_conditional_acceptance, lambda steps: [0.5] * max(d for d, _ in steps)),
    (ex5.check_sampled_verdict, lambda p, q, u: u < p),
    (ex5.check_step_speedup, lambda tps, split, ar: tps)], ids=lambda x: getattr(x, "__name__", "case"))
def test_a_wrong_answer_is_told_its_case_never_the_expected_value(checker, wrong):
    bad = checker(wrong)
    # a deterministic checker names one failing case; the statistical one names its draws and its test
    assert not bad and ("case like" in bad.why or "draws" in bad.why), bad.why
    assert not any(w in bad.why for w in GIVEAWAYS), bad.why



# wrong answers to 02's exercise 2 (the overlapped schedule's forwards), each with the words its hint must hold
OVERLAP_WRONG = [
    (lambda m, k: math.ceil(m / k), "first forward too"),          # the prefill left out
    (lambda m, k: 1 + (m - 1) // k, "round up, not down"),         # a partial block dropped (the same numbers)
    (lambda m, k: 1 + math.ceil(m / k), "already commits one"),    # every one of the m tokens left to later forwards
    (lambda m, k: 1 + m // k, "round the number"),                 # a partial block dropped
    (lambda m, k: m, "Count it in two parts"),                     # none of the above: how to set the count up
    (lambda m, k: 2 * math.ceil(m / k), "Count it in two parts"),
]


@pytest.mark.parametrize("wrong,hint", OVERLAP_WRONG, ids=[h for _, h in OVERLAP_WRONG])
def test_every_wrong_overlap_count_gets_a_hint_toward_the_count_never_the_count(wrong, hint):
    """Issue 40: 02's exercise 2 said only "wrong on a case like m=9, k=4" to most wrong answers (1 + ceil(m/k) among
    them); now every wrong whole-number answer gets one hint, named from the whole answer (not from one case, which
    can fit two mistakes), which leads toward the count without writing it."""
    bad = blockwise.check_overlap_steps(wrong)
    assert not bad and hint in bad.why, bad.why
    assert bad.why.count(". ") <= 4, bad.why  # one hint, not several stacked
    assert not any(w in bad.why for w in GIVEAWAYS + ("ceil", "(m - 1)", "m-1", "//")), bad.why


# ---------------------------------------------------------------------------------- checked by properties alone
from mtplab.teaching import classroom, peers  # noqa: E402

PROPERTY_CASES = [
    (props.check_context_ratio, sol.context_ratio, lambda w, a, q, c: (w + q * a) / (w + a), "context"),
    (props.check_context_ratio, sol.context_ratio, lambda w, a, q, c: float(q), "attention work"),
    (props.check_best_k, sol.best_k, lambda a, c, d, ks: max(ks), "only costs"),
    (props.check_best_k, sol.best_k,  # the drafter's cost left out
     lambda a, c, d, ks: max(ks, key=lambda k: sum(a ** i for i in range(k)) / c[k]), "costs more"),
    (props.check_best_k, sol.best_k,  # drafts kept independently of the ones before
     lambda a, c, d, ks: max(ks, key=lambda k: (1 + a * (k - 1)) / (c[k] + (k - 1) * d)), "every draft before it"),
    (peers.check_loop_ratios, sol.loop_ratio,
     lambda rec: {m: 1 / v for m, v in peers.loop_ratios(rec).items()}, "peers.loop_ratios"),
    (peers.check_loop_ratios, sol.loop_ratio, lambda rec: {m: {r["method"]: r["speedup_vs_hf_greedy"] for r in
                                                               rec["rows"]}[hf] / {r["method"]: r["speedup_vs_hf_greedy"]
                                                               for r in rec["rows"]}[m] for hf, m in peers.PAIRS
                                                           if m in {r["method"] for r in rec["rows"]}},
     "case like"),
]


@pytest.mark.parametrize("checker,right,wrong,hint", PROPERTY_CASES, ids=[f"{c[0].__name__}-{c[3]}" for c in PROPERTY_CASES])
def test_property_checkers_accept_right_and_reject_wrong(checker, right, wrong, hint):
    good = checker(right)
    assert good, str(good)
    bad = checker(wrong)
    assert not bad and hint in bad.why, bad.why
    assert not any(w in bad.why for w in GIVEAWAYS), bad.why
    assert not checker(boom) and "student bug" in checker(boom).why
    assert not checker(lambda *a: None)


def test_the_loop_ratio_checker_never_states_the_formula():
    upside = peers.check_loop_ratios(lambda rec: {m: 1 / v for m, v in sol.loop_ratio(rec).items()})
    assert not upside and "upside down" in upside.why
    assert "divide" not in upside.why and "speedup_vs_hf_greedy" not in upside.why


def test_notebook_10_shows_no_answer_before_its_exercise():
    """Issue 39: cells 13 and 22 called the answer function peers.loop_ratios before exercise 1, and the checker's
    body spelled the formula; the checker now compares with answers precomputed as numbers."""
    import inspect
    import json
    from pathlib import Path
    nb = json.loads((Path(__file__).resolve().parents[2] / "notebooks" / "10_beside_hugging_face.ipynb").read_text())
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    assert not any("peers.loop_ratios(" in c for c in code)
    body = inspect.getsource(peers.check_loop_ratios)
    assert "/ by[" not in body and "speedup_vs_hf_greedy\"] /" not in body


def _record(busy=None, others=0.05):
    rows = [{"row": "meta k=4", "method": "meta", "k": 4, "tokens_per_step": 2.4, "draft_t1": 0.1,
             "measured_there": 1.6}]  # what preflight stores: the inputs, no forecast
    return {"machine": {"cpu": "x", "threads": 2}, "classroom": {"ratio": {"1": 1.0, "2": 1.1, "4": 1.3}},
            "predictions": {"classroom": rows}, "busy": busy, "others_cores": others}


def test_the_laptop_assignment_is_graded_from_the_students_own_record(tmp_path):
    import json

    rec = _record()
    mine = sol.laptop_prediction(rec, "meta k=4")
    ok = classroom.check_laptop_prediction(rec, "meta k=4", mine, measured=1.5)
    assert ok and "raced 1.50x" in ok.why
    assert not classroom.check_laptop_prediction(rec, "meta k=4", 1.6)  # the record machine's number
    assert "not a prediction for your laptop" in classroom.check_laptop_prediction(rec, "meta k=4", 1.6).why
    assert not classroom.check_laptop_prediction(rec, "meta k=4", 2.4)  # tokens per step alone
    busy = classroom.check_laptop_prediction(_record(busy="other processes used 1.2 cores"), "meta k=4", mine)
    assert not busy and "busy" in busy.why
    rough = classroom.check_laptop_prediction(_record(others=None), "meta k=4", mine)
    assert rough and "not measured" in rough.why
    assert "choose among" in classroom.check_laptop_prediction(rec, "nope", 1.0).why
    # a plain-schedule row needs t(3)/t(1), which the record does not measure: both interpolate it (1.2, by hand)
    plain = _record()
    plain["predictions"]["classroom"].append({"row": "blockwise k=4", "method": "blockwise", "k": 4,
                                               "tokens_per_step": 2.0, "draft_t1": 0.0, "measured_there": 1.2})
    assert sol.laptop_prediction(plain, "blockwise k=4") == pytest.approx(0.909090909091)
    assert classroom.check_laptop_prediction(plain, "blockwise k=4", sol.laptop_prediction(plain, "blockwise k=4"))
    # past the record's largest q (a --quick record stops at 4): both take its largest
    plain["predictions"]["classroom"].append({"row": "meta k=8", "method": "meta", "k": 8, "tokens_per_step": 3.0,
                                               "draft_t1": 0.0, "measured_there": 2.0})
    assert sol.laptop_prediction(plain, "meta k=8") == pytest.approx(2.307692307692)
    assert classroom.check_laptop_prediction(plain, "meta k=8", sol.laptop_prediction(plain, "meta k=8"))
    # a classmate's number does not pass on another laptop's record
    other = _record()
    other["classroom"]["ratio"]["4"] = 2.0
    (tmp_path / "a.json").write_text(json.dumps(rec))
    (tmp_path / "b.json").write_text(json.dumps(other))
    graded = classroom.grade_class(tmp_path, {"a.json": {"row": "meta k=4", "predicted": mine},
                                              "b.json": {"row": "meta k=4", "predicted": mine},
                                              "c.json": {"row": "meta k=4", "predicted": mine}})
    assert [g["ok"] for g in graded] == [True, False, False]
    # worked by hand from _record's numbers (the working is in the key, instructor/answers.md, not in the students' copy)
    assert sol.laptop_prediction(other, "meta k=4") == pytest.approx(1.142857142857)
    assert mine == pytest.approx(1.714285714286)
