"""Words from numbers, shared by every notebook's companion: a verdict is printed only when the numbers carry it.

* the busy-machine guard: `busy_line`, with `NOT_VALID` and `NOT_MEASURED` as `measuring.race` says them;
* ranges: `overlap` (do two ranges share a point), `side_of_one` and `range_words` (a speedup is faster or slower
  only when its whole range lies on one side of 1), `fastest_words` (a record's highest median called the fastest
  only when its range lies apart from the others'), `spread` and `range_text` (how a live timing is printed);
* rates: `rate_text` (a rate with its 95% Wilson interval and n), `compare_rates` (up or down only when the
  intervals do not overlap);
* a live race beside a shipped record: `live_text`, `agree`, `bench_speedup_text`, `wall_reps` (a benchmark row's
  speedup over its repeats).
A companion (`teaching/<notebook>.py`) keeps only the sentences of its own notebook.
"""
from __future__ import annotations

import statistics

from mtplab.measuring.acceptance import wilson
from mtplab.measuring.race import NOT_MEASURED, NOT_VALID
from mtplab.measuring.record import speedup_span, speedup_text
from mtplab.device import machine
from mtplab.model import kernels
from mtplab.platform_compat import cpu_seconds

__all__ = ["NOT_MEASURED", "NOT_VALID", "agree", "bench_speedup_text", "busy_line", "compare_rates", "fastest_words",
           "live_text", "overlap", "range_text", "range_words", "rate_text", "side_of_one", "spread",
           "wall_reps"]


# ---------------------------------------------------------------------------------- the busy-machine guard
def busy_line(busy: str | None, what: str = "this timing") -> str:
    """The guard's line for one live measurement: valid, or why not (printed before any verdict). Where this machine's
    load cannot be read (`platform_compat.cpu_seconds` is None), a valid verdict rests on the rounds' spread alone,
    and the line says so: never "no other load" unmeasured."""
    if busy is not None:
        return f"{what}: " + NOT_VALID.format(why=busy)
    if cpu_seconds() is None:
        return f"{what}: valid by the rounds' spread only; {NOT_MEASURED}"
    return f"{what}: valid (the busy-machine guard saw no other load)"


# ---------------------------------------------------------------------------------- ranges
def _ends(x) -> tuple[float, float]:
    """(low, high) of a range: a row with speedup_min and speedup_max, a (low, high) pair or any list of numbers."""
    if isinstance(x, dict):
        return x["speedup_min"], x["speedup_max"]
    return min(x), max(x)


def overlap(a, b) -> bool:
    """Do two ranges share a point? Each a row (speedup_min, speedup_max), a (low, high) pair or a list of values."""
    (alo, ahi), (blo, bhi) = _ends(a), _ends(b)
    return alo <= bhi and blo <= ahi


def side_of_one(low: float, high: float, *, tie: str = "not distinguishable from") -> str:
    """'faster than' when the whole range is above 1, 'slower than' when it is below, else `tie`."""
    return "faster than" if low > 1.0 else "slower than" if high < 1.0 else tie


def range_words(ratio: float, low: float, high: float, *, than: str = "AR") -> str:
    """A live speedup read from its own range: 'faster than AR here (1.20x, range 1.10-1.30)'; a range across 1
    says so."""
    nums = f"{ratio:.2f}x, range {low:.2f}-{high:.2f}"
    side = side_of_one(low, high)
    return f"{side} {than} here ({nums}{' spans 1' if side == 'not distinguishable from' else ''})"


def fastest_words(best: dict, others: list[dict], name, *, among: str) -> str:
    """How `best` (a record row: speedup, and speedup_min/max where it has them) stands against `others`, the rows it
    was picked from by its median, in the words their ranges carry: 'the only {among}' when there is no other;
    'the fastest {among}' only when its range lies apart from every other's; else 'the fastest {among} by median',
    within the range of each row that overlaps it, which the record does not rank. `name(row)` names a row."""
    nums = speedup_text(best)
    if not others:
        return f"the only {among} ({name(best)}: {nums}), so the record compares it with no other"
    ties = [r for r in others if overlap(speedup_span(r), speedup_span(best))]
    if not ties:
        return (f"the fastest {among} ({name(best)}: {nums}), its range apart from every other's ("
                + "; ".join(f"{name(r)}: {speedup_text(r)}" for r in others) + ")")
    return (f"the fastest {among} by median ({name(best)}: {nums}), within the range of "
            + " and of ".join(f"{name(r)} ({speedup_text(r)})" for r in ties)
            + ": the record does not rank " + ("the two" if len(ties) == 1 else "them"))


def spread(values) -> str:
    """'median (range min-max, n = N)' of a list of numbers: how a live timing is printed."""
    v = sorted(values)
    return f"{statistics.median(v):.2f} (range {v[0]:.2f}-{v[-1]:.2f}, n = {len(v)})"


def range_text(row: dict) -> str:
    """'1.21x (median of 5, range 1.10-1.30)' for one row of a race (`RaceResult.row`)."""
    return f"{row['speedup']:.2f}x (median of {len(row['rounds'])}, range {row['speedup_min']:.2f}-{row['speedup_max']:.2f})"


# ---------------------------------------------------------------------------------- rates
def rate_text(k: int, n: int) -> str:
    """'0.61 [0.51, 0.70] (n = 95)': a rate with its 95% Wilson interval and its n."""
    if not n:
        return "n/a (n = 0)"
    lo, hi = wilson(k, n)
    return f"{k / n:.2f} [{lo:.2f}, {hi:.2f}] (n = {n})"


def compare_rates(a: tuple[int, int], b: tuple[int, int], up: str, down: str) -> str:
    """Words for rate b against rate a, each given as (successes, n), chosen from their 95% Wilson intervals: `up` or
    `down` only when the intervals do not overlap; otherwise which way the point estimate went, and that they overlap."""
    (ka, na), (kb, nb) = a, b
    if not na or not nb:
        return "cannot be compared (no steps counted)"
    (alo, ahi), (blo, bhi) = wilson(ka, na), wilson(kb, nb)
    if blo > ahi:
        return up
    if bhi < alo:
        return down
    moved = kb / nb - ka / na
    way = "ends higher" if moved > 0 else ("ends lower" if moved < 0 else "ends where it started")
    return f"{way}, but within overlapping 95% intervals"


# ---------------------------------------------------------------------------------- a live race beside a record
def live_text(live: dict) -> str:
    """'1.05x live (median of 5 interleaved repeats over 1 prompt x 24 tokens, range 0.98-1.10)' for a live race
    (`timing.interleaved_race`), and the race's verdict when the machine was too busy for it to be valid."""
    prompts = f"{live['prompts']} prompt{'s' if live['prompts'] != 1 else ''}"
    busy = "" if live["busy"] is None else "; " + NOT_VALID.format(why=live["busy"])
    return (f"{live['speedup']:.2f}x live (median of {len(live['rounds'])} interleaved repeats over {prompts} "
            f"x {live['max_new_tokens']} tokens, range {live['speedup_min']:.2f}-{live['speedup_max']:.2f}{busy})")


def agree(live: dict, row: dict | None, apart: str = "") -> str:
    """Whether the live range holds the benchmark's figure, in words a notebook can print beside both; `apart`
    (`apart_words`) says what differs between the two measurements when the figure lies outside."""
    if row is None:
        return "no benchmark figure for this pair"
    b = row["speedup_wall"]
    if live["speedup_min"] <= b <= live["speedup_max"]:
        return "the benchmark's figure lies inside the live range"
    side = "below" if b < live["speedup_min"] else "above"
    return (f"the benchmark's figure lies {side} the live range; "
            + (apart or "the live run is shorter (fewer prompts and tokens)"))


def apart_words(rec, *, live: str, recorded: str, device="cpu") -> str:
    """What differs between a live race here and a record's figure, from the record's fields: the decodes (`live`
    and `recorded`, e.g. '2 prompts x 24 tokens'), the machine (CPU and last-level cache against this one's) and the
    kernel (the record's `kernel` field, 'stock' for records older than the exact kernel, against the one active
    here, `mtplab.model.kernels`). `rec`: a record dict or `Record`."""
    out = [f"the decodes ({live} here, {recorded} in the record)"]
    m, here = rec.get("machine"), machine(device)
    if isinstance(m, dict) and (m.get("cpu"), m.get("llc")) != (here["cpu"], here["llc"]):
        out.append(f"the machine ({here['cpu']}, cache {here['llc']} here; {m.get('cpu')}, cache {m.get('llc')} in "
                   "the record)")
    k_rec, k_here = rec.get("kernel", "stock"), "exact" if kernels.active() else "stock"
    if k_rec != k_here:
        out.append(f"the kernel ({k_here} here, {k_rec} in the record)")
    return "what differs: " + "; ".join(out)


def wall_reps(row: dict) -> list[float]:
    """A decode benchmark row's wall-clock speedup over its repeats: [speedup_wall] for a row that kept none."""
    return row.get("speedup_wall_reps") or [row["speedup_wall"]]


def bench_speedup_text(row: dict | None) -> str:
    """'1.09x (range 1.02-1.12 over 3 repeats)' for a decode benchmark row; 'not in the benchmark' for None."""
    if row is None:
        return "not in the benchmark"
    reps = row.get("speedup_wall_reps")
    rng = f" (range {min(reps):.2f}-{max(reps):.2f} over {len(reps)} repeats)" if reps else ""
    return f"{row['speedup_wall']:.2f}x{rng}"
