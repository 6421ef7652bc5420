"""Notebook 09's companion: the choices an engine makes (k, adaptive k, one module reused, typical acceptance).

* `acceptance_text`: acceptance by draft position pooled over prompts (`pooled(traces).acceptance_rate_per_position`),
  each rate with its n and 95% Wilson interval, and how many continuations fell into a loop (a looping text makes
  its own drafts easy); notebook 08 prints its live decode the same way.
* `typical_study`: the exact rule against Medusa's typical acceptance on a toy whose second-token distribution is
  computed exactly (`sampling.second_token_marginal`), tested with the lab's one chi-square level.
* `benchmark_story`: why two shipped records give different speedups for the same heads (with their machine lines),
  read from the records' own fields (prompts, new tokens, rounds, the cost curve, tokens per forward).

The notebook races live with `measuring.timing.interleaved_race`; this module never times anything.
"""
from __future__ import annotations


from mtplab.decoding.drafters import SternDrafter
from mtplab.decoding.trace import Trace, conditional_counts, pooled
from mtplab.errors import MtplabError
from mtplab.measuring.record import Record, machine_text
from mtplab.measuring.acceptance import wilson
from mtplab.measuring.quality import loop_onset, loop_window
from mtplab.model.toy import random_model
from mtplab.teaching.find_the_bug import ALPHA
from mtplab.teaching.sampling import chi_square, second_token_counts, second_token_marginal
from mtplab.teaching.words import overlap, range_words


# ---------------------------------------------------------------------------------------------- acceptance
def looping(traces: list[Trace]) -> tuple[int, int, int]:
    """(looping continuations, continuations, window the test read): a continuation loops when its last `window`
    tokens repeat with a period of at most window // 2 (`measuring.quality.loop_onset`)."""
    if not traces:
        raise MtplabError("no traces: decode at least one prompt first")
    n = sum(loop_onset(t.tokens) is not None for t in traces)
    return n, len(traces), loop_window(min(len(t.tokens) for t in traces))[0]


def acceptance_rows(traces: list[Trace]) -> list[dict]:
    """Unconditional acceptance per draft position, pooled over the traces (`pooled(...)`), with n and a 95% Wilson
    interval: [{"position": 1, "accepted": a, "n": n, "rate": a / n, "low": ..., "high": ...}, ...]."""
    if not traces:
        raise MtplabError("no traces: decode at least one prompt first")
    t = pooled(traces)
    n = t.num_drafts
    ivs = [wilson(a, n) for a in t.accepted_per_position]
    return [{"position": i + 1, "accepted": a, "n": n, "rate": rate, "low": lo, "high": hi}
            for i, (a, rate, (lo, hi)) in enumerate(zip(t.accepted_per_position, t.acceptance_rate_per_position, ivs))]


def acceptance_text(traces: list[Trace], *, continuations: list[Trace] | None = None) -> str:
    """'0.68 [0.55, 0.79] / 0.43 [...] (n = 40 drafting steps over 2 prompts; 1 of 2 continuations looping, ...)'.
    `continuations`: one trace per prompt to test for loops, when `traces` are already pooled (greedy speculative
    text equals AR's, so AR's traces do)."""
    rows = acceptance_rows(traces)
    loops, total, window = looping(continuations or traces)
    rates = " / ".join(f"{r['rate']:.2f} [{r['low']:.2f}, {r['high']:.2f}]" for r in rows)
    return (f"{rates} (n = {rows[0]['n'] if rows else 0} drafting steps over {total} prompt{'s' * (total != 1)}; "
            f"{loops} of {total} continuation{'s' * (total != 1)} looping, i.e. the last {window} tokens repeat with a "
            f"period of at most {window // 2})")


def acceptance_intervals(trace: Trace) -> dict[str, list[tuple[float, float]]]:
    """95% Wilson intervals per draft position for both conventions of one (pooled) trace: unconditional over the
    drafting steps, conditional over the steps that reached the position."""
    n = trace.num_drafts
    return {"unconditional": [wilson(a, n) for a in trace.accepted_per_position],
            "conditional": [wilson(a, r) if r else (0.0, 1.0) for a, r in conditional_counts(trace)]}


def conditional_text(trace: Trace) -> str:
    """The conditional rates per position with counts and 95% intervals, and what they did with the position in
    words: 'rise', 'fall', 'go up and down'; 'cannot tell' when every interval overlaps every other."""
    counts = conditional_counts(trace)
    ivs = acceptance_intervals(trace)["conditional"]
    rates = [a / r if r else float("nan") for a, r in counts]
    parts = " / ".join(f"{a}/{r} = {x:.2f} [{lo:.2f}, {hi:.2f}]" for (a, r), x, (lo, hi) in zip(counts, rates, ivs))
    steps = [b - a for a, b in zip(rates, rates[1:])]
    shape = ("rise with the position" if all(d > 0 for d in steps) else "fall with the position"
             if all(d < 0 for d in steps) else "go up and down with the position")
    together = all(overlap(a, b) for i, a in enumerate(ivs) for b in ivs[i + 1:])
    return (f"conditional by position: {parts}; here they {shape}"
            + ("; every interval overlaps every other, so this decode cannot tell whether they change at all"
               if together else ""))


def control_verdicts(gaps: dict[str, float], n: int) -> list[str]:
    """Did each control of notebook 08 §3 fail, i.e. move further from the live loop than either estimate, by more
    than the sampling noise of one rate over n drafting steps (the 95% half-width at rate 0.5, 1.96 sqrt(0.25 / n))?
    gaps: {estimate or control: largest gap from the live loop}, as `teacher_forced.largest_gap` gives."""
    if n < 1:
        raise MtplabError(f"n must be the live loop's drafting steps, at least 1 (got {n})")
    ref = max(gaps["teacher-forced"], gaps["teacher-forced, every position"])
    noise = 1.96 * (0.25 / n) ** 0.5
    lines = []
    for k in ("control: target shifted by one", "control: no causal mask"):
        margin = gaps[k] - ref
        if margin > noise:
            words = (f"failed as it must: {margin:.3f} further from the live loop than either estimate, more than the "
                     f"noise of a rate over n = {n} drafting steps (+-{noise:.3f})")
        elif margin > 0:
            words = (f"further from the live loop than either estimate by {margin:.3f}, within the noise of a rate "
                     f"over n = {n} drafting steps (+-{noise:.3f}): on this few tokens it cannot tell")
        else:
            words = "did NOT fail: it is no further from the live loop than an estimate; on this few tokens it cannot tell"
        lines.append(f"  {k}: {words}")
    return lines


def reuse_text(a: tuple[str, list[Trace]], b: tuple[str, list[Trace]], *, record_rows: list[dict] | None = None) -> str:
    """Two decodes' acceptance by position compared through their 95% intervals: where one is above the other's
    interval, or 'this run cannot tell them apart'; then each one's tokens per forward from the shipped record rows
    ({label: row}) when given, read from the record."""
    (la, ta), (lb, tb) = a, b
    ra, rb = acceptance_rows(ta), acceptance_rows(tb)
    apart = [(x["position"], x["rate"], y["rate"]) for x, y in zip(ra, rb) if x["low"] > y["high"] or y["low"] > x["high"]]
    if apart:
        text = (f"{la} and {lb} differ at draft position " + ", ".join(f"{i} ({x:.2f} against {y:.2f})"
                                                                      for i, x, y in apart)
                + ", beyond both 95% intervals")
    else:
        same = all(x["accepted"] == y["accepted"] for x, y in zip(ra, rb))
        text = (f"{la} and {lb}: " + ("the same counts at every position" if same else "every position's intervals "
                                      "overlap") + f" (n = {ra[0]['n'] if ra else 0} and {rb[0]['n'] if rb else 0} "
                "drafting steps), so this run cannot tell them apart")
    if record_rows and all(record_rows.get(x) for x in (la, lb)):
        text += ("; docs/bench/k.json, read from the record: " + " against ".join(
            f"{record_rows[x]['tokens_per_forward']:.2f} tokens per forward ({x}, k = {record_rows[x]['k']}, "
            f"{record_rows[x]['prompts']} prompts)" for x in (la, lb)))
    return text


def k_record() -> tuple[Record | None, str]:
    """docs/bench/k.json (`bench k`) and the line that names it (prompts, tokens, rounds, machine), or (None, why)."""
    try:
        rec = Record.load("k")
    except MtplabError as e:
        return None, str(e)
    return rec, (f"the shipped record docs/bench/k.json: {rec['prompts']} prompts x {rec['max_new_tokens']} tokens, "
                 f"{rec['repeats']} rounds, {rec.machine_text()}")


def race_row(race: dict, **head) -> dict:
    """One live race (`timing.interleaved_race`) as a row of 09's tables: `head` (k=..., policy=...), then drafts
    per step, tokens per forward, speedup, lo, hi, range, identical, verdict and valid."""
    drafted = [len(s.drafted) for t in race["traces"] for s in t.decoding_steps]
    return {**head, "drafts per step": sum(drafted) / max(1, len(drafted)),
            "tokens per forward": race["tokens_per_forward"], "speedup": race["speedup"], "lo": race["speedup_min"],
            "hi": race["speedup_max"], "range": f"{race['speedup_min']:.2f}-{race['speedup_max']:.2f}",
            "identical": f"{race['identical']}/{race['prompts']}", "verdict": race["verdict"], "valid": race["valid"]}


def busy_lines(rows: list[dict], key: str) -> list[str]:
    """Each busy race's verdict under its name, or one line that every race passed the guard."""
    busy = [f"{r[key]}: {r['verdict']}" for r in rows if not r["valid"]]
    return busy or [f"every race {rows[0]['verdict']}"]


def best_k_line(live: list[dict], record, *, checkpoint: str, rounds: int, prompts: int, ks) -> str:
    """Section 1's verdict: the best k here, and why (busy, tied with every k whose range overlaps its range, the
    largest k swept, or a draft beyond it costs more than it is kept). `record`: docs/bench/k.json (`Record`) or
    None."""
    best = max(live, key=lambda r: r["speedup"])
    hi = best.get("hi", best["speedup"])
    ties = [r for r in live if r is not best and best["lo"] <= r.get("hi", r["speedup"]) and r["lo"] <= hi]
    head = (f"live, {checkpoint}: the highest median is k = {best['k']} ({best['speedup']:.2f}x, range {best['lo']:.2f}-"
            f"{hi:.2f}, {rounds} rounds of {prompts} prompt{'s' * (prompts != 1)})")
    if any(not r["valid"] for r in live):
        return head + ", but these races were not valid here (above): read the record's best k below"
    if ties:
        return (head + ", a tie within the ranges with " + ", ".join(f"k = {r['k']} ({r['speedup']:.2f}x, range "
                                                                      f"{r['range']})" for r in ties)
                + ": no single best k measured here" + (f"; the record's {record['repeats']} rounds of "
                                                        f"{record['prompts']} prompts are the number to trust"
                                                        if record is not None else ""))
    if best["k"] == max(ks):
        return head + ", its range apart from every other k's: the largest k swept, so the verify is still cheap " \
                      "enough to pay for one more draft"
    return head + ", its range apart from every other k's: beyond it a draft costs more than it is kept"


def adaptive_lines(adaptive: list[dict], live: list[dict], k: int) -> list[str]:
    """Section 2's verdict: the fastest policy against the fixed k (the first row), and the fixed k raced twice in
    one run (section 1 and here: the same decode, so their difference is timing noise)."""
    fixed, winner = adaptive[0], max(adaptive, key=lambda r: r["speedup"])
    gain = ("adapting did not beat the fixed k on these prompts" if winner is fixed else
            f"{winner['speedup'] / fixed['speedup'] - 1:.0%} over the fixed k")
    out = []
    first = next((r for r in live if r["k"] == k), None)  # section 1 raced the same fixed-k decode
    if first is not None:
        out.append(f"fixed k = {k} was raced twice in this run: {first['speedup']:.2f}x (range {first['range']}) in "
                   f"section 1 and {fixed['speedup']:.2f}x (range {fixed['range']}) here; the same decode, so the "
                   "difference is timing noise")
    busy = any(not r["valid"] for r in adaptive)
    out.append(f"{winner['policy']} was fastest here ({gain}), " + ("but these races were not valid here (above): read "
                                                                    "the record's line below" if busy else
                                                                    "compare the ranges before trusting it"))
    return out


def race_summary(what: str, rows: list[dict], key: str, *, record_line: str | None = None) -> str:
    """One 'what was learnt' line for live races: the fastest row and its speedup, led by the not-valid flag when any
    race was busy (then the record's line, when given, is the number to quote). rows: {key, speedup, range, valid}."""
    best = max(rows, key=lambda r: r["speedup"])
    busy = [str(r[key]) for r in rows if not r["valid"]]
    line = f"{what}: fastest here {best[key]} ({best['speedup']:.2f}x, range {best['range']})"
    if busy:
        line = (f"{what}: not valid here (the machine was busy while {', '.join(busy)} raced), so the live fastest, "
                f"{best[key]} at {best['speedup']:.2f}x, says nothing")
    return line + (f"; {record_line}" if record_line else "")


def live_against_record(live: dict, valid: bool, row: dict | None, apart: str = "") -> str:
    """A live speedup {speedup, speedup_min, speedup_max} against the shipped record's row: the verdict word only when
    the race was valid, and whether the record's median lies inside the live range; outside it, `apart`
    (`words.apart_words`: what differs between the two measurements) follows."""
    r, lo, hi = live["speedup"], live["speedup_min"], live["speedup_max"]
    text = range_words(r, lo, hi) if valid else f"not valid here, no verdict ({r:.2f}x, range {lo:.2f}-{hi:.2f})"
    if row:
        inside = lo <= row["speedup"] <= hi
        text += (f"; the record's row: {row['speedup']:.2f}x ({row['speedup_min']:.2f}-{row['speedup_max']:.2f}), "
                 + ("inside the live range" if inside else "outside the live range"
                    + (": the busy machine is the first suspect" if not valid else f"; {apart}" if apart else "")))
    return text


# ---------------------------------------------------------------------------------------------- typical acceptance
def typical_toy(seed: int = 23, vocab: int = 8):
    """The untrained toy of section 4: random Stern heads over `vocab` tokens, so its drafts are close to noise,
    the worst case for a lossy rule (trained heads propose likely tokens, and typical acceptance moves less)."""
    return random_model(vocab_size=vocab, seed=seed, noise=2.0, heads="stern", n_depths=3, n_layer=2, n_head=2,
                        n_embd=32, block_size=96).eval()


def rule_counts(model, prompt: list[int], n: int, *, rule: str, k: int = 3, seed: int = 0) -> dict:
    """Counts of the second new token over n sampled decodes (T = 1) with accept rule `rule` ('exact' or
    'typical'), and drafts kept per decode: `sampling.second_token_counts`."""
    if not isinstance(n, int) or n < 50:
        raise MtplabError(f"n must be an integer >= 50 decodes (got {n!r})")
    r = second_token_counts(model, lambda: SternDrafter(model), prompt, n, k=k, seed=seed, rule=rule)
    return {"counts": r["counts"], "kept": r["kept_per_run"]}


def typical_study(model, prompt: list[int], n: int, *, seed: int = 0, seeds: int = 3) -> dict:
    """Both rules against the exact second-token distribution, n decodes split over `seeds` independent runs (one
    test per run, as notebook 08 counts power): {rule: {pvalues, rejected, tv, kept}} and the verdict words.
    tv and kept are over all n decodes."""
    if not isinstance(seeds, int) or seeds < 1 or n // seeds < 50:
        raise MtplabError(f"seeds must be an integer >= 1 with at least 50 decodes each (got {seeds!r} for n = {n})")
    exact = second_token_marginal(model, prompt)
    out: dict = {}
    for rule in ("exact", "typical"):
        runs = [rule_counts(model, prompt, n // seeds, rule=rule, seed=seed + s) for s in range(seeds)]
        pvalues = [chi_square(r["counts"], exact)["pvalue"] for r in runs]
        counts = sum(r["counts"] for r in runs)
        total = float(counts.sum())
        out[rule] = {"pvalues": pvalues, "rejected": sum(p < ALPHA for p in pvalues),
                     "tv": 0.5 * float((counts / total - exact).abs().sum()),
                     "kept": sum(r["kept"] for r in runs) / seeds}
    ex, ty = out["exact"], out["typical"]
    chance = 1 - (1 - ALPHA) ** seeds
    words = (f"at the lab's level ALPHA = {ALPHA} the test rejected the typical rule on {ty['rejected']} of {seeds} "
             f"runs and the exact rule on {ex['rejected']} of {seeds}")
    if ty["rejected"] == seeds and ex["rejected"] <= 1:
        words += (f": the typical rule every time; a correct rule is rejected at least once in {seeds} runs with "
                  f"probability {chance:.0%}")
    elif ty["rejected"] < seeds:
        words += f": {n // seeds} decodes a run are too few to catch the typical rule every time; raise N_DRAWS"
    else:
        words += ": the exact rule more often than chance would; rerun with another SEED and read notebook 06"
    out.update(verdict=words, n=n, seeds=seeds)
    return out


# ---------------------------------------------------------------------------------------------- two records
def benchmark_story(a: dict, b: dict, *, name_a: str, name_b: str, pairs: list[tuple[str, dict, dict]]) -> str:
    """Why two records disagree on the same heads, from their own fields, each record's machine line printed.

    a, b: the records ("prompts", "max_new_tokens", "repeats", "cost_curve"); pairs: (what, row of a, row of b),
    rows with "k", a speedup ("speedup_wall" or "speedup"), "tokens_per_forward" and "acceptance_per_position";
    a row of a may carry "tokens_per_forward_first64" (decode.json does), which separates the continuation's length
    from the prompts. Every comparative word is computed."""
    for rec, name in ((a, name_a), (b, name_b)):
        missing = [f for f in ("prompts", "max_new_tokens", "repeats", "cost_curve") if f not in rec]
        if missing:
            raise MtplabError(f"{name} lacks {', '.join(missing)}: rerun its bench command to write them")
    parts = []
    for what, ra, rb in pairs:
        sa, sb = ra.get("speedup_wall") or ra["speedup"], rb.get("speedup_wall") or rb["speedup"]
        ta, tb = ra["tokens_per_forward"], rb["tokens_per_forward"]
        share = (ta / tb - 1) / (sa / sb - 1) if abs(sa / sb - 1) > 0.02 else None
        line = (f"{what}: {sa:.2f}x in {name_a}, {sb:.2f}x in {name_b}; tokens per forward {ta:.2f} against {tb:.2f}"
                f" ({ta / tb:.2f}x, the speedups {sa / sb:.2f}x)")
        k = str(ra.get("k", ""))
        ca, cb = a["cost_curve"].get(k), b["cost_curve"].get(k)
        if share is not None:
            line += (", so acceptance makes " + ("all" if abs(share - 1) < 0.005 else "more than all" if share > 1
                                                   else "nearly all" if share >= 0.9 else "most" if share > 0.66
                                                   else "part" if share > 0.33 else "little") + " of the gap")
            rest = sa / sb - ta / tb
            if abs(share - 1) >= 0.005:
                line += f" (the rest of the speedups' ratio, {rest:+.2f}, is time that tokens per forward do not count"
                if ca and cb and abs(ca / cb - 1) > 0.02:
                    # a costlier verify step in a lowers a's speedup: the cost curves predict rest < 0 when ca > cb
                    line += (": the verify step's cost, in the direction the cost curves predict" if (rest < 0) == (ca > cb)
                             else ": not the verify step's cost, whose curves point the other way, so the drafter's time "
                                  "or timing noise")
                line += ")"
        if ca and cb:
            line += f"; t({k})/t(1) was {ca:.2f} against {cb:.2f} on the day each was measured"
        first = ra.get("tokens_per_forward_first64")
        if first is not None and b["max_new_tokens"] == 64 and a["max_new_tokens"] > 64 and ta != tb:
            line += (f". Over its first 64 tokens {name_a} still gives {first:.2f} tokens per forward: the longer "
                     f"continuation explains {max(0.0, ta - first):.2f} of the {abs(ta - tb):.2f} difference, the "
                     f"prompts the rest (first-draft acceptance {ra['acceptance_per_position'][0]:.2f} against "
                     f"{rb['acceptance_per_position'][0]:.2f})")
        parts.append(line)
    return (f"{name_a} decoded {a['prompts']} prompts x {a['max_new_tokens']} new tokens over {a['repeats']} rounds, "
            f"{name_b} {b['prompts']} x {b['max_new_tokens']} over {b['repeats']}, "
            + (f"both {machine_text(a.get('machine'))}," if a.get("machine") == b.get("machine") else
               f"{name_a} {machine_text(a.get('machine'))}, {name_b} {machine_text(b.get('machine'))},")
            + " with the same schedule per method; neither record counts its looping continuations. "
            + ". ".join(parts) + ". Acceptance varies from prompt to prompt, so neither record is wrong: "
            "quote a speedup with its prompts, m and rounds.")
