"""Notebook 10, beside Hugging Face: the lab's own Hugging Face model and its draft model, the peer table read
from `bench peers`' record with pairs on the same drafts side by side, code against prose read from
`bench domain`'s record; and the checker of the notebook's exercise.
"""
from __future__ import annotations

from pathlib import Path

from mtplab import paths
from mtplab.measuring.record import Record
from mtplab.teaching.check import Check, _call

TARGET, DRAFT, HEADS = "mtplab-llama", "mtplab-llama-draft", "mtplab-llama-deepseek-d1.safetensors"


def pairs(k: int = 4) -> tuple[tuple[str, str], ...]:
    """(HF's row, mtplab's row on the same drafts) at k tokens a step, as `bench peers` names them."""
    return (("HF generate, greedy", "mtplab AR"),
            (f"HF prompt lookup, {k - 1} drafts", f"mtplab n-gram, HF's rule, k={k}"),
            (f"HF assisted, {k - 1} drafts", f"mtplab draft-model, k={k}"))


PAIRS = pairs(4)  # the record's k and the exercises'


def _pairs_in(record: dict) -> list[tuple[str, str, dict, dict]]:
    """(HF's row name, mtplab's, HF's row, mtplab's row) for every pair whose two rows are both in the record, at
    whatever k the rows were run (the live race may use another)."""
    by = {r["method"]: r for r in record["rows"]}
    found = [p for k in range(2, 17) for p in pairs(k) if p[0] in by and p[1] in by]
    return [(hf, mine, by[hf], by[mine]) for hf, mine in dict.fromkeys(found)]  # AR's pair is the same at every k


def load_own(device="cpu") -> dict:
    """The shipped target, its draft model and the target with its DeepSeek D = 1 heads (one HFTarget: the heads
    are attached to the target itself, so the AR rows and the heads row run the same weights)."""
    from mtplab.hf.target import load_heads, load_hf  # transformers

    target = load_hf(paths.HF_DIR / TARGET, device=device)
    draft = load_hf(paths.HF_DIR / DRAFT, device=device)
    load_heads(target, paths.HF_DIR / HEADS)
    return {"target": target, "draft": draft}


def card(folder) -> dict:
    """What `mtplab_record.json` says of how a model folder was trained."""
    r = Record.load(Path(folder) / "mtplab_record.json").data
    cfg = Record.load(Path(folder) / "config.json").data
    m = r["machine"]
    return {"model": Path(folder).name, "architecture": r["architecture"], "parameters": r["parameters"],
            "layers x width": f"{cfg['num_hidden_layers']} x {cfg['hidden_size']}", "corpus": r["corpus"], "steps": r["steps"],
            "tokens": r["tokens"], "train minutes": r["train_seconds"] / 60, "val bpb": r["val_bpb"],
            "val top-1": r["val_top1"], "machine": f"{m.get('cpu')}, torch {m.get('torch')}"}


def loop_ratios(record: dict) -> dict[str, float]:
    """mtplab's wall clock over HF's on the same drafts, per pair: > 1 means mtplab's loop is faster.
    Both rows are timed against the same HF greedy rounds, so the ratio of their speedups is the ratio of times."""
    return {mine: b["speedup_vs_hf_greedy"] / a["speedup_vs_hf_greedy"] for _, mine, a, b in _pairs_in(record)}


def pair_speedups(record: dict) -> dict[str, tuple[float, float]]:
    """Per pair on the same drafts: (HF's row, mtplab's row), each one's wall clock against HF's plain greedy."""
    return {mine: (a["speedup_vs_hf_greedy"], b["speedup_vs_hf_greedy"]) for _, mine, a, b in _pairs_in(record)}


def peer_sentences(record: dict) -> list[str]:
    """One sentence per pair on the same drafts, and one for the row with no HF peer, from the record's numbers."""
    out = []
    for hf, mine, a, b in _pairs_in(record):
        ratio = b["speedup_vs_hf_greedy"] / a["speedup_vs_hf_greedy"]
        verdict = "faster than" if ratio > 1.02 else "slower than" if ratio < 0.98 else "as fast as (within 2%)"
        out.append(f"{mine} is {verdict} {hf}: {ratio:.2f}x its wall clock, at {b['tokens_per_forward']:.2f} "
                   f"against {a['tokens_per_forward']:.2f} tokens per target forward; tokens identical to HF "
                   f"greedy on {b['identical_to_hf_greedy']}/{b['prompts']} and {a['identical_to_hf_greedy']}/"
                   f"{a['prompts']} prompts.")
    for r in record["rows"]:
        if "no HF peer" in r["method"]:
            out.append(f"{r['method']}: {r['speedup_vs_hf_greedy']:.2f}x HF's plain greedy (range "
                       f"{r['speedup_min']:.2f}-{r['speedup_max']:.2f}), {r['tokens_per_forward']:.2f} tokens per "
                       "forward.")
    return out


def split_sentences(record: dict, top: int = 3) -> list[str]:
    """Per pair on the same drafts: the share of a decode spent outside the model forwards (the loop), from the
    record's profile, and the functions that took the most time of their own in HF's row."""
    prof = record.get("profile", {})
    out = []
    for hf, mine, a, b in _pairs_in(record):
        if "rest_share" not in a:
            continue
        funcs = "; ".join(f"{t['function']} {1e3 * t['own_s']:.1f} ms in {t['calls']} calls"
                          for t in prof.get(hf, {}).get("top_own_time", [])[:top])
        out.append(f"{hf}: {a['rest_share']:.0%} of a decode outside the model forwards; {mine}: "
                   f"{b['rest_share']:.0%}. Most own time in HF's row: {funcs}.")
    c = record.get("forward_call")
    if c:
        out.append(f"The call itself: one verify forward over {c['q']} tokens at {c['context']} cached tokens takes "
                   f"{c['mtplab_ms']:.2f} ms as mtplab calls it and {c['transformers_ms']:.2f} ms as transformers' "
                   f"assisted loop calls it; a whole one-token decode of a {c['context']}-token prompt takes "
                   f"{c['mtplab_one_token_decode_ms']:.1f} ms through mtplab's AR and "
                   f"{c['transformers_one_token_decode_ms']:.1f} ms through generate() (medians of {c['repeats']}).")
    return out


def domain_sentences(record: dict) -> list[str]:
    """What the domain record says, each trunk on its own text and on the other: teacher-forced agreement, then per
    method the first draft's acceptance in decode, the wall clock, and how many greedy continuations loop."""
    rows = record["rows"]
    out = []

    def row(method, trunk, text):
        return next((r for r in rows if r["method"] == method and r["trained_on"] == trunk and r["text"] == text), None)

    for trunk in ("code", "prose"):
        other = "prose" if trunk == "code" else "code"
        own, cross = row("deepseek", trunk, trunk), row("deepseek", trunk, other)
        if own and cross:
            out.append(f"{trunk} trunk: teacher-forced agreement of the first draft {own['teacher_forced_agree']:.2f} "
                       f"on {trunk}, {cross['teacher_forced_agree']:.2f} on {other}; its greedy text loops on "
                       f"{own['looping']}/{own['prompts']} {trunk} prompts and {cross['looping']}/{cross['prompts']} "
                       f"{other} prompts.")
    for method in dict.fromkeys(r["method"] for r in rows):
        a, b = row(method, "code", "code"), row(method, "prose", "prose")
        if a and b and a["acceptance_by_position"] and b["acceptance_by_position"]:
            acc = lambda r: " / ".join(f"{x:.2f}" for x in r["acceptance_by_position"])  # noqa: E731
            out.append(f"{method} k={a['k']}, each trunk on its own text: acceptance by position code {acc(a)}, "
                       f"prose {acc(b)}; wall clock {a['speedup']:.2f}x against {b['speedup']:.2f}x.")
    return out


# ---------------------------------------------------------------------------------- notebook 10
def check_loop_ratios(fn) -> Check:
    """fn(record) -> {mtplab row name: mtplab's wall clock over HF's on the same drafts}, checked on made-up records
    (several, with speedups the student cannot guess, one missing a pair's HF row). A wrong answer is told its case
    and the mistake it looks like, never the formula or the expected value."""
    name = "loop ratios"
    if "loop_ratios" in getattr(getattr(fn, "__code__", None), "co_names", ()):
        return Check(name, False, "write it yourself from the record's rows instead of calling peers.loop_ratios")
    (hf0, mine0), (hf1, mine1) = PAIRS[0], PAIRS[1]
    cases = [({hf0: 1.0, mine0: 1.25, hf1: 2.0, mine1: 1.0}, {mine0: 1.25, mine1: 0.5}),  # (speedups, the answers)
             ({hf0: 1.0, mine0: 0.8, hf1: 1.6, mine1: 2.4}, {mine0: 0.8, mine1: 1.5}),
             ({hf0: 1.0, mine0: 1.1, mine1: 1.7}, {mine0: 1.1})]  # lacks the second pair's HF row: no ratio there
    for i, (speeds, answers) in enumerate(cases, 1):
        record = {"rows": [{"method": m, "speedup_vs_hf_greedy": v} for m, v in speeds.items()]}
        pairs = [(hf, mine) for hf, mine in PAIRS if hf in speeds and mine in speeds]
        case = f"made-up record {i} of {len(cases)} (rows: {'; '.join(speeds)})"  # names, never the numbers
        got, err = _call(fn, record)
        if err:
            return Check(name, False, f"{err} on a case like {case}")
        if not isinstance(got, dict) or set(got) != {mine for _, mine in pairs}:
            return Check(name, False, f"return a dict keyed by the mtplab rows that have their HF row in the record "
                                      f"(got keys {sorted(got) if isinstance(got, dict) else type(got).__name__} on a "
                                      f"case like {case})")
        for hf, mine in pairs:
            v = got[mine]
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                return Check(name, False, f"return numbers (got {v!r} for {mine} on a case like {case})")
            right = answers[mine]
            if abs(v - right) <= 1e-9 * max(1.0, abs(right)):
                continue
            if speeds[hf] != 1.0 and abs(v - speeds[mine]) <= 1e-9:
                hint = "that is the row against HF's plain greedy loop, not against HF on the same drafts"
            elif abs(v * right - 1) <= 1e-9:
                hint = "upside down: above 1 must mean mtplab's loop is the faster one"
            else:
                hint = "both rows are timed against the same HF greedy rounds; use that"
            return Check(name, False, f"wrong on a case like {case}, for {mine}: {hint}")
    return Check(name, True, "both rows are timed against the same HF greedy rounds, so their ratio is the loop's")
