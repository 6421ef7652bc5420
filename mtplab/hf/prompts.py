"""The hand-written held-out prompts of the real model's heads, by category: never trained on (the training prompts
are the model's own, scripts/make_chat_data.py), read by `distill`, `bench real` and the notebooks, as text
(`heldout_prompts`) or as chat turns in a model's ids (`heldout_ids`).
"""
from __future__ import annotations

from pathlib import Path
from mtplab.errors import MtplabError
from mtplab.files import read_json
from mtplab.hf.real import chat_ids
from mtplab.paths import DATA_DIR

HELDOUT = DATA_DIR / "prompts" / "heldout.json"
CATEGORIES = ("code", "math", "writing", "qa", "summarization", "translation")


def heldout_prompts(path: Path = HELDOUT) -> dict[str, list[str]]:
    """The hand-written held-out prompts by category (never trained on)."""
    d = read_json(path, limit=1 << 20, what="the held-out prompts", fix="restore data/prompts/heldout.json from git")
    cats = d.get("categories") if isinstance(d, dict) else None
    if not isinstance(cats, dict) or set(cats) != set(CATEGORIES) or not all(
            isinstance(v, list) and v and all(isinstance(s, str) and s for s in v) for v in cats.values()):
        raise MtplabError(f"{path} is not the lab's held-out prompt file (six categories: {', '.join(CATEGORIES)}); "
                          "restore it from git")
    return {c: list(cats[c]) for c in CATEGORIES}


def heldout_ids(target, per_category: int | None = None) -> tuple[list[list[int]], list[str]]:
    """The held-out prompts, the first `per_category` of each category (None: all), each as one user turn in the
    target's ids (`hf.real.chat_ids`), and the category of each."""
    held = [(c, p) for c, ps in heldout_prompts().items() for p in ps[:per_category]]
    return [chat_ids(target, p) for _, p in held], [c for c, _ in held]
