"""Notebook 04, DeepSeek-V3's MTP modules: eq. (24)'s layout checked against the model by perturbation, teacher
forcing against free running; and the checkers of its exercises.
"""
from __future__ import annotations

import torch
from mtplab.decoding.accept import Sampling
from mtplab.decoding.drafters import DeepSeekDrafter
from mtplab.errors import MtplabError
from mtplab.teaching.check import Check, _call, _number
from mtplab.measuring.teacher_forced import greedy_windows
from mtplab.training.losses import label_layout
from mtplab.measuring.acceptance import wilson
from mtplab.measuring.theory import per_position_tokens_per_step
from mtplab.teaching.blockwise import loop_split
from mtplab.teaching.words import compare_rates, overlap, wall_reps


def forced_and_free_greedy(model, windows: torch.Tensor, prompt_lens, *, progress: bool = False) -> dict:
    """`lab.forced_and_free`, scored against the target's own greedy path instead of the true text.

    Returns {"teacher-forced": [(correct, n) per depth 2..D+1], "free-running": [...], "n": positions}."""

    D = model.config.n_modules
    sums = {"teacher-forced": [0.0] * D, "free-running": [0.0] * D}
    n = 0
    for P in prompt_lens:
        if P + D + 1 > model.config.block_size:
            continue
        ff = forced_and_free(model, greedy_windows(model, windows, P, D + 1), [P], progress=progress)
        for key in sums:
            sums[key] = [s + a * ff["n"] for s, a in zip(sums[key], ff[key])]
        n += ff["n"]
    return {key: [(round(s), n) for s in vals] for key, vals in sums.items()} | {"n": n}


# ---------------------------------------------------------------------------------- notebook 04
# (T, k) -> ((first, last token read), (first, last label)), 1-based, read off eq. (24) once by hand
_LAYOUT_CASES = {(10, 0): ((1, 10), (2, 11)), (10, 1): ((2, 10), (3, 11)), (10, 2): ((3, 10), (4, 11)),
                 (7, 3): ((4, 7), (5, 8)), (5, 1): ((2, 5), (3, 6))}


def check_deepseek_labels(fn) -> Check:
    """fn(T, k) -> (reads, labels): the 1-based token numbers depth k reads and is scored against,
    position by position, for a training sequence t_1..t_{T+1}. k = 0 is the main model
    (reads t_i); k >= 1 is MTP module k (reads Emb(t_{i+k}) beside the depth k-1 hidden state)."""

    name = "DeepSeek label layout"
    for (T, k), ((r0, r1), (l0, l1)) in _LAYOUT_CASES.items():
        want = (list(range(r0, r1 + 1)), list(range(l0, l1 + 1)))
        got, err = _call(fn, T, k)
        if err:
            return Check(name, False, f"fn(T={T}, k={k}) raised {err}")
        try:
            got = (list(int(t) for t in got[0]), list(int(t) for t in got[1]))
        except (TypeError, ValueError, IndexError):
            return Check(name, False, f"fn(T={T}, k={k}) returned {got!r}; return two lists of token numbers")
        if got != want:
            hint = ""
            if got[1] and want[1] and got[1][0] == want[1][0] - 1:
                hint = " Your labels start one token early: a label is the token after the one read."
            elif got[1] and want[1] and got[1][-1] != want[1][-1]:
                hint = f" The last label is t_{T + 1}, the last token of the training sequence."
            if len(got[0]) != len(want[0]):
                hint += " A module needs the token it reads to exist: count its positions again."
            return Check(name, False, f"wrong on a case like T={T}, k={k} (you gave reads {got[0]}, labels "
                                      f"{got[1]}).{hint}")
    return Check(name, True, "each depth reads the token its module index ahead and is scored against the one "
                             "after it, eq. (24)")


# (m, D) -> target forwards with every draft kept, counted once with a perfect drafter on the lab's loop; and what
# D tokens per step (one short) would give, for the hint
_DS_CASES = {(12, 1): (7, 12), (12, 3): (4, 5), (9, 2): (4, 5), (1, 1): (1, 1), (20, 3): (6, 8), (7, 1): (4, 7)}


def check_deepseek_forwards(fn) -> Check:
    """fn(m, D) -> target forwards of self-speculative decoding with D modules when every draft is kept."""
    name = "DeepSeek self-speculation forwards"
    for (m, D), (want, one_short) in _DS_CASES.items():
        got, err = _call(fn, m, D)
        if err:
            return Check(name, False, f"fn(m={m}, D={D}) raised {err}")
        if _number(got) != want:
            hint = ""
            if _number(got) == one_short:
                hint = " D modules give D drafts, so a step commits D+1 tokens (k = D+1 tokens per step)."
            return Check(name, False, f"wrong on a case like m={m}, D={D} (you gave {got!r}).{hint}")
    return Check(name, True, "D drafts a step make blocks of D+1 tokens on the overlapped schedule of notebook 02")


@torch.inference_mode()
def layout_matches_model(model, *, T: int = 10, seed: int = 0) -> bool:
    """Check `label_layout` against the model itself, by perturbing one token at a time.

    For every depth and position of the layout: changing the token the depth reads changes its
    logits there, and changing its label (and everything after it) does not.
    """
    D = model.config.n_modules
    dev = model.wte.weight.device
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(V, (1, T), generator=g).to(dev)  # t_1..t_T at 0-based indices 0..T-1
    base = model.depth_logits(x)  # (1, T, D+1, V)

    def bumped(token: int, *, onward: bool):  # add 1 to t_token (1-based), and with `onward` to every later token
        y = x.clone()
        cut = slice(token - 1, None if onward else token)
        y[0, cut] = (y[0, cut] + 1) % V
        return model.depth_logits(y)

    for row in label_layout(T, D):
        d = row["k"]  # depth index: 0 the main model, k module k
        for i, reads in row["reads"].items():
            label = row["labels"][i]
            if torch.allclose(bumped(reads, onward=False)[0, i - 1, d], base[0, i - 1, d]):  # must see what it reads
                return False
            if label <= T and not torch.equal(bumped(label, onward=True)[0, i - 1, d], base[0, i - 1, d]):
                return False
    return True


@torch.inference_mode()
def forced_and_free(model, windows: torch.Tensor, prompt_lens, *, progress: bool = False) -> dict[str, list[float]]:
    """Accuracy of DeepSeek depths 2..D+1 against the true tokens, teacher-forced against free-running.

    For each window x and prompt length P: the main model reads x[:P] and guesses g = the token at P.
    Teacher forcing (training): module k reads the true x[P-1+k] and predicts x[P+k].
    Free running (inference): module 1 reads g, module k > 1 reads the draft of module k-1, and
    predicts the same x[P+k]. Returns per-depth accuracy under each, and the main model's own.
    """
    D = model.config.n_modules
    if D < 1:
        raise MtplabError("forced_and_free needs a DeepSeek checkpoint (deepseek-d1, deepseek-d3)")
    dev = model.wte.weight.device
    forced = torch.zeros(D)
    free = torch.zeros(D)
    main = 0
    n = 0
    it = windows
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(windows, desc="forced and free", unit="window")
    for x in it:
        x = x.tolist()
        for P in prompt_lens:
            if P + D + 1 > len(x) or P + D + 1 > model.config.block_size:
                continue
            ids = torch.tensor([x[:P + D]], device=dev)
            full = model(ids)  # the trunk is causal: its first P positions are the prompt's own forward
            logits = model.mtp.train_logits(model, ids, full)  # (1, P+D, D, V) teacher-forced modules
            out = full.cut((slice(None), slice(None, P)))
            g = int(out.logits[0, -1].argmax())
            drafter = DeepSeekDrafter(model)
            drafter.begin(model, x[:P] + [g], out, P, max_new_tokens=D + 1, sampling=Sampling())
            drafts = drafter.propose(D).tokens
            for k in range(1, D + 1):
                truth = x[P + k]
                forced[k - 1] += int(logits[0, P - 1, k - 1].argmax()) == truth
                free[k - 1] += drafts[k - 1] == truth
            main += g == x[P]
            n += 1
    if n == 0:
        raise MtplabError("no (window, prompt length) pair fits; use longer windows or shorter prompts")
    return {"main": [main / n], "teacher-forced": (forced / n).tolist(), "free-running": (free / n).tolist(),
            "n": n}


# ---------------------------------------------------------------------------------- the second token, D = 1 against D = 3
def second_token(traces: dict[str, list]) -> dict[str, dict]:
    """Per checkpoint: the second token's acceptance (the first draft's, unconditional) over every drafting step
    and over the steps taken before the continuation fell into a loop, each as (kept, n) with its 95% Wilson
    interval, and how many greedy continuations loop."""
    out = {}
    for name, trs in traces.items():
        sp = loop_split(trs)
        rows = {}
        for label, steps in (("all steps", [s for t in trs for s in t.steps]), ("before any loop", sp["free"].steps)):
            drafting = [s for s in steps if s.drafted]
            k, n = sum(s.accepted > 0 for s in drafting), len(drafting)
            rows[label] = {"kept": k, "n": n, "rate": k / n if n else float("nan"), "interval": wilson(k, n)}
        out[name] = rows | {"looping": sp["looping"], "continuations": sp["continuations"]}
    return out


def second_token_lines(st: dict[str, dict], band: tuple[float, float] = (0.85, 0.90)) -> list[str]:
    """The second token's acceptance with n, interval and loop count, and where its interval lies against a band."""
    out = []
    for name, r in st.items():
        parts = []
        for label in ("all steps",) + (("before any loop",) if r["looping"] else ()):  # the same steps when none loops
            x = r[label]
            lo, hi = x["interval"]
            if not x["n"]:
                parts.append(f"{label}: no drafting step")
                continue
            where = ("above" if lo > band[1] else "below" if hi < band[0] else "overlapping")
            parts.append(f"{label}: {x['kept']} of {x['n']}, {x['rate']:.1%} [95%: {lo:.1%}, {hi:.1%}], "
                         f"{where} the {band[0]:.0%}-{band[1]:.0%} band")
        out.append(f"{name}: {r['looping']} of {r['continuations']} greedy continuations loop; " + "; ".join(parts))
    return out


def first_draft_words(st: dict[str, dict], a: str, b: str) -> str:
    """Whether checkpoint b's first-draft (second-token) acceptance differs from a's over every drafting step
    (`second_token`), in words chosen from their 95% Wilson intervals: a direction only when they are apart."""
    x, y = st[a]["all steps"], st[b]["all steps"]
    if not x["n"] or not y["n"]:
        return f"first-draft acceptance: {a if not x['n'] else b} has no drafting step, so nothing to compare"
    if not overlap(x["interval"], y["interval"]):
        verdict = f"{b}'s is {'higher' if y['rate'] > x['rate'] else 'lower'}, the 95% intervals apart"
    else:
        verdict = "the 95% intervals overlap, so this run cannot tell the two apart"
    return (f"first-draft acceptance, {b} against {a}: {y['rate']:.1%} (n = {y['n']}) against {x['rate']:.1%} "
            f"(n = {x['n']}); {verdict}")


def _bench_rank(b1: dict, b3: dict) -> str | None:
    """'more' or 'less' where the benchmark's repeats put D = 3's whole range above or below D = 1's, else None."""
    r1, r3 = wall_reps(b1), wall_reps(b3)
    return "more" if min(r3) > max(r1) else "less" if max(r3) < min(r1) else None


def _against_bench(d3_more_live: bool, b1: dict | None, b3: dict | None) -> str:
    """After a live verdict on D = 3 against D = 1: whether the benchmark's repeats rank them the same way, and when
    they do not, why a live run and a record can differ, from what each measured."""
    if b1 is None or b3 is None:
        return " The benchmark has no row for both."
    rank = _bench_rank(b1, b3)
    if rank is None:
        return " In the benchmark their ranges overlap, so it does not rank them."
    if (rank == "more") == d3_more_live:
        return " The benchmark ranks them the same way."
    return (f" The benchmark ranks them the other way ({b3['speedup_wall']:.2f}x for D = 3 against "
            f"{b1['speedup_wall']:.2f}x, ranges apart). Its prompts, lengths and machine are on its source line, the "
            "live run's above: a module forward and a wider verify cost differently on another machine and over "
            "another decode length. Both are measurements; the ranking belongs to the machine and the decode.")


def d1_against_d3(forwards: tuple[int, int], live: tuple[dict, dict], bench: tuple[dict | None, dict | None]) -> str:
    """D = 3 against D = 1 in words chosen from the numbers: target forwards, then time, live when the live ranges
    separate the two and the race found the machine quiet enough (`timing.interleaved_race` rows: busy None),
    otherwise from the benchmark's repeats (and says so)."""
    (f1, f3), (l1, l3), (b1, b3) = forwards, live, bench
    fewer = "fewer" if f3 < f1 else ("as many" if f3 == f1 else "more")
    out = f"D = 3 needed {fewer} target forwards than D = 1 ({f3} vs {f1})"
    valid = l1["busy"] is None and l3["busy"] is None  # the race's busy-machine verdict
    lo1, hi1, lo3, hi3 = l1["speedup_min"], l1["speedup_max"], l3["speedup_min"], l3["speedup_max"]
    if valid and not overlap(l1, l3):
        more = "more" if l3["speedup"] > l1["speedup"] else "less"
        return (out + f" and, live, gained {more} time ({l3['speedup']:.2f}x, range {lo3:.2f}-{hi3:.2f}, "
                f"vs {l1['speedup']:.2f}x, range {lo1:.2f}-{hi1:.2f})." + _against_bench(more == "more", b1, b3))
    if not valid:
        out += ". Live, the machine was too busy for the timings to be valid, so this run cannot say which gained more time"
    else:
        out += (f". Live, the two speedups' ranges overlap ({lo3:.2f}-{hi3:.2f} vs {lo1:.2f}-{hi1:.2f}), so this run "
                "cannot say which gained more time")
    if b1 is None or b3 is None:
        return out + "; the benchmark has no row for both."
    rank, r1, r3 = _bench_rank(b1, b3), wall_reps(b1), wall_reps(b3)
    verdict = f"D = 3 gained {rank} time" if rank else "their ranges overlap too"
    return (out + f"; in the benchmark {verdict} ({b3['speedup_wall']:.2f}x, range {min(r3):.2f}-{max(r3):.2f}, vs "
            f"{b1['speedup_wall']:.2f}x, range {min(r1):.2f}-{max(r1):.2f}).")


def depth_trend(counts: list[tuple[int, int]]) -> str:
    """Teacher-forced agreement from the first module to the last, in words chosen from the 95% intervals."""
    words = compare_rates(counts[0], counts[-1], "rises", "falls")
    (a0, n0), (a1, n1) = counts[0], counts[-1]
    return (f"from depth 2 to depth {len(counts) + 1}, teacher-forced agreement {words} "
            f"({a0 / n0:.2f} -> {a1 / n1:.2f})")


def length_from_conditionals(trace) -> str:
    """Why a trace's mean accepted length and 1 + c1 + c1 c2 + ... (from its conditional rates) can differ: steps
    that drafted fewer than the most drafts (the decode stops at max_new_tokens) count in the first position's
    denominator but never reach the later positions."""
    from_c = per_position_tokens_per_step([x for x in trace.conditional_acceptance if x == x])  # NaN: not reached
    most = max((len(s.drafted) for s in trace.steps), default=0)
    short = sum(1 for s in trace.steps if s.drafted and len(s.drafted) < most)
    line = (f"{trace.mean_accepted_length:.2f} tokens per step counted; 1 + c1 + c1 c2 + ... from the printed "
            f"conditionals gives {from_c:.2f}")
    if short:
        return (line + f": {short} of {trace.num_drafts} drafting steps drafted fewer than {most} tokens (each decode "
                "stops at its last token), which count in the first position's n but never reach the later ones")
    return line + ": every drafting step drafted all its tokens, so the two agree"
