"""A Hugging Face model of your own, trained here: transformers' `LlamaForCausalLM` on a shipped corpus, with a
byte-level tokenizer whose ids are the lab's byte ids (token i is byte i, so `mtplab.tokenizer` and the model's
own tokenizer give the same ids; id 256 is an end-of-text token the lab's decoders never stop at).

What `python -m mtplab train-hf-model` runs (a script, not a part of the lab: its model ships as data, in
data/hf/, and the lab's own trainers are `mtplab.training`). The result is an ordinary model folder (config.json,
model.safetensors, tokenizer files) that `--hf`, `bench peers` and transformers' own `generate` load, plus
`mtplab_record.json`: how it was trained, on which machine, and its held-out bits per byte.

Training is plain next-token cross-entropy (bf16 autocast where the CPU has it) in the lab's one training loop
(`mtplab.training.fit.run`), saved as one save set of `mtplab.training.runs` (OUT/NAME.state*) beside the folder
OUT/NAME every --save-every steps, every 5 minutes and at SIGINT/SIGTERM, so a killed run continues with --resume.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from mtplab.data import CORPORA, corpus_path, get_batch, load_corpus, val_windows
from mtplab.device import machine, pick
from mtplab.errors import MtplabError
from mtplab.hf.real import quiet_transformers
from mtplab.files import atomic_write_text, os_reason, sha256
from mtplab.training import fit, runs
from mtplab.model.config import ModelConfig
from mtplab.training.config import TrainConfig, check_loop, check_memory, need_int
from mtplab.training.steps import AUTOCAST, autocast_context, autocast_kind

try:
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
except ImportError:  # the core runs without it
    transformers = None

EOS = 256
VOCAB = 257  # 256 bytes and end-of-text
RECORD = "mtplab_record.json"
# two shapes: a target small enough to ship in bf16 (about 10 MB) and a 6x cheaper draft with the same tokenizer
PRESETS = {
    "hf-target": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=6, num_attention_heads=4),
    "hf-draft": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=2),
}


def _need_transformers():
    if transformers is None:
        raise MtplabError('train-hf-model needs the transformers package; install the extra: pip install -e ".[hf]"')


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (what a ByteLevel pre-tokenizer emits)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_tokenizer():
    """A fast tokenizer with no merges: text -> its UTF-8 bytes, id = byte value, plus <eos> = 256."""
    _need_transformers()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<eos>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")


def model_config(preset: str):
    _need_transformers()
    if preset not in PRESETS:
        raise MtplabError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    s = PRESETS[preset]
    return LlamaConfig(vocab_size=VOCAB, num_key_value_heads=s["num_attention_heads"], max_position_embeddings=512,
                       tie_word_embeddings=True, rope_theta=10000.0, bos_token_id=None, eos_token_id=EOS,
                       pad_token_id=EOS, **s)


def build(preset: str, seed: int = 0):
    torch.manual_seed(seed)
    return LlamaForCausalLM(model_config(preset))


def _loss(model, x: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=x[:, :-1]).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))


@torch.no_grad()
def evaluate(model, windows: torch.Tensor, batch_size: int = 16) -> dict:
    """Held-out bits per byte and next-byte top-1 accuracy over fixed windows (B, T+1)."""
    was = model.training
    model.eval()
    nll, hits, n = 0.0, 0, 0
    for i in range(0, len(windows), batch_size):
        x = windows[i:i + batch_size]
        logits = model(input_ids=x[:, :-1]).logits.float()
        y = x[:, 1:]
        nll += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").item()
        hits += (logits.argmax(-1) == y).sum().item()
        n += y.numel()
    model.train(was)
    return {"val_bpb": nll / n / math.log(2), "val_top1": hits / n}


def _remove(p: Path) -> None:
    """What a cut save left at `p` (or anything planted there): a link or a file is unlinked, never followed."""
    try:
        if p.is_symlink() or (p.exists() and not p.is_dir()):
            p.unlink()
        elif p.exists():
            shutil.rmtree(p)
    except OSError as e:
        raise MtplabError(f"could not remove {p} ({e.strerror or e}); remove it by hand and continue with "
                          "--resume") from None


def check_folder(folder: Path) -> None:
    """OUT/NAME must be a folder (or absent): a link there would be swapped out by the first save."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise MtplabError(f"{folder} is a {'symlink' if folder.is_symlink() else 'file'}, not the model folder a run "
                          f"writes; remove it (rm {folder}) or choose another --out or --name")


def _write_folder(model, tokenizer, folder: Path, record: dict, dtype) -> None:
    """The model folder, replaced whole: written beside it, then swapped in (an old folder survives a failed write).
    A kill between the two renames leaves the last save in .NAME.old; `--resume` (or `load_hf`'s message) says so."""
    tmp = folder.with_name(f".{folder.name}.writing")
    old = folder.with_name(f".{folder.name}.old")
    check_folder(folder)
    _remove(tmp)
    if folder.exists():
        _remove(old)  # with no folder, .NAME.old is the last complete save: kept until the new one is in place
    try:
        with torch.random.fork_rng(devices=[]):  # building the copy draws its init: the run's generator stays put
            copy = LlamaForCausalLM(model.config)
        copy.load_state_dict(model.state_dict())
        with quiet_transformers():  # no "Writing model shards" bar at every save
            copy.to(dtype).save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        atomic_write_text(tmp / RECORD, json.dumps(record, indent=1) + "\n")
        if folder.exists():
            os.replace(folder, old)
        os.replace(tmp, folder)
    except Exception as e:  # OSError, or what safetensors and tokenizers raise from Rust for the same failures
        raise MtplabError(f"could not write {folder} ({os_reason(e)}); the last complete save is still there: "
                          "free space or fix --out, then continue with --resume") from None
    _remove(old)


@dataclass
class OwnRun:
    """One `train_own` run: where it saves, what it trains, and its history so far."""
    outp: Path
    name: str
    settings: dict
    model: object
    opt: torch.optim.Optimizer
    gen: torch.Generator
    data: torch.Tensor
    windows: torch.Tensor
    dev: torch.device
    save_dtype: str
    history: list = field(default_factory=list)

    @property
    def folder(self) -> Path:
        return self.outp / self.name

    def record(self, done: int) -> dict:
        """mtplab_record.json: how the folder's weights were trained, and on which machine."""
        s, last = self.settings, (self.history[-1] if self.history else {})
        return {"format": "mtplab-own-hf-model", "preset": s["preset"], "architecture": "LlamaForCausalLM",
                "parameters": sum(p.numel() for p in self.model.parameters()), "corpus": s["corpus"], "steps": done,
                "tokens": done * s["batch_size"] * s["seq_len"],
                "train_seconds": round(last.get("train_seconds", 0.0), 1), "val_bpb": last.get("val_bpb"),
                "val_top1": last.get("val_top1"), "saved_dtype": self.save_dtype, "settings": s,
                "machine": machine(self.dev), "transformers": transformers.__version__, "history": self.history}

    def save(self, done: int) -> None:
        """One save set: the model folder (the checkpoint) and the resume state."""
        dtype = torch.bfloat16 if self.save_dtype == "bf16" else torch.float32
        runs.save(self.outp, self.name, model=self.model, opt=self.opt, gen=self.gen, step=done, history=self.history,
                  settings=self.settings,
                  live={n: t for n, t in self.model.state_dict().items() if n != "lm_head.weight"},
                  write_weights=lambda _p: _write_folder(self.model, byte_tokenizer(), self.folder, self.record(done),
                                                         dtype))


def check_options(*, preset, corpus, steps, batch_size, seq_len, lr, warmup, save_every, eval_every, max_seconds,
                  autocast, save_dtype, resume, overwrite, name, seed=0) -> str:
    """Every option of `train_own`, checked before anything is built; returns the run's name."""
    _need_transformers()
    if preset not in PRESETS:
        raise MtplabError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    if corpus not in CORPORA:
        raise MtplabError(f"--corpus must be one of {', '.join(CORPORA)} (got {corpus!r})")
    name = name or preset
    check_loop(TrainConfig(steps=steps, batch_size=batch_size, lr=lr, warmup=warmup, save_every=save_every, seed=seed,
                           max_seconds=max_seconds, resume=resume, overwrite=overwrite, name=name))  # the lab's checks
    need_int("--seq-len", seq_len, 8, 511)
    need_int("--eval-every", eval_every, 1, optional=True)
    if autocast not in AUTOCAST:
        raise MtplabError(f"--autocast must be auto, bf16 or off (got {autocast!r})")
    if save_dtype not in ("fp32", "bf16"):
        raise MtplabError(f"--save-dtype must be fp32 or bf16 (got {save_dtype!r})")
    s = PRESETS[preset]  # the memory of one step, checked before the lock, the folder or the model exist
    cfg = ModelConfig(vocab_size=VOCAB, n_layer=s["num_hidden_layers"], n_head=s["num_attention_heads"],
                      n_embd=s["hidden_size"], block_size=512)
    n = cfg.n_layer * 12 * cfg.n_embd ** 2 + VOCAB * cfg.n_embd
    check_memory(cfg, batch_size=batch_size, seq_len=seq_len, trainable=n, frozen=0, dev=torch.device("cpu"),
                 hint="use a smaller --seq-len")
    return name


def train_own(*, preset: str = "hf-target", corpus: str = "code", out: str, name: str | None = None, steps: int = 1000,
              batch_size: int = 16, seq_len: int = 256, lr: float = 3e-3, warmup: int | None = None, seed: int = 0,
              max_seconds: float | None = None, resume: bool = False, overwrite: bool = False,
              save_every: int = 100, eval_every: int | None = None, autocast: str = "auto", device: str = "auto",
              save_dtype: str = "bf16", stop_after: int | None = None, log=print) -> dict:
    """Train a fresh Llama of `preset` on `corpus` into OUT/NAME (a Hugging Face folder). Returns its record.
    stop_after ends the run, saved, after that many steps (a killed run, in tests)."""
    name = check_options(preset=preset, corpus=corpus, steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr,
                         warmup=warmup, save_every=save_every, eval_every=eval_every, max_seconds=max_seconds,
                         autocast=autocast, save_dtype=save_dtype, resume=resume, overwrite=overwrite, name=name,
                         seed=seed)
    outp, dev = Path(out), pick(device)
    if (outp / name).exists() and not (resume or overwrite):
        raise MtplabError(f"{outp / name} already exists; continue it with --resume or replace it with --overwrite")
    runs.check_out(outp, name, resume=resume, overwrite=overwrite)
    check_folder(outp / name)
    manifest = runs.read_manifest(outp, name) if resume else None
    if warmup is None:  # a resumed run keeps its own warm-up
        warmup = manifest["settings"]["warmup"] if manifest else max(1, min(200, steps // 20))
    eval_every = eval_every or max(1, steps // 10)
    settings = {"preset": preset, "corpus": corpus, "batch_size": batch_size, "seq_len": seq_len, "lr": lr,
                "warmup": warmup, "seed": seed, "autocast": autocast_kind(dev, autocast),
                "corpus_sha256": sha256(corpus_path(corpus, "train")), "steps": steps}
    model = build(preset, seed).to(dev)
    model.train()
    run = OwnRun(outp, name, settings, model,
                 torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1),
                 torch.Generator().manual_seed(seed), load_corpus(corpus, "train"),
                 val_windows(load_corpus(corpus, "val"), seq_len, 32), dev, save_dtype)
    with runs.lock(outp, name), runs.Stop() as stop:
        if resume or overwrite:
            runs.remove_orphans(outp, name)
        # a --resume continues from the saved weights, optimizer, generators and history, its settings checked first
        start, run.history = runs.resume(outp, name, manifest, settings, model=model, opt=run.opt, gen=run.gen,
                                         tied=False)
        t0 = time.perf_counter() - (run.history[-1]["train_seconds"] if run.history else 0.0)
        last = {"loss": math.nan}

        def step_fn(step: int) -> float:  # one next-token step on a fresh batch (the lab's loop does the rest)
            x = get_batch(run.data, batch_size, seq_len, run.gen).to(dev)
            with autocast_context(dev, autocast):
                loss = _loss(model, x)
            loss.backward()
            last["loss"] = loss.item()
            return last["loss"]

        def validate(done: int, loss: float, say: bool = True) -> dict:
            rec = {"train_seconds": time.perf_counter() - t0, **evaluate(model, run.windows)}
            if say and log is not None:
                log(f"step {done}/{steps}: loss {loss:.3f}, val bpb {rec['val_bpb']:.3f}, top-1 {rec['val_top1']:.3f}, "
                    f"{done * batch_size * seq_len / rec['train_seconds']:.0f} tokens/s")
            return rec

        def save(done: int, history: list, early: bool) -> None:
            if not history or history[-1]["step"] != done:  # the folder's record holds its own weights' numbers,
                say = early or done == stop_after  # said when the run ends here, measured quietly between validations
                history.append({"step": done, "loss": last["loss"], **validate(done, last["loss"], say)})
            run.save(done)

        fit.run(step_fn, run.opt, list(model.parameters()), steps=steps, lr=lr, warmup=warmup, start=start,
                history=run.history, record=validate, eval_every=eval_every, save=save, save_every=save_every,
                max_seconds=max_seconds, stop=stop, out=outp, end=stop_after, t0=t0)
    return run.record(run.history[-1]["step"] if run.history else 0)
