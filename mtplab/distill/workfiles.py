"""Validated, bounded readers of the distillation's work folders: its answers/ and cache/ shards and times.json
(the heads' save sets are read by `mtplab.training.runs`), and the chat data's questions/ and answers/ shards
(`mtplab.distill.chatdata`, written by scripts/make_chat_data.py). A draft vocabulary (vocab-N.json here, and
draft-vocab.json where it ships) and what ships in data/hf/NAME are read by `mtplab.hf.heads_file`.

Each reader first checks the path with `mtplab.files.regular` (a regular file no larger than its kind can be, from
`os.stat`, before anything is opened), then reads it and checks its type, keys, lengths, token ids (against the
model's vocabulary size) and tensor shapes (against the model's config). Every failure is one `MtplabError` line that
names the file and the fix: delete the file and rerun its stage with --resume.
"""
from __future__ import annotations

import re
from pathlib import Path

from mtplab.errors import MtplabError
from mtplab.files import MAX_JSON, bad_file, checked_header, finite, ids_ok, ids_why, json_file

MAX_SHARD_JSON = 64 << 20      # bytes of one answers or questions shard
MAX_CACHE_SHARD = 4 << 30      # bytes of one trunk-cache shard (256 rows of 2,048 positions of a 576-wide trunk: 0.6 GB)
SHARD_NAME = re.compile(r"^[0-9]{5}\.(json|safetensors)$")
CACHE_KEYS = {"tokens": ("I64", 2), "hidden": ("BF16", 3), "top_i": ("I32", 3), "top_p": ("F16", 3),
              "length": ("I64", 1), "prompt_len": ("I64", 1)}


def rerun(stage: str) -> str:
    """The fix for a bad file of a work folder."""
    return f"delete it and rerun the {stage} stage with --resume"


def shards(folder, *, suffix: str = ".json") -> list[Path]:
    """The shards of a work folder's sub-folder, NNNNN.json or NNNNN.safetensors, in order; other files (a stray
    notes.json, an editor's backup, a temp file) are not shards and are left alone."""
    d = Path(folder)
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if SHARD_NAME.match(p.name) and p.suffix == suffix)


def read_answer_shard(path, *, vocab_size: int, context: int) -> list[dict]:
    """distill's answers/NNNNN.json: a non-empty list of {"category": str, "prompt_ids": [id], "answer_ids": [id]},
    every id in 0..vocab_size-1 and each row's prompt plus answer at most `context` tokens."""
    what, fix = "an answers shard", rerun("answers")
    d = json_file(path, limit=MAX_SHARD_JSON, what=what, fix=fix)
    if not isinstance(d, list) or not d:
        raise bad_file(path, what, "a non-empty JSON list of answered prompts", fix)
    for j, r in enumerate(d):
        if not isinstance(r, dict) or not isinstance(r.get("category"), str):
            raise bad_file(path, what, f"row {j} is not an object with a category", fix)
        for key in ("prompt_ids", "answer_ids"):
            if not ids_ok(r.get(key), vocab_size):
                raise bad_file(path, what, f"row {j}: {ids_why(r.get(key), vocab_size, key)}", fix)
        n = len(r["prompt_ids"]) + len(r["answer_ids"])
        if not r["prompt_ids"] or n > context:
            raise bad_file(path, what, f"row {j} has {n} tokens; a row has 1..{context} (the context window)", fix)
    return d


def read_cache_shard(path, *, vocab_size: int, hidden: int | None, topk: int, context: int) -> dict:
    """distill's cache/NNNNN.safetensors: tokens (B, T) I64, hidden (B, T, C) BF16, top_i (B, T, K) I32, top_p
    (B, T, K) F16, length (B,) and prompt_len (B,) I64; shapes checked against the model (C = its hidden size,
    T <= its context) from the header before loading, then ids in range, lengths in order, numbers finite."""
    import torch
    from safetensors.torch import load_file
    what, fix = "a trunk-cache shard", rerun("cache")
    shapes, dtypes, _ = checked_header(path, limit=MAX_CACHE_SHARD, what=what, fix=fix)
    if set(shapes) != set(CACHE_KEYS):
        odd = sorted(set(shapes) ^ set(CACHE_KEYS))
        raise bad_file(path, what, f"its tensors are {sorted(shapes)}; {odd[0]!r} is missing or extra", fix)
    odd = next((k for k, (dt, nd) in CACHE_KEYS.items() if dtypes[k] != dt or len(shapes[k]) != nd), None)
    if odd:
        raise bad_file(path, what, f"{odd} is {dtypes[odd]} {list(shapes[odd])}, want {CACHE_KEYS[odd][0]} with "
                   f"{CACHE_KEYS[odd][1]} dimensions", fix)
    B, T = shapes["tokens"]
    hidden = shapes["hidden"][2] if hidden is None else hidden
    want = {"hidden": (B, T, hidden), "top_i": (B, T, topk), "top_p": (B, T, topk), "length": (B,),
            "prompt_len": (B,)}
    odd = next((k for k, s in want.items() if shapes[k] != s), None)
    if odd or B == 0 or not 0 < T <= context:
        why = f"{odd} has shape {list(shapes[odd])}, want {list(want[odd])} for this model" if odd else \
            f"{B} rows of {T} positions; want at least one row of 1..{context} positions"
        raise bad_file(path, what, why, fix)
    try:
        t = load_file(str(path))
    except Exception as e:  # safetensors' own errors: the header said it was whole
        raise bad_file(path, what, f"corrupt: {str(e).splitlines()[0][:120] if str(e) else type(e).__name__}", fix) from None
    for k in ("tokens", "top_i"):
        if int(t[k].min()) < 0 or int(t[k].max()) >= vocab_size:
            raise bad_file(path, what, f"{k} holds ids outside 0..{vocab_size - 1}", fix)
    n, pl = t["length"], t["prompt_len"]
    if bool((n < 1).any() or (n > T).any() or (pl < 0).any() or (pl > n).any()):
        raise bad_file(path, what, f"a row's length or prompt length is outside 1..{T}", fix)
    if not bool(torch.isfinite(t["hidden"]).all()):
        raise bad_file(path, what, "its hidden states hold NaN or infinite values: heads trained on them would be NaN", fix)
    p = t["top_p"].float()
    if not bool(torch.isfinite(p).all()) or bool((p < 0).any() or (p > 1).any()):
        raise bad_file(path, what, "top_p holds values that are not probabilities", fix)
    return t


def read_times(path) -> dict[str, list[float]]:
    """distill's times.json: {stage: [CPU seconds, wall seconds]}, finite and not negative."""
    what, fix = "the stages' times", "delete it (the stages' times start over; nothing else is lost)"
    d = json_file(path, limit=MAX_JSON, what=what, fix=fix)
    if not isinstance(d, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and len(v) == 2 and all(finite(x) and x >= 0 for x in v)
            for k, v in d.items()):
        raise bad_file(path, what, "a JSON object of stage: [CPU seconds, wall seconds]", fix)
    return {k: [float(x) for x in v] for k, v in d.items()}


_DATA_ROWS = {"questions": {"category": str, "steer": str, "prompt": str, "finished": bool},
              "answers": {"category": str, "prompt": str, "prompt_len": int, "answer_ids": list}}


def read_data_shard(path, kind: str, *, vocab_size: int | None = None) -> dict:
    """One shard of `mtplab.distill.chatdata` (questions/NNNNN.json or answers/NNNNN.json): {"rows": [...], "tokens",
    "cpu_s", "wall_s", ...}, each row with its kind's keys and types; answer ids in 0..vocab_size-1 when given."""
    what, fix = f"a {kind} shard", rerun(kind)
    if kind not in _DATA_ROWS:
        raise MtplabError(f"a data shard is a questions or an answers shard (got {kind!r})")
    d = json_file(path, limit=MAX_SHARD_JSON, what=what, fix=fix)
    if not isinstance(d, dict) or not isinstance(d.get("rows"), list):
        raise bad_file(path, what, "a JSON object with a list of rows", fix)
    for k in ("tokens", "cpu_s", "wall_s"):
        if not finite(d.get(k)) or d[k] < 0:
            raise bad_file(path, what, f"{k} is {str(d.get(k))[:20]}, not a number >= 0", fix)
    for j, r in enumerate(d["rows"]):
        if not isinstance(r, dict):
            raise bad_file(path, what, f"row {j} is not an object", fix)
        for k, typ in _DATA_ROWS[kind].items():
            v = r.get(k)
            if not isinstance(v, typ) or (typ is int and (type(v) is not int or v < 0)):
                raise bad_file(path, what, f"row {j}: {k} is not {typ.__name__}", fix)
        if kind == "answers" and vocab_size is not None and not ids_ok(r["answer_ids"], vocab_size):
            raise bad_file(path, what, f"row {j}: {ids_why(r['answer_ids'], vocab_size, 'answer_ids')}", fix)
    return d


def data_shards(folder, kind: str, *, vocab_size: int | None = None) -> list[dict]:
    """Every shard of chatdata's `folder`/`kind`/, read by `read_data_shard`, in order."""
    return [read_data_shard(p, kind, vocab_size=vocab_size) for p in shards(Path(folder) / kind)]
