"""`bench real`: the real model (SmolLM2-135M-Instruct) with the heads the lab trained on its frozen trunk, on the
hand-written held-out chat prompts, greedy, against AR of the same model (same weights, same kernels), at 1 and 2
threads; the study itself is `mtplab.hf.study`. Writes OUT/real.{json,md}.
"""
from __future__ import annotations

import torch
from tqdm.auto import tqdm

from mtplab.bench.report import _md, _write
from mtplab.device import machine, pick
from mtplab.errors import MtplabError
from mtplab.hf.prompts import heldout_prompts
from mtplab.hf.real import REAL_MODELS, chat_ids, shipped_heads
from mtplab.measuring.timing import measure_cost_curve
from mtplab.model import checkpoint, kernels


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
                out.setdefault(str(n), {})[name] = {"t1_ms": 1e3 * c.seconds[1],
                                                    "ratio": {str(q): r for q, r in c.ratio.items()}}
    finally:
        torch.set_num_threads(saved)
        target.use_kernel("exact")
    return out


def run_real(a) -> dict:
    """bench real: the study at each thread count asked for, written to OUT/real.{json,md}."""
    from mtplab.hf.study import QUICK, acceptance_study, load_heads_all, pick_rows, study
    per_cat = a.prompts if a.prompts is not None else 1
    if isinstance(per_cat, bool) or not isinstance(per_cat, int) or not 1 <= per_cat <= 4:
        raise MtplabError(f"--prompts is held-out prompts per category for bench real, 1..4 (got {per_cat})")
    if a.dtype != "fp32":
        raise MtplabError("bench real runs the target in fp32 (the exact default); drop --dtype")
    m = 32 if a.quick else 128
    rounds = 2 if a.quick else 3
    heads = load_heads_all(a.hf or REAL, pick(a.device))
    held = heldout_prompts()
    cats = [c for c in held for _ in range(per_cat)]
    prompts = [chat_ids(heads.target, p) for c in held for p in held[c][:per_cat]]
    rows = pick_rows(heads, getattr(a, "rows", None), a.quick)
    threads = [1] if a.quick else [1, 2]
    saved = torch.get_num_threads()
    studies = {}
    try:
        for n in threads:
            torch.set_num_threads(n)
            use = rows if n == 1 else [r for r in rows if r.label in QUICK or r.label == "AR"]
            r = rounds if n == 1 else min(rounds, 2)
            with tqdm(total=len(use) * len(prompts) * r, desc=f"bench real, {n} thread(s)", unit="decode") as bar:
                studies[str(n)] = study(heads, prompts, cats, rows=use, m=m, rounds=r, bar=bar)
    finally:
        torch.set_num_threads(saved)
    every = [chat_ids(heads.target, p) for c in held for p in held[c]]  # every held-out prompt, untimed
    every_cats = [c for c in held for _ in held[c]]
    torch.set_num_threads(saved)
    name = a.hf or REAL
    heads_of = {f: (p.stem if (p := shipped_heads(name, f)) is not None else None) for f in ("deepseek", "stern")}
    flat_rows = [{**r, "threads": int(n), "model": name, "checkpoint": heads_of.get(r.get("family"))}
                 for n, s in studies.items() for r in s["rows"]]  # one list: Record.row(..., threads=1) finds a row
    rec = {"model": name, "m": m, "prompts_per_category": per_cat,
           "threads": {n: {k: v for k, v in s.items() if k != "rows"} for n, s in studies.items()}, "rows": flat_rows,
           "acceptance_all": acceptance_study(heads, every[:6] if a.quick else every, every_cats[:6] if a.quick
                                              else every_cats, m=m,
                                              bar=tqdm(desc="acceptance, every held-out prompt", unit="decode")),
           "machine": machine(pick(a.device)), "cost_curves": cost_curves(heads.target, threads, quick=a.quick)}
    md = "\n\n".join(f"### {n} thread{'s' if n != '1' else ''}\n\n{table(s)}\n\n{s['verdict']}"
                     for n, s in studies.items())
    md += "\n\n### t(q)/t(1)\n\n" + "\n".join(
        f"- {n} thread(s), {name}: t(1) = {c['t1_ms']:.1f} ms, " + ", ".join(f"t({q})/t(1) = {r:.2f}"
                                                                         for q, r in c["ratio"].items() if q != "1")
        for n, d in rec["cost_curves"].items() for name, c in d.items())
    name = "real-quick" if a.quick else "real"
    _write(a.out, name, rec, md, device=pick(a.device))
    return rec
