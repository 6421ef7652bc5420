"""Training: next-token and multi-token, from scratch or with a frozen trunk.

B batch, T time, C channels, K depths, V vocabulary.

`fit` is deterministic for a seed (batches come from a seeded generator, dropout from a
seeded global generator) and resumable: every `save_every` steps it writes the
checkpoint and a training state (optimizer moments, generator states, history) as
safetensors + JSON, atomically.
"""
from __future__ import annotations

import json
import math
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from . import checkpoint as ckpt
from .config import HEAD_FAMILIES, preset as get_preset
from .data import get_batch, load_corpus, val_windows
from .device import pick
from .errors import MtplabError
from .model import GPT, attach_heads
from .losses import depth_cross_entropies, family_loss, self_distill_cross_entropies

LN2 = math.log(2.0)


def default_name(heads: str, n_depths: int) -> str:
    """ntp, stern-k4 / meta-k4 (K depths), deepseek-d1 (D modules)."""
    if heads == "none":
        return "ntp"
    return f"deepseek-d{n_depths - 1}" if heads == "deepseek" else f"{heads}-k{n_depths}"


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warmup, then cosine decay to lr/10."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


LABELS = ("corpus", "self", "self-argmax")
AUTOCAST = ("auto", "bf16", "off")


def bf16_pays(device: torch.device) -> bool:
    """bf16 autocast pays on CUDA and on CPUs with native bf16 matmuls (AVX512-BF16 / AMX): measured 1.8x
    the fp32 training speed of the classroom preset on this lab's Xeon; on plain AVX2 it is emulated and slower."""
    if device.type == "cuda":
        return True
    return device.type == "cpu" and bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)())


def autocast_kind(device: torch.device, mode: str = "auto") -> str:
    """'bf16' or 'off': what `mode` means on this device."""
    return "off" if mode == "off" or (mode == "auto" and not bf16_pays(device)) else "bf16"


def _autocast(device: torch.device, mode: str = "auto"):
    if autocast_kind(device, mode) == "off":
        return nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def _head_loss(logits: torch.Tensor, x: torch.Tensor, teacher: torch.Tensor | None, d: int, labels: str):
    """Cross-entropy of one head's logits (B, T, V) at depth d (1-based): against the corpus token x[i+d],
    or against the frozen target's prediction of that token (row i+d-1 of `teacher`)."""
    T, V = logits.shape[1], logits.shape[-1]
    n = T - d + 1
    if labels == "corpus":
        return F.cross_entropy(logits[:, :n].reshape(-1, V).float(), x[:, d:d + n].reshape(-1))
    return self_distill_cross_entropies(logits[:, :n].unsqueeze(2), teacher[:, d - 1:d - 1 + n],
                                        hard=labels == "self-argmax")[0]


def meta_step(model: GPT, x: torch.Tensor, *, freeze_trunk: bool, memory_efficient: bool = True,
              labels: str = "corpus") -> float:
    """One backward pass for Meta heads (Gloeckle et al. 2024, sec. 2 'memory-efficient implementation').

    The trunk runs once; then each head's forward and backward run in turn on a detached copy
    of the trunk output z, whose gradient accumulates; finally z's gradient flows back through
    the trunk. Only one head's logits (B, T, V) are alive at a time, so peak memory does not
    grow with the number of heads. Returns the loss value.
    """
    idx = x[:, :-1]
    B, T = idx.shape
    rot = model.rope(0, T)
    heads = [model.blocks[-1]] + list(model.mtp.blocks)
    K = len(heads)
    first = 1 if freeze_trunk else 0  # a frozen trunk leaves head 1 (the original model) untouched
    n_trained = K - first
    ctx = torch.no_grad() if freeze_trunk else nullcontext()
    with ctx:
        z = model.wte(idx)
        for blk in model.blocks[:-1]:
            z = blk(z, rot)  # (B, T, C)
    teacher = None
    if labels != "corpus":  # the frozen target's own next-token logits (head 1), (B, T, V)
        with torch.no_grad():
            teacher = model.unembed(heads[0](z, rot))
    if not memory_efficient:
        total = 0.0
        for d in range(first, K):
            logits = model.unembed(heads[d](z, rot))  # (B, T, V)
            total = total + _head_loss(logits, x, teacher, d + 1, labels)
        loss = total / n_trained
        loss.backward()
        return loss.item()
    z_det = z.detach().requires_grad_(not freeze_trunk)
    total = 0.0
    for d in range(first, K):
        logits = model.unembed(heads[d](z_det, rot))  # (B, T, V) for this head only
        loss_d = _head_loss(logits, x, teacher, d + 1, labels) / n_trained
        loss_d.backward()
        total += loss_d.item()
    if not freeze_trunk:
        z.backward(z_det.grad)
    return total


def train_step(model: GPT, x: torch.Tensor, *, freeze_trunk: bool, lam: float, memory_efficient: bool = True,
               labels: str = "corpus") -> float:
    heads = model.config.heads
    if heads == "meta":
        return meta_step(model, x, freeze_trunk=freeze_trunk, memory_efficient=memory_efficient, labels=labels)
    idx = x[:, :-1]
    if freeze_trunk:
        with torch.no_grad():
            out = model(idx)
        extra = model.mtp.train_logits(model, idx, out)  # (B, T, K-1, V)
        logits = torch.cat([out.logits.unsqueeze(2), extra], dim=2)  # (B, T, K, V)
    else:
        logits = model.depth_logits(idx)  # (B, T, K, V)
    if labels == "corpus":
        ces = depth_cross_entropies(logits, x)
    else:  # self-distillation: depth d learns the frozen target's prediction of token i+d
        ces = self_distill_cross_entropies(logits, logits[:, :, 0].detach(), hard=labels == "self-argmax")
    loss = family_loss(heads, ces, lam=lam, freeze_trunk=freeze_trunk)
    loss.backward()
    return loss.item()


@torch.no_grad()
def evaluate(model: GPT, windows: torch.Tensor, batch_size: int = 16, autocast: str = "off") -> dict:
    """Teacher-forced per-depth validation: cross-entropy in bits per byte and top-1 accuracy
    of each depth against the true future token, and `val_agree_depth`: how often depth d at position i
    drafts what the target itself predicts for that token (its argmax at row i+d-1), a teacher-forced
    estimate of greedy acceptance."""
    was = model.training
    model.eval()
    K = model.config.n_depths
    sums = torch.zeros(K, dtype=torch.float64)
    hits = torch.zeros(K, dtype=torch.float64)
    agree = torch.zeros(K, dtype=torch.float64)
    counts = torch.zeros(K, dtype=torch.float64)
    dev = model.wte.weight.device
    for i in range(0, len(windows), batch_size):
        x = windows[i:i + batch_size].to(dev)
        with _autocast(dev, autocast):
            logits = model.depth_logits(x[:, :-1])  # (B, T, K, V)
        T = logits.shape[1]
        target_top = logits[:, :, 0].float().argmax(-1)  # (B, T) the target's own choice at each position
        for d in range(1, K + 1):
            n = T - d + 1
            lg = logits[:, :n, d - 1].float()
            tgt = x[:, d:d + n]
            sums[d - 1] += F.cross_entropy(lg.reshape(-1, lg.shape[-1]), tgt.reshape(-1), reduction="sum").item()
            top = lg.argmax(-1)
            hits[d - 1] += (top == tgt).sum().item()
            agree[d - 1] += (top == target_top[:, d - 1:d - 1 + n]).sum().item()
            counts[d - 1] += tgt.numel()
    model.train(was)
    bpb = (sums / counts / LN2).tolist()
    return {"val_bpb": bpb[0], "val_bpb_depth": bpb, "val_acc_depth": (hits / counts).tolist(),
            "val_agree_depth": (agree / counts).tolist()}


def _opt_state_tensors(opt) -> tuple[dict, dict]:
    tensors, scalars = {}, {}
    for gi, group in enumerate(opt.param_groups):
        for pi, p in enumerate(group["params"]):
            st = opt.state.get(p)
            if not st:
                continue
            tensors[f"{gi}.{pi}.exp_avg"] = st["exp_avg"]
            tensors[f"{gi}.{pi}.exp_avg_sq"] = st["exp_avg_sq"]
            scalars[f"{gi}.{pi}.step"] = float(st["step"])
    return tensors, scalars


def _load_opt_state(opt, tensors: dict, scalars: dict):
    for gi, group in enumerate(opt.param_groups):
        for pi, p in enumerate(group["params"]):
            key = f"{gi}.{pi}"
            if f"{key}.exp_avg" in tensors:
                opt.state[p] = {
                    "step": torch.tensor(scalars[f"{key}.step"]),
                    "exp_avg": tensors[f"{key}.exp_avg"].to(p.device),
                    "exp_avg_sq": tensors[f"{key}.exp_avg_sq"].to(p.device),
                }


def _paths(out: Path, name: str):
    return out / f"{name}.safetensors", out / f"{name}.state.safetensors", out / f"{name}.state.json"


def _save_all(model, opt, gen, step, history, out, name, base, meta, save_dtype):
    wpath, spath, jpath = _paths(out, name)
    ckpt.save(model, wpath, meta=meta, base=base, dtype=save_dtype)
    tensors, scalars = _opt_state_tensors(opt)
    tensors = {n: t.detach().cpu().contiguous() for n, t in tensors.items()}
    tensors["__batch_rng__"] = gen.get_state()
    tensors["__torch_rng__"] = torch.get_rng_state()
    # the live (full-precision) weights, so that a resumed run continues bit for bit
    for n, t in model.state_dict().items():
        if n != "lm_head.weight":
            tensors[f"__w__.{n}"] = t.detach().cpu().contiguous()
    ckpt.atomic_write(spath, lambda tmp: save_file(tensors, tmp))
    ckpt.atomic_write_text(jpath, json.dumps({"step": step, "scalars": scalars, "history": history}) + "\n")


def _distributed(device: str):
    """(rank, world, device) under torchrun (WORLD_SIZE > 1): gloo on CPU, nccl on CUDA; else (0, 1, pick(device))."""
    import os
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, pick(device)
    import torch.distributed as dist
    dev = pick(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return dist.get_rank(), world, dev


def _average_gradients(params, world: int):
    """Data parallelism by hand: average every gradient over the processes (one flat all_reduce).
    This is DistributedDataParallel's reduction without its hooks, which Meta's head-by-head
    backward (several backward passes per step) would trip over."""
    import torch.distributed as dist
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    i = 0
    for g in grads:
        g.copy_(flat[i:i + g.numel()].view_as(g))
        i += g.numel()


def _depths_for(heads: str, n_depths: int | None, n_modules: int | None) -> int:
    """The model's prediction depths K from the family and whichever of K or D (deepseek) was given."""
    if n_modules is not None:
        if heads != "deepseek":
            raise MtplabError(f"--modules (D) is for --heads deepseek; {heads} takes --depths K")
        if n_depths is not None and n_depths != n_modules + 1:
            raise MtplabError(f"D={n_modules} modules means K={n_modules + 1} depths, not {n_depths}; give one of them")
        if n_modules < 1:
            raise MtplabError(f"--modules must be >= 1 (got {n_modules})")
        return n_modules + 1
    if heads == "none":
        if n_depths not in (None, 1):
            raise MtplabError(f"--heads none predicts one token per position; --depths {n_depths} needs a head family")
        return 1
    depths = n_depths if n_depths is not None else (2 if heads == "deepseek" else 4)
    if depths < 2:
        raise MtplabError(f"--heads {heads} needs --depths >= 2 (got {depths}); depth 1 is the trunk's own head")
    return depths


def fit(*, preset: str = "tiny", corpus: str = "code", steps: int = 100, out=None, name: str | None = None,
        seed: int = 0, resume: bool = False, heads: str = "none", n_depths: int | None = None,
        n_modules: int | None = None, freeze_trunk: bool = False,
        from_checkpoint=None, lam: float = 0.3, batch_size: int = 16, lr: float = 3e-3, warmup: int | None = None,
        weight_decay: float = 0.1, grad_clip: float = 1.0, eval_every: int | None = None, eval_windows: int = 64,
        save_every: int | None = None, device: str = "auto", dropout: float | None = None,
        memory_efficient: bool = True, save_dtype: str | None = None, progress: bool = True,
        stop_after: int | None = None, max_seconds: float | None = None, labels: str = "corpus",
        autocast: str = "auto") -> list[dict]:
    """Train a model and return its history (a list of dicts, one per logged step).

    heads chooses the family; n_depths = K prediction depths (stern, meta; default 4), or for deepseek
    n_modules = D sequential modules (default 1; the model then has D+1 depths). freeze_trunk trains only the heads on top of `from_checkpoint` (Stern's frozen base,
    Medusa-1 style) and saves only the head weights with a reference to the base.
    `stop_after` ends the run early after that many steps (to simulate a killed run in tests);
    `max_seconds` ends it (validated and saved) once that much wall time has passed.
    labels: 'corpus' (the true next tokens), or with a frozen trunk 'self' / 'self-argmax': each depth
    learns the frozen target's own distribution / choice for its token (self-distillation).
    autocast: 'auto' trains in bf16 autocast where that pays (CUDA, CPUs with AVX512-BF16), 'bf16', 'off'.
    """
    if steps is None or int(steps) <= 0:
        raise MtplabError(f"steps must be a positive integer (got {steps})")
    if heads not in HEAD_FAMILIES:
        raise MtplabError(f"unknown head family {heads!r}; choose one of {', '.join(HEAD_FAMILIES)}")
    depths = _depths_for(heads, n_depths, n_modules)
    if lam < 0:
        raise MtplabError(f"lambda must be >= 0 (got {lam}); DeepSeek-V3 used 0.3 early in training, then 0.1")
    if freeze_trunk and from_checkpoint is None:
        raise MtplabError("--freeze-trunk needs --from CHECKPOINT: a frozen trunk must come from a trained model")
    if labels not in LABELS:
        raise MtplabError(f"unknown labels {labels!r}; choose one of {', '.join(LABELS)}")
    if labels != "corpus" and not freeze_trunk:
        raise MtplabError(f"--labels {labels} needs --freeze-trunk --from CHECKPOINT: the heads learn what a "
                          "frozen target predicts")
    if autocast not in AUTOCAST:
        raise MtplabError(f"unknown autocast {autocast!r}; choose one of {', '.join(AUTOCAST)}")
    if freeze_trunk and heads == "none":
        raise MtplabError("--freeze-trunk with --heads none has nothing to train; choose stern, meta or deepseek")
    rank, world, dev = _distributed(device)
    if batch_size % world:
        raise MtplabError(f"--batch-size {batch_size} is the global batch: make it a multiple of the {world} processes")
    progress = progress and rank == 0
    train_data = load_corpus(corpus, "train")
    val_data = load_corpus(corpus, "val")

    torch.manual_seed(seed)
    if from_checkpoint is not None:
        base_model = ckpt.load(from_checkpoint)
        if base_model.config.heads != "none":
            raise MtplabError(f"--from {from_checkpoint} already has {base_model.config.heads} heads; "
                              "start from a next-token checkpoint such as ntp")
        if dropout is not None or freeze_trunk:  # a frozen trunk runs as at inference: no dropout
            from dataclasses import replace
            base_model.config = replace(base_model.config, dropout=dropout or 0.0)
            for mod in base_model.modules():
                if hasattr(mod, "dropout") and isinstance(mod.dropout, float):
                    mod.dropout = dropout or 0.0
                if isinstance(mod, torch.nn.Dropout):
                    mod.p = dropout or 0.0
        model = attach_heads(base_model, heads, depths) if heads != "none" else base_model
        model.train()
    else:
        cfg = get_preset(preset).with_heads(heads, depths)
        if dropout is not None:
            from dataclasses import replace
            cfg = replace(cfg, dropout=dropout)
        model = GPT(cfg)
    model = model.to(dev).train()
    cfg = model.config
    if freeze_trunk:
        for n, p in model.named_parameters():
            p.requires_grad_(n.startswith("mtp."))
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95),
                            foreach=dev.type == "cuda")
    gen = torch.Generator().manual_seed(seed)
    warmup = warmup if warmup is not None else max(1, min(200, steps // 20))
    eval_every = eval_every or max(1, steps // 10)
    save_every = save_every or eval_every
    name = name or default_name(heads, depths)
    out = Path(out) if out is not None else None
    base = Path(from_checkpoint) if (freeze_trunk and from_checkpoint is not None) else None
    sdtype = {"bf16": torch.bfloat16, "fp16": torch.float16, None: None, "fp32": None}[save_dtype]
    history: list[dict] = []
    start = 0
    if resume:
        if out is None:
            raise MtplabError("--resume needs --out DIR holding an earlier run")
        wpath, spath, jpath = _paths(out, name)
        if not jpath.exists():
            raise MtplabError(f"nothing to resume in {out}: {jpath.name} is missing; run without --resume first")
        state = json.loads(jpath.read_text())
        tensors = load_file(str(spath))
        model.load_state_dict({n[len("__w__."):]: t for n, t in tensors.items() if n.startswith("__w__.")},
                              strict=False)
        model.lm_head.weight = model.wte.weight
        _load_opt_state(opt, {n: t for n, t in tensors.items() if not n.startswith("__")}, state["scalars"])
        gen.set_state(tensors["__batch_rng__"])
        torch.set_rng_state(tensors["__torch_rng__"])
        start, history = state["step"], state["history"]
    windows = val_windows(val_data, cfg.block_size, eval_windows)
    meta = {"preset": preset if from_checkpoint is None else None, "corpus": corpus, "heads": heads,
            "n_depths": depths, "n_modules": depths - 1 if heads == "deepseek" else None,
            "freeze_trunk": freeze_trunk, "from": str(from_checkpoint) if from_checkpoint else None,
            "seed": seed, "batch_size": batch_size, "lr": lr, "lambda": lam, "labels": labels,
            "autocast": autocast_kind(dev, autocast)}

    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=steps, initial=start, desc=f"train {name}", unit="step")
    t0 = time.perf_counter()
    tokens_seen = start * batch_size * cfg.block_size
    window_tokens, window_t = 0, time.perf_counter()
    end = steps if stop_after is None else min(steps, stop_after)
    for step in range(start, end):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup)
        x = get_batch(train_data, batch_size, cfg.block_size, gen)  # the global batch, the same on every rank
        if world > 1:
            x = x[rank * batch_size // world:(rank + 1) * batch_size // world]
        x = x.to(dev)
        with _autocast(dev, autocast):
            loss = train_step(model, x, freeze_trunk=freeze_trunk, lam=lam, memory_efficient=memory_efficient,
                              labels=labels)
        if world > 1:
            _average_gradients(params, world)
        if not math.isfinite(loss):
            raise MtplabError(f"training diverged at step {step} (loss {loss}); lower --lr")
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        tokens_seen += batch_size * cfg.block_size
        window_tokens += batch_size * cfg.block_size
        done = step + 1
        out_of_time = max_seconds is not None and time.perf_counter() - t0 > max_seconds
        if bar is not None:
            now = time.perf_counter()
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{window_tokens / max(1e-9, now - window_t):,.0f}")
            bar.update(1)
        if world > 1:  # every rank stops together
            flag = torch.tensor([float(out_of_time)], device=dev)
            torch.distributed.all_reduce(flag)
            out_of_time = bool(flag.item())
        if rank == 0 and (done % eval_every == 0 or done == steps or out_of_time):
            rec = {"step": done, "loss": loss, "lr": opt.param_groups[0]["lr"], "tokens": tokens_seen,
                   "elapsed_s": time.perf_counter() - t0,
                   "tokens_per_s": window_tokens / max(1e-9, time.perf_counter() - window_t)}
            rec.update(evaluate(model, windows))  # in fp32, comparable across runs
            history.append(rec)
            window_tokens, window_t = 0, time.perf_counter()
            if bar is not None:
                bar.write(f"step {done}: loss {loss:.3f} val bpb by depth "
                          + " ".join(f"{b:.3f}" for b in rec["val_bpb_depth"])
                          + " | top-1 acc " + " ".join(f"{a:.3f}" for a in rec["val_acc_depth"]))
        if rank == 0 and out is not None and (done % save_every == 0 or done == end or out_of_time):
            meta_now = dict(meta, steps=steps, step=done, tokens=tokens_seen, stopped_early=out_of_time,
                            wall_s=time.perf_counter() - t0, device=str(dev), val=history[-1] if history else None,
                            history=history)
            _save_all(model, opt, gen, done, history, out, name, base, meta_now, sdtype)
        if out_of_time:
            if bar is not None:
                bar.write(f"stopping at step {done}: max_seconds={max_seconds} reached")
            break
    if bar is not None:
        bar.close()
    if world > 1:
        torch.distributed.barrier()
    return history
