"""Notebook 09's companion: the choices an engine makes (k, adaptive k, one module reused, typical acceptance).

* `acceptance_text`: acceptance by draft position pooled over prompts (`pooled(traces).acceptance_rate_per_position`),
  each rate with its n and 95% Wilson interval, and how many continuations fell into a loop (a looping text makes
  its own drafts easy); notebook 08 prints its live decode the same way.
* `typical_study`: the exact rule against Medusa's typical acceptance on a toy whose second-token distribution is
  computed exactly (`sampling.second_token_marginal`), tested with the lab's one chi-square level.
* `benchmark_story`: why two shipped records give different speedups for the same heads on the same machine,
  read from the records' own fields (prompts, new tokens, rounds, the cost curve, tokens per forward).

The notebook races live with `measuring.timing.interleaved_race`; this module never times anything.
"""
from __future__ import annotations


from mtplab.decoding.drafters import SternDrafter
from mtplab.decoding.trace import Trace, pooled
from mtplab.errors import MtplabError
from mtplab.measuring.acceptance import wilson
from mtplab.measuring.quality import loop_onset, loop_window
from mtplab.model.toy import random_model
from mtplab.teaching.find_the_bug import ALPHA
from mtplab.teaching.sampling import chi_square, second_token_counts, second_token_marginal


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
    rows = []
    for i, (a, rate) in enumerate(zip(t.accepted_per_position, t.acceptance_rate_per_position)):
        lo, hi = wilson(a, n)
        rows.append({"position": i + 1, "accepted": a, "n": n, "rate": rate, "low": lo, "high": hi})
    return rows


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
    """Why two records disagree on the same heads on the same machine, from their own fields.

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
        if share is not None:
            line += (", so acceptance makes " + ("all" if share >= 0.9 else "most" if share > 0.66 else "part"
                                                   if share > 0.33 else "little") + " of the gap")
        k = str(ra.get("k", ""))
        ca, cb = a["cost_curve"].get(k), b["cost_curve"].get(k)
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
            + ("on the same machine" if a.get("machine") == b.get("machine") else "on different machines")
            + " and with the same schedule per method; neither record counts its looping continuations. "
            + ". ".join(parts) + ". Acceptance varies from prompt to prompt, so neither record is wrong: "
            "quote a speedup with its prompts, m and rounds.")
