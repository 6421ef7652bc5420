"""Training runs: next-token and multi-token, from scratch or with a frozen trunk, and the one training loop.

`run(step_fn, opt, params, ...)` is the loop every trainer of the lab calls: the classroom models (`fit`), heads on
a Hugging Face trunk (`mtplab.distill.live.train_heads`) and heads on a cached trunk (`mtplab.training.heads.fit_heads`). It
sets the learning rate (warm-up, then cosine), runs the caller's step, clips and applies the gradients, validates,
saves one save set (`mtplab.training.runs`) every `save_every` steps, every `save_seconds` of wall time (5 minutes)
and at SIGINT or SIGTERM (after the step in flight), and stops at `max_seconds`.

`fit(TrainConfig(...))` or `fit(**keywords)` is deterministic for a seed (batches come from a seeded
generator, dropout from the seeded global one) and resumable bit for bit. The step itself, the loss and the
validation are `mtplab.training.steps`; averaging over torchrun processes is `mtplab.training.distributed`.
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
    t0: float = field(default_factory=time.perf_counter)
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
    run.start, run.history = runs.resume(out, name, manifest, run.settings, model=model, opt=opt, gen=run.gen)
    run.tokens = run.start * c.batch_size * model.config.block_size
    if c.progress and rank == 0:
        from tqdm.auto import tqdm
        run.bar = tqdm(total=c.steps, initial=run.start, desc=f"train {name}", unit="step")
    return run


def run(step_fn, opt, params, *, steps: int, lr: float, warmup: int, start: int = 0, history: list | None = None,
        record=None, eval_every: int | None = None, save=None, save_every: int | None = None,
        save_seconds: float | None = None, max_seconds: float | None = None, stop: runs.Stop | None = None,
        out: Path | None = None, end: int | None = None, grad_clip: float = 1.0, hint: str = "lower --lr",
        after=None, t0: float | None = None, rank: int = 0, world: int = 1, dev=None) -> list[dict]:
    """The one training loop, from step `start` to `steps` (or `end`). Returns the history.

    step_fn(step) -> loss: one forward and backward pass (the loop has set the learning rate).
    record(done, loss) -> dict: the validation at step `done` (every `eval_every` steps, the last and a timed-out
    one), appended to the history after its step and loss. save(done, history, stopped_early): one save set (every
    `save_every` steps, `save_seconds` of wall time, the last, a timed-out and a signalled one). after(done, loss):
    progress. A signal ends the run after its step is saved; Ctrl-C twice ends it at once, naming the last save."""
    history = [] if history is None else history
    eval_every = eval_every or max(1, steps // 10)
    save_every = save_every or eval_every
    end = steps if end is None else min(steps, end)
    every = save_seconds if save_seconds is not None else runs.SAVE_SECONDS
    t0 = time.perf_counter() if t0 is None else t0
    saved = {"step": start or None, "at": time.perf_counter()}
    step = start
    try:
        for step in range(start, end):
            for g in opt.param_groups:
                g["lr"] = lr_at(step, steps, lr, warmup)
            loss = step_fn(step)
            distributed.average_gradients(params, world)
            if not math.isfinite(loss):
                raise MtplabError(f"training diverged at step {step} (loss {loss}); {hint}")
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            done = step + 1
            late = distributed.any_rank(max_seconds is not None and time.perf_counter() - t0 > max_seconds, dev, world)
            if after is not None:
                after(done, loss)
            if rank == 0 and record is not None and (done % eval_every == 0 or done == steps or late):
                history.append({"step": done, "loss": loss, **record(done, loss)})
            signalled = distributed.any_rank(stop is not None and stop.signal is not None, dev, world)
            due = done % save_every == 0 or done == end or late or signalled or time.perf_counter() - saved["at"] >= every
            if rank == 0 and save is not None and due:
                save(done, history, late or signalled)
                saved.update(step=done, at=time.perf_counter())
            if signalled:
                raise MtplabError(runs.stopped_message(stop.signal or "signal", done, out if save else None))
            if late:
                break
    except KeyboardInterrupt:
        raise _interrupted(step, out if save is not None else None, saved["step"]) from None
    return history


def _batch(run: _Run, step: int, train_data) -> float:
    c, model = run.c, run.model
    x = get_batch(train_data, c.batch_size, model.config.block_size, run.gen)  # the global batch, on every rank
    x = distributed.shard(x, run.rank, run.world).to(run.dev)
    with autocast_context(run.dev, c.autocast):
        loss = train_step(model, x, freeze_trunk=c.freeze_trunk, lam=c.lam, memory_efficient=c.memory_efficient,
                          labels=c.labels)
    n = c.batch_size * model.config.block_size
    run.tokens += n
    run.window[0] += n
    return loss


def _validate(run: _Run, done: int, loss: float, windows) -> dict:
    now = time.perf_counter()
    rec = {"lr": run.opt.param_groups[0]["lr"], "tokens": run.tokens, "elapsed_s": now - run.t0,
           "tokens_per_s": run.window[0] / max(1e-9, now - run.window[1])}
    rec.update(evaluate(run.model, windows))  # in fp32, comparable across runs
    run.window[:] = [0, time.perf_counter()]
    if run.bar is not None:
        run.bar.write(f"step {done}: loss {loss:.3f} val bpb by depth "
                      + " ".join(f"{b:.3f}" for b in rec["val_bpb_depth"])
                      + " | top-1 acc " + " ".join(f"{a:.3f}" for a in rec["val_acc_depth"]))
    return rec


def _progress(run: _Run, done: int, loss: float) -> None:
    tok_s = run.window[0] / max(1e-9, time.perf_counter() - run.window[1])
    run.bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tok_s:,.0f}")
    run.bar.update(1)


def _save(run: _Run, done: int, history: list, stopped_early: bool) -> None:
    c = run.c
    meta = {"preset": run.settings["preset"], "corpus": c.corpus, "heads": c.heads, "n_depths": c.depths(),
            "n_modules": run.model.config.n_modules or None, "freeze_trunk": c.freeze_trunk,
            "from": str(c.from_checkpoint) if c.from_checkpoint else None, "seed": c.seed,
            "batch_size": c.batch_size, "lr": c.lr, "lambda": c.lam, "labels": c.labels,
            "autocast": run.settings["autocast"], "steps": c.steps, "step": done, "tokens": run.tokens,
            "stopped_early": stopped_early, "wall_s": time.perf_counter() - run.t0, "device": str(run.dev),
            "val": run.history[-1] if run.history else None, "history": run.history}
    base = Path(c.from_checkpoint) if c.freeze_trunk else None
    runs.save(run.out, run.name, model=run.model, opt=run.opt, gen=run.gen, step=done, history=run.history,
              settings=run.settings, meta=meta, base=base, dtype=SAVE_DTYPES[c.save_dtype])


def _interrupted(step: int, out: Path | None, last_save: int | None) -> MtplabError:
    if out is None:
        return MtplabError(f"interrupted at step {step}; nothing was saved (no --out)")
    if last_save is None:
        return MtplabError(f"interrupted at step {step}, before the first save; start again with --overwrite")
    return MtplabError(f"interrupted at step {step}; the last complete save is step {last_save} in "
                       f"{out}: continue it with the same command plus --resume")


def _loop(live: _Run) -> None:
    c = live.c
    block = live.model.config.block_size
    train_data = need_tokens(load_corpus(c.corpus, "train"), block + 2, corpus_path(c.corpus, "train"))
    windows = val_windows(need_tokens(load_corpus(c.corpus, "val"), block + 1, corpus_path(c.corpus, "val")), block,
                          c.eval_windows)
    end = c.steps if c.stop_after is None else min(c.steps, c.stop_after)
    also = f" or --lambda (now {c.lam})" if c.heads != "none" and c.lam > 1 else ""
    live.history = run(
        lambda step: _batch(live, step, train_data), live.opt, live.params, steps=c.steps, lr=c.lr, warmup=live.warmup,
        start=live.start, history=live.history, record=lambda done, loss: _validate(live, done, loss, windows),
        eval_every=c.eval_every, save=(lambda done, hist, early: _save(live, done, hist, early)) if live.out else None,
        save_every=c.save_every, save_seconds=c.save_seconds, max_seconds=c.max_seconds, stop=live.stop, out=live.out,
        end=end, grad_clip=c.grad_clip, hint=f"lower --lr{also}", t0=live.t0, rank=live.rank, world=live.world,
        dev=live.dev, after=(lambda done, loss: _progress(live, done, loss)) if live.bar is not None else None)
    last = live.history[-1]["step"] if live.history else live.start
    if live.bar is not None and c.max_seconds is not None and last < end:
        live.bar.write(f"stopping at step {last}: max_seconds={c.max_seconds} reached")


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
