"""Notebook 05's sections around the widget, so that its cells hold calls and prints: the methods side by side (§2,
`compare` and `acceptance_lines`), the shipped benchmark beside the live table (§3, `benchmark` and
`benchmark_notes`), one live row of §3's table (`live_row`: the lab's decode, raced against AR through
`timing.interleaved_race`, split by `speedup.speedup_row`) and the papers' numbers with the lab's (§4,
`paper_values`). Every sentence is computed from the numbers it reads.
"""
from __future__ import annotations

from mtplab.decoding.generate import run_prompts
from mtplab.decoding.trace import conditional_counts, pooled
from mtplab.device import pick
from mtplab.errors import MtplabError
from mtplab.measuring import speedup, timing
from mtplab.measuring.acceptance import wilson
from mtplab.measuring.record import Record
from mtplab.teaching import bottleneck, engines
from mtplab.teaching.acceptance_lab.session import decoded
from mtplab.teaching.acceptance_lab.state import LabState, run_all
from mtplab.teaching.words import bench_speedup_text


# ---------------------------------------------------------------------------------- §2 the methods side by side
def compare(models, rows, prompts, *, prompt: str, device, max_new_tokens: int) -> tuple[dict, dict, dict, list[str]]:
    """Each (method, k, checkpoint) of `rows` through the lab first (`session.decoded`: it loads the model and warms
    the method up, and refuses what does not fit), then decoded on every prompt (`generate.run_prompts`). Returns
    runs (label -> the prompts' traces pooled), per_prompt (label -> traces), pairs (label -> (method, k,
    checkpoint)) and one line per row the lab refused."""
    runs, per_prompt, pairs, errors = {}, {}, {}, []
    for method, k, name in rows:
        st = run_all(decoded(LabState(method=method, k=k, checkpoint=name, prompt=prompt, device=device,
                                      max_new_tokens=8), models))
        if st.error:
            errors.append(f"{method} k={k}: {st.error}")
            continue
        model = models.get(st.checkpoint_name, pick(device))
        draft = models.get("draft", pick(device)) if method == "draft-model" else None
        label = f"{method} k={k}"
        pairs[label] = (method, k, st.checkpoint_name)
        per_prompt[label] = run_prompts(method, model, prompts, max_new_tokens=max_new_tokens, k=k, draft_model=draft)
        runs[label] = pooled(per_prompt[label])
    return runs, per_prompt, pairs, errors


def _rate(a: int, n: int) -> str:
    lo, hi = wilson(a, n)
    return f"{a / n:.2f} [{lo:.2f}, {hi:.2f}]" if n else "n/a"


def acceptance_lines(runs: dict, per_prompt: dict) -> list[str]:
    """Per method: tokens per forward, drafting steps, looping continuations, and acceptance by position with 95%
    Wilson intervals, unconditional and conditional (with each position's n)."""
    out = []
    for name, t in runs.items():
        n = t.num_drafts
        unc = ", ".join(_rate(a, n) for a in t.accepted_per_position)
        cond = ", ".join(f"{_rate(a, r)} n={r}" for a, r in conditional_counts(t))
        loops, total, window = engines.looping(per_prompt[name])
        out.append(f"{name:22s} {t.tokens_per_forward:4.2f} tokens/forward, n = {n} drafting steps, {loops} of {total} "
                   f"continuations looping (last {window} tokens)\n"
                   f"{'':22s} unconditional by position: {unc}\n{'':22s} conditional by position:   {cond}")
    return out


# ---------------------------------------------------------------------------------- §3 live, and the benchmark beside
def live_row(models, name: str, method: str, k: int, checkpoint: str, prompt, *, device, seed: int, tokens: int,
             repeats: int) -> tuple[dict, dict, dict | None]:
    """One method on one prompt, everything from ONE race (`timing.interleaved_race`) against AR: the split, AR's
    step and the verify's cost t(q)/t(1) all come from the race's first round (the method's decode and AR's decode
    timed beside it), so the prediction reads the same decodes the race timed. `predicted` counts the prefill as the
    race does and leaves out only the loop's overhead; `round0` is what that round itself measured. The lab's decode
    (`session.decoded`) only loads and warms the method up. Returns (the table's row, the race, the benchmark row)."""
    st = run_all(decoded(LabState(method=method, k=k, checkpoint=checkpoint, prompt=prompt, device=device,
                                  max_new_tokens=tokens, seed=seed), models))
    model = models.get(st.checkpoint_name, pick(device))
    draft = models.get("draft", pick(device)) if method == "draft-model" else None
    live = timing.interleaved_race(method, model, [st.trace.prompt], max_new_tokens=tokens, k=k, repeats=repeats,
                                   draft_model=draft)
    trace, ar = live["traces"][0], live["ar_traces"][0]  # the race's first round: one method decode, one AR decode
    split, t1 = trace.time_split(), ar.time_split()["target_s"]
    q, plain = speedup.verify_width(trace), trace.schedule == "plain"
    verify = split["target_s"] / t1 - (1.0 if plain else 0.0) if t1 > 0 else 0.0  # t(q)/t(1) in this round
    row = speedup.speedup_row(name, trace, ar, {1: 1.0, q: verify} if q != 1 else {1: verify})
    ms = {n: [1e3 * s.wall_s for s in t.steps] for n, t in (("m", trace), ("ar", ar))}
    n_prefill = {n: len(t.steps) - len(t.decoding_steps) for n, t in (("m", trace), ("ar", ar))}
    pre = {n: sum(ms[n][:n_prefill[n]]) for n in ms}
    # the whole decode predicted from round 0's pieces, overhead left out; and what round 0 measured
    whole = ((pre["ar"] + len(ar.decoding_steps) * 1e3 * t1)
             / max(1e-9, pre["m"] + split["steps"] * 1e3 * (split["target_s"] + split["draft_s"])))
    bench = Record.load("decode").row(method=method, checkpoint=st.checkpoint_name)
    row.update(predicted_step=row["predicted"], predicted=whole, round0=sum(ms["ar"]) / max(1e-9, sum(ms["m"])),
               q=q, verify_cost=verify, measured=live["speedup"],
               live_range=f"{live['speedup_min']:.2f}-{live['speedup_max']:.2f}", tokens=tokens,
               prefill_ms=pre["m"], ar_prefill_ms=pre["ar"], benchmark=bench_speedup_text(bench).split(" ")[0])
    return row, live, bench


def prediction_lines(rows: list[dict], lives: dict) -> list[str]:
    """§3's rows read against their race: the prediction (round 0's pieces, prefill counted, overhead left out)
    inside, below or above the live range; for a row outside it, whether the prediction matched its own round (the
    gap is then round 0 against the other rounds) or not (the overhead it leaves out, and how large that was); and
    t(q)/t(1) of each verify as that round measured it."""
    if any(not lv["valid"] for lv, _ in lives.values()):
        return [bottleneck.prediction_line(lives, {r["method"]: r["predicted"] for r in rows}),
                _verify_line(rows) + " (from a busy race: not valid here)"]
    lo = {r["method"]: lives[r["method"]][0]["speedup_min"] for r in rows}
    hi = {r["method"]: lives[r["method"]][0]["speedup_max"] for r in rows}
    inside = [r for r in rows if lo[r["method"]] <= r["predicted"] <= hi[r["method"]]]
    out = [f"prediction inside the live range of {len(inside)} of {len(rows)} rows"
           + (f" ({', '.join(r['method'] for r in inside)})" if inside else "")]
    for r in rows:
        if r in inside:
            continue
        side = "above" if r["predicted"] > hi[r["method"]] else "below"
        share = r["overhead_ms"] / max(1e-9, r["target_ms"] + r["draft_ms"] + r["overhead_ms"])
        gap = abs(r["predicted"] - r["round0"]) / max(1e-9, r["round0"])
        r0 = r["round0"]
        where = ("faster than" if r0 > hi[r["method"]] else "slower than" if r0 < lo[r["method"]] else
                 "within the range of")
        why = (f"its own round measured {r0:.2f}x, within {gap:.0%} of it (the overhead left out is {share:.0%} of a "
               f"step), so the round the pieces come from ran {where} the race's other rounds"
               if gap <= max(share, 0.02) + 0.02 else
               f"its own round measured {r0:.2f}x, {gap:.0%} apart, more than the {share:.0%} overhead it leaves "
               "out: a cost in that round the split does not time")
        out.append(f"{r['method']}: predicted {r['predicted']:.2f}x {side} the live range {r['live_range']}; {why}")
    out.append(_verify_line(rows))
    return out


def _verify_line(rows: list[dict]) -> str:
    """t(q)/t(1) of each row's verify, as the race's first round measured it, and which ones came out at most 1."""
    low = [r["method"] for r in rows if r["verify_cost"] <= 1.0]
    return ("the verify forward against AR's one-token forward, t(q)/t(1), both from the race's first round: "
            + ", ".join(f"{r['method']} q={r['q']} {r['verify_cost']:.2f}" for r in rows) + "; "
            + (f"at or below 1 for {', '.join(low)}: in that round the wider forward cost no more than one token's "
               "(one decode's timings, noise included)" if low else
               "above 1 for every row: a wider verify cost more than one token's forward here"))


def benchmark(rows: list[dict], *, smoke: bool, path, time_tokens: int) -> tuple[str, list[dict], Record | None]:
    """The table to show beside the live one: the smoke run's own rows, or the shipped decode benchmark's with each
    row's range. Returns (its source line, the rows, the record or None)."""
    if smoke:
        return (f"smoke-sized run in this notebook (one prompt, {time_tokens} new tokens)",
                [{"label": r["method"], "speedup_predicted": r["predicted"], "speedup_wall": r["measured"]}
                 for r in rows], None)
    try:
        decode = Record.load(path)
        return decode.source_line(), [{**r, "speedup_range": bench_speedup_text(r)} for r in decode.rows], decode
    except MtplabError as e:
        return str(e), [], None


def benchmark_notes(decode: Record | None, runs: dict, lives: dict, *, n_prompts: int, compare_tokens: int,
                    time_tokens: int) -> list[str]:
    """The decode benchmark against docs/bench/k.json for the same pairs at k = 4, and prompt lookup's figures in the
    benchmark, in §2 and live (a longer decode gives it more to copy)."""
    if decode is None:
        return []
    out = []
    try:
        k_rec = Record.load("k")
        same = [(lbl, decode.row(method=m, checkpoint=c), k_rec.row(method=m, checkpoint=c, k=4, adapt="fixed"))
                for lbl, m, c in (("meta", "meta", "meta-k4"), ("blockwise-overlap", "blockwise-overlap", "stern-k4"))]
        out.append(f"docs/bench/k.json ({k_rec['prompts']} prompts x {k_rec['max_new_tokens']} tokens, against "
                   f"{decode['prompts']} x {decode['max_new_tokens']} here; {k_rec.machine_text()}) gives "
                   + ", ".join(f"{lbl} k=4 {b['speedup']:.2f}x (here {a['speedup_wall']:.2f}x)"
                               for lbl, a, b in same if a and b)
                   + ". Notebook 09 §1 sets the two records side by side and says where the difference comes from.")
    except MtplabError as e:
        out.append(str(e))
    ng = decode.row(method="ngram") if "ngram k=4" in runs else None
    if ng:
        live = lives["ngram k=4"][0]
        out.append(f"ngram: {ng['tokens_per_forward']:.2f} tokens per forward and {ng['speedup_wall']:.2f}x in the "
                   f"benchmark ({decode['prompts']} prompts x {decode['max_new_tokens']} tokens), "
                   f"{runs['ngram k=4'].tokens_per_forward:.2f} in section 2 ({n_prompts} x {compare_tokens}) and "
                   f"{live['speedup']:.2f}x live (one prompt x {time_tokens}{'' if live['valid'] else ', not valid here'}"
                   "): prompt lookup only copies what the context already holds, so longer decodes give it more to copy")
    return out


# ---------------------------------------------------------------------------------- §4 the papers
def paper_values(rows: list[dict], pairs: dict, runs: dict, per_prompt: dict, decode: Record | None, *,
                 smoke: bool) -> dict[str, str]:
    """The lab's value for each `speedup.PAPERS` row it measured: the benchmark's wall clock (the smoke run's live
    one), blockwise's mean accepted length and DeepSeek D = 1's second-token acceptance with its interval."""
    by_pair = {pairs[r["method"]][::2]: r["measured"] for r in rows}  # smoke: (method, checkpoint) -> live speedup

    def wall(method, checkpoint):
        if smoke:
            got = by_pair.get((method, checkpoint))
        else:
            row = decode.row(method=method, checkpoint=checkpoint) if decode is not None else None
            got = row.get("speedup_wall") if row else None
        return f"{got:.2f}x" if got is not None else "not in the benchmark"

    measured = {"blockwise-overlap: wall-clock speedup": wall("blockwise-overlap", "stern-k4"),
                "meta k=4: wall-clock speedup": wall("meta", "meta-k4"),
                "draft-model k=4: wall-clock speedup": wall("draft-model", "ntp")}
    if "blockwise k=4" in runs:
        t = runs["blockwise k=4"]
        measured["blockwise k=4: mean accepted length"] = f"{t.mean_accepted_length:.2f} (n = {t.num_drafts} steps)"
    if "deepseek k=2" in runs:
        t = runs["deepseek k=2"]
        a, n = t.accepted_per_position[0], t.num_drafts
        lo, hi = wilson(a, n)
        loops, total, _ = engines.looping(per_prompt["deepseek k=2"])
        measured["deepseek D=1: 2nd-token acceptance; wall-clock speedup"] = (
            f"{a / n:.0%} [{lo:.0%}, {hi:.0%}], n = {n}, {loops} of {total} continuations looping; "
            f"{wall('deepseek', 'deepseek-d1')}")
    return measured
