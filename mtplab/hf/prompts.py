"""Prompts for the real model's heads: the hand-written held-out prompts by category (never trained on) and task
templates over topic lists and passages of the shipped corpora, one per held-out category. Plain text, no model:
`mtplab.hf.distill` and `mtplab.hf.chatdata` add the model's own questions (Magpie) to them.
"""
from __future__ import annotations

import random
from pathlib import Path
from mtplab.errors import MtplabError
from mtplab.files import read_json
from mtplab.paths import DATA_DIR

HELDOUT = DATA_DIR / "prompts" / "heldout.json"
CATEGORIES = ("code", "math", "writing", "qa", "summarization", "translation")

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
