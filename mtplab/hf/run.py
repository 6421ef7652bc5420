"""Train heads on a Hugging Face model and decode with it: what `python -m mtplab train --hf` and
`generate --hf` run (the adapter itself is `mtplab.hf.target`), and the heads' training on a cached trunk that
`python -m mtplab distill` runs (`fit_heads`).

B batch, T time, K depths, V vocabulary.

Training is self-distillation on the frozen trunk: depth d at position i learns the target's own distribution
for token i+d (`mtplab.training.losses.self_distill_cross_entropies`), because greedy verification keeps a draft only
when it is the target's own choice. Every family goes through the lab's `train_step` with a frozen trunk, in the
lab's one training loop (`mtplab.training.fit.run`).
"""
from __future__ import annotations

import hashlib
import inspect
import os
from pathlib import Path
import torch
from mtplab.data import CORPORA, corpus_path, get_batch, val_windows
from mtplab.errors import MtplabError
from mtplab.training import fit
from mtplab.training.losses import head_losses, sub_vocab_index
from mtplab.training.steps import LABELS, autocast_context, evaluate, train_step
from mtplab.training.config import TrainConfig
from mtplab.decoding.drafters import method as get_method
from mtplab.decoding.generate import DTYPES, decode_with
from mtplab.device import describe, now, pick
from mtplab.hf.real import chat_ids, end_of_turn, quiet_transformers, shipped_heads
from mtplab.hf.heads_file import base_record, save_heads
from mtplab.hf.target import load_hf, load_target
from mtplab.files import read_bounded
from mtplab.model import kernels
from mtplab.model.config import HEAD_FAMILIES
from mtplab.model.heads import build_heads
from mtplab.training import runs
from mtplab.training.config import check_loop, check_memory, default_name, need_int

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
    params, opt, gen = _fresh_heads(target, heads, depths, seed=seed, lr=lr)
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
    history = fit.run(step_fn, opt, params, **kw) if out is None else _fit_set(
        target, out, name, step_fn, opt, params, gen, settings=settings, manifest=manifest,
        meta=lambda done, hist: {**(meta or {}), "step": done, "history": hist}, **kw)
    target.eval()
    return history


def _fresh_heads(target, heads: str, depths: int, *, seed: int, lr: float):
    """A fresh, seeded head family attached to `target`: its parameters, their AdamW and the batch generator that
    the save set carries."""
    torch.manual_seed(seed)
    target.attach(heads, depths)
    params = list(target.mtp.parameters())
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    return params, opt, torch.Generator().manual_seed(seed)


def _fit_set(target, out: Path, name: str, step_fn, opt, params, gen, *, settings, manifest, meta, vocab=None,
             **kw) -> list[dict]:
    """The heads' run in the lab's one loop as one save set OUT/NAME of `mtplab.training.runs`, continued from
    `manifest` (--resume) after its settings are checked; the heads file records `meta(done, history)` and `vocab`."""
    start, history = runs.resume(out, name, manifest, settings or {}, model=target.mtp, opt=opt, gen=gen, tied=False)

    def save(done: int, hist: list, early: bool) -> None:
        runs.save(out, name, model=target.mtp, opt=opt, gen=gen, step=done, history=hist, settings=settings,
                  live=target.mtp.state_dict(),
                  write_weights=lambda path: save_heads(target, path, meta=meta(done, hist), vocab=vocab))

    return fit.run(step_fn, opt, params, start=start, history=history, save=save, out=out, **kw)


def warm_start(target, path) -> None:
    """Copy the head weights of heads file PATH into the freshly attached heads, which must match them name for
    name and shape for shape (fp32 whatever the file's dtype)."""
    from safetensors.torch import load_file
    saved = {k[len("mtp."):]: v for k, v in load_file(str(path)).items() if k.startswith("mtp.")}
    mine = target.mtp.state_dict()
    if set(saved) != set(mine) or any(saved[k].shape != mine[k].shape for k in mine):
        raise MtplabError(f"{path} holds other heads than the {target.config.heads} family being trained "
                          f"({len(saved)} tensors against {len(mine)}): start from heads of the same family and size")
    with torch.no_grad():
        for k, t in mine.items():  # state_dict's tensors share the parameters' storage
            t.copy_(saved[k].to(t.dtype))


# ---- heads on a cached trunk (mtplab.hf.distill): the same loop, the cached-trunk losses ------------------------
def _rows(train: list[int], step: int, batch_size: int, seed: int) -> list[int]:
    """The cached rows of `step`: epoch e visits the training rows in its own seeded order, so a resumed run draws
    the batches the uninterrupted one draws, with no generator state to carry."""
    out = []
    for j in range(step * batch_size, (step + 1) * batch_size):
        e, i = divmod(j, len(train))
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed * 1_000_003 + e))
        out.append(train[int(order[i])])
    return out


def held_back(n: int, *, val_rows: int, seed: int = 0, drawn: int | None = None) -> tuple[list[int], list[int]]:
    """The cached rows (one prompt each) held back for validation and those trained on: a seeded split by prompt,
    the same for the training, the draft vocabulary's count and the record. With `drawn` (a grown work folder,
    `distill.stage_grow`), the split is drawn from the first `drawn` rows, the ones trained on before it grew, and
    every later row trains: a row once trained on is never validated on."""
    m = n if drawn is None else drawn
    order = torch.randperm(m, generator=torch.Generator().manual_seed(seed)).tolist()
    return order[:val_rows], (order[val_rows:] or order) + list(range(m, n))


def grown_settings(saved: dict, now: dict) -> dict:
    """A --resume's saved settings as a grown work folder continues them: when the new rows came after the ones the
    run started on (`split_rows`, the rows its held-back split was drawn from, is what it trained on before), the
    count of sequences may grow; anything else is left for `runs.check_settings` to refuse."""
    drawn = now.get("split_rows")
    before = saved.get("split_rows", saved.get("sequences"))
    if drawn is None or drawn != before or not now.get("sequences", 0) >= saved.get("sequences", 0):
        return saved
    return {**saved, "sequences": now["sequences"], "split_rows": drawn}


TRAINED = "self-distilled on the model's own greedy answers (mtplab distill)"  # what a distilled heads file says


def fit_heads(target, cache, vocab: torch.Tensor, *, heads: str, n_depths: int, steps: int,
              batch_size: int = 8, lr: float = 1e-3, unroll: int = 3, seed: int = 0, val_rows: int = 24,
              weights=(1.0, 0.6, 0.4, 0.3), out=None, resume: bool = False, overwrite: bool = False,
              settings: dict | None = None, log=None, max_seconds: float | None = None,
              drawn: int | None = None, init=None) -> list[dict]:
    """Train a head family on the cache with the lab's one loop (`mtplab.training.fit.run`: AdamW, warm-up
    then cosine), bf16 autocast where native, against the cached-trunk losses (`training.losses.head_losses`).
    With `out`, the run is one save set of `mtplab.training.runs` named after the family (OUT/FAMILY.safetensors:
    the heads with their draft vocabulary; OUT/FAMILY.state.*), saved by steps, by time and at SIGINT/SIGTERM, and
    continued with `resume`. `init`: a heads file of this family and shape to start from instead of fresh weights
    (a warm start: the shipped heads trained further on a GPU). Returns the history (per-depth agreement on
    held-back rows)."""
    if resume and overwrite:
        raise MtplabError("--resume continues the head trainings in --work and --overwrite replaces them; give one")
    params, opt, gen = _fresh_heads(target, heads, n_depths, seed=seed, lr=lr)  # gen: saved; the batches are `_rows`
    if init is not None:
        warm_start(target, init)
    dev = target.wte.weight.device
    vocab = vocab.to(dev)
    where = sub_vocab_index(vocab, target.config.vocab_size).to(dev)
    val, train = held_back(len(cache.rows), val_rows=val_rows, seed=seed, drawn=drawn)

    def step_fn(step: int) -> float:
        with autocast_context(dev, "auto"):
            res = head_losses(target, cache.batch(_rows(train, step, batch_size, seed), dev), where, vocab,
                              unroll=unroll)
        loss = sum(w * r[0] for w, r in zip(weights, res))
        loss.backward()
        return float(loss.detach())

    def record(done: int, loss: float) -> dict:
        rec = {"val_agree_depth": evaluate_heads(target, cache, val, where, vocab, unroll=unroll)}
        if log:
            log(f"step {done}/{steps}: loss {loss:.3f}, agreement by depth "
                + " ".join(f"{a:.3f}" for a in rec["val_agree_depth"]))
        return rec

    kw = dict(steps=steps, lr=lr, warmup=max(1, steps // 20), record=record, eval_every=max(1, steps // 20),
              max_seconds=max_seconds)
    if out is None:
        return fit.run(step_fn, opt, params, **kw)
    settings = {"heads": heads, "n_depths": n_depths, "batch_size": batch_size, "lr": lr, "unroll": unroll,
                "seed": seed, "val_rows": val_rows, "weights": list(weights), **(settings or {}),
                **({"init": Path(init).name} if init is not None else {})}
    out = Path(out)
    old = out / f"{heads}.pt"
    if os.path.lexists(old) and not os.path.lexists(runs.paths(out, heads)["manifest"]) and not overwrite:
        raise MtplabError(f"{old} is a save set of an older distill; the head training now saves {heads}.safetensors "
                          f"and {heads}.state.*: delete {old} and rerun the {heads} stage")
    runs.check_out(out, heads, resume=resume, overwrite=overwrite)
    manifest = runs.read_manifest(out, heads) if resume and runs.paths(out, heads)["manifest"].exists() else None
    if manifest:
        manifest["settings"] = grown_settings(manifest["settings"], settings)
    with runs.lock(out, heads), runs.Stop() as stop:
        if resume or overwrite:
            runs.remove_orphans(out, heads)
        return _fit_set(target, out, heads, step_fn, opt, params, gen, settings=settings, manifest=manifest,
                        meta=lambda done, _: {"trained": TRAINED, "steps": done}, vocab=vocab, stop=stop, **kw)


@torch.no_grad()
def evaluate_heads(target, cache, rows: list[int], where, vocab, *, unroll: int = 3) -> list[float]:
    """Teacher-forced agreement of each depth with the target's argmax on held-back cached rows."""
    tot = None
    for i in range(0, len(rows), 8):
        res = head_losses(target, cache.batch(rows[i:i + 8], target.wte.weight.device), where, vocab, unroll=unroll)
        hits = torch.stack([r[1] for r in res]).float()
        tot = hits if tot is None else tot + hits
    return [float(h / max(1.0, n)) for h, n in tot.tolist()] if tot is not None else []


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


def generate_ids(hf, ids: list[int], m: int, stop: int | None = None, **kw) -> list[int]:
    """transformers' greedy `generate` for exactly m new tokens (no early stop at end-of-text), the new ids; with
    `stop` (a chat model's end of turn), at most m, ending with it; `kw` goes to `generate` (prompt_lookup_num_tokens,
    assistant_model, ...)."""
    x = torch.tensor([ids], device=hf.device)
    with quiet_transformers():  # its notes about its own argument handling, once per call
        out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=m, min_new_tokens=m if stop is None
                          else 0, do_sample=False, num_beams=1, pad_token_id=0, eos_token_id=stop, **kw)
    return out[0, len(ids):].tolist()


@torch.inference_mode()
def warm_up(target, ids: list[int]) -> float:
    """One forward of the prompt's first token, untimed and thrown away, before a timed decode: what a process pays
    once (the exact kernel packs each weight into panels at its first use, numba loads its compiled code) is then
    not in `wall_s` of a one-off `generate`, which `bench real` leaves out by its warm-up rounds. Returns its
    seconds (`warm_s`)."""
    t0 = now()
    target(torch.tensor([ids[:1]], device=target.wte.weight.device))
    return now() - t0


def run_hf_generate(*, hf: str, heads_checkpoint=None, method="ar", prompt: str, max_new_tokens=64, k=None,
                    temperature=0.0, top_k=None, seed=0, alpha=0.8, draft_hf=None, device="auto",
                    dtype="fp32", chat: bool = False, draft_vocab: str = "full", kernel: str = "exact") -> dict:
    """`generate --hf`: decode with any method; `tokens` are the model's own token ids, `text` its decoding.
    For a real model named by its bare name (`smollm2`), a head method finds the heads the lab ships for it;
    `chat` wraps the prompt as one user turn and ends the decode at the end of the model's turn (`end_of_turn`);
    `answer` is the new text without that token; `draft_vocab='reduced'` drafts over the vocabulary saved with the
    heads (`save_heads`), and the trace records its size. `kernel='stock'` decodes through transformers' forward and
    F.linear everywhere (the old path, to compare with the exact default); `forward` says which ran."""

    m = get_method(method)
    if dtype not in DTYPES:
        raise MtplabError(f"unknown dtype {dtype!r}; use fp32 or bf16")
    if draft_vocab not in ("full", "reduced"):
        raise MtplabError(f"--draft-vocab is full or reduced (got {draft_vocab!r})")
    if m.family is not None and heads_checkpoint is None:
        heads_checkpoint = shipped_heads(hf, m.family)
    if m.family is not None and heads_checkpoint is None:
        raise MtplabError(f"method {method} needs {m.family} heads on this model: pass --heads-checkpoint "
                          f"(train them with python -m mtplab train --hf {hf} --heads {m.family} ...)")
    if not prompt:
        raise MtplabError("the prompt is empty; give some text with --prompt")
    dev = pick(device)
    target = load_target(hf, heads_checkpoint if m.family is not None else None, device=dev, dtype=DTYPES[dtype],
                         kernel=kernel, draft_vocab=draft_vocab == "reduced")
    if m.family is not None and target.config.heads != m.family:
        raise MtplabError(f"method {method} needs {m.family} heads, but {Path(heads_checkpoint).name} holds "
                          f"{target.config.heads} heads; train {m.family} heads with python -m mtplab train --hf "
                          f"{hf} --heads {m.family} ...")
    if draft_vocab == "reduced" and m.family is not None and target.draft_vocab is None:
        raise MtplabError(f"{Path(heads_checkpoint).name} carries no draft vocabulary; use --draft-vocab full")
    draft = None
    if m.needs_draft_model:
        if draft_hf is None:
            raise MtplabError("method draft-model with --hf needs a smaller model with the same tokenizer: --draft-hf PATH")
        draft = load_hf(draft_hf, device=dev, dtype=DTYPES[dtype], kernel=kernel)
    ids = chat_ids(target, prompt) if chat else target.encode(prompt)
    stop = end_of_turn(target) if chat else None
    with kernels.use_stock(kernel == "stock"):  # the heads' linears too
        warm = warm_up(target, ids) + (warm_up(draft, ids) if draft is not None else 0.0)
        t0 = now()
        trace = decode_with(method, target, ids, max_new_tokens=max_new_tokens, k=k, temperature=temperature,
                            top_k=top_k, seed=seed, alpha=alpha, draft_model=draft, stop=stop)
        wall = now() - t0
    res = trace.summary(target.decode)  # the text by the model's own tokenizer
    res.update(checkpoint=str(heads_checkpoint) if heads_checkpoint else target.path, hf=target.path,
               device=describe(dev), wall_s=wall, warm_s=warm, kernel=kernel, forward=target.forward_path,
               draft_vocab=draft_vocab, draft_vocab_size=trace.draft_vocab, chat=chat,
               answer=target.decode(trace.tokens[:-1] if trace.tokens[-1:] == [stop] else trace.tokens),
               ended_turn=stop is not None and trace.tokens[-1:] == [stop])
    return res
