"""Where a benchmark's record goes: OUT/NAME.json (the numbers and the machine), OUT/NAME.md (the table), and the
figure beside them. What was measured is never lost to a failed write: it goes to a folder in the temp dir
instead, or to stdout when that fails too, and the one-line error says where.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from mtplab.errors import MtplabError
from mtplab.device import machine, machine_line
from mtplab import files
from mtplab.files import atomic_write_text, os_reason
from mtplab.measuring.record import flat
from mtplab.model import kernels


def held_out_count(a) -> int:
    """--prompts of a benchmark over the held-out code prompts: 1..20 (the held-out set has 20); 8 by default."""
    if a.prompts is None:
        return 8
    if isinstance(a.prompts, bool) or not isinstance(a.prompts, int) or not 1 <= a.prompts <= 20:
        raise MtplabError(f"--prompts must be in 1..20, the held-out prompts there are (got {a.prompts})")
    return a.prompts


def curve_record(c) -> dict:
    """A measured cost curve (`measuring.timing.measure_cost_curve`) as the records keep it: t(1) in milliseconds
    and t(q)/t(1) by q."""
    return {"t1_ms": 1e3 * c.seconds[1], "ratio": {str(q): r for q, r in c.ratio.items()}}


def curve_words(c: dict) -> str:
    """A `curve_record` in one line: t(1), then t(q)/t(1) for every q > 1."""
    return f"t(1) = {c['t1_ms']:.1f} ms, " + ", ".join(f"t({q})/t(1) = {r:.2f}" for q, r in c["ratio"].items()
                                                      if q != "1")


def _write(out: Path, name: str, data: dict, table: str, fig=None, *, device="cpu") -> None:
    """Each file is written atomically (a failed write leaves the old one intact), and every record names the
    machine it was measured on: CPU model, cores and threads, last-level cache, torch, and the kernel the linears
    ran through (`kernel`: 'exact' or 'stock', `mtplab.model.kernels`; a record that raced both says so per row).
    A write that fails (a full disk) keeps the results elsewhere and raises one line naming where."""
    kernel = data.get("kernel") or ("exact" if kernels.active() else "stock")  # the linears' kernel while it ran
    data = flat({**data, "machine": data.get("machine") or machine(device), "kernel": kernel})  # rows carry fields
    md = table + "\n\n" + machine_line(device) + "\n"
    try:
        _files(Path(out), name, data, md, fig)
    except OSError as e:
        kept = _keep(name, data, md, fig)
        raise MtplabError(f"could not write {name}.json to {out} ({os_reason(e)}); the results measured are kept in "
                          f"{kept}: free space and copy them to {out}") from None


def _files(out: Path, name: str, data: dict, md: str, fig) -> None:
    atomic_write_text(out / f"{name}.json", json.dumps(data, indent=2) + "\n")
    atomic_write_text(out / f"{name}.md", md)
    if fig is not None:
        files.atomic_write(out / f"{name}.png", lambda tmp: fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight"))


def _keep(name: str, data: dict, md: str, fig) -> str:
    """The results, where --out could not take them: a new folder in the temp dir, else stdout."""
    try:
        where = Path(tempfile.mkdtemp(prefix=f"mtplab-{name}-"))
        _files(where, name, data, md, None)
    except OSError:
        print(json.dumps(data))
        return "the JSON printed above (the temp dir is not writable either)"
    if fig is not None:
        try:
            _files(where, name, data, md, fig)
        except OSError:
            pass  # the numbers are kept; the figure is drawn again from them
    return str(where / f"{name}.json")


def _md(rows: list[dict], cols: list[str]) -> str:
    """A record's table: viz's one markdown table, floats to 3 significant digits."""
    from mtplab.viz.text import markdown_table  # the viz package imports matplotlib

    return markdown_table(rows, cols, number=lambda v: f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}").rstrip("\n")
