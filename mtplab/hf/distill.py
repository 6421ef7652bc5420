"""Heads for a real model, affordable on two CPU cores: self-distillation data, a trunk cache, training on it.

B batch, T time, C channels (hidden size), V vocabulary, N the draft vocabulary's size.

The pipeline (`python -m mtplab distill`), each stage resumable and saved as it goes into a work folder:

1. `prompts`: training prompts (`mtplab.hf.prompts`), none of them a held-out prompt. Two sources: the model's own questions,
   Magpie-style (Xu et al. 2024: an aligned model given only the start of a user turn writes the question), and
   task templates over topic lists and passages of the shipped corpora, one per held-out category.
2. `answers`: the model's own greedy answers (batched `generate`), as Medusa's self-distillation (Cai et al. 2024,
   §2.3.2) and FastMTP train heads on the model's own outputs: a head is then trained on exactly the text its drafts
   will be verified against. With --data, the answers of an `mtplab.hf.chatdata` folder instead (`stage_import`).
3. `cache`: one trunk forward per answered prompt: the last layer's hidden state at every position (bf16) and the
   target's top-k next-token probabilities there. The 30-layer trunk never runs again.
4. `train`: heads trained for many epochs on the cache (`fit_heads`, on the lab's one loop, saved as one save set),
   over the draft vocabulary: the N tokens most frequent in the model's own answers (EAGLE-3, FR-Spec and FastMTP
   also draft over a frequency-ranked subset; only EAGLE-3 counts its training answers, FR-Spec counts a pretraining
   corpus and FastMTP reuses FR-Spec's). The projection of a draft costs N rows instead of 49,152; the target still
   verifies over the full vocabulary, so output stays exact. The ids travel in the heads file (`save_heads`).
"""
from __future__ import annotations

import json
import math
import os
import random
import time
from contextlib import contextmanager
from pathlib import Path
import torch
from mtplab.errors import MtplabError
from mtplab.files import atomic_write, atomic_write_text, read_json
from mtplab.device import machine, now, pick
from mtplab.hf import workfiles as wf
from mtplab.hf.prompts import heldout_prompts, template_prompts  # also what hf/chatdata, bench/real, teaching/real read
from mtplab.hf.real import REAL_MODELS, real_model
from mtplab.hf.run import fit_heads
from mtplab.paths import DATA_DIR, may_write_shipped, shipped_folder
from mtplab.training import runs
from mtplab.training.config import default_name
from mtplab.training.losses import CACHED_LOSSES

TOPK = 8  # target probabilities kept per position in the cache

# ------------------------------------------------------------------------------------------- generation
def _chat(tok, prompt: str | None) -> list[int]:
    """The chat template's ids for one user turn with the generation prompt, or (prompt=None) only the start of a
    user turn, as Magpie gives it."""
    if prompt is None:
        full = tok.apply_chat_template([{"role": "user", "content": "X"}], tokenize=False, add_generation_prompt=False)
        head = full[:full.rindex("X")]
        return tok.encode(head, add_special_tokens=False)
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=True, add_generation_prompt=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


@torch.inference_mode()
def batch_generate(target, prompts: list[list[int]], *, max_new_tokens: int, sample: bool = False, seed: int = 0,
                   temperature: float = 0.9, stop: int | None = None) -> list[list[int]]:
    """transformers' `generate` over a batch (left padding); each row's new tokens up to and including `stop`."""
    from transformers import GenerationConfig
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(seed)
    gc = GenerationConfig(do_sample=sample, temperature=temperature if sample else None, top_p=0.95 if sample else None,
                          top_k=None, max_new_tokens=max_new_tokens, eos_token_id=stop, pad_token_id=pad)
    out = target.hf.generate(ids.to(target.wte.weight.device), attention_mask=mask.to(target.wte.weight.device),
                             generation_config=gc)[:, width:].tolist()
    res = []
    for row in out:
        if stop is not None and stop in row:
            row = row[:row.index(stop) + 1]
        res.append(row)
    return res


def magpie_prompts(target, n: int, *, seed: int = 0, batch_size: int = 32, log=None) -> list[dict]:
    """n questions the model writes itself when given only the start of a user turn (Magpie)."""
    tok = target.tokenizer
    end = tok.convert_tokens_to_ids("<|im_end|>")
    head = _chat(tok, None)
    out: list[dict] = []
    b = 0
    while len(out) < n:
        rows = batch_generate(target, [head] * batch_size, max_new_tokens=48, sample=True, seed=seed * 100003 + b,
                              stop=end)
        b += 1
        for r in rows:
            if r and r[-1] == end:  # a finished question only
                q = tok.decode(r[:-1]).strip()
                if 12 <= len(q) <= 300:
                    out.append({"category": "magpie", "prompt": q})
        if log:
            log(f"magpie: {len(out)}/{n} questions")
    return out[:n]


class Work:
    """The distillation's work folder: prompts.json, answers/NNNNN.json shards, cache/NNNNN.safetensors shards,
    vocab.json and the heads' save sets. Every file is written atomically; a stage skips what is done."""

    def __init__(self, folder):
        self.dir = Path(folder)
        for sub in ("answers", "cache"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.V, self.ctx, self.C = 1 << 24, 1 << 24, None  # the model's sizes the files are checked against

    def limits(self, target) -> "Work":
        """Check the files against this model: token ids against its vocabulary, lengths against its context,
        cached hidden states against its width."""
        self.V, self.ctx, self.C = target.config.vocab_size, target.config.block_size, target.config.n_embd
        return self

    def read_answers(self, shard: Path) -> list[dict]:
        return wf.read_answer_shard(shard, vocab_size=self.V, context=self.ctx)

    def json(self, name: str):
        p = self.dir / name
        return read_json(p, limit=256 << 20, what=f"the distillation's {name}", fix="delete it and rerun the stage") \
            if p.is_file() else None

    def write_json(self, name: str, obj) -> None:
        atomic_write_text(self.dir / name, json.dumps(obj) + "\n")

    @contextmanager
    def timed(self, stage: str):
        """Add this stage's CPU seconds (all threads of this process) and wall seconds to times.json."""
        cpu, wall = time.process_time(), now()
        try:
            yield
        finally:
            t = wf.read_times(self.dir / "times.json") if os.path.lexists(self.dir / "times.json") else {}
            c, w = t.get(stage, [0.0, 0.0])
            t[stage] = [c + time.process_time() - cpu, w + now() - wall]
            self.write_json("times.json", t)

    def shards(self, sub: str) -> list[Path]:
        return wf.shards(self.dir / sub, suffix=".json" if sub == "answers" else ".safetensors")


def stage_prompts(target, work: Work, *, n_magpie: int, n_template: int, seed: int = 0, log=None) -> list[dict]:
    if os.path.lexists(work.dir / "prompts.json"):
        return wf.read_prompts(work.dir / "prompts.json")
    held = {p for ps in heldout_prompts().values() for p in ps}
    ps = template_prompts(n_template, seed) + magpie_prompts(target, n_magpie, seed=seed, log=log)
    ps = [p for p in ps if p["prompt"] not in held]
    random.Random(seed).shuffle(ps)
    work.write_json("prompts.json", ps)
    return ps


def stage_answers(target, work: Work, prompts: list[dict], *, max_new_tokens: int = 128, batch_size: int = 16,
                  max_seconds: float | None = None, log=None) -> int:
    """Greedy answers, a shard per batch ({"prompt_ids": [...], "answer_ids": [...]} per row); returns rows done."""
    tok = target.tokenizer
    end = tok.convert_tokens_to_ids("<|im_end|>")
    t0 = now()
    n_batches = math.ceil(len(prompts) / batch_size)
    for b in range(n_batches):
        shard = work.dir / "answers" / f"{b:05d}.json"
        chunk = prompts[b * batch_size:(b + 1) * batch_size]
        if os.path.lexists(shard):  # done, if it answers this batch of prompts.json (a replaced one is refused)
            if [r["prompt_ids"] for r in work.read_answers(shard)] != [_chat(tok, p["prompt"]) for p in chunk]:
                raise MtplabError(f"{shard} answers other prompts than batch {b} of prompts.json (was prompts.json "
                                  "replaced?); delete answers/ and cache/ and rerun the answers stage")
            continue
        if max_seconds is not None and now() - t0 > max_seconds:
            break
        ids = [_chat(tok, p["prompt"]) for p in chunk]
        answers = batch_generate(target, ids, max_new_tokens=max_new_tokens, stop=end)
        rows = [{"category": p["category"], "prompt_ids": i, "answer_ids": a} for p, i, a in zip(chunk, ids, answers)]
        atomic_write_text(shard, json.dumps(rows) + "\n")
        if log:
            log(f"answers: batch {b + 1}/{n_batches} ({now() - t0:.0f} s)")
    return sum(1 for _ in work.shards("answers")) * batch_size


def stage_import(target, work: Work, data, *, per_shard: int = 64, log=None) -> int:
    """The answers of a data folder written by `mtplab.hf.chatdata` (the model's own questions and greedy answers)
    as this work folder's answer shards: each prompt in the chat template's ids, checked against the length the
    generator recorded. Returns the rows imported; a folder that already holds answers is left as it is."""
    if work.shards("answers"):
        return 0
    rows = [r for d in wf.data_shards(data, "answers", vocab_size=target.config.vocab_size) for r in d["rows"]]
    if not rows:
        raise MtplabError(f"{data} holds no answers; run python -m mtplab.hf.chatdata {data} --stage answers first")
    out = []
    for r in rows:
        ids = _chat(target.tokenizer, r["prompt"])
        if len(ids) != r["prompt_len"]:
            raise MtplabError(f"{data}: the prompt {r['prompt'][:40]!r} is {len(ids)} tokens here, {r['prompt_len']} "
                              "when its answer was generated (another tokenizer or chat template); regenerate the data "
                              "with this model")
        out.append({"category": r["category"], "prompt_ids": ids, "answer_ids": r["answer_ids"]})
    for b in range(0, len(out), per_shard):
        atomic_write_text(work.dir / "answers" / f"{b // per_shard:05d}.json", json.dumps(out[b:b + per_shard]) + "\n")
    if log:
        log(f"imported {len(out)} answers from {data}")
    return len(out)


@torch.inference_mode()
def cache_tensors(target, rows: list[dict]) -> dict:
    """One trunk forward over answered prompts ({"prompt_ids", "answer_ids"} each), right-padded (causal: the
    padding never changes an earlier position): tokens, hidden (bf16), the target's top-k ids and probabilities."""
    seqs = [r["prompt_ids"] + r["answer_ids"] for r in rows]
    T = max(len(s) for s in seqs)
    ids = torch.tensor([s + [0] * (T - len(s)) for s in seqs])
    res = target(ids.to(target.wte.weight.device))
    top_p, top_i = torch.softmax(res.logits.float(), -1).topk(TOPK, dim=-1)  # (B, T, TOPK)
    return {"tokens": ids, "hidden": res.hidden.to(torch.bfloat16).cpu(), "top_i": top_i.int().cpu(),
            "top_p": top_p.half().cpu(), "length": torch.tensor([len(s) for s in seqs]),
            "prompt_len": torch.tensor([len(r["prompt_ids"]) for r in rows])}


@torch.inference_mode()
def stage_cache(target, work: Work, *, log=None, max_seconds: float | None = None) -> int:
    """One trunk forward per answer shard: hidden (bf16), the target's top-k ids and probabilities, the tokens."""
    from safetensors.torch import save_file
    t0 = now()
    done = 0
    for shard in work.shards("answers"):  # every shard checked before the first forward, not an hour into the stage
        wf.read_answer_shard(shard, vocab_size=target.config.vocab_size, context=target.config.block_size)
    for shard in work.shards("answers"):
        out = work.dir / "cache" / (shard.stem + ".safetensors")
        if out.exists():
            done += 1
            continue
        if max_seconds is not None and now() - t0 > max_seconds:
            break
        tensors = cache_tensors(target, wf.read_answer_shard(shard, vocab_size=target.config.vocab_size,
                                                             context=target.config.block_size))
        atomic_write(out, lambda tmp, t=tensors: save_file({k: v.contiguous() for k, v in t.items()}, tmp))
        done += 1
        if log:
            log(f"cache: shard {shard.stem} ({now() - t0:.0f} s)")
    return done


def draft_vocabulary(work: Work, n: int) -> torch.Tensor:
    """The n token ids most frequent in the model's own answers (ties by id), sorted by id."""
    counts: dict[int, int] = {}
    for shard in work.shards("answers"):
        for r in work.read_answers(shard):
            for t in r["answer_ids"]:
                counts[t] = counts.get(t, 0) + 1
    best = sorted(counts, key=lambda t: (-counts[t], t))[:n]
    return torch.tensor(sorted(best), dtype=torch.long)


def vocab_coverage(work: Work, vocab: torch.Tensor) -> float:
    keep = set(vocab.tolist())
    tot = hit = 0
    for shard in work.shards("answers"):
        for r in work.read_answers(shard):
            tot += len(r["answer_ids"])
            hit += sum(t in keep for t in r["answer_ids"])
    return hit / max(1, tot)


# ------------------------------------------------------------------------------------------- training on the cache
class TrunkCache:
    """Every cached sequence in memory: hidden (bf16), tokens, the target's top-k, lengths and prompt lengths."""

    def __init__(self, shards: list[dict]):
        self.rows: list[dict] = []
        for t in shards:
            for b in range(t["tokens"].shape[0]):
                n = int(t["length"][b])
                self.rows.append({"tokens": t["tokens"][b, :n], "hidden": t["hidden"][b, :n],
                                  "top_i": t["top_i"][b, :n].long(), "top_p": t["top_p"][b, :n].float(),
                                  "prompt_len": int(t["prompt_len"][b])})
        if not self.rows:
            raise MtplabError("the trunk cache holds no sequences; run the answers and cache stages first")

    @classmethod
    def load(cls, work: Work, *, limit: int | None = None) -> "TrunkCache":
        return cls([wf.read_cache_shard(p, vocab_size=work.V, hidden=work.C, topk=TOPK, context=work.ctx)
                    for p in work.shards("cache")[:limit]])

    @property
    def tokens(self) -> int:
        return sum(len(r["tokens"]) - r["prompt_len"] for r in self.rows)

    def batch(self, idx: list[int], device="cpu") -> dict:
        rows = [self.rows[i] for i in idx]
        T = max(len(r["tokens"]) for r in rows)
        C = rows[0]["hidden"].shape[-1]
        out = {"tokens": torch.zeros(len(rows), T, dtype=torch.long), "hidden": torch.zeros(len(rows), T, C),
               "top_i": torch.zeros(len(rows), T, TOPK, dtype=torch.long), "top_p": torch.zeros(len(rows), T, TOPK),
               "answer": torch.zeros(len(rows), T, dtype=torch.bool)}
        for b, r in enumerate(rows):
            n = len(r["tokens"])
            out["tokens"][b, :n] = r["tokens"]
            out["hidden"][b, :n] = r["hidden"].float()
            out["top_i"][b, :n] = r["top_i"]
            out["top_p"][b, :n] = r["top_p"]
            out["answer"][b, r["prompt_len"]:n] = True  # positions whose token is part of the answer
        return {k: v.to(device) for k, v in out.items()}


def load_vocab(work: Work, n: int) -> torch.Tensor:
    """The draft vocabulary of size n, computed once from the answers and kept in the work folder."""
    name = f"vocab-{n}.json"
    if os.path.lexists(work.dir / name):
        return torch.tensor(wf.read_vocab(work.dir / name, vocab_size=work.V), dtype=torch.long)
    ids = draft_vocabulary(work, n)
    have = {"n": len(ids), "ids": ids.tolist(), "coverage": vocab_coverage(work, ids)}
    work.write_json(name, have)
    return torch.tensor(have["ids"], dtype=torch.long)


# ------------------------------------------------------------------------------------------- the whole recipe
RECIPE = {"n_magpie": 320, "n_template": 1120, "max_new_tokens": 128, "answer_batch": 24, "vocab": 8192,
          "heads": {"deepseek": {"n_depths": 2, "steps": 1200, "batch_size": 8, "lr": 1e-3, "unroll": 3},
                    "stern": {"n_depths": 4, "steps": 1200, "batch_size": 8, "lr": 1e-3, "unroll": 3}}}
# on a GPU the same stages take minutes: more prompts, larger batches, more steps (same vocabulary size)
GPU_RECIPE = {**RECIPE, "n_magpie": 2000, "n_template": 8000, "answer_batch": 256,
              "heads": {f: {**o, "steps": 4000, "batch_size": 32} for f, o in RECIPE["heads"].items()}}
STAGES = ("prompts", "answers", "cache", "deepseek", "stern", "ship")


def run_distill(model: str, work_dir, *, stages=STAGES, resume: bool = False, steps: int | None = None, device="cpu",
                max_seconds: float | None = None, log=None, data=None, overwrite: bool = False) -> dict:
    """`python -m mtplab distill`: the stages in order, each resumable (a killed run continues with --resume and
    the same options). `ship` writes the heads (bf16), the draft vocabulary and the record into data/hf/MODEL."""
    from mtplab.hf.target import load_hf
    bad = [s for s in stages if s not in STAGES]
    if bad:
        raise MtplabError(f"unknown distill stage {bad[0]!r}; choose among {', '.join(STAGES)}")
    rm = real_model(model)
    if rm is None:
        raise MtplabError(f"distill trains heads for a real model the lab knows: {', '.join(_real_names())}")
    check_distill_options(work_dir, stages, steps, max_seconds)
    dev = pick(device)
    work = Work(work_dir)
    target = load_hf(model, device=dev)
    work.limits(target)
    R = GPU_RECIPE if dev.type == "cuda" else RECIPE
    t0, cpu0 = now(), time.process_time()
    prompts = None
    if data is not None and "answers" in stages:  # the answers of mtplab.hf.chatdata's work folder
        with work.timed("answers"):
            stage_import(target, work, data, log=log)
    elif "prompts" in stages or "answers" in stages:  # only what was asked for runs
        with work.timed("prompts"):
            prompts = stage_prompts(target, work, n_magpie=R["n_magpie"], n_template=R["n_template"], log=log)
    if "answers" in stages and data is None:
        with work.timed("answers"):
            stage_answers(target, work, prompts, max_new_tokens=R["max_new_tokens"],
                          batch_size=R["answer_batch"], max_seconds=max_seconds, log=log)
    if "cache" in stages:
        with work.timed("cache"):
            stage_cache(target, work, max_seconds=max_seconds, log=log)
    histories = {}
    for fam in CACHED_LOSSES:  # deepseek, stern
        if fam not in stages:
            continue
        opts = dict(R["heads"][fam])
        if steps is not None:
            opts["steps"] = steps
        cache = TrunkCache.load(work)
        vocab = load_vocab(work, R["vocab"])
        if log:
            log(f"{fam}: {len(cache.rows)} sequences, {cache.tokens} answer tokens, draft vocabulary {len(vocab)}")
        settings = {"heads": fam, "vocab": R["vocab"], "sequences": len(cache.rows), **opts}
        with work.timed(fam):
            histories[fam] = fit_heads(target, cache, vocab, heads=fam, out=work.dir, resume=resume,
                                       overwrite=overwrite, settings=settings, log=log, max_seconds=max_seconds,
                                       **opts)
    if "ship" in stages:
        ship(target, work, rm, log=log)
    return {"work": str(work.dir), "seconds": now() - t0, "cpu_seconds": time.process_time() - cpu0,
            "histories": histories}


def _real_names():
    return list(REAL_MODELS)


def check_distill_options(work_dir, stages, steps, max_seconds) -> None:
    """distill's options, each one line before anything runs or is created: at least one stage, steps >= 1, a
    positive finite --max-seconds, and a work folder that is not the lab's data folder or what it ships."""
    if not stages:
        raise MtplabError(f"--stages names no stage; choose among {', '.join(STAGES)}")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise MtplabError(f"--steps must be an integer >= 1 (got {steps!r})")
    if max_seconds is not None and (not isinstance(max_seconds, (int, float)) or not math.isfinite(max_seconds)
                                    or max_seconds <= 0):
        raise MtplabError(f"--max-seconds must be a positive number of seconds (got {max_seconds!r})")
    w = Path(work_dir).resolve()
    if w == DATA_DIR.resolve() or shipped_folder(w) is not None:
        raise MtplabError(f"--work {work_dir} is the lab's data folder or inside what it ships; give a work folder "
                          "of your own (e.g. --work runs/distill)")


def ship(target, work: Work, rm, *, log=None) -> None:
    """Write what ships into data/hf/NAME: each trained family's heads in bf16, the draft vocabulary and a record
    of how they were made (tokens, steps, CPU time, the machine, the agreement history)."""
    from mtplab.hf.target import load_heads, save_heads
    out = rm.heads_dir
    if not may_write_shipped():
        raise MtplabError(f"ship replaces what the lab ships in {out}; set MTPLAB_WRITE_SHIPPED=1 to do it on purpose")
    trained = [f for f in CACHED_LOSSES if os.path.lexists(runs.paths(work.dir, f)["manifest"])]
    if not trained or not work.shards("answers"):
        raise MtplabError(f"{work.dir} holds {'no trained heads' if not trained else 'no answers'}: nothing to ship; "
                          "run the answers, cache and deepseek or stern stages first")
    prev = wf.read_heads_record(out / "record.json") if os.path.lexists(out / "record.json") else {}
    if target is not None:
        work.limits(target)
    out.mkdir(parents=True, exist_ok=True)
    vocab = load_vocab(work, RECIPE["vocab"])
    record = {"model": rm.name, "package": f"{rm.package}=={rm.version}", "gguf_sha256": rm.gguf_sha256,
              "recipe": RECIPE, "machine": machine("cpu"), "heads": {},
              "cpu_and_wall_seconds_by_stage": wf.read_times(work.dir / "times.json")
              if os.path.lexists(work.dir / "times.json") else {}}
    answers = [r for s in work.shards("answers") for r in work.read_answers(s)]
    record["data"] = {"prompts": len(answers), "answer_tokens": sum(len(r["answer_ids"]) for r in answers),
                      "by_category": {c: sum(r["category"] == c for r in answers)
                                      for c in sorted({r["category"] for r in answers})}}
    for fam in trained:  # the heads file of the family's save set, with its draft vocabulary, rewritten in bf16
        state = runs.read_manifest(work.dir, fam)
        load_heads(target, runs.paths(work.dir, fam)["weights"])
        name = default_name(fam, target.config.n_depths)  # deepseek-d1, stern-k4
        save_heads(target, out / name, dtype=torch.bfloat16,
                   meta={"trained": "self-distilled on the model's own greedy answers (mtplab distill)",
                         "steps": state["step"]})
        record["heads"][name] = {"steps": state["step"], "settings": state["settings"], "history": state["history"]}
        if log:
            log(f"shipped {out / name}.safetensors")
    cov = wf.json_file(work.dir / f"vocab-{RECIPE['vocab']}.json", limit=wf.MAX_SMALL_JSON, what="a draft vocabulary",
                       fix=wf.rerun("deepseek"))  # read_vocab checked it above
    atomic_write_text(out / "draft-vocab.json", json.dumps({"n": len(vocab), "coverage": cov.get("coverage", 0.0),
                                                            "ids": vocab.tolist()}) + "\n")
    record["heads"] = {**(prev.get("heads") or {}), **record["heads"]}
    atomic_write_text(out / "record.json", json.dumps(record, indent=1) + "\n")
