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
from mtplab.teaching import engines
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
    """One method on one prompt: the lab's decode (its AR baseline's split), the method raced against AR
    (`timing.interleaved_race`), the split read against the cost curve of this model (`speedup.speedup_row`), and the
    shipped decode benchmark's row for the same pair. Returns (the table's row, the race, the benchmark row)."""
    st = run_all(decoded(LabState(method=method, k=k, checkpoint=checkpoint, prompt=prompt, device=device,
                                  max_new_tokens=tokens, seed=seed), models))
    model = models.get(st.checkpoint_name, pick(device))
    draft = models.get("draft", pick(device)) if method == "draft-model" else None
    live = timing.interleaved_race(method, model, [st.trace.prompt], max_new_tokens=tokens, k=k, repeats=repeats,
                                   draft_model=draft)
    curve = timing.measure_cost_curve(model, qs=range(1, k + 1), context=64, repeats=3).ratio
    row = speedup.speedup_row(name, live["traces"][0], st.baseline, curve)
    bench = Record.load("decode").row(method=method, checkpoint=st.checkpoint_name)
    row.update(measured=live["speedup"], live_range=f"{live['speedup_min']:.2f}-{live['speedup_max']:.2f}", tokens=tokens,
               prefill_ms=1e3 * live["traces"][0].steps[0].wall_s, ar_prefill_ms=1e3 * st.baseline.steps[0].wall_s,
               benchmark=bench_speedup_text(bench).split(" ")[0])
    return row, live, bench



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
