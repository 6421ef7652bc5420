"""Reference solutions of the notebooks' exercises, for the instructor and for tests/teaching/test_exercises.py (which
checks that every checker accepts them). Not part of the package, not in any notebook, and left out of the student
copy (`make student-copy` builds it with `git archive`; .gitattributes marks this folder export-ignore), so no answer
is one grep away there. tests/ground/test_portable.py checks that no file of the student copy holds one of these bodies.
"""
import math

import torch
import torch.nn.functional as F

from mtplab.decoding.accept import accept
from mtplab.teaching.peers import PAIRS
def plain_forwards(m, k):
    if k == 1:
        return m
    full, rest = divmod(m, k)
    return 2 * full + (0 if rest == 0 else 1 if rest == 1 else 2)


def overlap_forwards(m, k):
    return 1 + math.ceil((m - 1) / k)


def accepted_prefix(drafts, target):
    n = 0
    for d, t in zip(drafts, target):
        if d != t:
            break
        n += 1
    return n


def multi_token_loss(logits, x, K):
    B, T, _, V = logits.shape
    return torch.stack([F.cross_entropy(logits[:, :T - k, k].reshape(-1, V), x[:, k + 1:].reshape(-1))
                        for k in range(K)]).mean()


def expected_tokens(alpha, n):
    return sum(alpha ** i for i in range(n + 1))


def speedup(tps, curve, q):
    return tps / curve[q]


def layout(T, k):
    return list(range(k + 1, T + 1)), list(range(k + 2, T + 2))


def deepseek_forwards(m, D):
    return 1 + math.ceil((m - 1) / (D + 1))


def acceptance_rate(p, q):
    return float(torch.minimum(p, q).sum())


def sampling_rule(p, q, d, g):
    if float(torch.rand(1, generator=g)) < min(1.0, float(p[d] / q[d])):
        return True, d
    resid = torch.clamp(p - q, min=0)
    return False, int(torch.multinomial(resid / resid.sum(), 1, generator=g))


def mtplab_rule(p, q, d, g):
    n, tok, _ = accept([d], p[None], q[None], greedy=False, generator=g)
    return n == 1, d if n == 1 else tok


# notebook 05
def conditional(steps):
    n = max((d for d, _ in steps), default=0)
    out = []
    for i in range(n):
        reached = [a for d, a in steps if d > i and a >= i]
        out.append(sum(a > i for a in reached) / len(reached) if reached else float("nan"))
    return out


def sampled_verdict(p, q, u):
    return u < min(1.0, p / q)


def step_speedup(tps, split, ar):
    return tps * ar / sum(split[k] for k in ("target_s", "draft_s", "overhead_s"))


# notebook 10
def loop_ratio(record):
    speed = {r["method"]: r["speedup_vs_hf_greedy"] for r in record["rows"]}
    return {mine: speed[mine] / speed[hf] for hf, mine in PAIRS if hf in speed and mine in speed}


# notebook 01, exercise 3
def context_ratio(weights_ms, attn_ms, q, context):
    return (weights_ms + q * context * attn_ms) / (weights_ms + context * attn_ms)


# notebook 09
def best_k(alpha, cost_curve, draft_cost, ks):
    def speed(k):
        return sum(alpha ** i for i in range(k)) / (cost_curve[k] + (k - 1) * draft_cost)
    return max(ks, key=speed)


# the laptop assignment (mtplab.teaching.classroom.ASSIGNMENT), from the student's own preflight record
def laptop_prediction(record, row):
    from mtplab.decoding.drafters import METHODS
    r = next(x for x in record["predictions"]["classroom"] if x["row"] == row)
    ratio = {int(q): v for q, v in record["classroom"]["ratio"].items()}
    plain = METHODS[r["method"]].schedule == "plain"  # the plain schedule verifies k - 1 tokens after a predict forward
    q = min(r["k"] - 1 if plain else r["k"], max(ratio))  # past the record's largest q: its largest, as the grader
    if q not in ratio:  # t(3)/t(1): between the two nearest q the record measured, linearly
        lo, hi = max(x for x in ratio if x < q), min(x for x in ratio if x > q)
        ratio[q] = ratio[lo] + (ratio[hi] - ratio[lo]) * (q - lo) / (hi - lo)
    return r["tokens_per_step"] / (ratio[q] + r["draft_t1"] + (1.0 if plain else 0.0))
