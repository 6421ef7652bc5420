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

Task templates over topic lists and passages of the shipped corpora (`template_prompts`, one per held-out category)
fill at most 15% of the prompts. A script, not a part of the lab: what it writes ships as data (data/chat/MODEL), and
`python -m mtplab distill` reads it through `mtplab.distill.chatdata`. Run from the repository root:
`python scripts/make_chat_data.py data/chat/smollm2 --stage questions` (then select, then answers).
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
from mtplab.files import atomic_write_text, bad_file, json_file
from mtplab.distill.chatdata import ANSWER_TOKENS, DataWork, decode_rows, spread
from mtplab.hf.prompts import CATEGORIES, heldout_prompts
from mtplab.hf.real import REAL_MODELS, template_ids
from mtplab.paths import DATA_DIR

BATCH = 64             # answer rows per batch
QUESTION_BATCH = 128   # user turns per batch (short: a larger batch pays the per-step floor less often)
TEMPERATURES = (0.7, 0.9, 1.1)
QUESTION_TOKENS = 112   # a user turn longer than this is dropped (unfinished)
MAX_PROMPT_CHARS = 6000        # a training prompt (the longest template, a passage of five lines, is ~1,500)
MAX_PROMPTS = 1_000_000        # prompts in one prompts.json
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


def read_data_prompts(path) -> list[dict]:
    """The select stage's prompts.json: {"prompts": [{"category": str, "prompt": str of 1..MAX_PROMPT_CHARS}, ...], ...};
    returns the prompts."""
    what, fix = "the selected prompts", "delete it and rerun the select stage"
    d = json_file(path, limit=256 << 20, what=what, fix=fix)
    ps = d.get("prompts") if isinstance(d, dict) else None
    if not isinstance(ps, list) or not ps:
        raise bad_file(path, what, "a JSON object with a non-empty list of prompts", fix)
    if len(ps) > MAX_PROMPTS:
        raise bad_file(path, what, f"{len(ps)} prompts, more than {MAX_PROMPTS}", fix)
    for j, r in enumerate(ps):
        if not isinstance(r, dict) or not isinstance(r.get("category"), str) or not isinstance(r.get("prompt"), str):
            raise bad_file(path, what, f"prompt {j} is not an object with a category and a prompt, both text", fix)
        if not r["prompt"].strip() or len(r["prompt"]) > MAX_PROMPT_CHARS:
            raise bad_file(path, what, f"prompt {j} has {len(r['prompt'])} characters; a training prompt has 1.."
                       f"{MAX_PROMPT_CHARS}", fix)
    return ps


def user_turn_head(tok) -> list[int]:
    """The chat template's ids up to where a user's words begin (Magpie's input)."""
    full = tok.apply_chat_template([{"role": "user", "content": "X"}], tokenize=False, add_generation_prompt=False)
    return tok.encode(full[:full.rindex("X")], add_special_tokens=False)



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
    ap = argparse.ArgumentParser(prog="python scripts/make_chat_data.py", description=__doc__.splitlines()[0])
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
