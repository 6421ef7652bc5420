"""Training runs: next-token and multi-token, from scratch or with a frozen trunk.

`fit(TrainConfig(...))` or `fit(**keywords)` is deterministic for a seed (batches come from a seeded
generator, dropout from the seeded global one) and resumable bit for bit: every `save_every` steps, every
`save_seconds` of wall time (5 minutes) and at SIGINT or SIGTERM (after the step in flight) it writes one save
set (`mtplab.training.runs`). The step itself, the loss and the validation are `mtplab.steps`;
averaging over torchrun processes is `mtplab.distributed`.
"""
from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
import torch
from mtplab import files
from mtplab.model import checkpoint as ckpt
from mtplab.training import distributed
from mtplab.training import runs
from mtplab.model.config import preset as get_preset
from mtplab.data import corpus_path, get_batch, load_corpus, need_tokens, val_windows
from mtplab.errors import MtplabError
from mtplab.model.gpt import GPT, attach_heads, deepen
from mtplab.training.steps import autocast_context, autocast_kind, evaluate, lr_at, train_step
from mtplab.training.config import SAVE_DTYPES, TrainConfig, check, check_memory, count_parameters


def _build_model(c: TrainConfig, depths: int) -> GPT:
    """From scratch (the preset), or heads attached to a next-token checkpoint (`--from`)."""
    if c.from_checkpoint is None:
        cfg = get_preset(c.preset).with_heads(c.heads, depths)
        return GPT(replace(cfg, dropout=c.dropout) if c.dropout is not None else cfg)
    base = ckpt.load(c.from_checkpoint)
    if base.config.heads != "none":
        raise MtplabError(f"--from {c.from_checkpoint} already has {base.config.heads} heads; "
                          "start from a next-token checkpoint such as ntp")
    if c.dropout is not None or c.freeze_trunk:  # a frozen trunk runs as at inference: no dropout
        p = c.dropout or 0.0
        base.config = replace(base.config, dropout=p)
        for mod in base.modules():
            if hasattr(mod, "dropout") and isinstance(mod.dropout, float):
                mod.dropout = p
            if isinstance(mod, torch.nn.Dropout):
                mod.p = p
    if c.deepen is not None:
        base = deepen(base, c.deepen)
    model = attach_heads(base, c.heads, depths) if c.heads != "none" else base
    if c.heads_from is not None:  # start the heads from another run's heads (same family and depths)
        old = ckpt.load(c.heads_from)
        if (old.config.heads, old.config.n_depths, old.config.n_embd) != (c.heads, depths, base.config.n_embd):
            raise MtplabError(f"--heads-from {c.heads_from} has {old.config.heads} heads with {old.config.n_depths} "
                              f"depths at width {old.config.n_embd}; this run trains {c.heads} with {depths} at "
                              f"width {base.config.n_embd}: give heads of the same family, depths and width")
        model.mtp.load_state_dict(old.mtp.state_dict())
    return model


def _check_size(c: TrainConfig, depths: int, dev: torch.device) -> None:
    """Memory for one step, from the config alone: before a module is built or a batch drawn."""
    if c.from_checkpoint is None:
        cfg = get_preset(c.preset).with_heads(c.heads, depths)
    else:
        base = ckpt.config_of(c.from_checkpoint)
        if c.deepen is not None:
            base = replace(base, n_layer=max(base.n_layer, c.deepen))
        cfg = base.with_heads(c.heads, depths) if c.heads != "none" else base
    n = count_parameters(cfg)
    frozen = count_parameters(replace(cfg, heads="none", n_depths=1)) if c.freeze_trunk else 0
    check_memory(cfg, batch_size=c.batch_size, seq_len=cfg.block_size, trainable=n - frozen, frozen=frozen, dev=dev,
                 hint="train a smaller model or with fewer --depths / --modules")


def _optimizer(model: GPT, c: TrainConfig, dev: torch.device):
    if c.freeze_trunk:
        for n, p in model.named_parameters():
            p.requires_grad_(n.startswith("mtp."))
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": c.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return params, torch.optim.AdamW(groups, lr=c.lr, betas=(0.9, 0.95), foreach=dev.type == "cuda")


def _settings(c: TrainConfig, depths: int, warmup: int, dev: torch.device, world: int) -> dict:
    """What a --resume must repeat (runs.MAY_CHANGE lists what may differ)."""
    s = {k: v for k, v in asdict(c).items() if k not in runs.MAY_CHANGE and k not in ("name", "from_checkpoint")}
    s.update(n_depths=depths, n_modules=None, warmup=warmup, autocast=autocast_kind(dev, c.autocast), world=world,
             preset=c.preset if c.from_checkpoint is None else None,
             corpus_sha256=files.sha256(corpus_path(c.corpus, "train")),  # --resume on the same bytes
             from_sha256=files.sha256(ckpt.resolve(c.from_checkpoint)) if c.from_checkpoint is not None else None)
    return s


@dataclass
class _Run:
    """The live state of one run: what the loop's helpers share."""
    c: TrainConfig
    model: GPT
    opt: torch.optim.Optimizer
    params: list
    gen: torch.Generator
    out: Path | None
    name: str
    dev: torch.device
    rank: int
    world: int
    warmup: int
    settings: dict
    history: list = field(default_factory=list)
    start: int = 0
    last_save: int | None = None
    t0: float = field(default_factory=time.perf_counter)
    saved_at: float = field(default_factory=time.perf_counter)  # wall clock of the last save (or the start)
    stop: runs.Stop | None = None
    tokens: int = 0
    window: list = field(default_factory=lambda: [0, time.perf_counter()])  # tokens since the last log, since when
    bar: object = None


def _begin(c: TrainConfig, rank: int, world: int, dev: torch.device) -> _Run:
    """Model surgery, optimizer, generators; on --resume, the saved state after checking the settings."""
    depths, name = c.depths(), c.run_name()
    out = Path(c.out) if c.out is not None else None
    manifest = runs.read_manifest(out, name) if c.resume else None
    saved = manifest["settings"] if manifest else {}
    warmup = c.warmup if c.warmup is not None else saved.get("warmup", max(1, min(200, c.steps // 20)))
    torch.manual_seed(c.seed)
    model = _build_model(c, depths).to(dev).train()
    params, opt = _optimizer(model, c, dev)
    run = _Run(c, model, opt, params, torch.Generator().manual_seed(c.seed), out, name, dev, rank, world, warmup,
               _settings(c, depths, warmup, dev, world))
    if manifest:
        runs.check_settings(saved, run.settings, out)
        runs.restore(runs.load_state(out, name, manifest), manifest, model=model, opt=opt, gen=run.gen, out=out)
        run.start = run.last_save = manifest["step"]
        run.history = manifest["history"]
    run.tokens = run.start * c.batch_size * model.config.block_size
    if c.progress and rank == 0:
        from tqdm.auto import tqdm
        run.bar = tqdm(total=c.steps, initial=run.start, desc=f"train {name}", unit="step")
    return run


def _step(run: _Run, step: int, train_data) -> float:
    c, model = run.c, run.model
    for g in run.opt.param_groups:
        g["lr"] = lr_at(step, c.steps, c.lr, run.warmup)
    x = get_batch(train_data, c.batch_size, model.config.block_size, run.gen)  # the global batch, on every rank
    x = distributed.shard(x, run.rank, run.world).to(run.dev)
    with autocast_context(run.dev, c.autocast):
        loss = train_step(model, x, freeze_trunk=c.freeze_trunk, lam=c.lam, memory_efficient=c.memory_efficient,
                          labels=c.labels)
    distributed.average_gradients(run.params, run.world)
    if not math.isfinite(loss):
        also = f" or --lambda (now {c.lam})" if c.heads != "none" and c.lam > 1 else ""
        raise MtplabError(f"training diverged at step {step} (loss {loss}); lower --lr{also}")
    torch.nn.utils.clip_grad_norm_(run.params, c.grad_clip)
    run.opt.step()
    run.opt.zero_grad(set_to_none=True)
    n = c.batch_size * model.config.block_size
    run.tokens += n
    run.window[0] += n
    return loss


def _validate(run: _Run, done: int, loss: float, windows) -> None:
    now = time.perf_counter()
    rec = {"step": done, "loss": loss, "lr": run.opt.param_groups[0]["lr"], "tokens": run.tokens,
           "elapsed_s": now - run.t0, "tokens_per_s": run.window[0] / max(1e-9, now - run.window[1])}
    rec.update(evaluate(run.model, windows))  # in fp32, comparable across runs
    run.history.append(rec)
    run.window[:] = [0, time.perf_counter()]
    if run.bar is not None:
        run.bar.write(f"step {done}: loss {loss:.3f} val bpb by depth "
                      + " ".join(f"{b:.3f}" for b in rec["val_bpb_depth"])
                      + " | top-1 acc " + " ".join(f"{a:.3f}" for a in rec["val_acc_depth"]))


def _save(run: _Run, done: int, stopped_early: bool) -> None:
    c = run.c
    meta = {"preset": run.settings["preset"], "corpus": c.corpus, "heads": c.heads, "n_depths": c.depths(),
            "n_modules": c.depths() - 1 if c.heads == "deepseek" else None, "freeze_trunk": c.freeze_trunk,
            "from": str(c.from_checkpoint) if c.from_checkpoint else None, "seed": c.seed,
            "batch_size": c.batch_size, "lr": c.lr, "lambda": c.lam, "labels": c.labels,
            "autocast": run.settings["autocast"], "steps": c.steps, "step": done, "tokens": run.tokens,
            "stopped_early": stopped_early, "wall_s": time.perf_counter() - run.t0, "device": str(run.dev),
            "val": run.history[-1] if run.history else None, "history": run.history}
    base = Path(c.from_checkpoint) if c.freeze_trunk else None
    runs.save(run.out, run.name, model=run.model, opt=run.opt, gen=run.gen, step=done, history=run.history,
              settings=run.settings, meta=meta, base=base, dtype=SAVE_DTYPES[c.save_dtype])
    run.last_save, run.saved_at = done, time.perf_counter()


def _interrupted(run: _Run, step: int) -> MtplabError:
    if run.out is None:
        return MtplabError(f"interrupted at step {step}; nothing was saved (no --out)")
    if run.last_save is None:
        return MtplabError(f"interrupted at step {step}, before the first save; start again with --overwrite")
    return MtplabError(f"interrupted at step {step}; the last complete save is step {run.last_save} in "
                       f"{run.out}: continue it with the same command plus --resume")


def _loop(run: _Run) -> None:
    c = run.c
    block = run.model.config.block_size
    train_data = need_tokens(load_corpus(c.corpus, "train"), block + 2, corpus_path(c.corpus, "train"))
    windows = val_windows(need_tokens(load_corpus(c.corpus, "val"), block + 1, corpus_path(c.corpus, "val")), block,
                          c.eval_windows)
    eval_every = c.eval_every or max(1, c.steps // 10)
    save_every = c.save_every or eval_every
    end = c.steps if c.stop_after is None else min(c.steps, c.stop_after)
    step = run.start
    try:
        for step in range(run.start, end):
            if _one(run, step, train_data, windows, eval_every, save_every, end):
                break
    except KeyboardInterrupt:
        raise _interrupted(run, step) from None


def _one(run: _Run, step: int, train_data, windows, eval_every: int, save_every: int, end: int) -> bool:
    """One step with its progress, validation and save; True when the time limit says stop."""
    c = run.c
    loss = _step(run, step, train_data)
    done = step + 1
    late = distributed.any_rank(c.max_seconds is not None and time.perf_counter() - run.t0 > c.max_seconds,
                                run.dev, run.world)
    if run.bar is not None:
        tok_s = run.window[0] / max(1e-9, time.perf_counter() - run.window[1])
        run.bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tok_s:,.0f}")
        run.bar.update(1)
    if run.rank == 0 and (done % eval_every == 0 or done == c.steps or late):
        _validate(run, done, loss, windows)
    signalled = distributed.any_rank(run.stop is not None and run.stop.signal is not None, run.dev, run.world)
    every = c.save_seconds if c.save_seconds is not None else runs.SAVE_SECONDS
    due = done % save_every == 0 or done == end or late or signalled or time.perf_counter() - run.saved_at >= every
    if run.rank == 0 and run.out is not None and due:
        _save(run, done, late or signalled)
    if signalled:
        raise MtplabError(runs.stopped_message(run.stop.signal if run.stop and run.stop.signal else "signal", done,
                                               run.out))
    if late and run.bar is not None:
        run.bar.write(f"stopping at step {done}: max_seconds={c.max_seconds} reached")
    return late


def fit(config: TrainConfig | None = None, /, **kwargs) -> list[dict]:
    """Train a model and return its history (a list of dicts, one per validation).
    Give a TrainConfig, its fields as keywords (see TrainConfig), or both (the keywords replace fields)."""
    c = replace(config, **kwargs) if config is not None else TrainConfig(**kwargs)
    check(c)
    rank, world, dev = distributed.setup(c.device)
    if c.batch_size % world:
        raise MtplabError(f"--batch-size {c.batch_size} is the global batch: make it a multiple of the {world} processes")
    _check_size(c, c.depths(), dev)
    if c.out is not None:
        runs.check_out(Path(c.out), c.run_name(), resume=c.resume, overwrite=c.overwrite)
    held = runs.lock(Path(c.out), c.run_name()) if c.out is not None and rank == 0 else nullcontext()
    with held, runs.Stop() as stop:
        if c.out is not None and rank == 0 and (c.resume or c.overwrite):
            runs.remove_orphans(Path(c.out), c.run_name())
        run = _begin(c, rank, world, dev)
        run.stop = stop
        try:
            _loop(run)
        finally:
            if run.bar is not None:
                run.bar.close()
    distributed.barrier(world)
    return run.history
