"""Validated, bounded readers for every file the real model's commands read back: the distillation's work folder
(answers/ and cache/ shards, vocab-N.json, times.json; the heads' save sets are read by `mtplab.training.runs`), the
chat data's folder (`mtplab.hf.chatdata`, written by scripts/make_chat_data.py: questions/ and answers/ shards) and
what ships in data/hf/NAME (record.json, draft-vocab.json, the heads files).

Each reader first checks, from `os.stat` and before anything is opened, that the path is a regular file no larger
than its kind can be (a FIFO, a device, a directory or a sparse giant is refused, never opened for reading), then
reads it and checks its type, keys, lengths, token ids (against the model's vocabulary size) and tensor shapes
(against the model's config). Every failure is one `MtplabError` line that names the file and the fix: for the
work folders, delete the file and rerun its stage with --resume; for what ships, restore it from git.
"""
from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path

from mtplab.errors import MtplabError
from mtplab import files
from mtplab.files import read_json
from mtplab.paths import shipped_folder

MAX_SHARD_JSON = 64 << 20      # bytes of one answers or questions shard
MAX_CACHE_SHARD = 4 << 30      # bytes of one trunk-cache shard (256 rows of 2,048 positions of a 576-wide trunk: 0.6 GB)
MAX_HEADS_FILE = 2 << 30       # bytes of a heads .safetensors file
MAX_SMALL_JSON = 16 << 20      # times.json, record.json, vocab-N.json, draft-vocab.json
SHARD_NAME = re.compile(r"^[0-9]{5}\.(json|safetensors)$")
CACHE_KEYS = {"tokens": ("I64", 2), "hidden": ("BF16", 3), "top_i": ("I32", 3), "top_p": ("F16", 3),
              "length": ("I64", 1), "prompt_len": ("I64", 1)}


def rerun(stage: str) -> str:
    """The fix for a bad file of a work folder."""
    return f"delete it and rerun the {stage} stage with --resume"


def in_shipped(path) -> bool:
    """The file lies in what the lab ships (its folder does: a link there to elsewhere is still a shipped file)."""
    return shipped_folder(Path(path).absolute().parent) is not None


def shipped_fix(path) -> str:
    """The fix for a bad file that ships in data/: restore it, since no command rewrites it in place."""
    return f"restore it from git (git checkout -- {Path(path).parent})"


# ------------------------------------------------------------------------------------------- the file itself
def regular(path, *, limit: int, what: str, fix: str) -> int:
    """The size of `path`, a regular file of at most `limit` bytes, from `os.stat` before anything opens it; a
    missing file, a directory, a FIFO, a device or a file larger than its kind can be is one line."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise MtplabError(f"{p} is missing (or a link to nothing), not {what}; {fix}") from None
    except (OSError, ValueError) as e:
        raise MtplabError(f"cannot read {p} ({getattr(e, 'strerror', None) or e}); {fix}") from None
    if not stat.S_ISREG(st.st_mode):
        raise MtplabError(f"{p} is not a regular file (a device, a pipe or a directory), not {what}; {fix}")
    if st.st_size > limit:
        raise MtplabError(f"{p} holds {st.st_size} bytes, more than {what} can ({limit}); {fix}")
    return st.st_size


def json_file(path, *, limit: int, what: str, fix: str):
    """A JSON file checked by `regular`, then read bounded (`read_json`)."""
    regular(path, limit=limit, what=what, fix=fix)
    return read_json(Path(path), limit=limit, what=what, fix=fix)


def _bad(path, what: str, why: str, fix: str) -> MtplabError:
    return MtplabError(f"{path} is not {what} ({why}); {fix}")


def _num(x) -> bool:
    return (type(x) is int or type(x) is float) and math.isfinite(x)


def _ids_ok(ids, V: int) -> bool:
    return isinstance(ids, list) and all(type(i) is int and 0 <= i < V for i in ids)


def _ids_why(ids, V: int, key: str) -> str:
    if not isinstance(ids, list):
        return f"{key} is a {type(ids).__name__}, not a list of token ids"
    bad = next(i for i in ids if not (type(i) is int and 0 <= i < V))
    return f"{key} holds {json.dumps(bad)[:40]}, not a token id in 0..{V - 1}"


def shards(folder, *, suffix: str = ".json") -> list[Path]:
    """The shards of a work folder's sub-folder, NNNNN.json or NNNNN.safetensors, in order; other files (a stray
    notes.json, an editor's backup, a temp file) are not shards and are left alone."""
    d = Path(folder)
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if SHARD_NAME.match(p.name) and p.suffix == suffix)


# ------------------------------------------------------------------------------------------- distill's work folder
def read_answer_shard(path, *, vocab_size: int, context: int) -> list[dict]:
    """distill's answers/NNNNN.json: a non-empty list of {"category": str, "prompt_ids": [id], "answer_ids": [id]},
    every id in 0..vocab_size-1 and each row's prompt plus answer at most `context` tokens."""
    what, fix = "an answers shard", rerun("answers")
    d = json_file(path, limit=MAX_SHARD_JSON, what=what, fix=fix)
    if not isinstance(d, list) or not d:
        raise _bad(path, what, "a non-empty JSON list of answered prompts", fix)
    for j, r in enumerate(d):
        if not isinstance(r, dict) or not isinstance(r.get("category"), str):
            raise _bad(path, what, f"row {j} is not an object with a category", fix)
        for key in ("prompt_ids", "answer_ids"):
            if not _ids_ok(r.get(key), vocab_size):
                raise _bad(path, what, f"row {j}: {_ids_why(r.get(key), vocab_size, key)}", fix)
        n = len(r["prompt_ids"]) + len(r["answer_ids"])
        if not r["prompt_ids"] or n > context:
            raise _bad(path, what, f"row {j} has {n} tokens; a row has 1..{context} (the context window)", fix)
    return d


def safetensors_header(path, *, limit: int, what: str, fix: str) -> tuple[dict, dict, dict]:
    """(shapes, dtypes, metadata) of a safetensors file, after `regular`, from `mtplab.files.safetensors_header`
    (bounded header; the tensors must exactly cover the file)."""
    regular(path, limit=limit, what=what, fix=fix)
    try:
        return files.safetensors_header(path)
    except RecursionError:
        raise _bad(path, what, "its header is nested too deeply", fix) from None
    except OSError as e:
        raise MtplabError(f"cannot read {path} ({e.strerror or e}); {fix}") from None
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise _bad(path, what, f"corrupt or truncated: {str(e)[:160]}", fix) from None


def read_cache_shard(path, *, vocab_size: int, hidden: int | None, topk: int, context: int) -> dict:
    """distill's cache/NNNNN.safetensors: tokens (B, T) I64, hidden (B, T, C) BF16, top_i (B, T, K) I32, top_p
    (B, T, K) F16, length (B,) and prompt_len (B,) I64; shapes checked against the model (C = its hidden size,
    T <= its context) from the header before loading, then ids in range, lengths in order, numbers finite."""
    import torch
    from safetensors.torch import load_file
    what, fix = "a trunk-cache shard", rerun("cache")
    shapes, dtypes, _ = safetensors_header(path, limit=MAX_CACHE_SHARD, what=what, fix=fix)
    if set(shapes) != set(CACHE_KEYS):
        odd = sorted(set(shapes) ^ set(CACHE_KEYS))
        raise _bad(path, what, f"its tensors are {sorted(shapes)}; {odd[0]!r} is missing or extra", fix)
    odd = next((k for k, (dt, nd) in CACHE_KEYS.items() if dtypes[k] != dt or len(shapes[k]) != nd), None)
    if odd:
        raise _bad(path, what, f"{odd} is {dtypes[odd]} {list(shapes[odd])}, want {CACHE_KEYS[odd][0]} with "
                   f"{CACHE_KEYS[odd][1]} dimensions", fix)
    B, T = shapes["tokens"]
    hidden = shapes["hidden"][2] if hidden is None else hidden
    want = {"hidden": (B, T, hidden), "top_i": (B, T, topk), "top_p": (B, T, topk), "length": (B,),
            "prompt_len": (B,)}
    odd = next((k for k, s in want.items() if shapes[k] != s), None)
    if odd or B == 0 or not 0 < T <= context:
        why = f"{odd} has shape {list(shapes[odd])}, want {list(want[odd])} for this model" if odd else \
            f"{B} rows of {T} positions; want at least one row of 1..{context} positions"
        raise _bad(path, what, why, fix)
    try:
        t = load_file(str(path))
    except Exception as e:  # safetensors' own errors: the header said it was whole
        raise _bad(path, what, f"corrupt: {str(e).splitlines()[0][:120] if str(e) else type(e).__name__}", fix) from None
    for k in ("tokens", "top_i"):
        if int(t[k].min()) < 0 or int(t[k].max()) >= vocab_size:
            raise _bad(path, what, f"{k} holds ids outside 0..{vocab_size - 1}", fix)
    n, pl = t["length"], t["prompt_len"]
    if bool((n < 1).any() or (n > T).any() or (pl < 0).any() or (pl > n).any()):
        raise _bad(path, what, f"a row's length or prompt length is outside 1..{T}", fix)
    if not bool(torch.isfinite(t["hidden"]).all()):
        raise _bad(path, what, "its hidden states hold NaN or infinite values: heads trained on them would be NaN", fix)
    p = t["top_p"].float()
    if not bool(torch.isfinite(p).all()) or bool((p < 0).any() or (p > 1).any()):
        raise _bad(path, what, "top_p holds values that are not probabilities", fix)
    return t


def read_vocab(path, *, vocab_size: int, shipped: bool = False) -> list[int]:
    """A draft vocabulary ({"n": N, "ids": [id], ...}): N distinct token ids in 0..vocab_size-1, sorted. `shipped`:
    data/hf/NAME/draft-vocab.json (the fix is to restore it); else distill's vocab-N.json (rerun the stage)."""
    what = "a draft vocabulary"
    fix = shipped_fix(path) if shipped else "delete it and rerun the deepseek or stern stage with --resume"
    d = json_file(path, limit=4 << 20, what=what, fix=fix)
    ids = d.get("ids") if isinstance(d, dict) else None
    if not isinstance(ids, list) or not ids:
        raise _bad(path, what, "a JSON object with a non-empty list of token ids, 'ids'", fix)
    if not _ids_ok(ids, vocab_size):
        raise _bad(path, what, _ids_why(ids, vocab_size, "ids"), fix)
    n = d.get("n", len(set(ids)))
    if type(n) is not int or n != len(set(ids)):
        raise _bad(path, what, f"n = {str(n)[:20]} but it lists {len(set(ids))} distinct ids", fix)
    if "coverage" in d and not (_num(d["coverage"]) and 0 <= d["coverage"] <= 1):
        raise _bad(path, what, "its coverage is not a fraction in 0..1", fix)
    return sorted(set(ids))


def read_times(path) -> dict[str, list[float]]:
    """distill's times.json: {stage: [CPU seconds, wall seconds]}, finite and not negative."""
    what, fix = "the stages' times", "delete it (the stages' times start over; nothing else is lost)"
    d = json_file(path, limit=MAX_SMALL_JSON, what=what, fix=fix)
    if not isinstance(d, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and len(v) == 2 and all(_num(x) and x >= 0 for x in v)
            for k, v in d.items()):
        raise _bad(path, what, "a JSON object of stage: [CPU seconds, wall seconds]", fix)
    return {k: [float(x) for x in v] for k, v in d.items()}


# ------------------------------------------------------------------------------------------- what ships in data/hf/NAME
def read_heads_record(path) -> dict:
    """data/hf/NAME/record.json: a JSON object whose "heads" (if any) maps names to objects."""
    what, fix = "the shipped heads' record", shipped_fix(path)
    d = json_file(path, limit=MAX_SMALL_JSON, what=what, fix=fix)
    if not isinstance(d, dict) or not isinstance(d.get("heads", {}), dict) or not all(
            isinstance(v, dict) for v in d.get("heads", {}).values()):
        raise _bad(path, what, "a JSON object with a 'heads' object of records", fix)
    return d


def check_heads_file(path) -> Path:
    """A heads .safetensors file (shipped or given) checked to be a regular file of bounded size before safetensors
    opens it (a FIFO would block its open forever); the fix names git for a shipped one."""
    p = Path(path)
    fix = shipped_fix(p) if in_shipped(p) else "give the heads file that train --hf wrote"
    regular(p, limit=MAX_HEADS_FILE, what="a heads file", fix=fix)
    return p


# ------------------------------------------------------------------------------------------- chatdata's work folder
_DATA_ROWS = {"questions": {"category": str, "steer": str, "prompt": str, "finished": bool},
              "answers": {"category": str, "prompt": str, "prompt_len": int, "answer_ids": list}}


def read_data_shard(path, kind: str, *, vocab_size: int | None = None) -> dict:
    """One shard of `mtplab.hf.chatdata` (questions/NNNNN.json or answers/NNNNN.json): {"rows": [...], "tokens",
    "cpu_s", "wall_s", ...}, each row with its kind's keys and types; answer ids in 0..vocab_size-1 when given."""
    what, fix = f"a {kind} shard", f"delete it and rerun the {kind} stage with --resume"
    if kind not in _DATA_ROWS:
        raise MtplabError(f"a data shard is a questions or an answers shard (got {kind!r})")
    d = json_file(path, limit=MAX_SHARD_JSON, what=what, fix=fix)
    if not isinstance(d, dict) or not isinstance(d.get("rows"), list):
        raise _bad(path, what, "a JSON object with a list of rows", fix)
    for k in ("tokens", "cpu_s", "wall_s"):
        if not _num(d.get(k)) or d[k] < 0:
            raise _bad(path, what, f"{k} is {str(d.get(k))[:20]}, not a number >= 0", fix)
    for j, r in enumerate(d["rows"]):
        if not isinstance(r, dict):
            raise _bad(path, what, f"row {j} is not an object", fix)
        for k, typ in _DATA_ROWS[kind].items():
            v = r.get(k)
            if not isinstance(v, typ) or (typ is int and (type(v) is not int or v < 0)):
                raise _bad(path, what, f"row {j}: {k} is not {typ.__name__}", fix)
        if kind == "answers" and vocab_size is not None and not _ids_ok(r["answer_ids"], vocab_size):
            raise _bad(path, what, f"row {j}: {_ids_why(r['answer_ids'], vocab_size, 'answer_ids')}", fix)
    return d


def data_shards(folder, kind: str, *, vocab_size: int | None = None) -> list[dict]:
    """Every shard of chatdata's `folder`/`kind`/, read by `read_data_shard`, in order."""
    return [read_data_shard(p, kind, vocab_size=vocab_size) for p in shards(Path(folder) / kind)]
