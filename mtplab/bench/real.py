"""`bench real`: the real model (SmolLM2-135M-Instruct) with the heads the lab trained on its frozen trunk, on the
hand-written held-out chat prompts, greedy, against AR of the same model (same weights, same kernels), every row at 1
and 2 threads; the study itself is `mtplab.hf.study`, the rows are `GRIDS` here. Writes OUT/real.{json,md}.

    python -m mtplab bench real                      # the informative grid (`GRIDS['default']`)
    python -m mtplab bench real --rows "k; tree"     # other grids, or rows by label, separated by ';'

It prints its estimated time first (`estimate_s`, from the shipped record's own times).
"""
from __future__ import annotations

import sys

import torch
from tqdm.auto import tqdm

from mtplab.bench.report import curve_record, curve_words, _md, _write
from mtplab.decoding.drafters import Pair, real_label, pairs
from mtplab.decoding.generate import decode_with
from mtplab.decoding.trace import pooled
from mtplab.device import machine, pick
from mtplab.errors import MtplabError
from mtplab.hf.prompts import heldout_ids
from mtplab.hf.real import REAL_MODELS, end_of_turn, shipped_heads
from mtplab.measuring.choice import REAL_JSON, STOP_NOTE, heads_sha256
from mtplab.measuring.quality import loop_period
from mtplab.measuring.record import Record
from mtplab.measuring.timing import measure_cost_curve
from mtplab.model import checkpoint, kernels


# the rows are the real model's `PAIRS` rows (`decoding.drafters.pairs(name)`); these are filters of them, by label
QUICK = (real_label("ar", None), real_label("hf-generate", None), real_label("deepseek", 2, "reduced"),
         real_label("deepseek-reuse", 4, "reduced"))
_AR, _DS2 = real_label("ar", None), real_label("deepseek", 2, "reduced")
_STERN4 = real_label("blockwise-overlap", 4, "reduced")
_DS_TREE2 = real_label("deepseek", 2, "reduced", widths=(2,))  # the module's top 2 at depth 1, verified in one forward
_STOPS = (real_label("deepseek-reuse", 4, "reduced", stop=0.3), real_label("deepseek-reuse", 5, "reduced", stop=0.3),
          real_label("blockwise-overlap", 4, "reduced", stop=0.3))  # drafts end at the first below 0.3 confidence
# `bench real --rows NAME`: one comparison each; 'default' is the informative set (one row of each comparison)
GRIDS = {
    "baselines": (_AR, real_label("hf-generate", None), real_label("hf-lookup", 4), real_label("ngram", 4)),
    "vocab": (real_label("deepseek", 2), _DS2, real_label("deepseek-reuse", 4),
              real_label("deepseek-reuse", 4, "reduced"), real_label("blockwise-overlap", 4), _STERN4),
    "k": (real_label("ngram", 3), real_label("ngram", 4), _DS2, real_label("deepseek-reuse", 3, "reduced"),
          real_label("deepseek-reuse", 4, "reduced"), real_label("deepseek-reuse", 5, "reduced"),
          real_label("blockwise-overlap", 2, "reduced"), real_label("blockwise-overlap", 3, "reduced"), _STERN4),
    "kernels": (_AR, real_label("ar", None, kernel="stock"), _DS2, real_label("deepseek", 2, "reduced", kernel="stock")),
    "tree": (real_label("blockwise-overlap", 3, "reduced"), real_label("blockwise-overlap", 3, "reduced", widths=(2, 2)),
             _STERN4, real_label("blockwise-overlap", 4, "reduced", widths=(2, 1, 1)), _DS2, _DS_TREE2,
             real_label("deepseek", 2, "reduced", widths=(3,))),
    "stop": (real_label("deepseek-reuse", 3, "reduced"), real_label("deepseek-reuse", 4, "reduced"), _STERN4, *_STOPS),
    "bf16": (real_label("ar", None, dtype="bf16"), real_label("deepseek-reuse", 4, "reduced", "bf16")),
    "default": (_AR, real_label("hf-generate", None), real_label("hf-lookup", 4), real_label("ngram", 4),
                real_label("deepseek", 2), _DS2, real_label("deepseek-reuse", 3, "reduced"),
                real_label("deepseek-reuse", 4, "reduced"), real_label("deepseek-reuse", 5, "reduced"), *_STOPS, _DS_TREE2,
                real_label("blockwise-overlap", 2, "reduced"), real_label("blockwise-overlap", 3, "reduced"), _STERN4,
                real_label("blockwise-overlap", 4, "reduced", widths=(2, 1, 1)),
                real_label("ar", None, kernel="stock"), real_label("deepseek", 2, "reduced", kernel="stock")),
}


def table(rec: dict) -> str:
    lines = []
    for r in rec["rows"]:
        acc = r.get("acceptance", {}).get("pooled")
        first = f"{acc['rate'][0]:.2f} ({acc['interval'][0][0]:.2f}-{acc['interval'][0][1]:.2f})" if acc else "-"
        sp = r.get("split")
        tpf = r.get("tokens_per_forward")
        lines.append({"row": r["label"], "tokens/forward": f"{tpf:.2f}" if tpf is not None else "-",
                      "vs AR (range)": f"{r['speedup']:.2f}x ({r['speedup_min']:.2f}-{r['speedup_max']:.2f})",
                      "1st draft accepted (95%)": first,
                      "step ms: target / draft / rest": (f"{sp['target_ms']:.0f} / {sp['draft_ms']:.0f} / "
                                                         f"{sp['overhead_ms']:.0f}" if sp else "-"),
                      "= AR": f"{r['identical_to_ar']}/{r['prompts']}",
                      "= generate": f"{r.get('identical_to_generate', '-')}/{r['prompts']}"})
    cols = list(lines[0]) if lines else []
    return _md(lines, cols)


REAL = next(iter(REAL_MODELS))  # the real model bench real measures by default


def cost_curves(target, threads: list[int], *, quick: bool) -> dict:
    """t(q)/t(1) of the real model beside the classroom model (ntp, 12 x 256), at each thread count, with the exact
    kernels (the default) and the stock ones: the regime on a model no laptop cache holds, against one that a large
    cache does."""
    classroom = checkpoint.load("ntp")
    qs, reps = ((1, 2, 4), 3) if quick else ((1, 2, 4, 8), 7)
    out: dict = {}
    saved = torch.get_num_threads()
    try:
        for n in threads:
            torch.set_num_threads(n)
            for name, model in ((REAL, target), (f"{REAL}, stock kernels", target), ("ntp", classroom),
                                ("ntp, stock kernels", classroom)):
                if model is target:  # stock: transformers' forward, the old path; exact: the lab's (the default)
                    target.use_kernel("stock" if "stock" in name else "exact")
                with kernels.use_stock("stock" in name):
                    c = measure_cost_curve(model, qs, context=128, repeats=reps)
                out.setdefault(str(n), {})[name] = curve_record(c)
    finally:
        torch.set_num_threads(saved)
        target.use_kernel("exact")
    return out


ROUNDS = {1: 3, 2: 2}  # interleaved rounds of the race at each thread count (--quick: 2 at one thread)


def estimate_s(rows, prompts: int, rounds: dict, *, acceptance_decodes: int, m: int = 128,
               record=None) -> float | None:
    """Seconds a `bench real` run should take, from the shipped record's own times (its AR milliseconds per token,
    answer tokens per prompt, and each row's speedup where it measured the row; a row it did not measure is counted as
    AR; answers cut at m new tokens scaled from the record's m): the races, their warm-ups, the untimed acceptance
    study and the cost curves. None without a record."""
    path = REAL_JSON if record is None else record
    try:
        rec = Record.load(path)
        per = rec["threads"]
    except (MtplabError, KeyError):
        return None
    total = 60.0  # the cost curves, 4 models x 4 q, at each thread count (measured: about a minute in all)
    for n, r in rounds.items():
        t = per.get(str(n)) or per.get("1")
        ar_s = t["ar_ms_per_token"] / 1e3 * t["answer_tokens"] / max(1, t["prompts"])  # one AR decode
        ar_s *= min(1.0, m / max(1, rec.get("m") or m))
        for row in rows:
            old = rec.row(label=row.label, threads=n) or rec.row(label=row.label, threads=1)
            speed = old["speedup"] if old and old.get("speedup") else 1.0
            total += ar_s / speed * (prompts * r + 1)  # + its warm-up
        if n == 1:
            total += ar_s * acceptance_decodes
    return total


def run_real(a) -> dict:
    """bench real: the study at each thread count asked for, written to OUT/real.{json,md}."""
    from mtplab.hf.study import load_heads_all  # transformers
    per_cat = a.prompts if a.prompts is not None else 1
    if isinstance(per_cat, bool) or not isinstance(per_cat, int) or not 1 <= per_cat <= 4:
        raise MtplabError(f"--prompts is held-out prompts per category for bench real, 1..4 (got {per_cat})")
    if a.dtype != "fp32":
        raise MtplabError("bench real runs the target in fp32 (the exact default); drop --dtype")
    m = 32 if a.quick else 128
    rounds = {1: 2} if a.quick else dict(ROUNDS)
    heads = load_heads_all(a.hf or REAL, pick(a.device))
    prompts, cats = heldout_ids(heads.target, per_cat)
    rows = pick_rows(heads, getattr(a, "rows", None), a.quick)
    every, every_cats = heldout_ids(heads.target)  # every held-out prompt, untimed
    if a.quick:
        every, every_cats = every[:6], every_cats[:6]
    est = estimate_s(rows, len(prompts), rounds, acceptance_decodes=len(every) * (1 + len(ACCEPTANCE_ROWS)), m=m)
    tqdm.write(f"bench real: {len(rows)} rows x {len(prompts)} prompts, "
               + ", ".join(f"{r} rounds at {n} thread{'s' if n > 1 else ''}" for n, r in rounds.items())
               + f", m = {m}; " + (f"about {est / 60:.0f} minutes on the machine of the shipped record"
                                   if est is not None else "no shipped record to estimate the time from"),
               file=sys.stderr)
    studies = races(heads, rows, prompts, cats, m=m, rounds=rounds)
    name = a.hf or REAL
    rec = {"model": name, "m": m, "prompts_per_category": per_cat, "kernel_status": kernels.status(),
           "threads": {n: {k: v for k, v in s.items() if k != "rows"} for n, s in studies.items()},
           "rows": flat_rows(name, studies),
           "acceptance_all": acceptance_study(heads, every, every_cats, m=m,
                                              bar=tqdm(desc="acceptance, every held-out prompt", unit="decode")),
           "machine": machine(pick(a.device)), "estimated_s": est,
           "cost_curves": cost_curves(heads.target, list(rounds), quick=a.quick)}
    _write(a.out, "real-quick" if a.quick else "real", rec, markdown(rec, studies), device=pick(a.device))
    return rec


def pick_rows(heads, only: str | None, quick: bool) -> list[Pair]:
    """The rows to race: `only` names grids (`GRIDS`) and labels, separated by ';' (AR always comes first); None:
    the 'default' grid, or `QUICK` with quick. Rows whose heads or draft vocabulary the model lacks are left out."""
    every = pairs(REAL)
    rows = [r for r in every if r.family is None or r.family in heads.families]
    rows = [r for r in rows if r.draft_vocab == "full" or heads.vocab is not None]
    want = [s.strip() for s in only.split(";") if s.strip()] if only else ["quick" if quick else "default"]
    labels = {r.label for r in every}
    bad = [w for w in want if w not in labels and w not in GRIDS and w not in ("all", "quick")]
    if bad:
        raise MtplabError(f"no bench real row named {bad[0]!r}; choose grids ({', '.join([*GRIDS, 'all', 'quick'])}) "
                          f"or rows among: {'; '.join(r.label for r in every)}")
    chosen = {lab for w in want for lab in ({w} if w in labels else labels if w == "all" else
                                            set(QUICK) if w == "quick" else set(GRIDS[w]))}
    return [r for r in rows if r.label in chosen or r.label == "AR"]


ACCEPTANCE_ROWS = (real_label("deepseek", 2, "reduced"), real_label("deepseek-reuse", 4, "reduced"))


def acceptance_study(heads, prompts: list[list[int]], cats: list[str], *, m: int,
                     labels=ACCEPTANCE_ROWS, bar=None) -> dict:
    """Untimed: each row decoded once on every prompt, for acceptance by position (pooled and per category, with
    intervals), the looping count and exactness on more prompts than a timed race can afford."""
    from mtplab.hf.study import acceptance_table, lab_decode, rejections_outside  # transformers
    by = {r.label: r for r in pairs(REAL)}
    stop = end_of_turn(heads.target)  # acceptance on the answer only
    ars = [decode_with("ar", heads.use(None, "full"), p, max_new_tokens=m, stop=stop).tokens for p in prompts]
    out = {}
    for label in labels:
        r = by[label]
        if r.family is not None and r.family not in heads.families:
            continue
        traces, same = [], 0
        for p, ar in zip(prompts, ars):
            tr = lab_decode(r, heads.use(r.family, r.draft_vocab), p, m=m, stop=stop)  # the row as raced
            traces.append(tr)
            same += tr.tokens == ar
            if bar is not None:
                bar.update(1)
        outside, rejections = rejections_outside(traces, heads.vocab if r.draft_vocab == "reduced" else None)
        out[label] = {"acceptance": acceptance_table(traces, cats), "prompts": len(prompts), "identical_to_ar": same,
                      "rejections": rejections, "rejected_outside_vocab": outside,
                      "looping": sum(loop_period(t.tokens) is not None for t in traces),
                      "tokens_per_forward": pooled(traces).tokens_per_forward}
    return out


def races(heads, rows, prompts, cats, *, m: int, rounds: dict) -> dict:
    """The study (`hf.study.study`) of every row at each thread count, with `rounds[threads]` interleaved rounds."""
    from mtplab.hf.study import study
    saved = torch.get_num_threads()
    studies = {}
    try:
        for n, r in rounds.items():
            torch.set_num_threads(n)
            with tqdm(total=len(rows) * len(prompts) * r, desc=f"bench real, {n} thread(s)", unit="decode") as bar:
                studies[str(n)] = study(heads, prompts, cats, rows=rows, m=m, rounds=r, bar=bar)
    finally:
        torch.set_num_threads(saved)
    return studies


def flat_rows(name: str, studies: dict) -> list[dict]:
    """One list of rows, each with its thread count, the model, and the heads file it decoded with, by name and by
    sha256 (`measuring.choice.choose_k` takes a default k only from rows of the heads that are loaded): Record.row(...,
    threads=1) finds a row."""
    files = {f: shipped_heads(name, f) for f in ("deepseek", "stern")}
    sums = {f: heads_sha256(p) for f, p in files.items()}
    return [{**r, "threads": int(n), "model": name,
             "checkpoint": files[r["family"]].stem if files.get(r.get("family")) else None,
             "heads_sha256": sums.get(r.get("family"))} for n, s in studies.items() for r in s["rows"]]


def markdown(rec: dict, studies: dict) -> str:
    md = "\n\n".join(f"### {n} thread{'s' if n != '1' else ''}\n\n{table(s)}\n\n{s['verdict']}"
                      + ("\n\n" + STOP_NOTE if any(r.get("adapt") == "confidence" for r in s["rows"]) else "")
                      for n, s in studies.items())
    return md + "\n\n### t(q)/t(1)\n\n" + "\n".join(
        f"- {n} thread(s), {name}: {curve_words(c)}" for n, d in rec["cost_curves"].items() for name, c in d.items())
