"""Heads trained on a Hugging Face model while its trunk runs, on a text corpus: what `python -m mtplab train --hf`
runs (the adapter is `mtplab.hf.target`; the heads' training loop and save set are `mtplab.training.heads`, shared with
the distillation's heads on a cached trunk, `mtplab.distill.pipeline`).

B batch, T time, K depths, V vocabulary.

Training is self-distillation on the frozen trunk: depth d at position i learns the target's own distribution
for token i+d (`mtplab.training.losses.self_distill_cross_entropies`), because greedy verification keeps a draft only
when it is the target's own choice. Every family goes through the lab's `train_step` with a frozen trunk, in the
lab's one training loop (`mtplab.training.fit.run`).
"""
from __future__ import annotations

import hashlib
import inspect
from pathlib import Path
import torch
from mtplab.data import CORPORA, corpus_path, get_batch, val_windows
from mtplab.device import now, pick
from mtplab.errors import MtplabError
from mtplab.files import read_bounded
from mtplab.hf.heads_file import base_record
from mtplab.hf.target import load_hf
from mtplab.model.config import HEAD_FAMILIES
from mtplab.model.heads import build_heads
from mtplab.training import fit, runs
from mtplab.training.config import TrainConfig, check_loop, check_memory, default_name, need_int
from mtplab.training.heads import fit_set, fresh_heads
from mtplab.training.steps import LABELS, evaluate, train_step

MAX_CORPUS = 64 << 20  # bytes of --corpus text: a tokenizer takes about 5x that in memory


def corpus_file(corpus, split: str = "train") -> Path:
    """A shipped corpus name (code, prose) or a path to a text file: the file."""
    path = corpus_path(corpus, split) if corpus in CORPORA else Path(corpus) if isinstance(corpus, str) else None
    if path is None or not path.is_file():
        raise MtplabError(f"corpus {corpus!r} is neither one of {', '.join(CORPORA)} nor a text file")
    return path


def corpus_bytes(corpus: str, split: str = "train") -> bytes:
    """A shipped corpus name or a path to a text file (`corpus_file`): its bytes, at most MAX_CORPUS."""
    return read_bounded(corpus_file(corpus, split), limit=MAX_CORPUS, what="a training corpus the lab tokenizes in memory",
                        fix=f"give at most {MAX_CORPUS >> 20} MiB of text (heads need far less: the shipped corpora "
                            "are 4-5 MB)")


def corpus_ids(target, corpus: str, split: str = "train") -> torch.Tensor:
    """A shipped corpus name (code, prose) or a path to a UTF-8 text file, in the model's own token ids."""
    text = corpus_bytes(corpus, split).decode("utf-8", errors="replace")
    return torch.tensor(target.encode(text), dtype=torch.long)


def check_train_options(*, heads: str, labels: str = "self", seq_len: int = 128, corpus: str = "code", **loop) -> int:
    """Every option of `train --hf`, checked before a model is loaded: the few of its own, then what the lab's one
    loop and run folder take (`loop`: n_depths, n_modules, steps, batch_size, lr, warmup, lam, seed, eval_windows,
    max_seconds, name, resume, overwrite, save_every, save_seconds), by the lab trainer's own checks
    (`training.config.check_loop`). Returns the depths K."""
    if heads not in HEAD_FAMILIES[1:]:
        raise MtplabError(f"--hf trains heads on a frozen model: choose --heads stern, meta or deepseek (got {heads!r})")
    if labels not in LABELS[1:]:  # self or self-argmax
        raise MtplabError(f"--hf heads learn the model's own predictions: --labels self or self-argmax (got {labels!r})")
    need_int("--seq-len", seq_len, 1)
    corpus_file(corpus)
    return check_loop(TrainConfig(heads=heads, **loop))


def _training_data(target, heads: str, depths: int, *, corpus: str, batch_size: int, seq_len: int,
                   eval_windows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The memory check for the heads about to be trained, then the corpus in the model's ids and the fixed
    validation windows (the corpus's val split, or the training text when it has none)."""
    cfg = target.config.with_heads(heads, depths)
    with torch.device("meta"):
        n_heads = sum(p.numel() for p in build_heads(cfg).parameters())
    check_memory(cfg, batch_size=batch_size, seq_len=seq_len, trainable=n_heads, frozen=0,
                 dev=target.wte.weight.device, hint="use fewer --depths / --modules or a smaller --seq-len")
    data, val = corpus_ids(target, corpus, "train"), corpus_ids(target, corpus, "val") if corpus in CORPORA else None
    if len(data) < seq_len + 2:
        raise MtplabError(f"the corpus has {len(data)} tokens, fewer than one window of {seq_len + 1}; "
                          "give a longer text or a smaller --seq-len")
    val = val if val is not None and len(val) > seq_len + 1 else data
    return data, val_windows(val, seq_len, eval_windows)


def train_heads(target, *, heads: str, n_depths: int | None = None, n_modules: int | None = None,
                corpus: str = "code", steps: int = 100, batch_size: int = 8, seq_len: int = 128, lr: float = 1e-3,
                warmup: int | None = None, lam: float = 0.3, labels: str = "self", seed: int = 0,
                eval_windows: int = 8, max_seconds: float | None = None, log=None, out: Path | None = None,
                name: str | None = None, settings: dict | None = None, meta: dict | None = None,
                manifest: dict | None = None, save_every: int | None = None, save_seconds: float | None = None,
                stop: runs.Stop | None = None) -> list[dict]:
    """Attach a fresh head family to `target` and train it (the trunk stays frozen) with the lab's one loop
    (`mtplab.training.fit.run`) and its step (`training.steps.train_step`, frozen trunk). Returns the history: one
    record at the end (and every steps/10 with `log`), with `evaluate`'s per-depth agreement. With `out`, it saves
    OUT/NAME as one save set by steps and by time, continues `manifest` (--resume), and stops after saving at
    SIGINT or SIGTERM (`stop`)."""
    depths = check_train_options(heads=heads, n_depths=n_depths, n_modules=n_modules, corpus=corpus, steps=steps,
                                 batch_size=batch_size, seq_len=seq_len, lr=lr, warmup=warmup, lam=lam, labels=labels,
                                 seed=seed, eval_windows=eval_windows, max_seconds=max_seconds)
    seq_len = min(seq_len, target.config.block_size - 1)
    data, windows = _training_data(target, heads, depths, corpus=corpus, batch_size=batch_size, seq_len=seq_len,
                                   eval_windows=eval_windows)
    params, opt, gen = fresh_heads(target, heads, depths, seed=seed, lr=lr)
    target.train()
    warmup = warmup if warmup is not None else max(1, min(100, steps // 20))
    dev = target.wte.weight.device

    def step_fn(step: int) -> float:
        x = get_batch(data, batch_size, seq_len, gen).to(dev)
        return train_step(target, x, freeze_trunk=True, lam=lam, labels=labels)

    def record(done: int, loss: float) -> dict:
        rec = {"elapsed_s": now() - t0, **evaluate(target, windows, batch_size=batch_size)}
        if log is not None:
            log(f"step {done}: loss {loss:.3f}, agreement with the target by depth "
                + " ".join(f"{a:.3f}" for a in rec["val_agree_depth"]))
        return rec

    t0 = now()
    kw = dict(steps=steps, lr=lr, warmup=warmup, record=record, eval_every=max(1, steps // 10) if log is not None
              else steps, save_every=save_every or max(1, steps // 10), save_seconds=save_seconds,
              max_seconds=max_seconds, stop=stop, t0=t0)
    history = fit.run(step_fn, opt, params, **kw) if out is None else fit_set(
        target, out, name, step_fn, opt, params, gen, settings=settings, manifest=manifest,
        meta=lambda done, hist: {**(meta or {}), "step": done, "history": hist}, **kw)
    target.eval()
    return history


# what a --resume of train --hf must repeat, with train_heads' defaults
RESUME_SETTINGS = {n: inspect.signature(train_heads).parameters[n].default
                   for n in ("corpus", "batch_size", "seq_len", "lr", "warmup", "lam", "labels", "seed", "eval_windows")}


def run_hf_train(*, hf: str, heads: str, n_depths=None, n_modules=None, out: str, name: str | None = None,
                 device="cpu", resume: bool = False, overwrite: bool = False, save_every: int | None = None,
                 save_seconds: float | None = None, **kw) -> dict:
    """`train --hf`: the lab's run directory for heads on a Hugging Face trunk. --out and --name are checked, the
    run is locked, saved as one save set (OUT/NAME.safetensors: heads only, naming their base) by steps, by time
    and at SIGINT/SIGTERM, and continued with --resume or replaced with --overwrite."""
    depths = check_train_options(heads=heads, n_depths=n_depths, n_modules=n_modules, name=name, resume=resume,
                                 overwrite=overwrite, save_every=save_every, save_seconds=save_seconds,
                                 **{k: v for k, v in kw.items() if k != "log"})
    if out is None:
        raise MtplabError("train --hf needs --out DIR")
    name = name or default_name(heads, depths)
    outp = Path(out)
    runs.check_out(outp, name, resume=resume, overwrite=overwrite)
    manifest = runs.read_manifest(outp, name) if resume else None
    if kw.get("warmup") is None:  # the saved run's warm-up, as fit does, else train_heads' default
        saved = manifest["settings"] if manifest else {}
        kw["warmup"] = saved.get("warmup", max(1, min(100, kw.get("steps", 100) // 20)))
    with runs.lock(outp, name), runs.Stop() as stop:
        if resume or overwrite:
            runs.remove_orphans(outp, name)
        if overwrite:  # a lab run's NAME.json would sit beside heads that are not its weights
            runs.paths(outp, name)["config"].unlink(missing_ok=True)
        target = load_hf(hf, device=pick(device))
        settings = {"hf": {k: v for k, v in base_record(target).items() if k not in ("path", "name")},
                    "heads": heads, "n_depths": depths, **{k: kw.get(k, v) for k, v in RESUME_SETTINGS.items()},
                    "corpus_sha256": hashlib.sha256(corpus_bytes(kw.get("corpus", "code"))).hexdigest()}  # the same text
        hist = train_heads(target, heads=heads, n_depths=n_depths, n_modules=n_modules, out=outp, name=name,
                           settings=settings, meta={"hf": str(hf), **{k: v for k, v in kw.items() if k != "log"}},
                           manifest=manifest, save_every=save_every, save_seconds=save_seconds, stop=stop, **kw)
    return {"checkpoint": str(runs.paths(outp, name)["weights"]), "history": hist}
