"""How good is a model's greedy text? Loops, the failure of small greedy models, counted plainly.

A greedy continuation has *fallen into a loop* when its last `window` tokens repeat with a short period:
token t equals token t-p for every t in the window, for some p <= max_period. A model that has learnt
little copies its own last line forever; this counts how often that happens on held-out prompts.
"""
from __future__ import annotations

from mtplab.decoding.loop import autoregressive
from mtplab.errors import MtplabError


def loop_period(tokens: list[int], *, window: int = 48, max_period: int = 24) -> int | None:
    """The shortest period p <= max_period with which the last `window` tokens repeat, or None."""
    if window < 2 or max_period < 1:
        raise MtplabError("window must be >= 2 and max_period >= 1")
    if len(tokens) < window + 1:
        return None
    tail = tokens[-window:]
    for p in range(1, max_period + 1):
        if p >= window:
            break
        if all(tail[i] == tail[i - p] for i in range(p, window)):
            return p
    return None


def looping(model, prompts: list[list[int]], *, max_new_tokens: int = 128, window: int = 48,
            max_period: int = 24) -> dict:
    """Greedy continuations of every prompt; which of them end in a loop. Returns counts and periods."""
    periods = []
    for p in prompts:
        cont = autoregressive(model, p, max_new_tokens=max_new_tokens).tokens
        periods.append(loop_period(cont, window=window, max_period=max_period))
    n_loop = sum(p is not None for p in periods)
    return {"prompts": len(prompts), "looping": n_loop, "fraction": n_loop / max(1, len(prompts)),
            "periods": periods, "max_new_tokens": max_new_tokens, "window": window, "max_period": max_period}
