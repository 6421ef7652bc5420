"""Find the bug: accept rules that look right, some of which are not lossless.

Every rule here has the signature of `mtplab.decoding.accept` (sampling path):
`rule(drafts, p, q, *, greedy, generator) -> (n_accepted, next_token or -1, source)`, with p (n+1, V)
or (n, V) target distributions and q (n, V) the distributions the drafts were drawn from.

Speculative sampling (Leviathan et al. 2023, sec. 2.3; Chen et al. 2023, alg. 2) keeps a draft d ~ q
with probability min(1, p(d)/q(d)) and replaces a rejected one by a draw from norm(max(0, p - q)); the
emitted token then follows p exactly. Four planted bugs are of the shape of public reports, not copies of them: the
draft sampled at a temperature the rule ignores (z-lab/dflash#74); the target p rounded through bf16 while q stays
in float32, one side in another dtype than the other (deepseek-ai/DeepSpec#31, where it was the draft side: drafts
sampled through native-dtype logits, the ratio in float32); a rejected draft replaced by the residual's argmax where
a sample was due (jaymody/speculative-sampling#3, where the draft itself was an argmax); top-k applied to the
target p and not to q, a sampling setting on one side only (vllm-project/vllm PR #10198, where it was the other
side: top-p filtered the draft's q and not the target's p). Two are the lab's own: the first draft never verified,
the residual taken as p.

The students see the rules under neutral names (`RULES`: rule_a, rule_b, ...); `ANSWERS` says which
are broken and why; `check_verdicts` grades a student's verdicts without naming which are off. `power` runs the
chi-square test of `mtplab.teaching.sampling` over many seeds and returns how often it rejects: high for a bug,
about alpha for a correct rule. Nothing a notebook draws or prints shows the key before the student's verdicts
pass: `earned(check)` is the key only after a passing check, and `power_figure`, `power_text` and `label` are
neutral without it.

V vocabulary of the toy, N draws per test.
"""
from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
import torch
from mtplab.decoding.accept import accept, sample
from mtplab.errors import MtplabError
from mtplab.teaching.check import Check
from mtplab.teaching.sampling import accept_counts, chi_square

# The toy (one draft per step, V tokens, p and q far apart); the settings a bug forgets are named here.
V = 8
N_DRAWS = 3000          # draws per chi-square test: every planted bug is caught at this size (tests/test_bugs.py)
ALPHA = 0.05            # the lab's one test level (as notebook 06): a correct rule fails at rate ALPHA
DRAFT_TEMPERATURE = 0.5  # the drafter samples at this temperature
TOP_K = 3               # a top-k left over from another request, applied to p only
LOGIT_LEVEL = 200.0     # raw target logits sit near here (logits of 40 at T = 0.2): bf16 steps by 1.0 there


def toy(seed: int, *, vocab: int = V, spread: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """A target p and a draft q (V,), drawn at random from `seed`; q is the drafter's distribution at
    DRAFT_TEMPERATURE, the one its drafts are sampled from."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(spread * torch.randn(vocab, generator=g, dtype=torch.float64), -1).float()
    q = torch.softmax(spread * torch.randn(vocab, generator=g, dtype=torch.float64) / DRAFT_TEMPERATURE, -1).float()
    return p, q


def _resample(p_row, q_row, generator) -> int:
    resid = torch.clamp(p_row - q_row, min=0)  # norm(max(0, p - q))
    total = float(resid.sum())
    return sample(resid / total if total > 0 else p_row, generator)


def _standard(drafts, p, q, generator, *, start: int = 0, resample=_resample) -> tuple[int, int, str]:
    """The textbook loop over drafts[start:], with the residual draw swappable (for one planted bug)."""
    n = len(drafts)
    for i in range(start, n):
        d = drafts[i]
        if float(torch.rand(1, generator=generator)) < min(1.0, float(p[i, d]) / float(q[i, d])):
            continue
        return i, resample(p[i], q[i], generator), "correction"
    if p.shape[0] > n:
        return n, sample(p[n], generator), "target"
    return n, -1, "none"


# ---------------------------------------------------------------------------------- correct rules
def reference(drafts, p, q, *, greedy=False, generator=None):
    """mtplab's own rule, `decoding.accept`."""
    return accept(drafts, p, q, greedy=greedy, generator=generator)


def ratio_free(drafts, p, q, *, greedy=False, generator=None):
    """Correct, written differently: keep d when u * q(d) < p(d) (no division), resample from the residual."""
    n = len(drafts)
    for i, d in enumerate(drafts):
        u = float(torch.rand(1, generator=generator))
        if u * float(q[i, d]) < float(p[i, d]):
            continue
        return i, _resample(p[i], q[i], generator), "correction"
    return (n, sample(p[n], generator), "target") if p.shape[0] > n else (n, -1, "none")


# ---------------------------------------------------------------------------------- planted bugs
def ignores_temperature(drafts, p, q, *, greedy=False, generator=None):
    """Bug: the drafts were sampled at DRAFT_TEMPERATURE, but the rule divides by the drafter's
    distribution at temperature 1 (q^T renormalised), as a drafter that stored its untempered softmax would."""
    q1 = q.double() ** DRAFT_TEMPERATURE
    q1 = (q1 / q1.sum(-1, keepdim=True)).float()
    return _standard(drafts, p, q1, generator)


def p_in_bf16(drafts, p, q, *, greedy=False, generator=None):
    """Bug: p is computed in bf16 from raw logits near LOGIT_LEVEL (bf16 steps by 1 there), q stays fp32."""
    logits = (torch.log(p.double()) + LOGIT_LEVEL).to(torch.bfloat16)
    pb = torch.softmax(logits.float(), -1)
    return _standard(drafts, pb, q, generator)


def argmax_residual(drafts, p, q, *, greedy=False, generator=None):
    """Bug: a rejected draft is replaced by the argmax of the residual, not by a draw from it."""
    return _standard(drafts, p, q, generator,
                     resample=lambda pr, qr, g: int(torch.clamp(pr - qr, min=0).argmax()))


def first_unverified(drafts, p, q, *, greedy=False, generator=None):
    """Bug: the loop starts at 1 (the first draft is taken as the target's own token and never tested)."""
    return _standard(drafts, p, q, generator, start=1)


def residual_is_p(drafts, p, q, *, greedy=False, generator=None):
    """Bug: a rejected draft is replaced by a draw from p instead of norm(max(0, p - q))."""
    return _standard(drafts, p, q, generator, resample=lambda pr, qr, g: sample(pr, g))


def top_k_on_p(drafts, p, q, *, greedy=False, generator=None):
    """Bug: top-k (TOP_K) applied to p but not to q, so the rule reproduces top-k(p), not p."""
    kth = torch.topk(p, TOP_K, dim=-1).values[..., -1:]
    pk = torch.where(p >= kth, p, torch.zeros_like(p))
    pk = pk / pk.sum(-1, keepdim=True)
    return _standard(drafts, pk, q, generator)


@dataclass(frozen=True)
class Answer:
    rule: object
    broken: bool
    why: str


# the neutral names students see; the order is fixed, so that notebooks and tests agree
ANSWERS: dict[str, Answer] = {
    "rule_a": Answer(residual_is_p, True, "the residual is taken as p instead of norm(max(0, p - q)): tokens that "
                                          "q over-proposes come out too often"),
    "rule_b": Answer(reference, False, "decoding.accept: min(1, p/q), then norm(max(0, p - q))"),
    "rule_c": Answer(ignores_temperature, True, f"the drafts were sampled at T = {DRAFT_TEMPERATURE}, but the "
                                                 "ratio uses the drafter's distribution at T = 1 (of the shape of "
                                                 "z-lab/dflash#74)"),
    "rule_d": Answer(first_unverified, True, "the loop starts at the second draft: the first one is never "
                                             "verified, so it follows q"),
    "rule_e": Answer(p_in_bf16, True, f"the target p comes from bf16 logits near {LOGIT_LEVEL:g}, where bf16 steps "
                                      "by 1, while q stays float32: the rule is exact for a rounded p, not for p (of "
                                      "the shape of DeepSpec#31, where the draft side was in the other dtype)"),
    "rule_f": Answer(ratio_free, False, "u * q(d) < p(d) is u < p(d)/q(d) without the division"),
    "rule_g": Answer(argmax_residual, True, "a rejected draft becomes the residual's argmax; a sample was due (of "
                                           "the shape of jaymody/speculative-sampling#3, where the draft was an argmax)"),
    "rule_h": Answer(top_k_on_p, True, f"top-{TOP_K} applied to the target p but not to q: the output follows "
                                        "top-k(p) (of the shape of vllm PR #10198, where top-p filtered q, not p)"),
}
RULES = {name: a.rule for name, a in ANSWERS.items()}


def listing(name: str) -> str:
    """The source of rule `name` as a student sees it: under its neutral name, without its docstring."""
    if name not in ANSWERS:
        raise MtplabError(f"unknown rule {name!r}; the rules are {', '.join(ANSWERS)}")
    tree = ast.parse(inspect.getsource(ANSWERS[name].rule))
    fn = tree.body[0]
    fn.name = name
    if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant):
        fn.body = fn.body[1:]  # the docstring names the bug
    return ast.unparse(tree)


def shared_listing() -> str:
    """The two helpers several rules call: the residual draw and the textbook loop."""
    return inspect.getsource(_resample) + "\n\n" + inspect.getsource(_standard)


# ---------------------------------------------------------------------------------- the harness
def judge(rule, seed: int = 0, *, n: int = N_DRAWS, stream: int = 0) -> dict:
    """Draw n drafts d ~ q on the toy of `seed`, let `rule` decide, chi-square the emitted tokens
    against the exact target p. Returns the test's stat, dof and pvalue, the counts, p and `broken`.
    `stream` picks the random numbers of the draws (the toy stays the seed's): two rules judged on one stream see
    the same numbers, so two correct rules written alike emit the same tokens; `judge_all` and `power` give each
    rule its own stream, so that no two bars share their luck."""
    if not callable(rule):
        raise MtplabError(f"rule must be a function with decoding.accept's signature (got {type(rule).__name__})")
    if not isinstance(n, int) or n < 50:
        raise MtplabError(f"n must be an integer >= 50 draws (got {n!r}); the default is {N_DRAWS}")
    p, q = toy(seed)
    run = accept_counts(p, q, n, generator=torch.Generator().manual_seed(10_000 + seed + 7_919 * stream), rule=rule)
    test = chi_square(run["counts"], p)
    return {**test, "counts": run["counts"], "p": p, "kept": run["kept"], "broken": test["pvalue"] < ALPHA}


def power(rule, *, seeds: int = 20, n: int = N_DRAWS, stream: int = 0) -> float:
    """Fraction of `seeds` independent toys on which the test rejects the rule at ALPHA: the power for a
    broken rule, the false-alarm rate (about ALPHA) for a correct one."""
    if not isinstance(seeds, int) or seeds < 1:
        raise MtplabError(f"seeds must be an integer >= 1 (got {seeds!r})")
    return sum(judge(rule, s, n=n, stream=stream)["broken"] for s in range(seeds)) / seeds


def judge_all(seed: int = 0, *, n: int = N_DRAWS) -> dict[str, dict]:
    """judge() for every rule in RULES on the toy of `seed`, each rule on its own stream of random numbers."""
    return {name: judge(rule, seed, n=n, stream=i + 1) for i, (name, rule) in enumerate(RULES.items())}


def power_table(*, seeds: int = 20, n: int = N_DRAWS) -> dict[str, float]:
    """power(rule) for every rule in RULES, each rule on its own stream of random numbers (as `judge_all`)."""
    return {name: power(rule, seeds=seeds, n=n, stream=i + 1) for i, (name, rule) in enumerate(RULES.items())}


def check_verdicts(verdicts: dict) -> Check:
    """verdicts: {rule name: True if you think it is broken}. Right when every rule is judged right.

    A wrong answer says how many verdicts are off and in which direction, never which rule: with two answers
    per rule, naming the rule would give the key away."""
    name = "find the bug"
    if not isinstance(verdicts, dict):
        return Check(name, False, "give a dict such as {'rule_a': True, 'rule_b': False, ...} (True = broken)")
    unknown = [r for r in verdicts if r not in ANSWERS]
    if unknown:
        return Check(name, False, f"unknown rule {', '.join(map(str, unknown))}; the rules are {', '.join(ANSWERS)}")
    missing = [r for r in ANSWERS if verdicts.get(r) is None]
    if missing:
        return Check(name, False, f"no verdict yet for {', '.join(missing)}")
    wrong = [r for r, a in ANSWERS.items() if bool(verdicts[r]) != a.broken]
    if wrong:
        passed = sum(ANSWERS[r].broken for r in wrong)  # broken rules you called correct
        hints = []
        if passed:
            hints.append(f"{passed} you called correct {'is' if passed == 1 else 'are'} broken: a bug can hide on "
                         "one seed; run bugs.power(bugs.RULES[name], seeds=20) on the rules you passed, and read "
                         "their listings against the shared helpers")
        if len(wrong) - passed:
            hints.append(f"{len(wrong) - passed} you called broken {'is' if len(wrong) - passed == 1 else 'are'} "
                         f"correct: one small p-value on one seed happens at rate {ALPHA}")
        verb = "is" if len(wrong) == 1 else "are"
        return Check(name, False, f"{len(wrong)} of {len(ANSWERS)} verdicts {verb} off. " + "; ".join(hints))
    return Check(name, True, "; ".join(f"{r}: {a.why}" for r, a in ANSWERS.items() if a.broken))


def earned(check) -> dict[str, bool] | None:
    """The answer key {rule: broken} once `check` is a passing `check_verdicts`; None before (nothing to reveal)."""
    if isinstance(check, Check) and check.ok and check.name == "find the bug":
        return {n: a.broken for n, a in ANSWERS.items()}
    return None


def label(name: str, key: dict[str, bool] | None = None) -> str:
    """A rule's name for a legend: neutral before the key is earned, with its verdict and why after."""
    if name not in ANSWERS:
        raise MtplabError(f"unknown rule {name!r}; the rules are {', '.join(ANSWERS)}")
    if key is None:
        return name
    return f"{name} ({'broken' if key[name] else 'correct'}: {ANSWERS[name].why.split(':')[0]})"


def power_figure(power: dict[str, float], *, seeds: int, key: dict[str, bool] | None = None):
    """The rejection rate per rule: grey bars before the key is earned, red (broken) and green (correct) after."""
    from mtplab.viz import stats as viz_stats

    fig = viz_stats.power_bars(power, alpha=ALPHA, broken=key, seeds=seeds)
    fig.axes[0].set_title(f"chi-square test against the exact p, {seeds} seeds: one rejection draws a bar at "
                          f"{1 / seeds:.2f}\n" + ("coloured by the answers you earned" if key else
                                                  "grey until your verdicts pass the checker"), fontsize=9)
    return fig


def power_text(power: dict[str, float], *, seeds: int, n: int = N_DRAWS, key: dict[str, bool] | None = None,
               runs: dict | None = None) -> str:
    """What the power table says, in words computed from it. Before the key: the spread of the rates only.
    After: the broken rules' lowest power and the correct rules' rejections, counted once per seed when the
    correct rules emitted the same tokens on the same draws (`runs`: judge() per rule on one seed)."""
    if set(power) != set(ANSWERS):
        raise MtplabError(f"power must hold every rule ({', '.join(ANSWERS)}); got {', '.join(power)}")
    chance = 1 - (1 - ALPHA) ** seeds
    if key is None:
        high = sorted(r for r, v in power.items() if v == 1.0)
        every = "on the one seed" if seeds == 1 else f"on every one of {seeds} seeds"
        return (f"{len(high)} of {len(power)} rules were rejected {every} ({n} draws each, "
                f"ALPHA = {ALPHA}); a correct rule is rejected at least once in {seeds} seed{'s' * (seeds != 1)} "
                "with probability "
                f"{chance:.0%}, so a bar above zero is not a verdict. The colours appear once your verdicts pass.")
    broken = [r for r in power if key[r]]
    correct = [r for r in power if not key[r]]
    lines = [f"lowest power among the broken rules: {min(power[r] for r in broken):.2f} (over {seeds} seeds, "
             f"{n} draws each, ALPHA = {ALPHA})"]
    hits = {r: round(power[r] * seeds) for r in correct}
    same = runs is not None and len(correct) > 1 and all(
        torch.equal(runs[correct[0]]["counts"], runs[r]["counts"]) for r in correct[1:])
    if same:
        lines.append(f"the correct rules {' and '.join(correct)} emitted the same tokens draw for draw (u * q < p is "
                     f"u < p / q on the same random numbers), so their rejections fall on the same seeds: "
                     f"{max(hits.values())} of {seeds} seeds, counted once")
    else:
        lines.append("the correct rules were rejected on " + ", ".join(f"{r}: {h} of {seeds}" for r, h in hits.items())
                     + " seeds")
    lines.append(f"too few seeds to estimate a false-alarm rate (at ALPHA a correct rule is rejected at least once in "
                 f"{seeds} seeds with probability {chance:.0%}); notebook 06 shows it over 40 seeds")
    return "; ".join(lines)


def main(argv=None) -> int:
    """python -m mtplab.teaching.find_the_bug [--seeds S] [--draws N] [--quick] [--json PATH]: the power table over S seeds."""
    import argparse
    import json
    import sys

    ap = argparse.ArgumentParser(prog="python -m mtplab.teaching.find_the_bug", description=main.__doc__)
    ap.add_argument("--seeds", type=int, default=200, help="independent toys per rule (default 200)")
    ap.add_argument("--draws", type=int, default=N_DRAWS, help=f"draws per test (default {N_DRAWS})")
    ap.add_argument("--quick", action="store_true", help="5 seeds: a check that it runs")
    ap.add_argument("--json", type=str, default=None, help="also write the table to this JSON file")
    args = ap.parse_args(argv)
    seeds = 5 if args.quick else args.seeds
    try:
        table = power_table(seeds=seeds, n=args.draws)
    except MtplabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, rate in table.items():
        a = ANSWERS[name]
        print(f"{name} ({a.rule.__name__}, {'broken' if a.broken else 'correct'}): rejected on {rate:.3f} of {seeds} "
              f"seeds at alpha {ALPHA}, {args.draws} draws each")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"seeds": seeds, "n_draws": args.draws, "alpha": ALPHA, "vocab": V,
                       "power": table, "broken": {n: a.broken for n, a in ANSWERS.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
