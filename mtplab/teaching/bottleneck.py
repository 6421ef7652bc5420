"""Notebook 01, the autoregressive bottleneck: decodes timed with and without the KV cache, dynamic INT8 on the
CPU, ms per token; and the checkers of its exercises (`check_speedup`, `check_latency_cut`).
"""
from __future__ import annotations

import math
import torch
import statistics
import warnings
from mtplab.decoding.loop import autoregressive
from mtplab.decoding.trace import Trace
from mtplab.teaching.check import Check, _call, _number
from mtplab.errors import MtplabError
from mtplab import paths
from mtplab.decoding.drafters import pair
from mtplab.measuring.race import race
from mtplab.measuring.timing import forward_cost, untimed_output
from mtplab.model import kernels
from mtplab.teaching.words import busy_line as _busy_line
from mtplab.teaching.words import NOT_VALID, overlap, side_of_one, wall_reps
from mtplab.measuring.record import Record


# ---------------------------------------------------------------------------------- notebook 01
# (tokens per step, cost curve, q) -> the predicted speedup, computed once: fixed cases, not the package's formula
_CURVES = [{1: 1.0, 2: 1.05, 4: 1.2, 8: 1.7}, {1: 1.0, 2: 1.6, 4: 2.9, 8: 5.5}, {1: 1.0, 4: 1.0, 8: 1.0}]
_SPEEDUP_CASES = [((3.2, 0, 4), 2.666666666666667), ((1.8, 0, 2), 1.7142857142857142), ((3.2, 1, 4), 1.103448275862069),
                  ((4.0, 2, 4), 4.0), ((6.5, 0, 8), 3.823529411764706)]


def check_speedup(fn) -> Check:
    """fn(tokens_per_step, cost_curve, q) -> predicted wall-clock speedup over autoregressive decoding.

    cost_curve is {q: t(q)/t(1)}; a step feeds q tokens to one forward and commits tokens_per_step tokens.
    """
    name = "predicted speedup"
    for (tps, c, q), want in _SPEEDUP_CASES:
        curve = _CURVES[c]
        got, err = _call(fn, tps, dict(curve), q)
        if err:
            return Check(name, False, f"fn({tps}, {curve}, {q}) raised {err}")
        g = _number(got)
        if g is None:
            return Check(name, False, f"fn({tps}, {curve}, {q}) returned {got!r}; return a number")
        if not math.isclose(g, want, rel_tol=1e-6):
            hint = ""
            if math.isclose(g, tps, rel_tol=1e-6):
                hint = (" That is the step count alone (the sources' view); a step's forward over q tokens "
                        f"costs t(q)/t(1) = {curve[q]} forwards of one token, not 1.")
            elif math.isclose(g, tps * curve[q], rel_tol=1e-6):
                hint = " You multiplied by the cost of the step; divide: tokens per unit of time."
            return Check(name, False, f"wrong on a case like fn({tps}, {curve}, q={q}), which gave {g:.4g}.{hint}")
    return Check(name, True, "tokens per step against what a step costs in forwards of one token")


# speedup -> the fraction of the latency it removes, computed once
_CUT_CASES = {4.0: 0.75, 2.0: 0.5, 1.25: 0.2, 1.0: 0.0, 10.0: 0.9, 1.6: 0.375}


def check_latency_cut(fn) -> Check:
    """fn(speedup) -> the fraction of decoding latency removed by that speedup (0.75 for 4x)."""
    name = "latency cut from a speedup"
    for s, want in _CUT_CASES.items():
        got, err = _call(fn, s)
        if err:
            return Check(name, False, f"fn({s}) raised {err}")
        g = _number(got)
        if g is None:
            return Check(name, False, f"fn({s}) returned {got!r}; return a fraction between 0 and 1")
        if not math.isclose(g, want, abs_tol=1e-9):
            hint = ""
            if math.isclose(g, s - 1, abs_tol=1e-9):
                hint = " That is 'how much faster' (s - 1), not how much of the time is gone."
            elif math.isclose(g, 1 / s, abs_tol=1e-9):
                hint = " That is the latency that remains, not the part removed."
            return Check(name, False, f"wrong on a case like fn({s}), which gave {g:.4g}.{hint}")
    return Check(name, True, "a speedup s leaves 1/s of the latency; the sources' 4x removes 75%")


def raced_decodes(variants: dict, prompt_ids, *, max_new_tokens: int, repeats: int = 5,
                  progress: bool = False) -> tuple[dict[str, Trace], dict[str, list[float]], str | None]:
    """Greedy autoregressive decoding of the same prompt by several (model, use_cache) variants, raced
    (`measuring.race`: one short warm-up decode each, then `repeats` rounds in rotating order).

    Returns ({label: the Trace of its median round}, {label: ms per token of every round}, why the race is not
    valid here or None); each Trace's steps carry their wall time (`Step.wall_s`)."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise MtplabError(f"repeats must be an integer >= 1 (got {repeats!r})")
    traces: dict[str, list[Trace]] = {label: [] for label in variants}

    def decoder(label, model, use_cache):
        def run(ids, warm=False):
            tr = autoregressive(model, ids, max_new_tokens=4 if warm else max_new_tokens, use_cache=use_cache)
            if not warm:
                traces[label].append(tr)  # every round's trace: ms per token is read from its steps
            return tr
        return run
    fns = {label: decoder(label, *v) for label, v in variants.items()}
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=repeats * len(fns), desc="decoding", unit="decode")
    model = next(iter(variants.values()))[0]
    res = race(fns, [prompt_ids], baseline=next(iter(fns)), rounds=repeats, device=model.wte.weight.device, bar=bar,
         warmup=lambda label, fn: fn(prompt_ids, warm=True))  # the first decode pays one-off costs
    if bar is not None:
        bar.close()
    ms = {label: [ms_per_token(t) for t in ts] for label, ts in traces.items()}
    median = {label: sorted(ts, key=ms_per_token)[len(ts) // 2] for label, ts in traces.items()}
    return median, ms, res.busy


def benchmark_row(label: str, path=paths.DECODE_JSON) -> tuple[dict | None, str]:
    """The shipped decode benchmark's row for the pair labelled `label` and the machine it was measured on (a
    line), or (None, why) when the record has no such row."""
    rec = Record.load(path)
    p = pair(label)
    row = rec.row(method=p.method, checkpoint=p.checkpoint)
    if row is None:
        return None, f"{rec.path.name} has no row for {label!r}"
    return row, rec.machine_text().removeprefix("measured on ")  # notebook 01 prints "measured on {where}"


def ms_per_token(trace: Trace) -> float:
    """Median wall time of one decoding step after the prefill, in milliseconds."""
    return 1e3 * statistics.median(s.wall_s for s in trace.steps[1:]) if len(trace.steps) > 1 else float("nan")


def climb_words(runs: dict[str, Trace], busy: str | None = None) -> str:
    """How each decode's step time moved along the decode, from the traces the step-time figure draws: the median
    wall time of its first quarter of steps against its last quarter (the prefill left out), so that the sentence
    under the figure is read from it, not assumed. `busy` (the race's reason): the rise is marked as timed on a busy
    machine."""
    parts = []
    for label, tr in runs.items():
        w = [s.wall_s for s in tr.steps if not s.prefill]
        n = len(w) // 4
        if n < 1:
            parts.append(f"{label}: too few steps ({len(w)}) to tell")
            continue
        a, b = 1e3 * statistics.median(w[:n]), 1e3 * statistics.median(w[-n:])
        if a <= 0:
            parts.append(f"{label}: its first steps were not timed")
            continue
        parts.append(f"{label} {a:.2f} -> {b:.2f} ms ({100 * (b / a - 1):+.0f}%)")
    head = "median step time, first quarter of the steps -> last quarter: "
    return head + "; ".join(parts) + ("" if busy is None else f" (timed on a busy machine: {busy})")


def quantize_int8(model):
    """Dynamic INT8 quantization of every nn.Linear, the lab's `layers.Linear` included (weights stored in int8,
    activations quantized on the fly).

    Returns (quantized model on CPU, or None when no layer was quantized, and a one-line note). CPU only:
    torch's dynamic quantized kernels do not run on CUDA or MPS. The torch.ao API is deprecated in recent torch
    releases; if it is missing, the note says so and the caller skips the comparison.
    """
    try:
        from torch.ao.quantization import quantize_dynamic
    except ImportError as e:  # removed from this torch
        return None, f"torch.ao.quantization.quantize_dynamic is not available in torch {torch.__version__} ({e})"
    import copy

    cpu_model = copy.deepcopy(model).to("cpu").float().eval()
    for mod in cpu_model.modules():  # quantize_dynamic swaps the exact type nn.Linear only, not a subclass
        if isinstance(mod, torch.nn.Linear) and type(mod) is not torch.nn.Linear:
            mod.__class__ = torch.nn.Linear  # the lab's layers.Linear holds nn.Linear's fields: F.linear from here on
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the API announces its own deprecation on every call
            qm = quantize_dynamic(cpu_model, {torch.nn.Linear}, dtype=torch.qint8)
    except (RuntimeError, AssertionError, NotImplementedError) as e:
        return None, f"dynamic INT8 quantization failed on torch {torch.__version__}: {e}"
    n = sum(1 for mod in qm.modules() if type(mod).__module__.startswith("torch.ao.nn.quantized.dynamic")
            and type(mod).__name__ == "Linear")  # not their packed-parameter children
    if n == 0:
        return None, f"torch {torch.__version__}: quantize_dynamic changed no linear layer, so there is no int8 model to race"
    return qm, f"torch {torch.__version__}: {n} nn.Linear layers now hold int8 weights (deprecated torch.ao API)"


# ---------------------------------------------------------------------------------- verdict words from the numbers
RACED_OK = "the race's guard passed (little other load, rounds that agree)"


def rows_busy(rows: list[dict]) -> str | None:
    """The first reason any row's own race gave (`measuring.regime` rows carry it), else None."""
    return next((r["busy"] for r in rows if r.get("busy")), None)


def compare_ms(ms: dict[str, list[float]], busy: str | None) -> str:
    """Two labelled lists of ms per token (every round) in words: which was faster, only when the busy guard
    passed and the ranges do not overlap; otherwise why this run cannot say."""
    (a, va), (b, vb) = list(ms.items())[:2]
    if busy is not None:
        return NOT_VALID.format(why=busy) + f"; no verdict on {a} against {b}"
    if overlap(va, vb):
        return f"valid here; {a} and {b}: the ranges overlap, so this run cannot tell them apart"
    fast, slow = (a, b) if statistics.median(va) < statistics.median(vb) else (b, a)
    return f"valid here; {fast} was faster than {slow} (the ranges do not overlap)"


def race_line(race: dict, n_prompts: int) -> str:
    """A live race (`timing.interleaved_race`'s dict) in words: the busy verdict first; a speedup verdict only when
    the race is valid, and then only from its range."""
    nums = (f"{race['speedup']:.2f}x (median of {len(race['rounds'])} rounds over {n_prompts} prompts, "
            f"range {race['speedup_min']:.2f}-{race['speedup_max']:.2f})")
    if not race["valid"]:
        return race["verdict"] + f"; the measured {nums} is not read as a verdict"
    word = side_of_one(race["speedup_min"], race["speedup_max"], tie="within noise of")
    return f"{race['verdict']}; measured {nums}: {word} plain decoding on this machine"


def curve_flags(ratio: dict, name: str = "") -> str:
    """Where a measured t(q)/t(1) falls as q grows (a noisy point: more q cannot cost less), or '' when none does."""
    qs = sorted(ratio)
    bad = [(a, b) for a, b in zip(qs, qs[1:]) if ratio[b] < ratio[a]]
    if not bad:
        return ""
    parts = ", ".join(f"t({b})/t(1) = {ratio[b]:.2f} below t({a})/t(1) = {ratio[a]:.2f}" for a, b in bad)
    return f"{name + ': ' if name else ''}not monotonic ({parts}): noise at this many repeats; read the trend, not one point"


def ratio_range(curve, q: int) -> tuple[float, float]:
    """(min, max) over the rounds of t(q)/t(1), each round's q over the same round's q = 1 (they were interleaved)."""
    r = [a / b for a, b in zip(curve.samples[q], curve.samples[1])]
    return min(r), max(r)


def cheaper_to_verify(curves: dict, q: int) -> str:
    """Which model's t(q)/t(1) is lower, in words, only when no curve is marked busy and the per-round ranges
    do not overlap."""
    busy = [f"{n}: {c.busy}" for n, c in curves.items() if c.busy]
    if busy:
        return NOT_VALID.format(why="; ".join(busy)) + "; no verdict on which model is cheaper to verify"
    rng = {n: ratio_range(c, q) for n, c in curves.items()}
    text = ", ".join(f"{n} {c.ratio[q]:.2f} (rounds {rng[n][0]:.2f}-{rng[n][1]:.2f})" for n, c in curves.items())
    if overlap(*list(rng.values())[:2]):
        return f"valid here; t({q})/t(1): {text}: the ranges overlap, so this run cannot tell which is cheaper to verify"
    cheap = min(curves, key=lambda n: curves[n].ratio[q])
    return f"valid here; t({q})/t(1): {text}: {cheap} is the cheaper one to verify here"


def live_kernel(device="cpu") -> str:
    """'exact' or 'stock': the kernel the lab's linears run through now on `device` (`mtplab.model.kernels`: the
    exact kernel runs on the CPU only)."""
    return "exact" if kernels.active() and torch.device(device).type == "cpu" else "stock"


def exact_curve_words(ratio: dict, *, attention: bool = True, busy: str | None = None) -> str:
    """Why an exact-kernel t(q)/t(1) ({q: value}) is not flat, from its numbers and the kernel's blocking
    (`kernel_blocks`: blocks of 2, 3, 4 and 8 with AVX-512, of 2 and 3 without, by the CPU): q that run as one block
    share one read of each weight, more blocks read the weights again (above `kernels.MAX_ROWS` rows the stock kernel
    runs); and with a cache the exact path runs attention one query row at a time (`attention`), so each row adds its
    own attention. A curve timed on a busy machine (`busy`, the guard's reason) gets the blocking only: its rise is not
    given a cause."""
    attention = attention and busy is None
    one = [q for q in sorted(ratio) if 1 < q and len(kernel_blocks(q)) == 1]
    more = [q for q in sorted(ratio) if len(kernel_blocks(q)) > 1 and q <= kernels.MAX_ROWS]
    wide = [q for q in sorted(ratio) if q > kernels.MAX_ROWS]  # a prefill's width: `linear` is F.linear there
    parts = []
    if one:
        q = one[-1]
        *most, last = map(str, sorted({kernel_blocks(x)[0] for x in one}))
        sizes = f"{', '.join(most)} or {last}" if most else last
        parts.append(f"q = 2..{q} each run as one block (of {sizes} rows: one read of each weight): "
                     f"t({q})/t(1) = {ratio[q]:.2f}"
                     + (", the rise being per-row work: the block's multiply-adds, and attention, which the exact path "
                        "runs one query row at a time" if attention else ""))
    if more:
        q = more[-1]
        b = kernel_blocks(q)
        parts.append(f"q = {q} runs as {len(b)} blocks ({' + '.join(map(str, b))} rows), so the weights are read "
                     f"{len(b)} times: t({q})/t(1) = {ratio[q]:.2f}")
    if wide:
        parts.append(f"q = {', '.join(map(str, wide))}, above {kernels.MAX_ROWS} rows, run the stock kernel")
    if busy is not None:
        parts.append("the rise itself is given no cause here: the curve was timed on a busy machine")
    return "; ".join(parts)


def kernel_blocks(q: int) -> list[int]:
    """The row blocks the exact kernel runs q rows in on this machine (`kernels.blocks`: with AVX-512, blocks of 8
    then one block of 2, 3, 4 or 8 for the last one to eight rows; elsewhere blocks of 3 while more than four or
    exactly three rows remain, then blocks of 2; a partial block repeats its last row). Each block reads every weight
    once."""
    if q < 1:
        raise MtplabError(f"q = {q}: a call has at least one row")
    return kernels.blocks(q)


def kernel_gap(record_kernel: str, live: str | None = None) -> str:
    """'' when a record and this run used the same kernel, else a clause naming both (records written before the
    exact kernel existed ran the stock one: `Record.kernel`)."""
    live = live or live_kernel()
    return "" if record_kernel == live else f"the record ran the {record_kernel} kernel, this run the {live} one"


def regime_lines(sizes: list[dict], shipped: list[dict] | None, busy: str | None, *, q: str = "4",
                 shipped_kernel: str = "stock", live: str | None = None) -> list[str]:
    """Notebook 01 §5 in words from its numbers: the live rows' t(q)/t(1) in order of weight size (is it monotonic,
    which rows disagree with the shipped record's value for the same shape by more than a quarter, and whether the
    record ran another kernel than this run, `shipped_kernel` against `live`), and the shipped record's models that
    fit in the cache against those that do not (do the two ranges separate), with the record's kernel named."""
    gap = kernel_gap(shipped_kernel, live)
    out = [NOT_VALID.format(why=busy) + "; the live rows below are not read as a verdict" if busy is not None
           else RACED_OK]
    rows = sorted(sizes, key=lambda r: r["weight_bytes"])
    ref = {(r["n_layer"], r["n_embd"]): r["ratio"][q] for r in shipped or []}
    noisy = [r for r in rows if (r["n_layer"], r["n_embd"]) in ref
             and abs(r["ratio"][q] / ref[(r["n_layer"], r["n_embd"])] - 1) > 0.25]
    vals = [r["ratio"][q] for r in rows]
    order = " < ".join(f"{r['weight_mb']:.0f} MB" for r in rows)
    trend = ("rises with the weights" if all(a < b for a, b in zip(vals, vals[1:])) else
             "falls with the weights" if all(a > b for a, b in zip(vals, vals[1:])) else "is not monotonic in the weights")
    out.append(f"live, t({q})/t(1) over {order}: " + ", ".join(f"{v:.2f}" for v in vals)
               + ("" if busy is not None else f"; it {trend}"))
    for r in noisy:
        was = ref[(r["n_layer"], r["n_embd"])]
        out.append(f"  the {r['weight_mb']:.0f} MB row ({r['ratio'][q]:.2f}) is {r['ratio'][q] / was:.1f}x "
                   f"the shipped record's {was:.2f} for the same shape: "
                   + (f"{gap}, so the two measure different kernels, not only noise" if gap else "a noisy row"))
    if shipped:
        fit = [r["ratio"][q] for r in shipped if r["fits_in_llc"]]
        big = [r["ratio"][q] for r in shipped if not r["fits_in_llc"]]
        if fit and big:
            verdict = ("the models that fit were cheaper to verify" if max(fit) < min(big) else
                       "the models that do not fit were cheaper to verify" if max(big) < min(fit) else
                       f"the two ranges overlap, so on that machine, with the {shipped_kernel} kernel, fitting in the "
                       "cache did not decide the cost of a verify")
            out.append(f"shipped record (run alone, {shipped_kernel} kernel): {len(fit)} models that fit in the cache "
                       f"verify {q} tokens for "
                       f"{min(fit):.2f}-{max(fit):.2f} one-token forwards, the {len(big)} that do not for "
                       f"{min(big):.2f}-{max(big):.2f}; {verdict}")
    return out


def why_shipped_differs(*, prompts: int, tokens: int, rounds: int, path=paths.DECODE_JSON) -> str:
    """Why the live race and the shipped decode benchmark may give different speedups for the same pair, from the
    record's own fields (prompts, max_new_tokens, repeats, kernel) against this run's."""
    rec = Record.load(path)
    d = rec.data
    diff = []
    if (d.get("prompts"), d.get("max_new_tokens")) != (prompts, tokens):
        diff.append(f"the record decoded {d.get('prompts')} prompts x {d.get('max_new_tokens')} new tokens, this run "
                    f"{prompts} x {tokens}: the prefill and each decode's fixed costs weigh more in short decodes")
    if d.get("repeats") != rounds:
        diff.append(f"it kept the median of {d.get('repeats')} rounds, this run of {rounds}")
    if gap := kernel_gap(rec.kernel()):
        diff.append(gap)
    return "; ".join(diff) or "same prompts, tokens, rounds and kernel: the difference is the machine or its load"


def claim_words(cuts: dict, predicted: float, race: dict) -> str:
    """Notebook 01 §4: the claim, the prediction and the wall clock read against each other; when the race is not
    valid, that first and no reading of the wall clock."""
    claim = cuts["seed article's claim"]
    head = f"the claim removes {claim:.0%}; measurements predict {cuts['predicted from measurements']:.0%}"
    if not race["valid"]:
        return f"{head}; {race['verdict']}: the wall clock is not read here (the shipped benchmark's figure is)"
    measured = race["speedup"]
    gap = abs(measured - predicted) / predicted
    near = ("the measured speedup is within 10% of the predicted one" if gap <= 0.1 else
            f"the measured speedup is {gap:.0%} {'below' if measured < predicted else 'above'} the predicted one "
            "(the prediction leaves out the loop's overhead and reads a cost curve timed apart from the race; "
            "notebook 05 §3 weighs the two from its own columns)")
    return f"{head} and the wall clock gave {cuts['measured wall clock']:.0%}: {near}"


def depth_words(rows: list[dict], busy: str | None) -> str:
    """Notebook 01 §5: the same heads on a shallow and a deep trunk; a verdict only when the guard passed and the
    two speedups' ranges do not overlap."""
    a, b = rows[0], rows[-1]
    head = (f"same heads, same tokens per forward ({a['tokens_per_forward']:.2f} and {b['tokens_per_forward']:.2f}): "
            f"{a['speedup']:.2f}x on {a['n_layer']} layers, {b['speedup']:.2f}x on {b['n_layer']}")
    if busy is not None:
        return f"{head}; " + NOT_VALID.format(why=busy) + ": no verdict (the shipped record above is the reference)"
    head = f"{RACED_OK}; {head}"
    if a["speedup_max"] < b["speedup_min"]:
        return f"{head}: the ranges do not overlap, so the deeper trunk is where these heads pay more"
    if b["speedup_max"] < a["speedup_min"]:
        return f"{head}: the ranges do not overlap, so here the shallower trunk paid more"
    return f"{head}: the ranges overlap, so this run cannot tell the two depths apart"


# ---------------------------------------------------------------------------------- notebook 05 §3, the same rules
def _busy(lives: dict) -> list[str]:
    return [n for n, (live, _) in lives.items() if live["busy"] is not None]


def not_valid_mark(*busy: str | None) -> str:
    """A figure title's suffix when any measurement drawn in it was marked busy ('' when all were valid)."""
    return " - NOT VALID: busy machine (see the line above)" if any(busy) else ""


def busy_marker(lives: dict) -> str:
    """'' when every live race passed the busy-machine guard; otherwise a title suffix for the figure."""
    busy = _busy(lives)
    return f" - NOT VALID: busy machine ({len(busy)} of {len(lives)} races)" if busy else ""


def prediction_line(lives: dict, predicted: dict[str, float]) -> str:
    """Notebook 05 §3: each live speedup against its prediction, read only when the race is valid and only when the
    whole live range lies on one side of the prediction. lives: name -> (`timing.interleaved_race` row, bench row)."""
    busy = _busy(lives)
    if busy:
        return (f"{len(busy)} of {len(lives)} live races are not valid here (busy machine: the lines above say why), "
                "so no row's live figure is read against its prediction; the benchmark column is the reference")
    below = [n for n, (lv, _) in lives.items() if lv["speedup_max"] < predicted[n]]
    above = [n for n, (lv, _) in lives.items() if lv["speedup_min"] > predicted[n]]
    inside = [n for n in lives if n not in below and n not in above]
    return (f"whole live range below the prediction (it leaves out the overhead, and its inputs were timed apart from "
            f"the race: the lines below weigh the two): {', '.join(below) or 'none'}; "
            f"above it (the prediction's inputs, timed apart from the race, were off): {', '.join(above) or 'none'}; "
            f"prediction inside the live range (no difference measured): {', '.join(inside) or 'none'}")


def fastest_line(speedups: dict[str, tuple[float, float, float]], where: str) -> str:
    """name -> (median, min, max). The fastest by median, and every other whose range overlaps its range: they tie
    within their ranges, so the run does not rank them."""
    best = max(speedups, key=lambda n: speedups[n][0])
    m, lo, hi = speedups[best]
    ties = [n for n, (_, a, b) in speedups.items() if n != best and overlap((a, b), (lo, hi))]
    text = f"{best} at {m:.2f}x (range {lo:.2f}-{hi:.2f})"
    if not ties:
        return f"{where} the fastest was {text}, its range apart from every other's"
    return (f"{where} {text} ties within the ranges with " +
            ", ".join(f"{n} {speedups[n][0]:.2f}x ({speedups[n][1]:.2f}-{speedups[n][2]:.2f})" for n in ties) +
            ": no single fastest")


def live_fastest_line(lives: dict) -> str:
    """Notebook 05's summary of the live races: no ranking when any race is not valid, else `fastest_line`."""
    busy = _busy(lives)
    if busy:
        return (f"Live, {len(busy)} of {len(lives)} races were not valid here (busy machine), so this run ranks no "
                "method; the benchmark's line above is the reference")
    return fastest_line({n: (lv["speedup"], lv["speedup_min"], lv["speedup_max"]) for n, (lv, _) in lives.items()},
                        "Live,")


def forwards_not_seconds(rows: list[dict], speedups: dict[str, tuple[float, float, float]]) -> str:
    """A decode benchmark's pair where more tokens per forward gave less wall-clock speed (rows: label and
    tokens_per_forward; speedups: `bench_speedups`), the one with the widest speed gap, and whether their ranges lie
    apart; says so when every method's speed follows its tokens per forward."""
    tpf = {r["label"]: r["tokens_per_forward"] for r in rows if r["label"] in speedups and r.get("tokens_per_forward")}
    pairs = [(a, b) for a in tpf for b in tpf if tpf[a] > tpf[b] and speedups[a][0] < speedups[b][0]]
    if not pairs:
        return ("in the benchmark every method's wall clock ranks as its tokens per forward do, so this record does "
                "not show it; the cost of a step (drafter, verify width) still sets the speedup, not forwards alone")
    a, b = max(pairs, key=lambda p: speedups[p[1]][0] - speedups[p[0]][0])
    apart = not overlap(speedups[a][1:], speedups[b][1:])
    return (f"in the benchmark {a} made {tpf[a]:.2f} tokens per forward at {speedups[a][0]:.2f}x, {b} fewer, "
            f"{tpf[b]:.2f}, at {speedups[b][0]:.2f}x: more tokens per forward, less speed, "
            + ("their ranges apart" if apart else "though their ranges overlap, so this run does not rank the two")
            + f"; {a}'s step costs more")


def bench_speedups(rows: list[dict]) -> dict[str, tuple[float, float, float]]:
    """label -> (speedup, min, max over its repeats) of a decode benchmark's rows, the oracle left out (it is a
    yardstick, not a method)."""
    out = {}
    for r in rows:
        if r.get("speedup_wall") is None or str(r.get("method", "")).startswith("oracle"):
            continue
        reps = wall_reps(r)
        out[r["label"]] = (r["speedup_wall"], min(reps), max(reps))
    return out


# ---------------------------------------------------------------------------------- notebook 01, section 6: kernels
SMOL_LAYER = ((576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536))  # (out, in)


def kernel_curves(layers: int = 4, qs=(1, 2, 4, 8), *, rounds: int = 5, threads: int = 1, seed: int = 0) -> dict:
    """t(q)/t(1) of the linears of `layers` SmolLM2 layers (random weights of its shapes, 14 MB a layer in float32:
    more than a laptop's cache from 3 layers on), with the stock kernel (F.linear) and the exact one
    (`mtplab.model.kernels`), in one race the lab's way on `threads` threads; and whether row 0 of a four-row call
    equals the one-row call with each kernel. Returns ratio {kernel: {q: (median, low, high)}}, t1_ms {kernel: ms},
    row0 {kernel: (equal, largest difference)}, busy (the guard's reason, None when valid) and status (which exact
    kernel ran)."""
    qs = sorted(set(qs) | {1})
    g = torch.Generator().manual_seed(seed)
    ws = [torch.randn(m, n, generator=g) * 0.02 for _ in range(layers) for m, n in SMOL_LAYER]
    xs = {(q, n): torch.randn(q, n, generator=g) for q in qs for n in (576, 1536)}

    def one_pass(q: int, stock: bool):
        with torch.inference_mode(), kernels.use_stock(stock):
            for w in ws:
                kernels.linear(xs[q, w.shape[1]], w)

    names = {(k, q): f"{k}, q = {q}" for k in ("stock", "exact") for q in qs}
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        res = race({name: untimed_output(lambda q=q, k=k: one_pass(q, k == "stock")) for (k, q), name in names.items()},
                   [None], baseline=names["stock", 1], rounds=rounds)
    finally:
        torch.set_num_threads(saved)
    out: dict = {"ratio": {}, "t1_ms": {}, "row0": {}, "busy": res.busy, "status": kernels.status()}
    w, x = ws[-1], xs[max(qs), 1536][:4]  # a down projection (576 x 1536), four rows
    for k in ("stock", "exact"):
        base = res.round_totals(names[k, 1])
        out["t1_ms"][k] = 1e3 * statistics.median(base)
        per = {q: [t / b for t, b in zip(res.round_totals(names[k, q]), base)] for q in qs}
        out["ratio"][k] = {q: (statistics.median(r), min(r), max(r)) for q, r in per.items()}
        with torch.inference_mode(), kernels.use_stock(k == "stock"):
            four, one = kernels.linear(x, w)[0], kernels.linear(x[:1], w)[0]
        out["row0"][k] = (torch.equal(four, one), float((four - one).abs().max()))
    return out


def _apart_words(kernel: str, a: int, b: int) -> str:
    """Why a kernel's t(b)/t(1) came out below t(a)/t(1), a < b, with the ranges apart: the stock kernel picks its
    blocking by the number of rows; the exact one never does less work for more rows (`kernel_blocks`), so for it the
    dip is the machine (load, frequency, what the cache held), not its blocking."""
    if kernel == "exact":
        ba, bb = (" + ".join(map(str, kernel_blocks(q))) for q in (a, b))
        return (f"the ranges lie apart, yet the exact kernel does no less work for {b} rows (blocks of {bb}) than for "
                f"{a} (blocks of {ba}), so this is the machine moving between calls (load, clock, cache), not the "
                "kernel's blocking")
    return ("the ranges lie apart, so the kernel really ran the larger call faster here (its blocking depends on the "
            "number of rows)")


def kernel_lines(kc: dict) -> list[str]:
    """What `kernel_curves` measured, in words: the guard's line first, one line per kernel (and, where t(q)/t(1)
    dips as q grows, whether the ranges call it noise), why the exact curve has its shape, then row 0 and the
    status line."""
    lines = [_busy_line(kc["busy"], "these kernel timings")]
    for k, curve in kc["ratio"].items():
        cells = ", ".join(f"t({q})/t(1) = {m:.2f} ({lo:.2f}-{hi:.2f})" for q, (m, lo, hi) in curve.items() if q > 1)
        lines.append(f"{k:>5} kernel: t(1) = {kc['t1_ms'][k]:.1f} ms; {cells}")
        qs = sorted(curve)
        for a, b in zip(qs, qs[1:]):  # a dip as q grows: noise where the ranges overlap
            if curve[b][0] < curve[a][0]:
                apart = curve[b][2] < curve[a][1]
                lines.append(f"{'':>5}        t({b})/t(1) below t({a})/t(1): " + (
                    _apart_words(k, a, b) if apart else "the ranges overlap, so the dip is noise"))
    if "exact" in kc["ratio"] and kc["status"].startswith("exact"):
        lines.append("exact kernel, the linears alone (no attention): " + exact_curve_words(
            {q: m for q, (m, _, _) in kc["ratio"]["exact"].items()}, attention=False))
    for k, (equal, diff) in kc["row0"].items():
        lines.append(f"{k:>5} kernel: row 0 of a four-row call {'equals' if equal else 'differs from'} the one-row "
                     f"call, bit for bit (largest difference {diff:.1e})")
    lines.append(kc["status"])
    return lines

def split_words(rows: list[dict]) -> list[str]:
    """Notebook 05 §3: the time-split table read against itself. Each row's split implies a speedup, tokens_per_step
    x ar_step_ms / (target + drafter + overhead), from one decode's steps; the race measured whole decodes, prefill
    included. The lines say, from the table's own numbers, how far the two lie apart, what the prefill (the same
    prompt forward for AR and the method) does to a short decode, how much AR's step (the same trunk in every row)
    moved between rows, and how large the overhead was: what a gap can and cannot come from. A row may carry
    prefill_ms, ar_prefill_ms and tokens (new tokens per decode) for the prefill line."""
    def total(r):
        return r["target_ms"] + r["draft_ms"] + r["overhead_ms"]

    def pct(values):
        lo, hi = min(values), max(values)
        return f"{lo:.0%}" if round(lo, 2) == round(hi, 2) else f"{lo:.0%}-{hi:.0%}"
    rows = [r for r in rows if total(r) > 0 and r.get("measured")]
    if not rows:
        return ["no timed row to read the split against"]
    implied = {r["method"]: r["tokens_per_step"] * r["ar_step_ms"] / total(r) for r in rows}
    lines = ["the split implies (tokens_per_step x ar_step_ms / the step's three parts): " + ", ".join(
        f"{r['method']} {implied[r['method']]:.2f}x (race: {r['measured']:.2f}x)" for r in rows)]
    whole = {r["method"]: (r["ar_prefill_ms"] + (r["tokens"] - 1) * r["ar_step_ms"])
             / (r["prefill_ms"] + r.get("steps", (r["tokens"] - 1) / r["tokens_per_step"]) * total(r))
             for r in rows if {"prefill_ms", "ar_prefill_ms", "tokens"} <= set(r)}
    if whole:
        share = [r["ar_prefill_ms"] / (r["ar_prefill_ms"] + (r["tokens"] - 1) * r["ar_step_ms"]) for r in rows
                 if r["method"] in whole]
        lines.append(f"with the prefill counted, as the race counts it (it is {pct(share)} of an AR decode of "
                     f"{rows[0]['tokens']} tokens, and the same for every method): " + ", ".join(
                         f"{m} {v:.2f}x" for m, v in whole.items()))
    best = {m: whole.get(m, implied[m]) for m in implied}
    ar = [r["ar_step_ms"] for r in rows]
    spread = (max(ar) - min(ar)) / min(ar)
    over = [r["overhead_ms"] / total(r) for r in rows]
    gaps = {r["method"]: abs(best[r["method"]] - r["measured"]) / r["measured"] for r in rows}
    worst = max(gaps, key=gaps.get)
    lines.append(f"AR's step, one and the same trunk in every row, measured {min(ar):.2f}-{max(ar):.2f} ms across the "
                 f"rows ({spread:.0%} apart); the overhead was {pct(over)} of a step")
    if gaps[worst] <= max(over):
        cause = "within the overhead: the split and the race agree"
    elif gaps[worst] <= spread:
        cause = ("larger than the overhead could make it, and within how far one decode's timings moved here (the "
                 "split is one round's decode, the race's median covers every round): read the race's median, and "
                 "the split for its proportions")
    else:
        cause = ("larger than the overhead and than the spread of AR's step: the split decode and the race's decodes "
                 "differ by more than this table explains (load during one of them, or a cost the split does not time)")
    lines.append(f"the largest gap between the split{' (prefill counted)' if whole else ''} and the race, {worst} "
                 f"{gaps[worst]:.0%}, is {cause}")
    return lines


def t1_words(cfg, t1_ms: float, context: int, step_ms: float, step_context: int) -> str:
    """Notebook 01 §3: the cost curve's t(1) (one token over `context` cached ones) against a step of §2's decode race
    (contexts up to `step_context`), and how much of the gap the longer context explains by the roofline's bytes
    (`timing.forward_cost`: weights plus the cached keys and values read)."""
    want = forward_cost(cfg, 1, context=context)["bytes"] / forward_cost(cfg, 1, context=step_context)["bytes"]
    got = t1_ms / step_ms
    head = (f"t(1) = {t1_ms:.2f} ms over {context} cached tokens, against {step_ms:.2f} ms a step in section 2's race "
            f"(contexts up to {step_context}): {got:.2f}x; the longer context adds bytes for {want:.2f}x")
    if abs(got - 1) > 0.01 and (want - 1) / (got - 1) > 0:
        part = (want - 1) / (got - 1)  # the share of the measured gap from 1 that the longer context accounts for
        if part > 1.1:
            return (head + f": the longer context predicts more than was measured ({part:.0%} of the gap); the "
                    "forward ran cheaper than its bytes say (what the cache held), so read t(q)/t(1) within this curve")
        if part >= 0.9:
            return head + f": the context explains it (about {part:.0%} of the gap from 1)"
        return (head + f": the context explains about {part:.0%} of the gap from 1; the rest is how far the same "
                "forward timed in two runs here moved (load, what the cache held), so read t(q)/t(1) within this "
                "curve, where every q shared the run")
    return (head + ": the context does not explain the gap; the same forward timed in two runs here moved that much "
            "(load, what the cache held), so read t(q)/t(1) within this curve, where every q shared the run")
