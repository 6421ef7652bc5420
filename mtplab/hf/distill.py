"""Heads for a real model, affordable on two CPU cores: self-distillation data, a trunk cache, training on it.

B batch, T time, C channels (hidden size), V vocabulary, N the draft vocabulary's size.

The pipeline (`python -m mtplab distill`), each stage resumable and saved as it goes into a work folder:

1. `prompts`: training prompts, none of them a held-out prompt. Two sources: the model's own questions,
   Magpie-style (Xu et al. 2024: an aligned model given only the start of a user turn writes the question), and
   task templates over topic lists and passages of the shipped corpora, one per held-out category.
2. `answers`: the model's own greedy answers (batched `generate`), as Medusa's self-distillation (Cai et al. 2024, §2.3.2)
   and FastMTP train heads on the model's own outputs: a head is then trained on exactly the text its drafts will be verified against.
3. `cache`: one trunk forward per answered prompt: the last layer's hidden state at every position (bf16) and the
   target's top-k next-token probabilities there. The 30-layer trunk never runs again.
4. `train`: heads trained for many epochs on the cache (`fit_heads`), over the draft vocabulary: the N tokens most
   frequent in the model's own answers (EAGLE-3, FR-Spec and FastMTP also draft over a frequency-ranked subset;
   only EAGLE-3 counts its training answers, FR-Spec counts a pretraining corpus and FastMTP reuses FR-Spec's). The projection of a draft costs N
   rows instead of 49,152; the target still verifies over the full vocabulary, so output stays exact.
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
import torch.nn.functional as F
from mtplab.errors import MtplabError
from mtplab.files import atomic_write, atomic_write_text, read_json
from mtplab.device import machine, pick
from mtplab.hf.real import REAL_MODELS, real_model
from mtplab.paths import DATA_DIR, may_write_shipped
from mtplab.training.steps import autocast_context, lr_at

HELDOUT = DATA_DIR / "prompts" / "heldout.json"
CATEGORIES = ("code", "math", "writing", "qa", "summarization", "translation")
TOPK = 8  # target probabilities kept per position in the cache

# ------------------------------------------------------------------------------------------- prompts
_TOPICS = ["the ocean", "volcanoes", "honey bees", "the moon", "trains", "rain forests", "the human heart",
           "electricity", "glaciers", "the printing press", "chess", "bread", "recycling", "the internet",
           "owls", "coffee", "bicycles", "the solar system", "photosynthesis", "earthquakes", "music",
           "friendship", "gardening", "libraries", "robots", "winter", "rivers", "birds", "mountains", "deserts",
           "a city park", "the weather", "computers", "dinosaurs", "tea", "football", "painting", "clocks",
           "bridges", "the post office", "a lighthouse", "a small village", "a school trip", "the wind"]
_CODE_TASKS = ["reverses a string", "checks whether a number is prime", "returns the sum of a list",
               "finds the smallest item in a list", "counts the vowels in a word", "merges two sorted lists",
               "removes duplicates from a list", "returns the factorial of n", "converts Celsius to Fahrenheit",
               "checks whether a word is a palindrome", "returns the n-th Fibonacci number",
               "sorts a list of names by length", "reads a file and counts its lines", "flattens a nested list",
               "returns the average of some numbers", "finds the longest word in a sentence",
               "capitalizes every word in a sentence", "computes the greatest common divisor of two numbers",
               "groups words by their first letter", "returns the even numbers of a list"]
_LANGS = ["French", "Spanish", "German", "Italian", "Portuguese"]
_SENTENCES = ["I like to walk in the park on Sunday.", "The shop opens at nine in the morning.",
              "Can you help me find my keys?", "We are going to the beach tomorrow.",
              "The children are playing in the garden.", "This book is very interesting.",
              "How much does this bread cost?", "My sister lives in a big city.",
              "It is raining, so take an umbrella.", "The museum is closed on Mondays.",
              "I am learning to play the piano.", "Please close the window, it is cold.",
              "Our teacher gave us a lot of homework.", "The cat is sleeping on the sofa.",
              "Dinner will be ready in ten minutes."]
_TEMPLATES = {
    "code": ["Write a Python function that {task}.", "Write a Python function that {task}, with a docstring.",
             "How would you write a function in Python that {task}? Show the code."],
    "math": ["What is {a} plus {b}? Explain.", "What is {a} times {c}? Show the steps.",
             "If a box holds {c} apples, how many apples are in {d} boxes?",
             "A shop sells pens for {c} dollars each. How much do {d} pens cost?",
             "What is {p} percent of {a}?", "Solve for x: {c}x + {d} = {e}."],
    "writing": ["Write a short poem about {topic}.", "Write a short story about {topic}.",
                "Write a paragraph describing {topic}.", "Write a short letter to a friend about {topic}."],
    "qa": ["What is {topic}?", "Tell me three facts about {topic}.", "Why is {topic} important?",
           "How does {topic} work?", "Explain {topic} to a ten-year-old."],
    "summarization": ["Summarize in one sentence: {passage}", "Summarize the main idea of this text: {passage}",
                      "Give a short summary: {passage}"],
    "translation": ["Translate into {lang}: {sentence}", "How do you say this in {lang}? {sentence}"],
}


def heldout_prompts(path: Path = HELDOUT) -> dict[str, list[str]]:
    """The hand-written held-out prompts by category (never trained on)."""
    d = read_json(path, limit=1 << 20, what="the held-out prompts", fix="restore data/prompts/heldout.json from git")
    cats = d.get("categories") if isinstance(d, dict) else None
    if not isinstance(cats, dict) or set(cats) != set(CATEGORIES) or not all(
            isinstance(v, list) and v and all(isinstance(s, str) and s for s in v) for v in cats.values()):
        raise MtplabError(f"{path} is not the lab's held-out prompt file (six categories: {', '.join(CATEGORIES)}); "
                          "restore it from git")
    return {c: list(cats[c]) for c in CATEGORIES}


def _passages(rng: random.Random, n: int) -> list[str]:
    """Short prose passages from the shipped prose corpus (three to five consecutive non-empty lines)."""
    lines = [s.strip() for s in (DATA_DIR / "corpora" / "prose_train.txt").read_text(encoding="utf-8").splitlines()]
    lines = [s for s in lines if len(s) > 30 and not s.isupper()]
    out = []
    for _ in range(n):
        i = rng.randrange(len(lines) - 5)
        out.append(" ".join(lines[i:i + rng.randint(3, 5)]))
    return out


def template_prompts(n: int, seed: int = 0) -> list[dict]:
    """n prompts from the task templates, spread evenly over the six categories: [{category, prompt}]."""
    rng = random.Random(seed)
    passages = _passages(rng, n)
    out = []
    for i in range(n):
        cat = CATEGORIES[i % len(CATEGORIES)]
        t = rng.choice(_TEMPLATES[cat])
        a, b = rng.randint(12, 480), rng.randint(3, 250)
        c, d = rng.randint(2, 12), rng.randint(2, 15)
        out.append({"category": cat, "prompt": t.format(
            task=rng.choice(_CODE_TASKS), topic=rng.choice(_TOPICS), lang=rng.choice(_LANGS),
            sentence=rng.choice(_SENTENCES), passage=passages[i], a=a, b=b, c=c, d=d, e=c * rng.randint(1, 9) + d,
            p=rng.choice([5, 10, 15, 20, 25, 50]))})
    return out


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

    def json(self, name: str):
        p = self.dir / name
        return read_json(p, limit=256 << 20, what=f"the distillation's {name}", fix="delete it and rerun the stage") \
            if p.is_file() else None

    def write_json(self, name: str, obj) -> None:
        atomic_write_text(self.dir / name, json.dumps(obj) + "\n")

    @contextmanager
    def timed(self, stage: str):
        """Add this stage's CPU seconds (all threads of this process) and wall seconds to times.json."""
        cpu, wall = time.process_time(), time.perf_counter()
        try:
            yield
        finally:
            t = self.json("times.json") or {}
            c, w = t.get(stage, [0.0, 0.0])
            t[stage] = [c + time.process_time() - cpu, w + time.perf_counter() - wall]
            self.write_json("times.json", t)

    def shards(self, sub: str) -> list[Path]:
        return sorted(p for p in (self.dir / sub).iterdir() if p.name[0] != "." and p.suffix in (".json", ".safetensors"))


def stage_prompts(target, work: Work, *, n_magpie: int, n_template: int, seed: int = 0, log=None) -> list[dict]:
    have = work.json("prompts.json")
    if have is not None:
        return have
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
    t0 = time.perf_counter()
    n_batches = math.ceil(len(prompts) / batch_size)
    for b in range(n_batches):
        shard = work.dir / "answers" / f"{b:05d}.json"
        if shard.exists():
            continue
        if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
            break
        chunk = prompts[b * batch_size:(b + 1) * batch_size]
        ids = [_chat(tok, p["prompt"]) for p in chunk]
        answers = batch_generate(target, ids, max_new_tokens=max_new_tokens, stop=end)
        rows = [{"category": p["category"], "prompt_ids": i, "answer_ids": a} for p, i, a in zip(chunk, ids, answers)]
        atomic_write_text(shard, json.dumps(rows) + "\n")
        if log:
            log(f"answers: batch {b + 1}/{n_batches} ({time.perf_counter() - t0:.0f} s)")
    return sum(1 for _ in work.shards("answers")) * batch_size


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
    t0 = time.perf_counter()
    done = 0
    for shard in work.shards("answers"):
        out = work.dir / "cache" / (shard.stem + ".safetensors")
        if out.exists():
            done += 1
            continue
        if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
            break
        tensors = cache_tensors(target, json.loads(shard.read_text(encoding="utf-8")))
        atomic_write(out, lambda tmp, t=tensors: save_file({k: v.contiguous() for k, v in t.items()}, tmp))
        done += 1
        if log:
            log(f"cache: shard {shard.stem} ({time.perf_counter() - t0:.0f} s)")
    return done


def draft_vocabulary(work: Work, n: int) -> torch.Tensor:
    """The n token ids most frequent in the model's own answers (ties by id), sorted by id."""
    counts: dict[int, int] = {}
    for shard in work.shards("answers"):
        for r in json.loads(shard.read_text(encoding="utf-8")):
            for t in r["answer_ids"]:
                counts[t] = counts.get(t, 0) + 1
    best = sorted(counts, key=lambda t: (-counts[t], t))[:n]
    return torch.tensor(sorted(best), dtype=torch.long)


def vocab_coverage(work: Work, vocab: torch.Tensor) -> float:
    keep = set(vocab.tolist())
    tot = hit = 0
    for shard in work.shards("answers"):
        for r in json.loads(shard.read_text(encoding="utf-8")):
            tot += len(r["answer_ids"])
            hit += sum(t in keep for t in r["answer_ids"])
    return hit / max(1, tot)


def env_threads() -> int:
    return int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or torch.get_num_threads()


_ = F


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
        from safetensors.torch import load_file
        return cls([load_file(str(p)) for p in work.shards("cache")[:limit]])

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


def sub_vocab_index(vocab: torch.Tensor, V: int) -> torch.Tensor:
    """(V,) position of each token id in the draft vocabulary, -1 outside it."""
    where = torch.full((V,), -1, dtype=torch.long)
    where[vocab] = torch.arange(len(vocab))
    return where


def soft_ce(logits: torch.Tensor, top_i: torch.Tensor, top_p: torch.Tensor, where: torch.Tensor,
            mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of draft logits over the draft vocabulary (B, T, N) against the target's top-k probabilities
    (B, T, TOPK) renormalized inside it; mask (B, T) picks the positions that count. Returns (loss, top-1 hits)."""
    idx = where[top_i]  # (B, T, TOPK), -1 outside the draft vocabulary
    p = top_p * (idx >= 0)
    keep = mask & (p.sum(-1) > 0)
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-9)
    logp = torch.log_softmax(logits.float(), -1).gather(-1, idx.clamp_min(0))  # (B, T, TOPK)
    loss = -(p * logp).sum(-1)[keep].mean() if keep.any() else logits.sum() * 0
    hits = (logits.argmax(-1) == idx[..., 0]) & keep  # the draft equals the target's argmax
    return loss, torch.stack([hits.sum(), keep.sum()])


def head_losses(target, batch: dict, where: torch.Tensor, vocab: torch.Tensor, *, unroll: int = 3):
    """Per-depth losses and hits of `target.mtp` on a cached batch, over the draft vocabulary.

    DeepSeek (one module, reused as the drafter reuses it): depth d+1 runs the module on depth d's hidden states and
    Emb(t_{i+d}) (teacher forcing on tokens, free running on hidden states, as EAGLE-3 trains), up to `unroll` depths.
    Stern: depth d reads the trunk's hidden state at i and predicts t_{i+d}."""
    h, tok, ans = batch["hidden"], batch["tokens"], batch["answer"]
    T = h.shape[1]
    W = target.lm_head.weight[vocab]  # (N, C)
    out = []
    if target.config.heads == "deepseek":
        prev = h
        for d in range(1, unroll + 1):
            if T - d <= 1:
                break
            prev = target.mtp.layers[0](target, prev[:, :T - d], target.wte(tok[:, d:]))  # (B, T-d, C) predicts t_{i+d+1}
            logits = F.linear(target.norm(prev), W)
            # the target's distribution for t_{i+d+1} sits at position i+d; count it where t_{i+d+1} is an answer token
            m = torch.zeros_like(ans[:, :T - d])
            m[:, :T - d - 1] = ans[:, d + 1:]
            out.append(soft_ce(logits[:, :T - d - 1], batch["top_i"][:, d:T - 1], batch["top_p"][:, d:T - 1], where,
                               m[:, :T - d - 1]))
            prev = F.pad(prev, (0, 0, 0, d))  # keep positions aligned with the trunk's
    elif target.config.heads == "stern":
        hs = target.mtp.hidden(h)  # (B, T, K-1, C)
        for j in range(hs.shape[2]):
            d = j + 2  # depth d at position i predicts t_{i+d}: the target's distribution sits at position i+d-1
            if T - d <= 0:
                break
            logits = F.linear(target.norm(hs[:, :T - d, j]), W)
            out.append(soft_ce(logits, batch["top_i"][:, d - 1:T - 1], batch["top_p"][:, d - 1:T - 1], where,
                               ans[:, d:]))
    else:
        raise MtplabError(f"fit_heads trains deepseek or stern heads on a trunk cache (got {target.config.heads!r})")
    return out


def fit_heads(target, cache: TrunkCache, vocab: torch.Tensor, *, heads: str, n_depths: int, steps: int,
              batch_size: int = 8, lr: float = 1e-3, unroll: int = 3, seed: int = 0, val_rows: int = 24,
              weights=(1.0, 0.6, 0.4, 0.3), run=None, log=None, max_seconds: float | None = None) -> list[dict]:
    """Train a fresh head family on the cache for `steps` steps (AdamW, warm-up then cosine), bf16 autocast where
    native. `run` (a `HeadsRun`) saves and resumes. Returns the history (per-depth agreement on held-back rows)."""
    torch.manual_seed(seed)
    target.attach(heads, n_depths)
    dev = target.wte.weight.device
    vocab = vocab.to(dev)
    where = sub_vocab_index(vocab, target.config.vocab_size).to(dev)
    gen = random.Random(seed)
    order = list(range(len(cache.rows)))
    gen.shuffle(order)
    val, train = order[:val_rows], order[val_rows:] or order
    params = list(target.mtp.parameters())
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    start, history = 0, []
    if run is not None:
        start, history = run.restore(target, opt)
    t0 = time.perf_counter()
    for step in range(start, steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, max(1, steps // 20))
        idx = [train[(step * batch_size + j) % len(train)] for j in range(batch_size)]
        if (step * batch_size) // len(train) != ((step + 1) * batch_size) // len(train):
            gen.shuffle(train)
        with autocast_context(dev, "auto"):
            res = head_losses(target, cache.batch(idx, dev), where, vocab, unroll=unroll)
        loss = sum(w * r[0] for w, r in zip(weights, res))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        done = step + 1
        last = done == steps or (max_seconds is not None and time.perf_counter() - t0 > max_seconds)
        if done % max(1, steps // 20) == 0 or last:
            rec = {"step": done, "loss": float(loss.detach()), "elapsed_s": time.perf_counter() - t0,
                   "val_agree_depth": evaluate_heads(target, cache, val, where, vocab, unroll=unroll)}
            history.append(rec)
            if log:
                log(f"step {done}/{steps}: loss {rec['loss']:.3f}, agreement by depth "
                    + " ".join(f"{a:.3f}" for a in rec["val_agree_depth"]))
            if run is not None:
                run.save(target, opt, done, history)
        if last:
            break
    return history


@torch.no_grad()
def evaluate_heads(target, cache: TrunkCache, rows: list[int], where, vocab, *, unroll: int = 3) -> list[float]:
    """Teacher-forced agreement of each depth with the target's argmax on held-back cached rows."""
    tot = None
    for i in range(0, len(rows), 8):
        res = head_losses(target, cache.batch(rows[i:i + 8], target.wte.weight.device), where, vocab, unroll=unroll)
        hits = torch.stack([r[1] for r in res]).float()
        tot = hits if tot is None else tot + hits
    return [float(h / max(1.0, n)) for h, n in tot.tolist()] if tot is not None else []


class HeadsRun:
    """A head training's save set in the work folder (heads, optimizer, step, history), replaced atomically."""

    def __init__(self, path: Path, *, resume: bool, settings: dict):
        self.path, self.resume, self.settings = Path(path), resume, settings
        if self.path.exists() and not resume:
            raise MtplabError(f"{self.path} already exists; continue it with --resume or delete it to start over")

    def restore(self, target, opt) -> tuple[int, list]:
        if not self.resume or not self.path.exists():
            return 0, []
        state = torch.load(self.path, map_location="cpu", weights_only=True)
        if state["settings"] != self.settings:
            diff = sorted(k for k in set(state["settings"]) | set(self.settings)
                          if state["settings"].get(k) != self.settings.get(k))
            raise MtplabError(f"{self.path} was trained with other settings ({', '.join(diff)}); give the same "
                              "options to --resume, or delete it to start over")
        target.mtp.load_state_dict(state["heads"])
        opt.load_state_dict(state["opt"])
        return int(state["step"]), list(state["history"])

    def save(self, target, opt, step: int, history: list) -> None:
        state = {"heads": target.mtp.state_dict(), "opt": opt.state_dict(), "step": step, "history": history,
                 "settings": self.settings}
        atomic_write(self.path, lambda tmp: torch.save(state, tmp))


def load_vocab(work: Work, n: int) -> torch.Tensor:
    """The draft vocabulary of size n, computed once from the answers and kept in the work folder."""
    name = f"vocab-{n}.json"
    have = work.json(name)
    if have is None:
        ids = draft_vocabulary(work, n)
        have = {"n": n, "ids": ids.tolist(), "coverage": vocab_coverage(work, ids)}
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
                max_seconds: float | None = None, log=None) -> dict:
    """`python -m mtplab distill`: the stages in order, each resumable (a killed run continues with --resume and
    the same options). `ship` writes the heads (bf16), the draft vocabulary and the record into data/hf/MODEL."""
    from mtplab.hf.target import load_hf
    bad = [s for s in stages if s not in STAGES]
    if bad:
        raise MtplabError(f"unknown distill stage {bad[0]!r}; choose among {', '.join(STAGES)}")
    rm = real_model(model)
    if rm is None:
        raise MtplabError(f"distill trains heads for a real model the lab knows: {', '.join(_real_names())}")
    work = Work(work_dir)
    dev = pick(device)
    target = load_hf(model, device=dev)
    R = GPU_RECIPE if dev.type == "cuda" else RECIPE
    t0, cpu0 = time.perf_counter(), time.process_time()
    with work.timed("prompts"):
        prompts = stage_prompts(target, work, n_magpie=R["n_magpie"], n_template=R["n_template"], log=log)
    if "answers" in stages:
        with work.timed("answers"):
            stage_answers(target, work, prompts, max_new_tokens=R["max_new_tokens"],
                          batch_size=R["answer_batch"], max_seconds=max_seconds, log=log)
    if "cache" in stages:
        with work.timed("cache"):
            stage_cache(target, work, max_seconds=max_seconds, log=log)
    histories = {}
    for fam in ("deepseek", "stern"):
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
        run = HeadsRun(work.dir / f"{fam}.pt", resume=resume, settings=settings)
        with work.timed(fam):
            histories[fam] = fit_heads(target, cache, vocab, heads=fam, run=run, log=log, max_seconds=max_seconds,
                                       **opts)
    if "ship" in stages:
        ship(target, work, rm, log=log)
    return {"work": str(work.dir), "seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - cpu0,
            "histories": histories}


def _real_names():
    return list(REAL_MODELS)


def ship(target, work: Work, rm, *, log=None) -> None:
    """Write what ships into data/hf/NAME: each trained family's heads in bf16, the draft vocabulary and a record
    of how they were made (tokens, steps, CPU time, the machine, the agreement history)."""
    from mtplab.hf.target import save_heads
    out = rm.heads_dir
    if not may_write_shipped():
        raise MtplabError(f"ship replaces what the lab ships in {out}; set MTPLAB_WRITE_SHIPPED=1 to do it on purpose")
    out.mkdir(parents=True, exist_ok=True)
    vocab = load_vocab(work, RECIPE["vocab"])
    record = {"model": rm.name, "package": f"{rm.package}=={rm.version}", "gguf_sha256": rm.gguf_sha256,
              "recipe": RECIPE, "machine": machine("cpu"), "heads": {},
              "cpu_and_wall_seconds_by_stage": work.json("times.json") or {}}
    answers = [r for s in work.shards("answers") for r in json.loads(s.read_text(encoding="utf-8"))]
    record["data"] = {"prompts": len(answers), "answer_tokens": sum(len(r["answer_ids"]) for r in answers),
                      "by_category": {c: sum(r["category"] == c for r in answers)
                                      for c in sorted({r["category"] for r in answers})}}
    for fam, K in (("deepseek", 2), ("stern", 4)):
        p = work.dir / f"{fam}.pt"
        if not p.exists():
            continue
        state = torch.load(p, map_location="cpu", weights_only=True)
        target.attach(fam, K)
        target.mtp.load_state_dict(state["heads"])
        name = {"deepseek": "deepseek-d1", "stern": "stern-k4"}[fam]
        save_heads(target, out / name, dtype=torch.bfloat16,
                   meta={"trained": "self-distilled on the model's own greedy answers (mtplab distill)",
                         "steps": state["step"]})
        record["heads"][name] = {"steps": state["step"], "settings": state["settings"], "history": state["history"]}
        if log:
            log(f"shipped {out / name}.safetensors")
    cov = work.json(f"vocab-{RECIPE['vocab']}.json")
    atomic_write_text(out / "draft-vocab.json", json.dumps({"n": len(vocab), "coverage": cov["coverage"],
                                                            "ids": vocab.tolist()}) + "\n")
    prev = read_json(out / "record.json", limit=16 << 20, what="the heads record", fix="restore it from git") \
        if (out / "record.json").is_file() else {}
    record["heads"] = {**(prev.get("heads") or {}), **record["heads"]}
    atomic_write_text(out / "record.json", json.dumps(record, indent=1) + "\n")
