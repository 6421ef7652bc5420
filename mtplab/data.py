"""The two shipped corpora as byte tensors, and seeded random batches."""
from __future__ import annotations

from pathlib import Path

import torch

from mtplab import paths
from mtplab.errors import MtplabError
from mtplab.tokenizer import encode

DATA_DIR = paths.DATA_DIR  # data/ beside the package, or MTPLAB_DATA (a non-editable install)
CORPORA = ("code", "prose")


def corpus_path(name: str, split: str) -> Path:
    if name not in CORPORA:
        raise MtplabError(f"unknown corpus {name!r}; choose one of {', '.join(CORPORA)}")
    if split not in ("train", "val"):
        raise MtplabError(f"unknown split {split!r}; use 'train' or 'val'")
    path = DATA_DIR / "corpora" / f"{name}_{split}.txt"
    if not path.exists():
        raise MtplabError(f"corpus file {path} not found; mtplab's data/ folder ships with the source, not the "
                          "wheel: set MTPLAB_DATA=/path/to/mtplab/data (or install with pip install -e .)")
    return path


def load_corpus(name: str, split: str = "train") -> torch.Tensor:
    """The corpus as a uint8 tensor of UTF-8 bytes (token ids)."""
    path = corpus_path(name, split)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise MtplabError(f"cannot read corpus file {path} ({e.strerror or e}); restore it (data/corpora/ ships "
                          "with the source) or point MTPLAB_DATA at a data folder") from None
    if not raw:
        raise MtplabError(f"corpus file {path} is empty; restore it (data/corpora/ ships with the source) or point "
                          "MTPLAB_DATA at a data folder whose corpora hold text")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def need_tokens(data: torch.Tensor, n: int, where) -> torch.Tensor:
    """`data` itself, once it holds at least n tokens (one window of n - 1 inputs and their targets, plus one
    more for a random start when n is block_size + 2)."""
    if len(data) < n:
        raise MtplabError(f"the corpus {where} has {len(data)} tokens, fewer than the {n} one training window of "
                          "this model needs; give a longer text or a model with a shorter context window")
    return data


def get_batch(data: torch.Tensor, batch_size: int, block_size: int, generator: torch.Generator) -> torch.Tensor:
    """(B, block_size + 1) windows: inputs are [:, :-1], next-token targets [:, 1:]."""
    need_tokens(data, block_size + 2, "given")
    ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=generator)
    return torch.stack([data[i:i + block_size + 1] for i in ix.tolist()]).long()


def val_windows(data: torch.Tensor, block_size: int, n: int) -> torch.Tensor:
    """n evenly spaced (block_size + 1) windows: the same every time, for comparable validation."""
    need_tokens(data, block_size + 1, "given")
    step = max(1, (len(data) - block_size - 1) // n)
    starts = [min(i * step, len(data) - block_size - 1) for i in range(n)]  # a short text repeats its last window
    return torch.stack([data[s:s + block_size + 1] for s in starts]).long()


BENCH_PROMPTS = 8  # `bench decode`, `bench peers` and `bench domain` decode the first 8 held-out prompts


def _spread(r: int) -> float:
    """0, 1/2, 1/4, 3/4, 1/8, ...: where round r's prompts sit between the first round's (van der Corput order)."""
    f, half = 0.0, 0.5
    while r:
        f, r, half = f + half * (r & 1), r >> 1, half / 2
    return f


def held_out_prompts(corpus: str = "code", n: int = 20, length: int = 64) -> list[str]:
    """The first n of ONE ordered set of held-out prompts, cut from the validation split at line starts, each `length`
    bytes at most. The first 8 are evenly spaced and are the benchmarks' set; the next ones fall between them. So a
    notebook's 3 or 6 prompts are the benchmarks' first 3 or 6, never another sample."""
    text = corpus_path(corpus, "val").read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    stride = max(1, len(lines) // BENCH_PROMPTS)
    prompts = []
    for j in range(n):
        i = min(len(lines) - 1, (j % BENCH_PROMPTS) * stride + int(_spread(j // BENCH_PROMPTS) * stride))
        chunk = ""
        while i < len(lines) and len(chunk.encode()) < length:
            chunk += lines[i]
            i += 1
        prompts.append(chunk.encode()[:length].decode("utf-8", errors="ignore") or "def ")
    return prompts


def held_out_ids(n: int, length: int = 48) -> list[list[int]]:
    """n held-out code prompts as token ids (the same ones `bench decode` uses)."""
    return [encode(p)[:length] for p in held_out_prompts("code", n, length)]
