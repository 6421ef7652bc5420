"""Where a benchmark's record goes: OUT/NAME.json (the numbers and the machine), OUT/NAME.md (the table), and the
figure beside them.
"""
from __future__ import annotations

import json
from pathlib import Path

from mtplab.errors import MtplabError
from mtplab.device import machine, machine_line
from mtplab.model.checkpoint import atomic_write, atomic_write_text


def held_out_count(a) -> int:
    """--prompts of a benchmark over the held-out code prompts: 1..20 (the held-out set has 20); 8 by default."""
    if a.prompts is None:
        return 8
    if isinstance(a.prompts, bool) or not isinstance(a.prompts, int) or not 1 <= a.prompts <= 20:
        raise MtplabError(f"--prompts must be in 1..20, the held-out prompts there are (got {a.prompts})")
    return a.prompts


def _write(out: Path, name: str, data: dict, table: str, fig=None, *, device="cpu") -> None:
    """Each file is written atomically (a failed write leaves the old one intact), and every record names the
    machine it was measured on: CPU model, cores and threads, last-level cache, torch."""
    data = {**data, "machine": data.get("machine") or machine(device)}
    atomic_write_text(Path(out) / f"{name}.json", json.dumps(data, indent=2) + "\n")
    atomic_write_text(Path(out) / f"{name}.md", table + "\n\n" + machine_line(device) + "\n")
    if fig is not None:
        atomic_write(Path(out) / f"{name}.png", lambda tmp: fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight"))


def _md(rows: list[dict], cols: list[str]) -> str:
    """A record's table: viz's one markdown table, floats to 3 significant digits."""
    from mtplab.viz.text import markdown_table  # the viz package imports matplotlib

    return markdown_table(rows, cols, number=lambda v: f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}").rstrip("\n")
