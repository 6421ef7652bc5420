"""Find the bug: accept rules that look right, some of which are not lossless.

Every rule here has the signature of `mtplab.decoding.accept` (sampling path):
`rule(drafts, p, q, *, greedy, generator) -> (n_accepted, next_token or -1, source)`, with p (n+1, V)
or (n, V) target distributions and q (n, V) the distributions the drafts were drawn from.

Speculative sampling (Leviathan et al. 2023, sec. 2.3; Chen et al. 2023, alg. 2) keeps a draft d ~ q
with probability min(1, p(d)/q(d)) and replaces a rejected one by a draw from norm(max(0, p - q)); the
emitted token then follows p exactly. Some rules below carry a planted bug, some are correct; which is which, and
why, is the exercise. The broken ones are of the shape of public reports (the key, with its sources, is in
instructor/find_the_bug_key.py, which the student copy leaves out).

The students see the rules under neutral names (`RULES`: rule_a, rule_b, ...). The package holds no answer key:
`check_verdicts` compares the whole set of verdicts with one salted, slow digest and answers for the set alone
(never how many or which verdicts are off, so one guess reveals no rule), and the explanations are sealed under the
right set, opened only by a passing check. `power` runs the
chi-square test of `mtplab.teaching.sampling` over many seeds and returns how often it rejects: high for a bug,
about alpha for a correct rule. Nothing a notebook draws or prints shows the key before the student's verdicts
pass: `earned(check)` is the key only after a passing check, and `power_figure`, `power_text` and `label` are
neutral without it.

V vocabulary of the toy, N draws per test.
"""
from __future__ import annotations

import ast
import base64
import hashlib
import inspect
import json
from pathlib import Path
import torch
from mtplab.decoding.accept import accept, sample
from mtplab.errors import MtplabError
from mtplab.files import atomic_write_text
from mtplab.teaching.check import Check
from mtplab.teaching.sampling import accept_counts, chi_square

# The toy (one draft per step, V tokens, p and q far apart); the settings a bug forgets are named here.
V = 8
N_DRAWS = 3000          # draws per chi-square test: every planted bug is caught at this size
                        # (tests/teaching/test_find_the_bug.py)
ALPHA = 0.05            # the lab's one test level (as notebook 06): a correct rule fails at rate ALPHA
DRAFT_TEMPERATURE = 0.5  # the drafter samples at this temperature
TOP_K = 3               # a top-k setting, as a sampler may carry one
LOGIT_LEVEL = 200.0     # raw target logits sit near here (logits of 40 at T = 0.2)


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


# ---------------------------------------------------------------------------------- the rules
def rule_a(drafts, p, q, *, greedy=False, generator=None):
    return _standard(drafts, p, q, generator, resample=lambda pr, qr, g: sample(pr, g))


def rule_b(drafts, p, q, *, greedy=False, generator=None):
    return accept(drafts, p, q, greedy=greedy, generator=generator)


def rule_c(drafts, p, q, *, greedy=False, generator=None):
    q1 = q.double() ** DRAFT_TEMPERATURE
    q1 = (q1 / q1.sum(-1, keepdim=True)).float()
    return _standard(drafts, p, q1, generator)


def rule_d(drafts, p, q, *, greedy=False, generator=None):
    return _standard(drafts, p, q, generator, start=1)


def rule_e(drafts, p, q, *, greedy=False, generator=None):
    logits = (torch.log(p.double()) + LOGIT_LEVEL).to(torch.bfloat16)
    pb = torch.softmax(logits.float(), -1)
    return _standard(drafts, pb, q, generator)


def rule_f(drafts, p, q, *, greedy=False, generator=None):
    n = len(drafts)
    for i, d in enumerate(drafts):
        u = float(torch.rand(1, generator=generator))
        if u * float(q[i, d]) < float(p[i, d]):
            continue
        return i, _resample(p[i], q[i], generator), "correction"
    return (n, sample(p[n], generator), "target") if p.shape[0] > n else (n, -1, "none")


def rule_g(drafts, p, q, *, greedy=False, generator=None):
    return _standard(drafts, p, q, generator,
                     resample=lambda pr, qr, g: int(torch.clamp(pr - qr, min=0).argmax()))


def rule_h(drafts, p, q, *, greedy=False, generator=None):
    kth = torch.topk(p, TOP_K, dim=-1).values[..., -1:]
    pk = torch.where(p >= kth, p, torch.zeros_like(p))
    pk = pk / pk.sum(-1, keepdim=True)
    return _standard(drafts, pk, q, generator)


RULES = {f.__name__: f for f in (rule_a, rule_b, rule_c, rule_d, rule_e, rule_f, rule_g, rule_h)}

# ---------------------------------------------------------------------------------- the sealed key
_SALT = b"mtplab find-the-bug, notebook 08"


_ROUNDS = 200_000  # PBKDF2 rounds: a tenth of a second a try, so a script that tries every set pays for it


def _bits(verdicts: dict) -> bytes:
    return bytes(int(bool(verdicts[r])) for r in RULES)


def _digest(verdicts: dict) -> str:
    """A salted, slow digest of a whole set of verdicts (in RULES order): the package keeps the right set's digest,
    never one per rule, so a check answers for the set alone and a guess at one rule learns nothing about it."""
    return hashlib.pbkdf2_hmac("sha256", _bits(verdicts), _SALT, _ROUNDS).hex()[:32]


def _stream(verdicts: dict, n: int) -> bytes:
    """n key-stream bytes derived from a full set of verdicts (in RULES order)."""
    seed = hashlib.sha256(_SALT + _bits(verdicts)).digest()
    out = b""
    i = 0
    while len(out) < n:
        out += hashlib.sha256(seed + i.to_bytes(4, "big")).digest()
        i += 1
    return out[:n]


# the salted digest of the right set of verdicts (instructor/find_the_bug_key.py makes it)
_KEY = "04308701d2f0d9f3c097ea1e50c957a8"
_SEALED = (  # the explanations, sealed under the right verdicts
    "kzet+EOqLLgKeeEwjaPBVUs2cyYavpJS+EMh3/gp0QUsy7KB+B9fOeHcOkVDgJW5y0U16PRZc6VNOJTANsZa37iXt1APzFQ7HSsa"
    "1vKVkYxp0RBZhFVaFILPEcLk8Is5Yh6lLS5kPe8Qv9+tkLMKXO7q8IeZ9Awlm+AMSosc0mn3LH3rovp04G7q2fXiXFwpnFmh2ntV"
    "P6KCTDf6sfLu1QgX217wm5T0dekKWvw2IsiaTFp0Mk14tofLV7oCBAZwMCDN9PPhjS1mRVreAXSMNVwXNfWsP3rORvzw7iWnWf0g"
    "qz09dO13raUTo1vz0+3+QqxEkVgxSjiOZvxW+Bfc+C4ByncsizKlH18Z7KDD4rcviEIkRet0j7b8bqdkM4gPJg6CxbYB3dM55RS6"
    "h0wfShcsSOzxuOenShSdmPqwOj8ROKq7NDOGbPV2fRMvpNDfKp4ApkWH5IPKKKaiS9LXYvJ26lnyO9Agvj/nU2fH1iWp07enupWY"
    "N83bhpZb/55+rLCN2Cg602DhBJwceGnWXPPzQAF7MA5Ic54f6lhWa0DvYVIMBvYLr7qaVSuMlm9CcteVcO01Bj103BZ2uc6+lAT0"
    "1bh4Kewe6b2o4nf3jSi6/bAPwE0Cbqvn9k1K+hAhSPpiC0itmd+wBXJwxrSO/dBxd4763K2PIBrTidyxpq2sJYHi7yKXp21/L3ee"
    "B++pbnAps7NQBDp3SJi5Ea5uMyU/zrJMU4bE1iUWm1XA0ots1RQtuGl3AiSKfp0l1OqN2mgP+4M5PPcTHKu8MVatV6KSTq+eq5Xw"
    "SSoLMWfiyJWnTy0mhxxaNwRRVeOv/4IO4/isKzdzm12RGU2BzHOlqhWBaIMyu0UL3+LtSeIczOPN50Cdv7rEK77efaWUxHQdZM+7"
    "Yn6j3H+m0bIwDxxXFhN7LzLk60LBHx/1ufInHQLqkx/puJkKmKJ5PUiTPzSHVgoGz/cVL8Ri1H4qNSSv5HQmvFMtqEEiKrlSYNpm"
    "5DHJ+1/GFiL3uPKXBjfjWECloF93rZZpWzyxkehE9wpDpVhTgogJEstryYMTvr6hKTYYdMcnavCMEO/Jml3C+dk4+hzlaXrRdjsk"
    "6x3+vq66hB4NzKiq2zF6T/9NEYiuaG+tM0OBN9tPv63vtYsWfQ/xhU9Qu4VnD1l+9EtlwdKPuDu8BIs8S2G1cQl9f0D2B7ZfVzcA"
    "X7AQX7srHAwJEfcJdorDr75ofA6Y2+UHr+o+o2baktGzafJZNCEXEM3KkJRaufaygZefSILmxowZ2657gCFLulJZ4HiB5iK4mXWV"
    "6SdK8IdhTYmnk7d+t84x02I42r9T6MJ0n3RTHJUw+r0ud/RD7hZKFj/0SvSsF2nr"
)


def _open(verdicts: dict) -> dict[str, str]:
    """The explanations, readable only with the right verdicts."""
    box = base64.b64decode(_SEALED)
    try:
        return json.loads(bytes(a ^ b for a, b in zip(box, _stream(verdicts, len(box)))).decode())
    except ValueError:  # UnicodeDecodeError and JSONDecodeError both are
        raise MtplabError("these verdicts do not open the explanations; pass bugs.check_verdicts first") from None


def listing(name: str) -> str:
    """The source of rule `name` as a student sees it: under its neutral name, without its docstring."""
    if name not in RULES:
        raise MtplabError(f"unknown rule {name!r}; the rules are {', '.join(RULES)}")
    tree = ast.parse(inspect.getsource(RULES[name]))
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

    One verdict for the whole set: a wrong set is told that it is wrong, never how many or which rules are off (a
    count would change by one when one verdict flips, and so name that rule's answer)."""
    name = "find the bug"
    if not isinstance(verdicts, dict):
        return Check(name, False, "give a dict such as {'rule_a': True, 'rule_b': False, ...} (True = broken)")
    unknown = [r for r in verdicts if r not in RULES]
    if unknown:
        return Check(name, False, f"unknown rule {', '.join(map(str, unknown))}; the rules are {', '.join(RULES)}")
    missing = [r for r in RULES if verdicts.get(r) is None]
    if missing:
        return Check(name, False, f"no verdict yet for {', '.join(missing)}")
    if _digest(verdicts) != _KEY:
        return Check(name, False, f"not every one of the {len(RULES)} verdicts is right (the checker grades the set, "
                                  "not a rule). A bug can hide on one seed: run bugs.power(bugs.RULES[name], "
                                  "seeds=20) on the rules you passed, and read their listings against the shared "
                                  f"helpers; one small p-value on one seed happens at rate {ALPHA}, so a rule you "
                                  "called broken on one seed may be correct")
    key = {r: bool(verdicts[r]) for r in RULES}
    _EARNED.clear()
    _EARNED.update(key)
    why = _open(key)
    return Check(name, True, "; ".join(f"{r}: {why[r]}" for r in RULES if key[r]))


_EARNED: dict[str, bool] = {}  # the right verdicts, once a check has passed


def earned(check) -> dict[str, bool] | None:
    """The answer key {rule: broken} once `check` is a passing `check_verdicts`; None before (nothing to reveal)."""
    if isinstance(check, Check) and check.ok and check.name == "find the bug":
        return dict(_EARNED) if _EARNED else None
    return None


def label(name: str, key: dict[str, bool] | None = None) -> str:
    """A rule's name for a legend: neutral before the key is earned, with its verdict and why after."""
    if name not in RULES:
        raise MtplabError(f"unknown rule {name!r}; the rules are {', '.join(RULES)}")
    if key is None:
        return name
    return f"{name} ({'broken' if key[name] else 'correct'}: {_open(key)[name].split(':')[0]})"


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
    if set(power) != set(RULES):
        raise MtplabError(f"power must hold every rule ({', '.join(RULES)}); got {', '.join(power)}")
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
                 f"{seeds} seeds with probability {chance:.0%}); notebook 06 shows it over its N_SEEDS seeds")
    return "; ".join(lines)


def main(argv=None) -> int:
    """python -m mtplab.teaching.find_the_bug [--seeds S] [--draws N] [--quick] [--json PATH]: the power table over S seeds."""
    import argparse
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
        print(f"{name}: rejected on {rate:.3f} of {seeds} seeds at alpha {ALPHA}, {args.draws} draws each")
    if args.json:
        atomic_write_text(Path(args.json), json.dumps({"seeds": seeds, "n_draws": args.draws, "alpha": ALPHA, "vocab": V,
                                                       "power": table}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
