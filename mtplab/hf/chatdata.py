"""The real model's training data: questions it writes itself (Magpie) and its own greedy answers.

Heads trained on templated prompts learn the templates (teacher-forced agreement 0.73 on templated answers against
0.41 on hand-written ones). So the prompts here are the model's own: given only the start of a user turn, an
instruction-tuned model writes a question like those it was tuned on (Magpie, Xu et al. 2024). A partial first line
steers some of them toward the six held-out categories; the rest are unsteered everyday chat.

Stages, each resumable, each file written whole (a killed run loses at most the batch in flight):
1. `questions`: batches of 128 sampled user turns at a few temperatures -> questions/NNNNN.json
2. `select`: deduplicated (normalised text, then word-trigram overlap), near-duplicates of the held-out prompts
   dropped, templates at most 15% -> prompts.json (fixed once answers start)
3. `answers`: greedy answers up to end of turn or 256 tokens, 64 rows a batch -> answers/NNNNN.json

Every shard records its CPU and wall seconds and its tokens, so the CPU-hours are summed, never guessed.
`--worker i/n` takes the batches b with b % n == i: two one-thread workers use two cores without the thread
contention of one two-thread process sharing its cores with anything else.
"""
from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path
import torch
from mtplab.device import machine, now
from mtplab.errors import MtplabError
from mtplab.files import atomic_write_text
from mtplab.hf.prompts import heldout_prompts, template_prompts
from mtplab.hf.real import REAL_MODELS, template_ids
from mtplab.hf.workfiles import data_shards, read_data_prompts

BATCH = 64             # answer rows per batch
QUESTION_BATCH = 128   # user turns per batch (short: a larger batch pays the per-step floor less often)
CATEGORIES = ("code", "math", "writing", "qa", "summarization", "translation")
TEMPERATURES = (0.7, 0.9, 1.1)
QUESTION_TOKENS = 112   # a user turn longer than this is dropped (unfinished)
ANSWER_TOKENS = 256
# partial first lines that steer a user turn toward a category; None: unsteered (the model's own chat)
STEERS: dict[str, list[str]] = {
    "code": ["Write a Python function that", "Write a Python program", "How do I", "Can you explain what this Python",
             "Write a function in JavaScript", "What is the difference between", "Write a SQL query", "Fix this code:",
             "Write a Python class", "How can I use"],
    "math": ["Solve", "Calculate", "If a", "A train", "What is", "How many", "Find the", "A store", "Simplify",
             "A recipe"],
    "writing": ["Write a short poem about", "Write a story about", "Write an email", "Write a product description",
                "Write a letter to", "Write a blog post about", "Write a speech", "Write a paragraph",
                "Write a haiku", "Write a cover letter"],
    "qa": ["Why", "What is the difference between", "How does", "What causes", "Explain", "Who was",
           "What are the benefits of", "How do", "What happens when", "Is it true that"],
    "summarization": ["Summarize the following text:", "Summarize in two sentences:", "Give a short summary:",
                      "Summarize the main idea of this paragraph:", "Summarize this article:",
                      "Please summarize:", "Summarize for a child:", "TL;DR:"],
    "translation": ["Translate into French:", "Translate into Spanish:", "Translate into German:",
                    "Translate into Italian:", "How do you say", "Translate this sentence into Portuguese:",
                    "Translate to French:", "What does this mean in English:"],
}
UNSTEERED = 0.4  # share of each batch given only the start of a user turn


# ------------------------------------------------------------------------------------------- the batched decoder
@torch.inference_mode()
def decode_rows(hf, prompts: list[list[int]], *, max_new: int, stop: int, pad: int = 0, temperature: float = 0.0,
                top_p: float = 0.95, seed: int = 0) -> list[list[int]]:
    """Each row's new tokens (up to and including `stop`), greedy at temperature 0, else sampled (top-p).

    Left padding; a finished row leaves the batch (its cache rows are dropped), so a batch costs what its live
    rows cost, not 64 rows times the longest answer."""
    import inspect
    from transformers import DynamicCache
    kw = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"  # renamed in 5.x
    B, W = len(prompts), max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (W - len(p)) + list(p) for p in prompts])
    mask = (torch.arange(W)[None] >= torch.tensor([W - len(p) for p in prompts])[:, None]).long()
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    cache = DynamicCache(config=hf.config)
    gen = torch.Generator().manual_seed(seed)
    out: list[list[int]] = [[] for _ in range(B)]
    alive = list(range(B))
    logits = hf(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1,
                **{kw: cache}).logits[:, -1].float()
    last = pos[:, -1]
    for _ in range(max_new):
        if temperature > 0:
            probs = torch.softmax(logits / temperature, -1)
            sp, si = probs.sort(-1, descending=True)
            sp[(sp.cumsum(-1) - sp) > top_p] = 0
            nxt = si.gather(-1, torch.multinomial(sp, 1, generator=gen)).squeeze(-1)
        else:
            nxt = logits.argmax(-1)
        keep = []
        for j, r in enumerate(alive):
            out[r].append(int(nxt[j]))
            if out[r][-1] != stop and len(out[r]) < max_new:
                keep.append(j)
        if not keep:
            break
        if len(keep) < len(alive):
            idx = torch.tensor(keep)
            cache.batch_select_indices(idx)
            mask, nxt, last, alive = mask[idx], nxt[idx], last[idx], [alive[j] for j in keep]
        mask = torch.cat([mask, torch.ones(len(alive), 1, dtype=mask.dtype)], 1)
        last = last + 1
        logits = hf(input_ids=nxt[:, None], attention_mask=mask, position_ids=last[:, None], use_cache=True,
                    **{kw: cache}).logits[:, -1].float()
    return out


def user_turn_head(tok) -> list[int]:
    """The chat template's ids up to where a user's words begin (Magpie's input)."""
    full = tok.apply_chat_template([{"role": "user", "content": "X"}], tokenize=False, add_generation_prompt=False)
    return tok.encode(full[:full.rindex("X")], add_special_tokens=False)


# ------------------------------------------------------------------------------------------- the work folder
class DataWork:
    """questions/, prompts.json and answers/ in one folder; shards written atomically, read back validated."""

    def __init__(self, folder):
        self.dir = Path(folder)
        for sub in ("questions", "answers"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)

    def shard(self, sub: str, b: int) -> Path:
        return self.dir / sub / f"{b:05d}.json"

    def rows(self, sub: str) -> list[dict]:
        """Every row of a stage's shards, each shard validated (`hf.workfiles.read_data_shard`)."""
        return [r for d in data_shards(self.dir, sub) for r in d["rows"]]

    def costs(self, sub: str) -> dict:
        """Summed CPU seconds, wall seconds and tokens of a stage's shards."""
        tot = {"shards": 0, "cpu_s": 0.0, "wall_s": 0.0, "tokens": 0}
        for d in data_shards(self.dir, sub):
            tot["shards"] += 1
            for k in ("cpu_s", "wall_s", "tokens"):
                tot[k] += d.get(k, 0)
        return tot


def _timed_write(path: Path, rows: list[dict], tokens: int, cpu0: float, wall0: float, extra: dict) -> None:
    atomic_write_text(path, json.dumps({"rows": rows, "tokens": tokens, "cpu_s": time.process_time() - cpu0,
                                        "wall_s": now() - wall0, "threads": torch.get_num_threads(),
                                        "cpu": machine("cpu").get("cpu", ""), **extra}) + "\n")


def stage_questions(hf, tok, work: DataWork, *, batches: int, worker: tuple[int, int] = (0, 1), seed: int = 0,
                    log=print) -> None:
    """Raw user turns, QUESTION_BATCH a shard: UNSTEERED of them from the bare start of a user turn, the rest from a
    category's partial first line, at a temperature drawn from TEMPERATURES per batch."""
    head = user_turn_head(tok)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    i, n = worker
    for b in range(batches):
        path = work.shard("questions", b)
        if b % n != i or path.exists():
            continue
        cpu0, wall0 = time.process_time(), now()
        rng = random.Random(seed * 1_000_003 + b)
        temp = rng.choice(TEMPERATURES)
        rows, prompts = [], []
        for _ in range(QUESTION_BATCH):
            if rng.random() < UNSTEERED:
                cat, steer = "chat", ""
            else:
                cat = rng.choice(CATEGORIES)
                steer = rng.choice(STEERS[cat])
            rows.append({"category": cat, "steer": steer, "temperature": temp})
            prompts.append(head + (tok.encode(steer, add_special_tokens=False) if steer else []))
        new = decode_rows(hf, prompts, max_new=QUESTION_TOKENS, stop=end, temperature=temp, seed=seed * 7919 + b)
        for r, t in zip(rows, new):
            r["finished"] = bool(t) and t[-1] == end
            r["prompt"] = (r["steer"] + tok.decode(t[:-1] if r["finished"] else t)).strip() if r["steer"] else \
                tok.decode(t[:-1] if r["finished"] else t).strip()
        _timed_write(path, rows, sum(map(len, new)), cpu0, wall0, {"temperature": temp})
        log(f"questions: batch {b + 1}/{batches} done at T={temp} ({now() - wall0:.0f} s, "
            f"{sum(1 for r in rows if r['finished'])} finished)")


# ------------------------------------------------------------------------------------------- selection
def normalise(s: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", s.lower()))


def trigrams(s: str) -> set:
    w = normalise(s).split()
    return {tuple(w[i:i + 3]) for i in range(max(1, len(w) - 2))}


def _jaccard(a: set, b: set) -> float:
    return len(a & b) / max(1, len(a | b))


def select_prompts(candidates: list[dict], heldout: list[str], *, templates: list[dict], max_template_share: float = 0.15,
                   near: float = 0.6, near_heldout: float = 0.4, seed: int = 0) -> tuple[list[dict], dict]:
    """Distinct prompts: exact duplicates after normalising dropped, then any prompt whose word trigrams overlap an
    earlier kept one's by Jaccard >= `near`
    (a held-out prompt's: >= `near_heldout`). Templates fill at most `max_template_share`.
    Returns (prompts, counts of what was dropped and why)."""
    held = [trigrams(h) for h in heldout]
    held_norm = {normalise(h) for h in heldout}
    kept: list[dict] = []
    index: dict[tuple, list[int]] = {}
    grams: list[set] = []
    why = {"unfinished": 0, "length": 0, "exact": 0, "near": 0, "heldout": 0}

    def admit(c: dict) -> bool:
        text = c["prompt"]
        norm = normalise(text)
        if norm in held_norm or any(_jaccard(g, h) >= near_heldout for h in held for g in [trigrams(text)]):
            why["heldout"] += 1
            return False
        g = trigrams(text)
        seen: set[int] = set()
        for t in g:
            for j in index.get(t, ()):
                if j in seen:
                    continue
                seen.add(j)
                if _jaccard(g, grams[j]) >= near:
                    why["exact" if normalise(kept[j]["prompt"]) == norm else "near"] += 1
                    return False
        for t in g:
            index.setdefault(t, []).append(len(kept))
        grams.append(g)
        kept.append(c)
        return True

    for c in candidates:
        if not c.get("finished", True):
            why["unfinished"] += 1
        elif not 12 <= len(c["prompt"]) <= 1500 or len(normalise(c["prompt"]).split()) < 3:
            why["length"] += 1
        else:
            admit(c)
    own = len(kept)
    cap = int(own * max_template_share / (1 - max_template_share))
    n_t = 0
    for c in templates:
        if n_t >= cap:
            break
        n_t += admit({**c, "source": "template"})
    random.Random(seed).shuffle(kept)
    return kept, {**why, "own": own, "templates": n_t}


def stage_select(work: DataWork, *, heldout: list[str], templates: list[dict], seed: int = 0, log=print) -> list[dict]:
    p = work.dir / "prompts.json"
    if p.exists():
        return read_data_prompts(p)
    rows = [{**r, "source": "magpie" if r["category"] == "chat" else "steered"} for r in work.rows("questions")]
    kept, why = select_prompts(rows, heldout, templates=templates, seed=seed)
    atomic_write_text(p, json.dumps({"prompts": kept, "dropped": why, "candidates": len(rows)}) + "\n")
    log(f"select: {len(kept)} prompts from {len(rows)} user turns ({why})")
    return kept


# ------------------------------------------------------------------------------------------- answers
def spread(n: int) -> list[int]:
    """0..n-1 in bit-reversed order (0, n/2, n/4, 3n/4, ...): the batches done after any stop are spread over the
    whole range, so a partial set of answers covers short and long prompts (every category) alike."""
    bits = max(1, (n - 1).bit_length())
    return [b for b in sorted(range(1 << bits), key=lambda b: int(f"{b:0{bits}b}"[::-1], 2)) if b < n]


def stage_answers(hf, tok, work: DataWork, prompts: list[dict], *, worker: tuple[int, int] = (0, 1),
                  max_batches: int | None = None, log=print) -> None:
    """Greedy answers, BATCH prompts a shard, the prompts sorted by length so that a batch pads little; the batches
    taken in `spread` order, so that answers stopped part way still cover every length and category."""
    end = tok.convert_tokens_to_ids("<|im_end|>")
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    enc = [(template_ids(tok, p["prompt"]), p) for p in prompts]
    order = sorted(range(len(enc)), key=lambda j: (len(enc[j][0]), j))
    n_b = (len(order) + BATCH - 1) // BATCH
    i, n = worker
    done = 0
    for b in spread(n_b):
        path = work.shard("answers", b)
        if b % n != i or path.exists():
            continue
        if max_batches is not None and done >= max_batches:
            break
        cpu0, wall0 = time.process_time(), now()
        chunk = [enc[j] for j in order[b * BATCH:(b + 1) * BATCH]]
        new = decode_rows(hf, [c[0] for c in chunk], max_new=ANSWER_TOKENS, stop=end, pad=pad)
        rows = [{"category": p["category"], "source": p.get("source", ""), "prompt": p["prompt"], "prompt_len": len(ids),
                 "answer_ids": a} for (ids, p), a in zip(chunk, new)]
        _timed_write(path, rows, sum(map(len, new)), cpu0, wall0, {})
        done += 1
        log(f"answers: batch {b + 1}/{n_b} ({now() - wall0:.0f} s, {sum(map(len, new))} tokens)")


def main(argv=None) -> None:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m mtplab.hf.chatdata", description=__doc__.splitlines()[0])
    ap.add_argument("work")
    ap.add_argument("--stage", choices=("questions", "select", "answers"), required=True)
    ap.add_argument("--batches", type=int, default=140, help="question batches of 128")
    ap.add_argument("--worker", default="0/1", help="i/n: this process takes batches b with b %% n == i")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default=next(iter(REAL_MODELS)), help="a real model the lab knows")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    i, n = (int(x) for x in args.worker.split("/"))
    work = DataWork(args.work)
    if args.stage == "select":
        held = [p for ps in heldout_prompts().values() for p in ps]
        stage_select(work, heldout=held, templates=template_prompts(2000, seed=1))
        return
    from mtplab.hf.target import load_hf
    t = load_hf(args.model)
    if args.stage == "questions":
        stage_questions(t.hf, t.tokenizer, work, batches=args.batches, worker=(i, n))
    else:
        ps = stage_select(work, heldout=[], templates=[]) if (work.dir / "prompts.json").exists() else None
        if ps is None:
            raise MtplabError(f"{work.dir}/prompts.json is missing; run --stage select first")
        stage_answers(t.hf, t.tokenizer, work, ps, worker=(i, n))


if __name__ == "__main__":
    main()
