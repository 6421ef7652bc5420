"""Checkers for the exercises at the end of each notebook: a checker runs the student's function on several inputs,
compares it with mtplab's own answer and returns a `Check`. It never raises on the student's code.
"""
from __future__ import annotations

from dataclasses import dataclass
import torch


@dataclass
class Check:
    """The verdict of one checker. bool(check) is True when the answer is right."""
    name: str
    ok: bool
    why: str

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return f"{'right' if self.ok else 'not yet'} ({self.name}): {self.why}"

    __repr__ = __str__


def _call(fn, *args):
    """(value, None) or (None, 'TypeError: ...') when the student's function raises."""
    try:
        return fn(*args), None
    except Exception as e:  # noqa: BLE001 - any failure of student code is reported, not raised
        return None, f"{type(e).__name__}: {e}"


def _number(v) -> float | None:
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)
