"""Where a Llama-family model's one-token forward time goes, and what a verify over q rows costs against it.

    python -m tools.forward_times                       # SmolLM2, 1 thread, 200 cached tokens, q = 1, 2, 4, 8
    python -m tools.forward_times --threads 2 --rounds 9 --json out.json
    python -m tools.forward_times --qs 2 4 8 16 --rounds 3 --reps 3  # a quicker look, and q = 16

Three forwards of the same model, timed in interleaved rounds (each round times every forward at every q, in a
rotated order, so that a slow spell of the machine falls on all of them):
* transformers: transformers' forward (its default attention) with its stock kernels, the old path (kernel='stock');
* lab, exact: the lab's forward (`mtplab.model.llama`) with the exact kernel, the default;
* lab, stock: the lab's forward with F.linear (`kernels.use_stock()`): what the kernel alone changes.
Each t(q) is the median of `--reps` forwards over q new tokens after P cached ones (the cache is cropped back after
each); a round's ratio t(q)/t(1) is taken within the round. Printed: the median over rounds and its range, the
targets of issue 37 (t(4)/t(1) <= 1.15, t(8)/t(1) <= 1.3, exact t(1) no slower than stock t(1)), the split of the
lab's exact t(1) into linears, attention rows and the rest, and the machine. Run it on an idle machine: numbers
taken while other work holds the cores are for development only.
"""
from __future__ import annotations

import argparse
import json
import statistics
from contextlib import nullcontext
from pathlib import Path

import torch

from mtplab.device import machine, machine_words, now
from mtplab.files import atomic_write_text
from mtplab.model import llama
from mtplab.paths import REAL_NAMES
from mtplab.hf.target import load_hf
from mtplab.model import attend, kernels

FORWARDS = ("transformers", "lab, exact", "lab, stock")
TARGETS = {4: 1.15, 8: 1.3}  # issue 37: whole-forward t(q)/t(1) with the exact kernel at most this


def _setup(target, name: str):
    """(the target with its kernel, the context the forward runs in) for one of FORWARDS."""
    target.use_kernel("stock" if name == "transformers" else "exact")
    return target, kernels.use_stock() if name == "lab, stock" else nullcontext()


def time_forward(target, name: str, ids: torch.Tensor, q: int, reps: int, P: int) -> float:
    """Median seconds of one forward over q new tokens after P cached tokens (the first P of ids)."""
    target, ctx = _setup(target, name)
    with ctx, torch.inference_mode():
        cache = target.new_cache()
        target(ids[:, :P], cache)
        new = ids[:, P:P + q]
        target(new, cache)  # warm-up: kernels compiled, weights packed, caches touched
        cache.crop(P)
        times = []
        for _ in range(reps):
            t0 = now()
            target(new, cache)
            times.append(now() - t0)
            cache.crop(P)
    return statistics.median(times)


def split_one_token(target, ids: torch.Tensor, reps: int, P: int) -> dict:
    """Seconds of the lab's exact one-token forward in kernels.linear, kernels.rms_norm, attention rows, the rest."""
    spent = {"linear": 0.0, "norm": 0.0, "attention": 0.0}

    def timed(part, f):
        def wrapped(*a, **kw):
            t0 = now()
            try:
                return f(*a, **kw)
            finally:
                spent[part] += now() - t0
        return wrapped

    target.use_kernel("exact")
    lin, norm, att, rows = kernels.linear, kernels.rms_norm, llama.attend_row, attend.attend
    with torch.inference_mode():
        cache = target.new_cache()
        target(ids[:, :P], cache)
        kernels.linear, kernels.rms_norm = timed("linear", lin), timed("norm", norm)
        llama.attend_row, attend.attend = timed("attention", att), timed("attention", rows)
        try:
            runs = []
            for _ in range(reps):
                spent.update(linear=0.0, norm=0.0, attention=0.0)
                t0 = now()
                target(ids[:, P:P + 1], cache)
                runs.append((now() - t0, dict(spent)))
                cache.crop(P)
        finally:
            kernels.linear, kernels.rms_norm, llama.attend_row, attend.attend = lin, norm, att, rows
    t, parts = sorted(runs, key=lambda r: r[0])[len(runs) // 2]  # the median repetition, with its parts
    return {"total_s": t, **{f"{k}_s": v for k, v in parts.items()}, "rest_s": t - sum(parts.values())}


def measure(model: str = REAL_NAMES[0], *, threads: int = 1, P: int = 200, qs=(1, 2, 4, 8), rounds: int = 7,
            reps: int = 5, seed: int = 0, forwards=FORWARDS) -> dict:
    torch.set_num_threads(threads)
    target = load_hf(model)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(target.config.vocab_size, (1, P + max(qs)), generator=g)
    pairs = [(name, q) for name in forwards for q in qs]
    runs: dict = {f"{name} t({q})": [] for name, q in pairs}
    for r in range(rounds):
        for name, q in pairs[r % len(pairs):] + pairs[:r % len(pairs)]:  # rotated: no forward always goes first
            runs[f"{name} t({q})"].append(time_forward(target, name, ids, q, reps, P))
    rows = {}
    for name in forwards:
        for q in qs:
            xs = runs[f"{name} t({q})"]
            rows[f"{name} t({q}) ms"] = _summary([x * 1e3 for x in xs])
            if q != qs[0]:
                ratios = [x / one for x, one in zip(xs, runs[f"{name} t({qs[0]})"])]
                rows[f"{name} t({q})/t({qs[0]})"] = _summary(ratios)
    if {"lab, exact", "lab, stock"} <= set(forwards):
        exact_vs_stock = [e / s for e, s in zip(runs[f"lab, exact t({qs[0]})"], runs[f"lab, stock t({qs[0]})"])]
        rows[f"lab exact t({qs[0]}) / lab stock t({qs[0]})"] = _summary(exact_vs_stock)
    return {"model": model, "cached": P, "threads": threads, "rounds": rounds, "reps": reps,
            "kernel": kernels.status(), "rows": rows, "split": split_one_token(target, ids, reps, P),
            "machine": machine()}


def _summary(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def report(res: dict) -> str:
    lines = [f"{res['model']}, {res['cached']} cached tokens, {res['threads']} thread(s), {res['rounds']} interleaved "
             f"rounds of {res['reps']} forwards; {res['kernel']}"]
    for k, s in res["rows"].items():
        lines.append(f"  {k:<40} {s['median']:8.3f}   range {s['min']:.3f}-{s['max']:.3f}")
    for q, limit in TARGETS.items():
        s = res["rows"].get(f"lab, exact t({q})/t(1)")
        if s:
            lines.append(f"  target t({q})/t(1) <= {limit}: {'met' if s['median'] <= limit else 'NOT met'} "
                         f"(median {s['median']:.3f})")
    s = res["rows"].get("lab exact t(1) / lab stock t(1)")
    if s:
        lines.append(f"  target exact t(1) <= stock t(1): {'met' if s['median'] <= 1 else 'NOT met'} "
                     f"(median {s['median']:.3f})")
    sp = res["split"]
    lines.append(f"  lab exact t(1) = {sp['total_s'] * 1e3:.2f} ms: linears {sp['linear_s'] * 1e3:.2f}, norms "
                 f"{sp['norm_s'] * 1e3:.2f}, attention rows {sp['attention_s'] * 1e3:.2f}, the rest "
                 f"{sp['rest_s'] * 1e3:.2f} (embedding, RoPE, cache writes, Python, the timers' own overhead)")
    lines.append(f"  {machine_words(res['machine'])}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.forward_times", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=REAL_NAMES[0], help=f"a Llama-family model folder or {REAL_NAMES[0]}")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cached", type=int, default=200, help="tokens in the cache before the timed forward")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=5, help="forwards per timing (their median is the timing)")
    ap.add_argument("--qs", type=int, nargs="+", default=[1, 2, 4, 8], help="new tokens per timed forward (1 is added)")
    ap.add_argument("--forwards", nargs="+", choices=FORWARDS, default=list(FORWARDS),
                    help="which forwards to time (quote each: 'lab, exact')")
    ap.add_argument("--json", type=Path, help="also write the result here")
    a = ap.parse_args(argv)
    qs = tuple(sorted(set(a.qs) | {1}))
    res = measure(a.model, threads=a.threads, P=a.cached, qs=qs, rounds=a.rounds, reps=a.reps, forwards=tuple(a.forwards))
    print(report(res))
    if a.json:
        atomic_write_text(a.json, json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
