"""One race, the lab's way, and the guard that says when the machine was too busy for it to mean anything.

A race times contenders (callables: prompt -> a `Trace` or a list of token ids) on the same prompts. Every round
runs every prompt through every contender back to back, in an order that rotates from prompt to prompt and round
to round, so that no contender always runs first or last (after a warm-up call of each, which allocates and picks
kernels). Every clock read follows a device sync (`mtplab.device.now`). A round's ratio for a contender is the
baseline's time over the contender's, summed over the prompts; the result gives the median round and the range.

The busy-machine guard. Two torch processes on two cores slow each other down 30-200x, and a browser or a video
call slows a race in ways that differ from contender to contender. So the race measures, through psutil the same
way on Linux, macOS and Windows (`platform_compat.cpu_seconds`), how much CPU time *other* processes used while it
ran (the machine's busy time minus this process's own); where it cannot read it, it says "not measured", never idle,
and how far the rounds disagree. When others used more than a quarter of a core on average, or when the baseline's
round totals spread by more than half their median (from 4 rounds on, leaving out the fastest and slowest), the
result is marked not valid, with the reason, so that a notebook prints "rerun or read the shipped record" instead
of a speedup made of noise.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable
from mtplab.device import machine, now
from mtplab.errors import MtplabError
from mtplab.platform_compat import cpu_seconds

BUSY_CORES = 0.25     # others' average CPU use (in cores) above which a race is not valid
BUSY_SPREAD = 0.5     # spread of the baseline's round totals (`round_spread`) above which it is not valid: on an idle
                      # 2-core VM, short CPU timings spread by up to 45%; two torch jobs on two cores spread them many-fold
# said wherever the load could not be read: never "idle" without a measurement
NOT_MEASURED = ("the load of other processes was not measured here (this system's CPU time could not be read: pip "
                "install psutil if it is missing)")
# said of every measurement the guard marks busy (`RaceResult.verdict`, `teaching.words.busy_line`)
NOT_VALID = "not valid here: the machine was busy ({why}); close other work and rerun, or read the shipped record"


class LoadMeter:
    """CPU time used by other processes between `start` and `stop`, in cores on average; `stop` returns None
    where the machine's CPU time cannot be read (then say NOT_MEASURED)."""

    def start(self) -> "LoadMeter":
        self.ticks, self.own, self.t0 = cpu_seconds(), time.process_time(), time.monotonic()
        return self

    def stop(self) -> float | None:
        end = cpu_seconds()
        wall = time.monotonic() - self.t0  # a load reading, not a timing: no device work to wait for
        if end is None or self.ticks is None or wall <= 0:
            return None
        others = (end[0] - self.ticks[0]) - (time.process_time() - self.own)
        return max(0.0, others / wall)


def round_spread(totals: list[float]) -> float | None:
    """How far the baseline's rounds disagree, relative to their median: the range, or from 4 rounds on the range
    without the fastest and the slowest round (one stray round, a page fault or a timer tick, is not a busy machine;
    rounds that keep disagreeing are)."""
    if len(totals) < 2 or min(totals) <= 0:
        return None
    kept = sorted(totals)[1:-1] if len(totals) >= 4 else totals
    return (max(kept) - min(kept)) / statistics.median(totals)


def busy_reason(others_cores: float | None, spread: float | None) -> str | None:
    """Why a race is not valid here, or None when it is."""
    why = []
    if others_cores is not None and others_cores > BUSY_CORES:
        why.append(f"other processes used {others_cores:.2f} cores on average while it ran")
    if spread is not None and spread > BUSY_SPREAD:
        why.append(f"the baseline's rounds differ by {100 * spread:.0f}%")
    return "; ".join(why) or None


@dataclass
class RaceResult:
    """The one result of a race: every timing, the outputs of round 0, and the busy-machine guard's verdict. `row`
    is its one dict shape, which every caller (benchmarks, studies, notebooks) reads."""
    names: list[str]
    baseline: str
    rounds: int
    prompts: int
    seconds: dict[str, list[list[float]]]           # name -> round -> prompt -> seconds
    outputs: dict[str, list[Any]]                    # name -> round-0 output per prompt
    tokens: dict[str, list[list[int]]]               # name -> round-0 token ids per prompt
    machine: dict = field(default_factory=dict)
    others_cores: float | None = None
    busy: str | None = None                          # why the race is not valid here; None when it is

    @property
    def valid(self) -> bool:
        return self.busy is None

    def round_totals(self, name: str) -> list[float]:
        return [sum(r) for r in self.seconds[name]]

    def ratios(self, name: str) -> list[float]:
        """Per round: the baseline's total time over this contender's."""
        return [b / max(1e-12, c) for b, c in zip(self.round_totals(self.baseline), self.round_totals(name))]

    def row(self, name: str) -> dict:
        """One contender against the baseline: speedup (the median round's ratio), speedup_min and speedup_max (the
        range over the rounds), rounds (every round's ratio), identical (prompts whose tokens equal the baseline's),
        prompts, valid and busy (the guard's verdict: None when valid)."""
        r = self.ratios(name)
        return {"speedup": statistics.median(r), "speedup_min": min(r), "speedup_max": max(r), "rounds": r,
                "identical": self.identical(name), "prompts": self.prompts, "valid": self.valid, "busy": self.busy}

    def seconds_median(self, name: str) -> float:
        """The median over the rounds of this contender's round total (seconds)."""
        return statistics.median(self.round_totals(name))

    def identical(self, name: str) -> int:
        """Prompts whose round-0 tokens equal the baseline's."""
        return sum(a == b for a, b in zip(self.tokens[name], self.tokens[self.baseline]))

    def verdict(self) -> str:
        """One line to print beside the table: valid, or why not and what to do."""
        if self.valid:
            load = (f"other processes used {self.others_cores:.2f} cores" if self.others_cores is not None
                    else NOT_MEASURED + ": only the rounds' spread was checked")
            return f"valid: {self.rounds} interleaved rounds over {self.prompts} prompts; {load}"
        return NOT_VALID.format(why=self.busy)


def _tokens(out) -> list[int]:
    toks = getattr(out, "tokens", out)
    return [int(t) for t in toks]


def race(contenders: dict[str, Callable[[Any], Any]], prompts: list, *, baseline: str, rounds: int = 3,
         device="cpu", warmup: Callable[[str, Callable], Any] | None = None, bar=None) -> RaceResult:
    """Time every contender on every prompt, `rounds` times, interleaved in rotating order (module docstring).
    `warmup(name, fn)` replaces the default warm-up (fn on the first prompt)."""
    if baseline not in contenders:
        raise MtplabError(f"the baseline {baseline!r} is not among the contenders ({', '.join(contenders)})")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise MtplabError(f"rounds must be an integer >= 1 (got {rounds!r})")
    if not prompts:
        raise MtplabError("a race needs at least one prompt")
    names = list(contenders)
    for n in names:
        (warmup or (lambda _n, fn: fn(prompts[0])))(n, contenders[n])
    seconds = {n: [[0.0] * len(prompts) for _ in range(rounds)] for n in names}
    outputs: dict[str, list] = {n: [] for n in names}
    meter = LoadMeter().start()
    for r in range(rounds):
        for i, p in enumerate(prompts):
            shift = (r * len(prompts) + i) % len(names)
            for n in names[shift:] + names[:shift]:
                t0 = now(device)
                out = contenders[n](p)
                seconds[n][r][i] = now(device) - t0
                if r == 0:
                    outputs[n].append(out)
                if bar is not None:
                    bar.update(1)
    others = meter.stop()
    res = RaceResult(names=names, baseline=baseline, rounds=rounds, prompts=len(prompts), seconds=seconds,
                     outputs=outputs, tokens={n: [_tokens(o) for o in outputs[n]] for n in names},
                     machine=machine(device), others_cores=others)
    totals = res.round_totals(baseline)
    spread = round_spread(totals)
    res.busy = busy_reason(others, spread)
    return res
