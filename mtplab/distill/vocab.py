"""The draft vocabulary of a real model's heads, chosen by measurement (the distillation's `vocab` stage): the N
tokens most frequent in the model's own training answers, N the smallest size tried that holds the goal's share of
the held-out answers' tokens, with the projection's cost at each size.

N the draft vocabulary's size, V the model's.
"""
from __future__ import annotations

import os
from collections import Counter
import torch
from mtplab.decoding.generate import decode_with
from mtplab.decoding.trace import pooled
from mtplab.device import machine, now
from mtplab.errors import MtplabError
from mtplab.distill import workfiles as wf
from mtplab.files import MAX_JSON, json_file
from mtplab.hf.heads_file import read_vocab
from mtplab.distill.trunkcache import VAL_ROWS, Work, check_cached, heldout_cache, split
from mtplab.measuring.race import LoadMeter, busy_reason, race
from mtplab.model import kernels

VOCAB_SIZES = (4096, 8192, 12288, 16384, 24576, 32768)   # the draft vocabulary's sizes the vocab stage measures
COVERAGE_GOAL = 0.98       # share of held-out answer tokens the chosen draft vocabulary must hold
DECODE_SIZES = (4096, 6144, 8192, 12288)  # the trained vocabulary's most frequent tokens that `decode_sizes` races
RULE = ("the largest size whose speedup range reaches the range of the highest median (the race cannot rank those, "
        "and the largest loses the fewest drafts)")


def token_counts(rows) -> Counter:
    return Counter(t for r in rows for t in r["answer_ids"])


def by_count(work: Work, val_rows: int = VAL_ROWS) -> list[int]:
    """Token ids by their count in the training answers (the held-back prompts' answers are not counted) and in the
    answers a cut cache did not reach (`trim`: never trained on, but the model's own text all the same), ties by id."""
    rows = work.answers()
    counts = token_counts(rows[i] for i in split(work, rows, val_rows=val_rows)[1])
    counts.update(token_counts(r for p in wf.shards(work.dir / "answers-uncached", suffix=".json")
                          for r in work.read_answers(p)))
    return sorted(counts, key=lambda t: (-counts[t], t))


def coverage(counts: Counter, keep) -> float:
    """The share of the counted tokens that lie inside `keep`."""
    keep = set(keep)
    return sum(c for t, c in counts.items() if t in keep) / max(1, sum(counts.values()))


def projection_ms(target, n: int, *, repeats: int = 25) -> float:
    """Median milliseconds of one row's projection onto n rows of the output matrix, on the kernel decoding uses."""
    W = target.lm_head.weight.detach()[:n].float().cpu().contiguous()  # drafts are projected on the CPU
    x = torch.randn(1, W.shape[1])
    times = []
    for i in range(repeats + 3):
        t0 = now()
        kernels.linear(x, W)
        if i >= 3:
            times.append(now() - t0)
    return 1e3 * sorted(times)[len(times) // 2]


def stage_vocab(target, work: Work, *, sizes=VOCAB_SIZES, goal: float = COVERAGE_GOAL, log=None) -> dict:
    """The draft vocabulary's size, chosen by measurement: at each size, the share of the held-back prompts' and of
    the held-out prompts' answer tokens inside it, and the projection's cost for one row on this machine (run it
    alone). Sizes are capped at the distinct tokens counted. The smallest size whose held-out coverage reaches `goal`
    is chosen (else the largest, every token counted): vocab-study.json and vocab-N.json."""
    check_cached(work)
    V = target.config.vocab_size
    ranked, rows = by_count(work), work.answers()
    back = token_counts(rows[i] for i in split(work, rows)[0])
    out = token_counts(heldout_cache(work)[0])
    meter = LoadMeter().start()  # the busy-machine guard over the timings
    study = {"goal": goal, "rule": "the smallest size whose coverage of held-out answer tokens reaches the goal, "
                                   "else every token counted",
             "machine": machine("cpu"), "full_projection_ms": projection_ms(target, V), "sizes": []}
    for n in sorted({min(n, V, len(ranked)) for n in sizes}):
        keep = ranked[:n]
        study["sizes"].append({"size": n, "distinct_in_training": min(n, len(ranked)),
                               "coverage_held_back": coverage(back, keep), "coverage_held_out": coverage(out, keep),
                               "projection_ms": projection_ms(target, n)})
        if log:
            log("vocab {size}: held-back {coverage_held_back:.4f}, held-out {coverage_held_out:.4f}, "
                "{projection_ms:.2f} ms".format(**study["sizes"][-1]))
    study["busy"] = busy_reason(meter.stop(), None)  # None: the projection times hold for this machine
    if study["busy"] and log:
        log(f"vocab: the projection times are not valid: {study['busy']}")
    good = [r["size"] for r in study["sizes"] if r["coverage_held_out"] >= goal]
    study["chosen"] = good[0] if good else study["sizes"][-1]["size"]
    load_vocab(work, study["chosen"], again=True)
    work.write_json("vocab-study.json", study)
    return study


def chosen_vocab(work: Work) -> int:
    """The draft vocabulary's size the vocab stage chose."""
    path = work.dir / "vocab-study.json"
    if not os.path.lexists(path):
        raise MtplabError(f"{work.dir} has no draft vocabulary chosen yet; run the vocab stage first (--stages vocab)")
    n = json_file(path, limit=MAX_JSON, what="the draft vocabulary study", fix=wf.rerun("vocab"))
    n = n.get("chosen") if isinstance(n, dict) else None
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= work.V:
        raise MtplabError(f"{path} names no draft vocabulary size in 1..{work.V}; {wf.rerun('vocab')}")
    return n


def load_vocab(work: Work, n: int, *, again: bool = False) -> torch.Tensor:
    """The draft vocabulary of size n: the n token ids most frequent in the model's own training answers (`by_count`),
    sorted by id; computed once (`again`: anew) and kept in the work folder with its coverage of the held-back
    prompts' answer tokens."""
    name = f"vocab-{n}.json"
    if os.path.lexists(work.dir / name) and not again:
        return torch.tensor(read_vocab(work.dir / name, vocab_size=work.V), dtype=torch.long)
    ids = sorted(by_count(work)[:n])
    rows = work.answers()
    back = token_counts(rows[i] for i in split(work, rows)[0])  # the held-back prompts' answer tokens
    work.write_json(name, {"n": len(ids), "ids": ids, "coverage": coverage(back, ids)})
    return torch.tensor(ids, dtype=torch.long)


def decode_sizes(target, prompts, counts: Counter, *, sizes=DECODE_SIZES, method: str = "deepseek-reuse", k: int = 4,
                 m: int = 128, rounds: int = 3, stop: int | None = None, held_out: Counter | None = None,
                 bar=None) -> dict:
    """The draft vocabulary's size chosen by decoding, after training: the heads' own vocabulary (`target.draft_vocab`,
    the one they were trained over) and its `sizes` most frequent tokens by `counts` (ties by id), each decoding
    `prompts` with `method` at k (m new tokens, ending at `stop`), raced against AR the lab's way (`measuring.race`:
    interleaved rounds, the busy guard). A smaller vocabulary projects each draft onto fewer rows (cheaper drafts)
    and cannot draft the tokens it left out (fewer accepted): the race weighs both. Per size: the speedup (median
    and range over rounds), whether every output equals AR's, tokens per target forward, first-draft acceptance and
    the drafter's milliseconds per draft (first round), and the share of AR's answer tokens (first round) inside it,
    and of `held_out`'s (token counts of other answers, e.g. the held-out prompts') where given.
    `chosen` (`RULE`): of the sizes whose range reaches the range of the highest median (the race cannot rank them),
    the largest, which loses the fewest drafts; `ids`: its token ids."""
    trained = target.draft_vocab
    if trained is None:
        raise MtplabError("these heads carry no draft vocabulary to shrink; load heads saved with one (load_heads)")
    ranked = sorted(trained.tolist(), key=lambda t: (-counts[t], t))
    vocabs = {n: torch.tensor(sorted(ranked[:n])) for n in sorted({min(n, len(ranked)) for n in (*sizes, len(ranked))})}

    def decoder(ids):
        def run(p):
            target._use_draft_vocab(ids)  # its rows are kept (`_use_draft_vocab`): switching costs no gather
            return decode_with(method, target, p, max_new_tokens=m, k=k, stop=stop)
        return run

    try:
        res = race({"AR": lambda p: decode_with("ar", target, p, max_new_tokens=m, stop=stop),
                    **{str(n): decoder(ids) for n, ids in vocabs.items()}}, prompts, baseline="AR", rounds=rounds,
                   device=target.wte.weight.device, bar=bar)
    finally:
        target._use_draft_vocab(trained)
    answers = Counter(t for out in res.outputs["AR"] for t in out.tokens)
    rows = []
    for n, ids in vocabs.items():
        one = pooled(res.outputs[str(n)])
        rows.append({"size": n, **{f: res.row(str(n))[f] for f in ("speedup", "speedup_min", "speedup_max", "identical")},
                     "tokens_per_forward": one.tokens_per_forward,
                     "first_draft_acceptance": one.acceptance_rate_per_position[0],
                     "ms_per_draft": 1e3 * sum(s.draft_s for s in one.steps if not s.prefill) / max(1, one.draft_forwards),
                     "coverage_of_ar_answers": coverage(answers, ids.tolist()),
                     **({} if held_out is None else {"coverage_held_out": coverage(held_out, ids.tolist())})})
    best = max(rows, key=lambda r: r["speedup"])
    chosen = max(r["size"] for r in rows if r["speedup_max"] >= best["speedup_min"])
    return {"method": method, "k": k, "m": m, "rounds": rounds, "prompts": len(prompts), "machine": res.machine,
            "busy": res.busy, "trained_size": len(ranked), "rule": RULE, "sizes": rows, "chosen": chosen,
            "ids": vocabs[chosen].tolist()}
