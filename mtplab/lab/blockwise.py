"""Decoding studies shared by the notebooks: many prompts, pooled traces, forward counts, step tables."""
from __future__ import annotations



from ..decoding import autoregressive, speculative
from ..trace import Trace
from ..drafters import OracleDrafter
from ..errors import MtplabError
from ..tokenizer import token_repr


# ---------------------------------------------------------------------------------- decoding studies
def pooled(traces: list[Trace]) -> Trace:
    """One Trace holding the steps of many (same method and k), so its counters pool over prompts."""
    if not traces:
        raise MtplabError("no traces to pool")
    t0 = traces[0]
    return Trace(method=t0.method, prompt=[], steps=[s for t in traces for s in t.steps], k=t0.k,
                 schedule=t0.schedule)


def run_prompts(method: str, model, prompts, *, max_new_tokens: int, k: int | None = None, progress: bool = False,
                **kw) -> list[Trace]:
    """`generate.decode_with` over a list of prompts (str or token lists); prompts are cut to fit the window."""
    from ..generate import decode_with
    from ..tokenizer import encode

    it = prompts
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(prompts, desc=method if k is None else f"{method} k={k}", unit="prompt", leave=False)
    room = model.config.block_size - max_new_tokens - (k or 8)
    out = []
    for p in it:
        ids = encode(p) if isinstance(p, str) else list(p)
        out.append(decode_with(method, model, ids[-room:], max_new_tokens=max_new_tokens, k=k, **kw))
    return out


def oracle_forward_counts(model, prompt, ms, ks, *, schedule: str) -> dict[int, list[int]]:
    """Forwards spent by speculative decoding with a perfect drafter (alpha = 1), for every m and k.

    With alpha = 1 the count depends only on m, k and the schedule, never on what the model says,
    which is what `theory.plain_forwards` and `theory.overlap_forwards` claim.
    """
    ms = list(ms)
    reference = autoregressive(model, prompt, max_new_tokens=max(ms)).tokens  # greedy: a prefix for every m
    return {k: [speculative(model, OracleDrafter(reference, 1.0), prompt, max_new_tokens=m, k=k,
                            schedule=schedule).forwards for m in ms] for k in ks}


def format_steps(trace: Trace, limit: int | None = None) -> str:
    """The steps of a speculative Trace as a text table: what each step drafted, kept and added."""
    def toks(ids):
        return " ".join(token_repr(t) for t in ids) or "-"

    lines = [f"{trace.method} (k={trace.k}, schedule={trace.schedule}): {len(trace.tokens)} tokens in "
             f"{trace.forwards} target forwards",
             f"{'step':>4} {'fwd':>3}  {'predict':<7}  {'drafts':<24} {'kept':>4}  {'then':<16} emitted"]
    steps = trace.steps if limit is None else trace.steps[:limit]
    for i, s in enumerate(steps):
        pred = token_repr(s.predict_token) if s.predict_token is not None else "-"
        if i == 0:
            then = "prefill"
        elif s.bonus is None:
            then = "-"
        else:
            then = f"{token_repr(s.bonus)} ({'bonus' if s.bonus_source == 'target' else 'correction'})"
        lines.append(f"{i:>4} {s.forwards:>3}  {pred:<7}  {toks(s.drafted):<24} {s.accepted:>4}  {then:<16} "
                     f"{toks(s.emitted)}")
    if limit is not None and len(trace.steps) > limit:
        lines.append(f"... {len(trace.steps) - limit} more steps")
    return "\n".join(lines)
