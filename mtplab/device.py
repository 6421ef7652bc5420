"""Device choice: cuda, then mps, then cpu. Nothing in mtplab assumes CUDA."""
from __future__ import annotations

import torch

from .errors import MtplabError


def pick(name: str = "auto") -> torch.device:
    name = (name or "auto").lower()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise MtplabError(f"device {name!r} was asked for but CUDA is not available here; use device='auto' or 'cpu'")
        return torch.device(name)
    if name == "mps":
        if getattr(torch.backends, "mps", None) is None or not torch.backends.mps.is_available():
            raise MtplabError("device 'mps' was asked for but MPS is not available here; use device='auto' or 'cpu'")
        return torch.device("mps")
    if name == "cpu":
        return torch.device("cpu")
    raise MtplabError(f"unknown device {name!r}; use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return device.type
