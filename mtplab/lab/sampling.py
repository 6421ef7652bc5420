"""Speculative sampling studies: exact counts of what the accept rule emits, and chi-square against p."""
from __future__ import annotations


import torch

from ..decoding import accept, distribution, speculative


def accept_counts(p: torch.Tensor, q: torch.Tensor, n: int, *, generator: torch.Generator, rule=None) -> dict:
    """Draw a draft d ~ q, let `rule` (default: `decoding.accept`) keep it or replace it, n times.

    p, q: (V,) target and draft distributions. Returns counts of the emitted token (V,) and the
    fraction of drafts kept. `rule(drafts, p_rows, q_rows, greedy=False, generator=...)` has
    `decoding.accept`'s signature; p_rows has one row, so a kept draft ends the step.
    """
    rule = rule or accept
    V = p.shape[0]
    counts = torch.zeros(V)
    kept = 0
    for _ in range(n):
        d = int(torch.multinomial(q, 1, generator=generator))
        n_ok, nxt, _ = rule([d], p[None], q[None], greedy=False, generator=generator)
        tok = d if n_ok == 1 else nxt
        counts[tok] += 1
        kept += n_ok
    return {"counts": counts, "kept": kept / n}


def chi_square(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> dict:
    """Pearson's chi-square test of counts against probs; cells expecting < min_expected are pooled.

    The p-value is the upper tail of the chi-square distribution, via torch.special.gammaincc.
    A p-value far below 0.01 says the counts were not drawn from probs.
    """
    counts = counts.double().flatten()
    expected = probs.double().flatten() * counts.sum()
    big = expected >= min_expected
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = max(1, int(keep.sum()) - 1)
    pvalue = float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                           torch.tensor(stat / 2.0, dtype=torch.float64)))
    return {"stat": stat, "dof": dof, "pvalue": pvalue}


@torch.inference_mode()
def second_token_marginal(model, prompt: list[int], *, temperature: float = 1.0, top_k=None) -> torch.Tensor:
    """Exact P(second new token) after `prompt`, summing over the first: (V,)."""
    V = model.config.vocab_size
    dev = model.wte.weight.device
    p1 = distribution(model(torch.tensor([prompt], device=dev)).logits[0, -1:], temperature, top_k)[0]  # (V,)
    seqs = torch.tensor([prompt + [a] for a in range(V)], device=dev)  # (V, P+1)
    p2 = distribution(model(seqs).logits[:, -1], temperature, top_k)  # (V, V): first -> second
    return (p1[:, None] * p2).sum(0).cpu()


def second_token_counts(model, make_drafter, prompt: list[int], n: int, *, k: int = 3, temperature: float = 1.0,
                        top_k=None, seed: int = 0, progress: bool = False) -> dict:
    """Counts of the second new token over n speculative runs (the first is sampled in the prefill,
    the second is the first one a drafter proposes), and the fraction of drafts kept."""
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V)
    drafted = kept = 0
    it = range(n)
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc="speculative samples", unit="run")
    for _ in it:
        tr = speculative(model, make_drafter(), prompt, max_new_tokens=3, k=k, temperature=temperature,
                         top_k=top_k, generator=g)
        counts[tr.tokens[1]] += 1
        drafted += tr.num_draft_tokens
        kept += tr.num_accepted_tokens
    return {"counts": counts, "kept": kept / max(1, drafted)}


@torch.inference_mode()
def acceptance_by_rule(target, draft, windows: torch.Tensor, *, temperatures=(1.0,)) -> dict:
    """Expected acceptance of one draft token at every position of some windows (teacher-forced).

    greedy: the draft is the drafter's argmax, kept if it equals the target's argmax.
    sampling at temperature T: the draft d ~ q is kept with probability min(1, p(d)/q(d)); averaged
    over d this is sum_v min(p(v), q(v)) = 1 - total variation distance between p and q.
    Returns {"greedy": float, "sampling": {T: float}}.
    """
    dev = target.wte.weight.device
    x = windows[:, :-1]
    p_logits = target(x.to(dev)).logits.float()  # (B, T, V)
    q_logits = draft(x.to(draft.wte.weight.device)).logits.float().to(dev)
    greedy = (p_logits.argmax(-1) == q_logits.argmax(-1)).float().mean().item()
    sampling = {}
    for t in temperatures:
        p = torch.softmax(p_logits / t, -1)
        q = torch.softmax(q_logits / t, -1)
        sampling[t] = torch.minimum(p, q).sum(-1).mean().item()
    return {"greedy": greedy, "sampling": sampling}
