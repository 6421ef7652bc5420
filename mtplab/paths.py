"""Where the lab's files live, resolved once: the corpora and checkpoints under `data/`, the benchmark records
under `docs/bench/`, the lab's own Hugging Face models under `data/hf/`.

`MTPLAB_DATA` points at another data folder (its `corpora/` and `checkpoints/`), for a non-editable install;
`MTPLAB_CHECKPOINTS` points at another checkpoint folder only. Imports nothing of the project.
"""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent           # the checkout (or the install's site-packages parent)
DATA_DIR = Path(os.environ.get("MTPLAB_DATA") or ROOT / "data")
SHIPPED_DIR = DATA_DIR / "checkpoints"                   # the shipped checkpoints, never written by a run
CHECKPOINT_DIR = Path(os.environ.get("MTPLAB_CHECKPOINTS") or SHIPPED_DIR)
BENCH_DIR = ROOT / "docs" / "bench"                      # the shipped benchmark records (bench --out's default)
DECODE_JSON = BENCH_DIR / "decode.json"                  # `bench decode`'s record, read by notebooks 03 and 05
HF_DIR = DATA_DIR / "hf"                                 # the lab's own Hugging Face models (train-hf-model)
PEERS_JSON = BENCH_DIR / "peers.json"                    # `bench peers`' record, read by notebook 10
DOMAIN_JSON = BENCH_DIR / "domain.json"                  # `bench domain`'s record, read by notebook 10
REAL_NAMES = ("smollm2",)  # the real models (installed from a package), named once for the layers below mtplab.hf;
                           # hf.real.REAL_MODELS asserts its keys are these, and the layers above it use REAL_MODELS

SHIPPED = (SHIPPED_DIR, HF_DIR)                          # what the lab ships: never replaced by a run's --out


def shipped_folder(path) -> Path | None:
    """The shipped folder that `path` is or lies in (data/checkpoints, data/hf), or None. Writing there needs the
    opt-in MTPLAB_WRITE_SHIPPED=1."""
    p = Path(path).resolve()
    for d in SHIPPED:
        d = d.resolve()
        if p == d or d in p.parents:
            return d
    return None


def may_write_shipped() -> bool:
    return os.environ.get("MTPLAB_WRITE_SHIPPED") == "1"
