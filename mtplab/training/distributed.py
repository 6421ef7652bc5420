"""Data parallelism by hand for `mtplab.training.fit`: under torchrun every process trains on its slice of the
global batch and the gradients are averaged with one all_reduce (gloo on CPU, nccl on CUDA).

A single process (no WORLD_SIZE, or WORLD_SIZE=1) never imports torch.distributed.
"""
from __future__ import annotations

import datetime
import os
import torch
from mtplab.device import pick
from mtplab.errors import MtplabError


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise MtplabError(f"{name}={raw!r} is not an integer; unset it, or launch with torchrun, "
                          "which sets it") from None
    if value < 0:
        raise MtplabError(f"{name}={value} must be >= 0; unset it, or launch with torchrun, which sets it")
    return value


def setup(device: str) -> tuple[int, int, torch.device]:
    """(rank, world, device) under torchrun (WORLD_SIZE > 1); else (0, 1, pick(device))."""
    world = _env_int("WORLD_SIZE", 1)
    if world <= 1:
        return 0, 1, pick(device)
    import torch.distributed as dist
    missing = [v for v in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
    if missing:
        raise MtplabError(f"WORLD_SIZE={world} but {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set; "
                          f"launch with torchrun --nproc_per_node {world} -m mtplab train ..., which sets them (or "
                          "unset WORLD_SIZE for one process)")
    rank = _env_int("RANK", 0)
    if rank >= world:
        raise MtplabError(f"RANK={rank} must be below WORLD_SIZE={world}; launch with torchrun, which sets both")
    dev = pick(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", _env_int("LOCAL_RANK", 0))
        torch.cuda.set_device(dev)
    wait = _env_int("MTPLAB_DIST_TIMEOUT", 300)  # seconds to wait for every rank (torch's default is 30 minutes)
    if not dist.is_initialized():
        try:
            dist.init_process_group("nccl" if dev.type == "cuda" else "gloo",
                                    timeout=datetime.timedelta(seconds=max(1, wait)))
        except (RuntimeError, ValueError) as e:  # torch's DistStoreError is a RuntimeError
            raise MtplabError(f"could not start {world} processes at {os.environ['MASTER_ADDR']}:"
                              f"{os.environ['MASTER_PORT']} ({str(e).splitlines()[0][:120] if str(e) else type(e).__name__}); "
                              "launch every rank with torchrun, or unset WORLD_SIZE for one process") from None
    return dist.get_rank(), world, dev


def shard(x: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This process's rows of the global batch (the same batch is drawn on every rank)."""
    n = x.shape[0]
    return x if world == 1 else x[rank * n // world:(rank + 1) * n // world]


def average_gradients(params, world: int) -> None:
    """Average every gradient over the processes (one flat all_reduce).
    This is DistributedDataParallel's reduction without its hooks, which Meta's head-by-head
    backward (several backward passes per step) would trip over."""
    if world == 1:
        return
    import torch.distributed as dist
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    i = 0
    for g in grads:
        g.copy_(flat[i:i + g.numel()].view_as(g))
        i += g.numel()


def any_rank(flag: bool, dev: torch.device, world: int) -> bool:
    """True on every process when it is true on one (so that all stop together)."""
    if world == 1:
        return flag
    t = torch.tensor([float(flag)], device=dev)
    torch.distributed.all_reduce(t)
    return bool(t.item())


def barrier(world: int) -> None:
    if world > 1:
        torch.distributed.barrier()
