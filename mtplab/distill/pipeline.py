"""Heads for a real model, affordable on two CPU cores: the model's own answers, a trunk cache, training on it.

B batch, T time, C channels (hidden size), V vocabulary, N the draft vocabulary's size.

The pipeline (`python -m mtplab distill`), each stage resumable and saved as it goes into a work folder:

1. `answers`: the model's own questions and greedy answers, imported from the data folder that
   scripts/make_chat_data.py writes (`--data`, default data/chat/MODEL; `stage_import`, through `mtplab.distill.chatdata`),
   as Medusa's self-distillation (Cai et al. 2024, §2.3.2) and FastMTP train heads on the model's own outputs: a head
   is then trained on exactly the text its drafts will be verified against. That script is the one generation loop
   of the training data; nothing here generates it.
   `grow`: a work folder trained on a subset takes the data's other answers as new shards (`stage_grow`), and a
   --resume continues the heads on them; the held-back prompts stay the ones drawn before it grew.
2. `heldout`: the hand-written held-out prompts (never trained on) answered the same way, and their trunk cache:
   what the draft vocabulary's coverage and the heads' held-out agreement are measured on.
3. `cache`: one trunk forward per answered prompt: the last layer's hidden state at every position (bf16) and the
   target's top-k next-token probabilities there. The 30-layer trunk never runs again. Cut short by --max-seconds,
   it has covered every prompt length (shards in `spread` order), and `trim` keeps the answers it reached.
4. `vocab`: the draft vocabulary, the N tokens most frequent in the model's own training answers (EAGLE-3, FR-Spec
   and FastMTP also draft over a frequency-ranked subset; only EAGLE-3 counts its training answers, FR-Spec counts a
   pretraining corpus and FastMTP reuses FR-Spec's), N chosen by measurement: the smallest size tried that holds
   98% of the held-out answers' tokens, with the projection's cost at each size (`stage_vocab`). The projection of
   a draft costs N rows instead of 49,152; the target still verifies over the full vocabulary, so output stays exact.
5. `deepseek`, `stern`: heads trained on the cache (`fit_heads`, on the lab's one loop, saved as one save set) over
   the draft vocabulary, validated on prompts held back from training (`training.heads.held_back`). The ids travel in the
   heads file.
6. `ship`: the heads in bf16, the draft vocabulary and the record into data/hf/MODEL (`ship`), with the shipped
   heads' teacher-forced agreement on held-back and held-out prompts side by side.
"""
from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from pathlib import Path
import torch
from mtplab.errors import MtplabError
from mtplab.files import MAX_JSON, atomic_write_text, json_file
from mtplab.device import machine, now, pick
from mtplab.distill import workfiles as wf
from mtplab.hf.heads_file import load_heads, read_heads_record, save_heads
from mtplab.distill.chatdata import ANSWER_TOKENS, DataWork, decode_rows, spread
from mtplab.hf.prompts import heldout_prompts
from mtplab.hf.real import end_of_turn, real_model, template_ids, REAL_MODELS
from mtplab.training.heads import TRAINED, evaluate_heads, fit_heads
from mtplab.distill.trunkcache import (VAL_ROWS, TrunkCache, Work, check_cached, drawn_rows, fingerprint, heldout_cache,
                                  split, write_cache)
from mtplab.distill.vocab import COVERAGE_GOAL, VOCAB_SIZES, chosen_vocab, load_vocab, stage_vocab
from mtplab.paths import DATA_DIR, may_write_shipped, shipped_folder
from mtplab.training import runs
from mtplab.training.config import default_name, need_int
from mtplab.training.losses import CACHED_LOSSES, sub_vocab_index


def stage_import(target, work: Work, data, *, limit: int | None = None, per_shard: int = 64, log=None) -> int:
    """The answers of a data folder of `mtplab.distill.chatdata` (the model's own questions and greedy answers)
    as this work folder's answer shards: each prompt in the chat template's ids, checked against the length the
    generator recorded. With `limit`, that many answers spread over the data (`chatdata.spread` over its rows, which
    lie in prompt-length order), so a subset a slow machine can cache covers every length and category. Returns the
    rows imported; a folder that already holds all of them is left as it is, one that holds another count (the data
    grew since, or another limit) is refused."""
    rows = [r for d in wf.data_shards(data, "answers", vocab_size=target.config.vocab_size) for r in d["rows"]]
    if not rows:
        raise MtplabError(f"{data} holds no answers; run python scripts/make_chat_data.py {data} --stage answers first")
    if limit is not None and limit < len(rows):
        rows = [rows[i] for i in sorted(spread(len(rows))[:limit])]
    if work.shards("answers"):
        have = sum(len(work.read_answers(s)) for s in work.shards("answers"))
        if have != len(rows):
            raise MtplabError(f"{work.dir / 'answers'} holds {have} answers, {data} now {len(rows)} (--answers); delete "
                              f"{work.dir / 'answers'} and {work.dir / 'cache'} and rerun the answers stage, or add "
                              "the others to the trained ones with --stages grow")
        return 0
    out = [_work_row(target, r, data) for r in rows]
    _write_shards(work, out, 0, per_shard)
    if log:
        log(f"imported {len(out)} answers from {data}")
    return len(out)


def _work_row(target, r: dict, data) -> dict:
    """A data folder's answer as a work folder's row: the prompt in the chat template's ids, checked against the
    length the generator recorded."""
    ids = template_ids(target.tokenizer, r["prompt"])
    if len(ids) != r["prompt_len"]:
        raise MtplabError(f"{data}: the prompt {r['prompt'][:40]!r} is {len(ids)} tokens here, {r['prompt_len']} "
                          "when its answer was generated (another tokenizer or chat template); regenerate the data "
                          "with this model")
    return {"category": r["category"], "prompt_ids": ids, "answer_ids": r["answer_ids"]}


def _write_shards(work: Work, rows: list[dict], first: int, per_shard: int) -> None:
    for b in range(0, len(rows), per_shard):
        atomic_write_text(work.dir / "answers" / f"{first + b // per_shard:05d}.json",
                          json.dumps(rows[b:b + per_shard]) + "\n")


def stage_grow(target, work: Work, data, *, per_shard: int = 64, log=None) -> int:
    """The `grow` stage: a work folder whose heads trained on part of the data takes the rest, so that a --resume
    trains on more prompts. The shards a trim moved out come back, and the data's answers not yet here are imported
    (in the chat template's ids, as `stage_import` does), both numbered after the last shard, so that the rows
    trained on so far stay first. split.json records their count and fingerprint: the held-back prompts stay the
    ones drawn from them (`split`), every new row trains. Then cache (resumable, --max-seconds), trim and --resume.
    Returns the rows added."""
    have = work.answers()
    if not have:
        raise MtplabError(f"{work.dir / 'answers'} holds no answers to grow; run the answers stage first")
    if not os.path.lexists(work.dir / "split.json"):
        work.write_json("split.json", {"rows": len(have), "fingerprint": fingerprint(have)})
    split(work, have)  # a split.json that no longer fits is refused before anything moves
    parked = wf.shards(work.dir / "answers-uncached", suffix=".json")
    last = max(int(p.stem) for p in work.shards("answers") + parked)
    back = sum(len(work.read_answers(p)) for p in parked)
    for i, p in enumerate(parked, start=last + 1):
        os.replace(p, work.dir / "answers" / f"{i:05d}.json")
    seen = {tuple(r["prompt_ids"]) for r in work.answers()}
    new = []
    for r in (r for d in wf.data_shards(data, "answers", vocab_size=target.config.vocab_size) for r in d["rows"]):
        row = _work_row(target, r, data)  # a prompt the template now tokenizes otherwise is refused, as on import
        if tuple(row["prompt_ids"]) not in seen:
            seen.add(tuple(row["prompt_ids"]))
            new.append(row)
    _write_shards(work, new, last + 1 + len(parked), per_shard)
    if log:
        log(f"grow: {len(parked)} trimmed shards back, {len(new)} answers imported from {data}; the held-back "
            f"prompts stay those drawn from the first {len(have)}")
    return back + len(new)


@torch.inference_mode()
def stage_cache(target, work: Work, *, log=None, max_seconds: float | None = None) -> int:
    """One trunk forward per answer shard: hidden (bf16), the target's top-k ids and probabilities, the tokens. The
    shards are taken in `spread` order (the answers lie in prompt-length order), so that a cache cut by `max_seconds`
    covers every length; `keep_cached` then trims the answers to the shards cached."""
    t0 = now()
    done = 0
    answers = {s: work.read_answers(s) for s in work.shards("answers")}  # every shard checked before the first forward
    order = list(answers)
    for shard in (order[i] for i in spread(len(order))):
        rows = answers[shard]
        out = work.dir / "cache" / (shard.stem + ".safetensors")
        if out.exists():
            done += 1
            continue
        if max_seconds is not None and now() - t0 > max_seconds:
            break
        write_cache(out, target, rows)
        done += 1
        if log:
            log(f"cache: shard {shard.stem} ({now() - t0:.0f} s)")
    return done


def keep_cached(work: Work, *, log=None) -> int:
    """The `trim` stage: after a cache cut short by --max-seconds, move the answer shards it did not reach into
    answers-uncached/, so that the vocabulary, the training and the record all see the same (cached) prompts, spread
    over every length. Returns the shards moved."""
    cached = {p.stem for p in work.shards("cache")}
    if not cached:
        raise MtplabError(f"{work.dir / 'cache'} holds no shard: run the cache stage before trim")
    moved = [p for p in work.shards("answers") if p.stem not in cached]
    (work.dir / "answers-uncached").mkdir(exist_ok=True)
    for p in moved:
        os.replace(p, work.dir / "answers-uncached" / p.name)
    if log:
        log(f"trim: {len(moved)} answer shards without a cache moved to answers-uncached/; {len(cached)} kept")
    return len(moved)


# ------------------------------------------------------------------------------------------- held-out prompts
def stage_heldout(target, work: Work, *, max_new: int | None = None, log=None) -> list[dict]:
    """The hand-written held-out prompts (never trained on) with the model's greedy answers, up to its end of turn or
    256 tokens, made as the training answers are (`chatdata.decode_rows`), and their trunk cache: heldout.json and
    heldout.safetensors. The draft vocabulary's coverage and the heads' held-out agreement are measured on them."""
    path, cpath = work.dir / "heldout.json", work.dir / "heldout.safetensors"
    if not os.path.lexists(path):
        held = [(c, p) for c, ps in heldout_prompts().items() for p in ps]
        ids = [template_ids(target.tokenizer, p) for _, p in held]
        tok = target.tokenizer
        new = decode_rows(target.hf, ids, max_new=max_new or ANSWER_TOKENS, stop=end_of_turn(target),
                          pad=tok.pad_token_id if tok.pad_token_id is not None else 0)
        work.write_json("heldout.json", [{"category": c, "prompt_ids": i, "answer_ids": a}
                                         for (c, _), i, a in zip(held, ids, new)])
        if log:
            log(f"held-out: {len(held)} prompts answered, {sum(map(len, new))} tokens")
    rows = work.read_answers(path)
    if not os.path.lexists(cpath):
        write_cache(cpath, target, rows)
    return rows


def stage_heads(target, work: Work, fam: str, recipe: dict, *, steps: int | None = None, log=None,
                cache: TrunkCache | None = None, **fit) -> list[dict]:
    """One family's heads on the cache, with the recipe's options (`steps` overrides its count); the history.
    `cache`: the work folder's cache, when already loaded."""
    opts = {**recipe["heads"][fam], **({"steps": steps} if steps is not None else {})}
    check_cached(work)
    cache = cache or TrunkCache.load(work)
    n = chosen_vocab(work)
    vocab = load_vocab(work, n)
    if log:
        log(f"{fam}: {len(cache.rows)} sequences, {cache.tokens} answer tokens, draft vocabulary {len(vocab)}")
    drawn = drawn_rows(work, work.answers())
    settings = {"heads": fam, "vocab": n, "sequences": len(cache.rows), **opts,
                **({"split_rows": drawn} if drawn else {})}
    with work.timed(fam):
        return fit_heads(target, cache, vocab, heads=fam, out=work.dir, settings=settings, log=log, drawn=drawn,
                         **opts, **fit)


# ------------------------------------------------------------------------------------------- the whole recipe
# the draft vocabulary's size is the vocab stage's measured choice; validation holds VAL_ROWS prompts out
RECIPE = {"vocab": {"sizes": list(VOCAB_SIZES), "goal": COVERAGE_GOAL},
          "heads": {"deepseek": {"n_depths": 2, "steps": 1200, "batch_size": 8, "lr": 1e-3, "unroll": 3,
                                 "val_rows": VAL_ROWS},
                    "stern": {"n_depths": 4, "steps": 1200, "batch_size": 8, "lr": 1e-3, "unroll": 3,
                              "val_rows": VAL_ROWS}}}
# on a GPU the same stages take minutes: more steps, larger batches (same vocabulary)
GPU_RECIPE = {**RECIPE, "heads": {f: {**o, "steps": 4000, "batch_size": 32} for f, o in RECIPE["heads"].items()}}
STAGES = ("answers", "grow", "heldout", "cache", "trim", "vocab", "deepseek", "stern", "ship")


def run_distill(model: str, work_dir, *, stages=STAGES, resume: bool = False, steps: int | None = None, device="cpu",
                max_seconds: float | None = None, log=None, data=None, overwrite: bool = False,
                answers: int | None = None) -> dict:
    """`python -m mtplab distill`: the stages in order, each resumable (a killed run continues with --resume and
    the same options). `answers` imports `data` (default data/chat/MODEL, written by scripts/make_chat_data.py); `ship`
    writes the heads (bf16), the draft vocabulary and the record into data/hf/MODEL. `answers` imports that many of
    the data's answers, spread over it (default all)."""
    from mtplab.hf.target import load_hf
    rm = check_distill_options(model, work_dir, stages, steps, max_seconds)
    if answers is not None and (isinstance(answers, bool) or not isinstance(answers, int) or answers < VAL_ROWS + 8):
        raise MtplabError(f"--answers must be an integer >= {VAL_ROWS + 8}: {VAL_ROWS} prompts are held back for "
                          f"validation (got {answers!r})")
    dev = pick(device)
    work = Work(work_dir)
    target = load_hf(model, device=dev)
    work.limits(target)
    recipe = GPU_RECIPE if dev.type == "cuda" else RECIPE
    data = DATA_DIR / "chat" / rm.name if data is None else data
    t0, cpu0 = now(), time.process_time()
    # the timed stages, in order: each with the clock it adds to in times.json (grow's is the answers') and its run
    timed = {"answers": ("answers", lambda: stage_import(target, work, data, limit=answers, log=log)),
             "grow": ("answers", lambda: stage_grow(target, work, data, log=log)),
             "heldout": ("heldout", lambda: stage_heldout(target, work, log=log)),
             "cache": ("cache", lambda: stage_cache(target, work, max_seconds=max_seconds, log=log))}
    for stage, (clock, run) in timed.items():
        if stage in stages:
            with work.timed(clock):
                run()
    if "trim" in stages:
        keep_cached(work, log=log)
    if "vocab" in stages:
        stage_vocab(target, work, log=log)
    histories = {fam: stage_heads(target, work, fam, recipe, steps=steps, log=log, resume=resume, overwrite=overwrite,
                                  max_seconds=max_seconds) for fam in CACHED_LOSSES if fam in stages}
    if "ship" in stages:
        ship(target, work, rm, log=log, data=data)
    return {"work": str(work.dir), "seconds": now() - t0, "cpu_seconds": time.process_time() - cpu0,
            "histories": histories}


def check_distill_options(model, work_dir, stages, steps, max_seconds):
    """distill's options, each one line before anything runs or is created: known stages (at least one) of a real
    model the lab knows, steps >= 1, a positive finite --max-seconds, and a work folder that is not the lab's data
    folder or what it ships. Returns the real model."""
    bad = [s for s in stages if s not in STAGES]
    if bad or not stages:
        raise MtplabError(f"--stages names {'no stage' if not bad else f'an unknown stage {bad[0]!r}'}; choose among "
                          f"{', '.join(STAGES)}")
    rm = real_model(model)
    if rm is None:
        raise MtplabError(f"distill trains heads for a real model the lab knows: {', '.join(REAL_MODELS)}")
    need_int("--steps", steps, 1, optional=True)
    if max_seconds is not None and (not isinstance(max_seconds, (int, float)) or not math.isfinite(max_seconds)
                                    or max_seconds <= 0):
        raise MtplabError(f"--max-seconds must be a positive number of seconds (got {max_seconds!r})")
    w = Path(work_dir).resolve()
    if w == DATA_DIR.resolve() or shipped_folder(w) is not None:
        raise MtplabError(f"--work {work_dir} is the lab's data folder or inside what it ships; give a work folder "
                          "of your own (e.g. --work runs/distill)")
    return rm


def agreement(target, work: Work, vocab: torch.Tensor, settings: dict, cache: TrunkCache | None = None) -> dict:
    """Teacher-forced agreement by depth of the attached heads with the target's argmax: on the held-back training
    prompts and on the held-out prompts (pooled and by category, first draft), side by side: their gap measures how
    well the training prompts match what people type. `cache`: the work folder's cache, when already loaded."""
    where = sub_vocab_index(vocab.to(target.wte.weight.device), target.config.vocab_size).to(target.wte.weight.device)
    kw = {"unroll": settings.get("unroll", 3)}
    val = split(work, val_rows=settings.get("val_rows", VAL_ROWS), seed=settings.get("seed", 0))[0]
    back = evaluate_heads(target, cache or TrunkCache.load(work), val, where, vocab, **kw)
    rows, held = heldout_cache(work)
    out = evaluate_heads(target, held, list(range(len(rows))), where, vocab, **kw)
    cats = sorted({r["category"] for r in rows})
    by = {c: evaluate_heads(target, held, [i for i, r in enumerate(rows) if r["category"] == c], where, vocab, **kw)[0]
          for c in cats}
    return {"held_back": back, "held_out": out, "held_out_by_category": by, "gap_first_draft": back[0] - out[0],
            "held_back_prompts": len(val), "held_out_prompts": len(rows)}


def ship(target, work: Work, rm, *, log=None, data=None, cache: TrunkCache | None = None) -> None:
    """Write what ships into data/hf/NAME: each trained family's heads in bf16, the draft vocabulary and a record
    of how they were made (tokens, steps, CPU time, the machine, the agreement history, the shipped heads' agreement
    on held-back and held-out prompts, the draft vocabulary study, the data's generation cost)."""
    out = rm.heads_dir
    if not may_write_shipped():
        raise MtplabError(f"ship replaces what the lab ships in {out}; set MTPLAB_WRITE_SHIPPED=1 to do it on purpose")
    trained = [f for f in CACHED_LOSSES if os.path.lexists(runs.paths(work.dir, f)["manifest"])]
    if not trained or not work.shards("answers"):
        raise MtplabError(f"{work.dir} holds {'no trained heads' if not trained else 'no answers'}: nothing to ship; "
                          "run the answers, cache and deepseek or stern stages first")
    prev = read_heads_record(out / "record.json") if os.path.lexists(out / "record.json") else {}
    if target is not None:
        work.limits(target)
    out.mkdir(parents=True, exist_ok=True)
    n = chosen_vocab(work)
    vocab = load_vocab(work, n)
    data = Path(DATA_DIR / "chat" / rm.name if data is None else data)
    dev = target.wte.weight.device if target is not None else torch.device("cpu")  # where the heads were measured
    record = {"model": rm.name, "package": f"{rm.package}=={rm.version}", "gguf_sha256": rm.gguf_sha256,
              "recipe": GPU_RECIPE if dev.type == "cuda" else RECIPE, "machine": machine(dev), "heads": {},
              "draft_vocab": json_file(work.dir / "vocab-study.json", limit=MAX_JSON,
                                          what="the draft vocabulary study", fix=wf.rerun("vocab")),
              "generation": {sub: DataWork(data).costs(sub) for sub in ("questions", "answers")}
              if (data / "answers").is_dir() else {},
              "cpu_and_wall_seconds_by_stage": wf.read_times(work.dir / "times.json")
              if os.path.lexists(work.dir / "times.json") else {}}
    answers = work.answers()
    record["data"] = {"prompts": len(answers), "answer_tokens": sum(len(r["answer_ids"]) for r in answers),
                      "by_category": dict(sorted(Counter(r["category"] for r in answers).items())),
                      "of_generated": {"prompts": sum(len(d["rows"]) for d in wf.data_shards(data, "answers")),
                                       "answer_tokens": record["generation"].get("answers", {}).get("tokens")}
                      if (data / "answers").is_dir() else {}}
    for fam in trained:  # the heads file of the family's save set, with its draft vocabulary, rewritten in bf16
        state = runs.read_manifest(work.dir, fam)
        load_heads(target, runs.paths(work.dir, fam)["weights"])
        name = default_name(fam, target.config.n_depths)  # deepseek-d1, stern-k4
        save_heads(target, out / name, dtype=torch.bfloat16, meta={"trained": TRAINED, "steps": state["step"]})
        load_heads(target, out / f"{name}.safetensors")  # what ships (bf16) is what is measured
        record["heads"][name] = {"steps": state["step"], "settings": state["settings"], "history": state["history"],
                                 "agreement": agreement(target, work, vocab, state["settings"], cache)}
        if log:
            log(f"shipped {out / name}.safetensors")
    cov = json_file(work.dir / f"vocab-{n}.json", limit=MAX_JSON, what="a draft vocabulary",
                       fix=wf.rerun("deepseek"))  # read_vocab checked it above
    atomic_write_text(out / "draft-vocab.json", json.dumps({"n": len(vocab), "coverage": cov.get("coverage", 0.0),
                                                            "ids": vocab.tolist()}) + "\n")
    record["heads"] = {**(prev.get("heads") or {}), **record["heads"]}
    atomic_write_text(out / "record.json", json.dumps(record, indent=1) + "\n")
