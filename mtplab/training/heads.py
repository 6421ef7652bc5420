"""Heads trained on a frozen trunk with the lab's one loop (`fit.run`) and one save set (`runs`): the shared pieces
of `train --hf` (`mtplab.distill.live.train_heads`, on a live trunk) and the heads on a cached trunk that `distill` trains
(`fit_heads`, against the cached-trunk losses of `losses.head_losses`).

The target is any model with a frozen trunk that can `attach(family, depths)` heads as `target.mtp`, and
`save_heads(path, meta=, vocab=)` them as a heads file (`mtplab.hf.target.HFTarget` is the one the lab has); the
cache is a `mtplab.distill.trunkcache.TrunkCache` (its `rows` and `batch(rows, device)`).
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from mtplab.errors import MtplabError
from mtplab.training import fit, runs
from mtplab.training.losses import head_losses, sub_vocab_index
from mtplab.training.steps import autocast_context


def fresh_heads(target, heads: str, depths: int, *, seed: int, lr: float):
    """A fresh, seeded head family attached to `target`: its parameters, their AdamW and the batch generator that
    the save set carries."""
    torch.manual_seed(seed)
    target.attach(heads, depths)
    params = list(target.mtp.parameters())
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    return params, opt, torch.Generator().manual_seed(seed)


def fit_set(target, out: Path, name: str, step_fn, opt, params, gen, *, settings, manifest, meta, vocab=None,
             **kw) -> list[dict]:
    """The heads' run in the lab's one loop as one save set OUT/NAME of `mtplab.training.runs`, continued from
    `manifest` (--resume) after its settings are checked; the heads file records `meta(done, history)` and `vocab`."""
    start, history = runs.resume(out, name, manifest, settings or {}, model=target.mtp, opt=opt, gen=gen, tied=False)

    def save(done: int, hist: list, early: bool) -> None:
        runs.save(out, name, model=target.mtp, opt=opt, gen=gen, step=done, history=hist, settings=settings,
                  live=target.mtp.state_dict(),
                  write_weights=lambda path: target.save_heads(path, meta=meta(done, hist), vocab=vocab))

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


# ---- heads on a cached trunk (`mtplab.distill.pipeline`): the same loop, the cached-trunk losses ---------------------
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
    params, opt, gen = fresh_heads(target, heads, n_depths, seed=seed, lr=lr)  # gen: saved; the batches are `_rows`
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
        return fit_set(target, out, heads, step_fn, opt, params, gen, settings=settings, manifest=manifest,
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
