"""A training run's settings: `TrainConfig` (every knob, with the defaults of `fit`) and `check`, every input
check, run before anything is loaded or written."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
import torch
from mtplab.model import checkpoint as ckpt
from mtplab.model.config import FAMILY, HEAD_FAMILIES, MAX_DEPTHS, ModelConfig, preset as get_preset
from mtplab.data import corpus_path
from mtplab.errors import MtplabError
from mtplab import platform_compat as compat
from mtplab.model.gpt import GPT
from mtplab.training.steps import AUTOCAST, LABELS

SAVE_DTYPES = {None: None, "fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
MAX_NAME = 200  # characters: NAME.state.next.safetensors and its temp file must stay under 255 bytes


@dataclass(frozen=True)
class TrainConfig:
    """Every knob of a run. n_depths = K (stern, meta; default 4), n_modules = D (deepseek; default 1, K = D+1).
    freeze_trunk trains only heads on `from_checkpoint` and saves only them, naming the base. labels: 'corpus',
    or with a frozen trunk 'self' / 'self-argmax' (each depth learns the frozen target's distribution / choice).
    stop_after ends early (a killed run, in tests); max_seconds ends it, validated and saved. autocast: 'auto'
    (bf16 where it pays), 'bf16', 'off'. resume continues the run in out; overwrite replaces it."""
    preset: str = "tiny"
    corpus: str = "code"
    steps: int = 100
    out: str | Path | None = None
    name: str | None = None
    seed: int = 0
    resume: bool = False
    overwrite: bool = False
    heads: str = "none"
    n_depths: int | None = None
    n_modules: int | None = None
    freeze_trunk: bool = False
    from_checkpoint: str | Path | None = None
    lam: float = 0.3
    batch_size: int = 16
    lr: float = 3e-3
    warmup: int | None = None
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int | None = None
    eval_windows: int = 64
    save_every: int | None = None
    device: str = "auto"
    dropout: float | None = None
    memory_efficient: bool = True
    save_dtype: str | None = None
    progress: bool = True
    stop_after: int | None = None
    max_seconds: float | None = None
    labels: str = "corpus"
    autocast: str = "auto"
    deepen: int | None = None  # grow the --from trunk to this many layers first (mtplab.model.gpt.deepen)
    save_seconds: float | None = None  # also save when this much wall time passed since the last save (300)
    heads_from: str | Path | None = None  # start the heads from this heads checkpoint (same family and depths)

    def depths(self) -> int:
        """K from the family and whichever of K or D (deepseek) was given."""
        heads, n_depths, n_modules = self.heads, self.n_depths, self.n_modules
        if n_modules is not None:
            if heads not in FAMILY or not FAMILY[heads].sequential:
                raise MtplabError(f"--modules (D) is for --heads deepseek; {heads} takes --depths K")
            if n_depths is not None and n_depths != n_modules + 1:
                raise MtplabError(f"D={n_modules} modules means K={n_modules + 1} depths, not {n_depths}; "
                                  "give one of them")
            if isinstance(n_modules, bool) or not isinstance(n_modules, int) or n_modules < 1:
                raise MtplabError(f"--modules must be >= 1 (got {n_modules!r})")
            if n_modules >= MAX_DEPTHS:
                raise MtplabError(f"--modules {n_modules} is more than {MAX_DEPTHS - 1} sequential modules; use at "
                                  f"most --modules {MAX_DEPTHS - 1} (DeepSeek-V3 trains one)")
            return n_modules + 1
        if heads == "none":
            if n_depths not in (None, 1):
                raise MtplabError(f"--heads none predicts one token per position; --depths {n_depths} needs "
                                  "a head family")
            return 1
        depths = n_depths if n_depths is not None else FAMILY[heads].default_depths if heads in FAMILY else 4
        if isinstance(depths, bool) or not isinstance(depths, int):
            raise MtplabError(f"--depths must be an integer >= 2 (got {depths!r})")
        if depths > MAX_DEPTHS:
            raise MtplabError(f"--depths {depths} is more than {MAX_DEPTHS} prediction depths; use at most --depths "
                              f"{MAX_DEPTHS} (acceptance falls off long before: the papers use 1 to 10, 32 for bytes)")
        if depths < 2:
            raise MtplabError(f"--heads {heads} needs --depths >= 2 (got {depths}); depth 1 is the trunk's own head")
        return depths

    def run_name(self) -> str:
        """ntp, stern-k4 / meta-k4 (K depths), deepseek-d1 (D modules), or the given name."""
        if self.name is not None:
            return self.name
        if self.heads == "none":
            return "ntp"
        k = self.depths()
        return f"{self.heads}-d{k - 1}" if FAMILY[self.heads].sequential else f"{self.heads}-k{k}"


def default_name(heads: str, n_depths: int) -> str:
    return TrainConfig(heads=heads, n_depths=n_depths).run_name()


def need_int(flag: str, v, lo: int, hi: int | None = None, *, optional: bool = False) -> None:
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v >= hi):
        span = f"in [{lo}, {hi})" if hi is not None else f">= {lo}"
        raise MtplabError(f"{flag} must be an integer {span} (got {v!r})")


def need_number(flag: str, v, *, low: float, strict: bool, optional: bool = False, high: float | None = None):
    if v is None and optional:
        return
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    ok = ok and (v > low if strict else v >= low) and (high is None or v < high)
    if not ok:
        span = (f"in [{low}, {high})" if high is not None else f"{'>' if strict else '>='} {low}")
        raise MtplabError(f"{flag} must be a finite number {span} (got {v!r})")


def check_loop(c: TrainConfig) -> int:
    """The checks of what the lab's one loop and its run folder take, shared by every trainer on it (`check`, and
    `train --hf` in `mtplab.distill.live.check_train_options`); returns the depths K."""
    if isinstance(c.steps, bool) or not isinstance(c.steps, int) or c.steps <= 0:
        raise MtplabError(f"steps must be a positive integer (got {c.steps})")
    if not (isinstance(c.lam, (int, float)) and not isinstance(c.lam, bool) and math.isfinite(c.lam) and c.lam >= 0):
        raise MtplabError(f"lambda must be >= 0 (got {c.lam}); DeepSeek-V3 used 0.3 early in training, then 0.1")
    need_int("--batch-size", c.batch_size, 1)
    need_number("--lr", c.lr, low=0, strict=True)
    need_int("--seed", c.seed, 0, 2 ** 63)
    need_int("--warmup", c.warmup, 0, optional=True)
    need_int("eval_windows", c.eval_windows, 1)
    need_int("--save-every", c.save_every, 1, optional=True)
    need_number("--max-seconds", c.max_seconds, low=0, strict=True, optional=True)
    need_number("save_seconds", c.save_seconds, low=0, strict=True, optional=True)
    check_name(c.name)
    if c.resume and c.overwrite:
        raise MtplabError("--resume continues the run in --out and --overwrite replaces it; give one of them")
    return c.depths()


def check(c: TrainConfig) -> None:
    """Every input check, before anything is loaded or written."""
    if c.heads not in HEAD_FAMILIES:
        raise MtplabError(f"unknown head family {c.heads!r}; choose one of {', '.join(HEAD_FAMILIES)}")
    check_loop(c)
    corpus_path(c.corpus, "train")
    get_preset(c.preset) if c.from_checkpoint is None else ckpt.resolve(c.from_checkpoint)
    need_number("--dropout", c.dropout, low=0, strict=False, high=1, optional=True)
    need_number("weight_decay", c.weight_decay, low=0, strict=False)
    need_number("grad_clip", c.grad_clip, low=0, strict=True)
    need_int("--eval-every", c.eval_every, 1, optional=True)
    need_int("stop_after", c.stop_after, 1, optional=True)
    if c.save_dtype not in SAVE_DTYPES:
        raise MtplabError(f"unknown save dtype {c.save_dtype!r}; choose fp32, fp16 or bf16")
    if c.freeze_trunk and c.from_checkpoint is None:
        raise MtplabError("--freeze-trunk needs --from CHECKPOINT: a frozen trunk must come from a trained model")
    if c.labels not in LABELS:
        raise MtplabError(f"unknown labels {c.labels!r}; choose one of {', '.join(LABELS)}")
    if c.labels != "corpus" and not c.freeze_trunk:
        raise MtplabError(f"--labels {c.labels} needs --freeze-trunk --from CHECKPOINT: the heads learn what a "
                          "frozen target predicts")
    if c.autocast not in AUTOCAST:
        raise MtplabError(f"unknown autocast {c.autocast!r}; choose one of {', '.join(AUTOCAST)}")
    if c.freeze_trunk and c.heads == "none":
        raise MtplabError("--freeze-trunk with --heads none has nothing to train; choose stern, meta or deepseek")
    need_int("--deepen", c.deepen, 1, 257, optional=True)
    if c.deepen is not None and (c.from_checkpoint is None or c.freeze_trunk):
        raise MtplabError("--deepen N grows a trained trunk and trains it on: give --from CHECKPOINT, without "
                          "--freeze-trunk")
    if c.heads_from is not None:
        if c.heads == "none" or not c.freeze_trunk:
            raise MtplabError("--heads-from starts heads on a frozen trunk: give --heads FAMILY --freeze-trunk --from CHECKPOINT")
        ckpt.resolve(c.heads_from)
    if (c.resume or c.overwrite) and c.out is None:
        raise MtplabError("--resume and --overwrite need --out DIR")


def check_name(name) -> None:
    """--name: a plain file stem that cannot leave --out (None: the default name)."""
    if name is not None and (not isinstance(name, str) or not NAME.fullmatch(name)
                             or name.endswith((".state", ".json", ".safetensors", ".next", ".probe"))):
        raise MtplabError(f"--name {name!r} must be a plain file stem (letters, digits, '.', '_', '-'; no '/' "
                          "and no leading '.'), such as ntp or my-run.v2")
    if name is not None and len(name) > MAX_NAME:
        raise MtplabError(f"--name is {len(name)} characters long; file names must stay under 255 bytes: use at "
                          f"most {MAX_NAME} characters")


def memory_here(dev: torch.device) -> int:
    """Bytes a run may use: the accelerator's memory, else the RAM (or the address-space limit, if lower)."""
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).total_memory
    return compat.memory_bytes() or 1 << 62  # unknown: no limit from here (platform_compat says where)


def _size(n: float) -> str:
    for unit, div in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n / 1e3:.0f} KB"


def check_memory(cfg: ModelConfig, *, batch_size: int, seq_len: int, trainable: int, frozen: int, dev: torch.device,
                 hint: str) -> None:
    """Refuse a run whose one training step cannot fit in memory, before anything is built: weights (4 bytes
    a parameter), with gradients and AdamW's two moments for the trainable ones (16 bytes), and activations
    (about 24 floats a channel per layer and token, plus 3 floats a vocabulary entry per depth and token)."""
    layers = cfg.n_layer + (cfg.n_depths - 1 if FAMILY[cfg.heads].layers else 0)
    per_sample = seq_len * 4 * (layers * (24 * cfg.n_embd + cfg.n_head * seq_len) + 3 * cfg.n_depths * cfg.vocab_size)
    fixed = 16 * trainable + 4 * frozen
    need, have = fixed + batch_size * per_sample, memory_here(dev)
    if need <= have:
        return
    fits = max(0, (have - fixed) // per_sample)
    more = f"lower --batch-size (at most about {fits} fits)" if fits >= 1 else hint
    depths = f"{cfg.n_depths} depth{'s' if cfg.n_depths != 1 else ''}"
    raise MtplabError(f"one training step needs about {_size(need)} of memory (--batch-size {batch_size}, {depths}, "
                      f"{trainable + frozen:,} parameters), more than the {_size(have)} here; {more}")


def count_parameters(cfg: ModelConfig) -> int:
    """Parameters of a GPT of this config, counted on the meta device (nothing is allocated)."""
    with torch.device("meta"):
        model = GPT(cfg)
    return sum(p.numel() for p in model.parameters())
