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
    for p in range(1, min(max_period, window - 1) + 1):
        if all(tail[i] == tail[i - p] for i in range(p, window)):
            return p
    return None


def loop_window(n_tokens: int) -> tuple[int, int]:
    """(window, max_period) of the lab's loop test for a continuation of `n_tokens` new tokens: its last half, at
    most 48 tokens (as in docs/bench/loops.json), repeating with a period of at most half that window."""
    window = min(48, n_tokens // 2)
    return window, max(1, window // 2)


def loop_onset(tokens: list[int]) -> int | None:
    """Where a greedy continuation starts repeating itself, or None when it does not loop (`loop_window`'s test).
    The loop starts at the first token from which every token equals the one a period earlier, to the end."""
    window, max_period = loop_window(len(tokens))
    if window < 4:
        return None
    p = loop_period(tokens, window=window, max_period=max_period)
    if p is None:
        return None
    t = len(tokens)
    while t - 1 - p >= 0 and tokens[t - 1] == tokens[t - 1 - p]:
        t -= 1
    return t


def looping(model, prompts: list[list[int]], *, max_new_tokens: int = 128, window: int = 48,
            max_period: int = 24) -> dict:
    """Greedy continuations of every prompt; which of them end in a loop. Returns counts and periods."""
    conts = [autoregressive(model, p, max_new_tokens=max_new_tokens).tokens for p in prompts]
    periods = [loop_period(c, window=window, max_period=max_period) for c in conts]
    n_loop = sum(p is not None for p in periods)
    return {"prompts": len(prompts), "looping": n_loop, "fraction": n_loop / max(1, len(prompts)),
            "periods": periods, "max_new_tokens": max_new_tokens, "window": window, "max_period": max_period}
