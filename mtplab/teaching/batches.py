"""Notebook 07's companion: what a batch and a tree do to speculation, read in words computed from the numbers.

The studies are `measuring.timing.measure_batch`, `measuring.timing.batch_cost_ratio` and
`decoding.tree.tree_speculative`; this module turns their rows into the sentences the notebook prints (every verdict
word, "shrank", "grew", "within noise", comes from the rows, so a rerun cannot contradict it) and holds the two
exercises' checkers. A checker says which kind of case it failed on, never the expected value.

B batch size (prompts decoded at once), k tokens per step, t(q) the time of one forward over q tokens a row.
"""
from __future__ import annotations

import math

from mtplab.errors import MtplabError
from mtplab.model.kernels import MAX_ROWS
from mtplab.teaching.check import Check, number_from
from mtplab.teaching.words import NOT_VALID, overlap, range_text

NOISE = 0.05  # a median that moved by less than this fraction "stayed about the same"


def trend(before: float, after: float, *, noise: float = NOISE) -> str:
    """'grew', 'shrank' or 'stayed about the same' (within `noise`, a fraction of `before`)."""
    if before <= 0:
        raise MtplabError(f"a speedup must be positive (got {before})")
    if after > (1 + noise) * before:
        return "grew"
    if after < (1 - noise) * before:
        return "shrank"
    return "stayed about the same"


def ratio_text(ratios: dict[int, float], kernels: dict[int, tuple[str, str]] | None = None) -> str:
    """What t(k)/t(1) did over the batch sizes, in words. A ratio below 1 is either two kernels (`kernels`: B -> the
    kernel of the one-token and of the k-token forward, `timing.batch_cost_ratio`'s, where they differ: the exact
    kernel serves up to 16 rows, the stock one more) or a disturbed timing."""
    if not ratios:
        raise MtplabError("no cost ratios: give {batch size: t(k)/t(1)} for at least one batch size")
    text = "t(k)/t(1) by batch size: " + ", ".join(f"B = {B}: {r:.2f}" for B, r in sorted(ratios.items()))
    if len(ratios) > 1:
        b0, b1 = min(ratios), max(ratios)
        move = trend(ratios[b0], ratios[b1])
        text += (f"; from B = {b0} to B = {b1} the ratio "
                 + {"grew": "climbs", "shrank": "falls", "stayed about the same": "barely moves"}[move]
                 + f" ({ratios[b0]:.2f} -> {ratios[b1]:.2f})")
    kernels = kernels or {}
    switch = [B for B, r in sorted(ratios.items()) if len(set(kernels.get(B, ()))) == 2]
    if switch:
        text += (f". At B = {', '.join(map(str, switch))} the two forwards ran different kernels (one token a row: "
                 f"{', '.join(kernels[B][0] for B in switch)}; k tokens a row: {', '.join(kernels[B][1] for B in switch)}"
                 f"): the exact kernel serves up to {MAX_ROWS} rows a call, so that ratio compares two kernels, not two widths")
    low = [B for B, r in sorted(ratios.items()) if r < 0.95 and B not in switch]
    if low:
        text += (f". A forward over k tokens a row cannot cost less than one over 1 token, yet B = "
                 f"{', '.join(map(str, low))} measured below 1: the machine was busy while it was timed; rerun alone")
    return text


def _spec_rows(rows: list[dict], method: str) -> list[dict]:
    spec = sorted((r for r in rows if r["kind"] == "spec"), key=lambda r: r["batch_size"])
    if not spec:
        raise MtplabError(f"no speculative rows for {method}: run timing.measure_batch first")
    return spec


def _busy(spec: list[dict]) -> list[int]:
    return [r["batch_size"] for r in spec if r.get("busy")]


def _busy_sizes(busy: list[int]) -> str:
    return NOT_VALID.format(why=f"the race's guard, while B = {', '.join(map(str, busy))} ran")


def batch_trend(rows: list[dict], method: str) -> str:
    """From the smallest B to the largest: 'shrank' / 'grew' / 'stayed about the same', with both medians, whether
    the ranges overlap, and the not-valid flag first when the race's guard marked any batch size busy."""
    spec = _spec_rows(rows, method)
    first, last = spec[0], spec[-1]
    moved = trend(first["speedup"], last["speedup"])
    noise = overlap(first, last)
    busy = _busy(spec)
    return ((f"not valid here (the machine was busy while B = {', '.join(map(str, busy))} ran): " if busy else "")
            + f"from B = {first['batch_size']} to B = {last['batch_size']} the median speedup over AR "
            f"{moved} ({first['speedup']:.2f}x -> {last['speedup']:.2f}x)"
            + ("; the two ranges overlap, so this run cannot tell the two batch sizes apart"
               if noise and moved != "stayed about the same" else "; the ranges do not overlap" if not noise else ""))


def batch_lines(rows: list[dict], ratios: dict[int, float], method: str, *, shipped: dict | None = None,
                predict: bool = False) -> list[str]:
    """One line per batch size (speedup, range, tokens per row-forward, the shipped record's row where `shipped`
    {B: row} has one; the rule's prediction only with predict=True, since exercise 2 asks for it), then the
    verdict: did the speedup shrink or grow from the smallest B to the largest, and is that change larger than the
    noise?"""
    spec = _spec_rows(rows, method)
    lines = []
    for r in spec:
        B = r["batch_size"]
        line = (f"B = {B:2d}: {r['speedup']:.2f}x over batched AR (range {r['speedup_min']:.2f}-"
                f"{r['speedup_max']:.2f}), {r['tokens_per_forward']:.2f} tokens per row-forward")
        if predict and B in ratios and ratios[B] > 0:
            line += f"; the rule tokens / (t(k)/t(1)) predicts {r['tokens_per_forward'] / ratios[B]:.2f}x"
        ar = next((a for a in rows if a["kind"] == "ar" and a["batch_size"] == B), None)
        if ar and ar.get("kernel") and r.get("kernel") and ar["kernel"] != r["kernel"]:
            line += (f"; AR ran the {ar['kernel']} kernel ({B} rows a forward) and the verify the {r['kernel']} one "
                     f"(B x k rows; the exact kernel serves up to {MAX_ROWS}): part of this speedup is the kernel")
        if shipped and shipped.get(B):
            n = shipped[B].get("repeats")  # the record's own count, not assumed
            line += (f"; shipped batch-quick.json: {shipped[B]['speedup']:.2f}x ("
                     + (f"{n} repeat{'s' * (n != 1)}" if isinstance(n, int) else "repeats not recorded") + ")")
        lines.append(line)
    pays = [r["batch_size"] for r in spec if r["speedup_min"] > 1]
    loses = [r["batch_size"] for r in spec if r["speedup_max"] < 1]
    lines.append(f"{method}: batch sizes that paid in every round: {', '.join(map(str, pays)) or 'none'}; that lost "
                 f"in every round: {', '.join(map(str, loses)) or 'none'}")
    busy = _busy(spec)
    if busy:
        lines.append(_busy_sizes(busy))
    if len(spec) > 1:
        lines.append(f"{method}: {batch_trend(rows, method)}")
    return lines


def prediction_lines(rows: list[dict], ratios: dict[int, float], method: str, rule) -> list[str]:
    """After exercise 2: the student's rule `rule(tokens_per_row_forward, t(k)/t(1))` against the measured speedup at
    each B, once `check_batch_speedup(rule)` passes (before, one line saying so: the printout would give the answer
    away). Where the machine was busy that comes first, and the gap is not read as a cost the rule leaves out."""
    check = check_batch_speedup(rule)
    if not check.ok:
        return ["exercise 2 is not solved yet: once its checker passes, this cell prints your rule's prediction "
                "beside the measured speedups"]
    spec = _spec_rows(rows, method)
    busy = _busy(spec)
    lines = [_busy_sizes(busy) + ": a gap below is timing noise before it is anything the rule leaves out"] if busy else []
    for r in spec:
        B = r["batch_size"]
        if B not in ratios or ratios[B] <= 0:
            continue
        pred = float(rule(r["tokens_per_forward"], ratios[B]))
        where = ("inside the measured range" if r["speedup_min"] <= pred <= r["speedup_max"] else
                 "above the measured range" if pred > r["speedup_max"] else "below the measured range")
        line = (f"B = {B:2d}: your rule predicts {pred:.2f}x, measured {r['speedup']:.2f}x (range "
                f"{r['speedup_min']:.2f}-{r['speedup_max']:.2f}): the prediction lies {where}")
        if where == "above the measured range":
            line += (" (the machine was busy: rerun alone before reading the gap)" if B in busy else
                     "; that gap is what the rule leaves out: the drafter's own time and the ragged-row bookkeeping")
        lines.append(line)
    return lines


def tree_lines(summary: dict[str, float], width: dict[str, int], timed: dict, *, widths, prompts: int,
               tokens: int, show_width: bool = True) -> list[str]:
    """The tree against the chain: tokens per forward, verify width (only with show_width=True: exercise 1 asks
    for it), wall clock over AR (timed: name -> `RaceResult.row`), and the verdict words ('faster', 'slower',
    'within noise') from the timed ranges, led by the race's not-valid flag when it was busy."""
    for name in ("chain", "tree"):
        if name not in summary or name not in timed or name not in width:
            raise MtplabError(f"no {name!r} row: give the chain's and the tree's tokens per forward, width and timing")
    ch, tr = timed["chain"], timed["tree"]
    lines = [f"{name} {w}: {summary[name]:.2f} tokens per forward"
             + (f" at a verify width of {width[name]}" if show_width or name == "chain" else
                " (its verify width: exercise 1)") + "; wall clock "
             f"over AR {range_text(timed[name])}"
             for name, w in (("chain", (1,) * len(widths)), ("tree", tuple(widths)))]
    pace = _pace(ch, tr)
    lines.append(_tree_flag(timed)
                 + f"the tree commits {summary['tree'] / summary['chain']:.2f}x the chain's tokens per forward and ran "
                 f"{pace} the chain ({prompts} held-out prompt{'s' * (prompts != 1)} x {tokens} tokens, not the drawn step's "
                 "prompt)")
    why = next((timed[n]["busy"] for n in ("chain", "tree") if timed[n]["busy"]), None)
    if why:
        lines.append(NOT_VALID.format(why=why))
    return lines


def _pace(ch: dict, tr: dict) -> str:
    """The tree against the chain, from their ranges over the rounds: a side only when the ranges do not overlap."""
    if overlap(ch, tr):
        return "within noise of"
    return "faster than" if tr["speedup"] > ch["speedup"] else "slower than"


def _tree_flag(timed: dict) -> str:
    busy = any(timed[n]["busy"] for n in ("chain", "tree"))
    return "not valid here (the machine was busy while the tree race ran): " if busy else ""


def summary_lines(rows: list[dict], ratios: dict[int, float], method: str, *, summary: dict[str, float],
                  width: dict[str, int], timed: dict, widths, show_width: bool) -> list[str]:
    """The 'what was learnt' lines of sections 2 and 3, with the same verdict words and not-valid flags as the
    lines printed there (`batch_trend`, `tree_lines`); the tree's width only once exercise 1 is solved."""
    b0, b1 = min(ratios), max(ratios)
    ch, tr = timed["chain"], timed["tree"]
    pace = _pace(ch, tr)
    w = f"a verify width of {width['tree']}" if show_width else "the verify width of exercise 1"
    return [f"{method}: {batch_trend(rows, method)}; t(k)/t(1) went from {ratios[b0]:.2f} to {ratios[b1]:.2f} over the "
            "same batch sizes.",
            f"{_tree_flag(timed)}a tree {tuple(widths)} committed {summary['tree']:.2f} tokens per forward against the "
            f"chain's {summary['chain']:.2f}, at {w} instead of {width['chain']}; it ran {pace} the chain (wall clock "
            f"over AR {tr['speedup']:.2f}x, range {tr['speedup_min']:.2f}-{tr['speedup_max']:.2f}, against "
            f"{ch['speedup']:.2f}x, range {ch['speedup_min']:.2f}-{ch['speedup_max']:.2f})."]


# ---------------------------------------------------------------------------------------------- exercises
# widths per depth -> (positions one verify forward reads, the root included; the nodes without the root; the
# wrong count 1 + sum(widths)), counted once by hand: fixed cases, never the package's own tree code
TREES = {(1, 1, 1): (4, 3, 4), (3, 2, 1): (16, 15, 7), (2, 2): (7, 6, 5), (4,): (5, 4, 5), (3, 3, 3): (40, 39, 10)}


def check_tree_width(fn) -> Check:
    """fn(widths) -> positions one tree verify forward reads, the root included."""
    name = "tree width"
    for w, (want, nodes, flat) in TREES.items():
        got, why = number_from(fn, w, case=f"on widths {w}")
        if why:
            return Check(name, False, why)
        if got != want:
            if got == flat:
                hint = "every node of one depth has its own children at the next: a depth holds more than its width"
            elif got == nodes:
                hint = "the root (the last committed token) goes through the same forward: count it"
            else:
                hint = "every depth-d node gets w_(d+1) children; add the nodes of every depth and the root"
            return Check(name, False, f"wrong on a case like widths {w}: {hint}")
    return Check(name, True, "every depth's nodes, plus the root")


# (tokens per row-forward, t(k)/t(1)) -> the speedup the simple rule predicts, computed once
BATCH_CASES = {(2.0, 1.5): 1.3333333333333333, (2.4, 1.2): 2.0, (1.8, 2.0): 0.9}


def check_batch_speedup(fn) -> Check:
    """fn(tokens_per_row_forward, cost_ratio) -> the speedup the simple rule predicts."""
    name = "batch speedup"
    for (tpf, c), want in BATCH_CASES.items():
        v, why = number_from(fn, tpf, c, case=f"on {tpf} tokens per row-forward at t(k)/t(1) = {c}")
        if why or v is None:
            return Check(name, False, why or "return a number")
        if not math.isclose(v, want, rel_tol=1e-9):
            hint = ("you multiplied by the cost; a step that costs more buys less" if math.isclose(v, tpf * c) else
                    "a speedup over 1 needs more tokens than the step costs in AR steps" if v > tpf else
                    "tokens a step commits, over what the step costs in AR steps")
            return Check(name, False, f"wrong on a case like {tpf} tokens per row-forward at t(k)/t(1) = {c}: {hint}")
    return Check(name, True, "tokens / (t(k)/t(1)); it leaves out the drafter's time and the ragged-row bookkeeping")
