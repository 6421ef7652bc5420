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


def number_from(fn, *args, case: str) -> tuple[float | None, str | None]:
    """(the student's number, None), or (None, why not) when fn raised or returned something else; `case` names
    the inputs in words, for the message ('on widths (3, 2, 1)')."""
    got, err = _call(fn, *args)
    if err:
        return None, f"your function raised {err} {case}"
    v = _number(got)
    if v is None:
        return None, f"return a number (got {got!r} {case})"
    return v, None
