"""Each notebook's run time with its defaults, measured on this machine, and the line that states it.

    python -m tools.notebook_times            # run every notebook with papermill, alone, one after the other; print
    python -m tools.notebook_times --write    # ... and write the measured times into the record and each first cell
    python -m tools.notebook_times --write --from-record   # only rewrite the first cells from the record

The record (docs/bench/notebooks.json) keeps each notebook's wall seconds, its slowest cell, whether the machine was
busy while it ran (the race's load meter) and the machine. tests/notebooks/test_notebooks.py checks that every first cell
states what the record says.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import nbformat

from mtplab.device import machine
from mtplab.files import atomic_write_text

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "docs" / "bench" / "notebooks.json"
LINE = re.compile(r"^\*Run time with the defaults: .*\*$", re.M)


def statement(rec: dict) -> str:
    """The line each first cell carries, drawn from the record."""
    m = rec["machine"]
    return (f"*Run time with the defaults: {rec['seconds']:.0f} s, measured alone on an idle {m['cores']}-core "
            f"{m['cpu']} (torch {m['torch']}; slowest cell {rec['slowest_cell_s']:.0f} s). On a machine busy with "
            "other work it takes longer, and its live timings say so.*")


TEACHING = ROOT / "docs" / "teaching.md"
START, END = "<!-- notebook times: drawn by tools/notebook_times.py -->", "<!-- /notebook times -->"


def table(record: dict) -> str:
    rows = ["| notebook | run time with the defaults | slowest cell |", "|---|---|---|"]
    for name, r in sorted(record["notebooks"].items()):
        rows.append(f"| {name[:2]} | {r['seconds']:.0f} s | {r['slowest_cell_s']:.0f} s |")
    m = next(iter(record["notebooks"].values()))["machine"] if record["notebooks"] else {}
    head = (f"Measured alone, one after the other, on an idle {m.get('cores', '?')}-core {m.get('cpu', '?')} "
            f"(torch {m.get('torch', '?')}), after `make run` had converted the real model. A browser or a video call "
            "on the same laptop makes each several times longer, and the live races then print \"not valid here\".")
    return "\n".join([START, head, "", *rows, END])


def write_teaching(record: dict) -> None:
    text = TEACHING.read_text()
    if START not in text:
        raise SystemExit(f"{TEACHING} has no {START} marker")
    i, j = text.index(START), text.index(END) + len(END)
    text = text[:i] + table(record) + text[j:]
    by = {name[:2]: r for name, r in record["notebooks"].items()}
    k = text.index(END)  # the plan after the table quotes times as "NN: S s idle, slowest cell C s": from the record too
    text = text[:k] + re.sub(r"\b(\d\d): \d+ s idle, slowest cell \d+ s",
                             lambda m: (f"{m[1]}: {by[m[1]]['seconds']:.0f} s idle, slowest cell "
                                        f"{by[m[1]]['slowest_cell_s']:.0f} s") if m[1] in by else m[0], text[k:])
    atomic_write_text(TEACHING, text)


def measure(path: Path) -> dict:
    import papermill as pm
    out = ROOT / "build" / "nbtimes" / path.name
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    pm.execute_notebook(str(path), str(out), kernel_name="python3", cwd=str(path.parent), progress_bar=False,
                        execution_timeout=900)
    seconds = time.perf_counter() - t0
    ran = nbformat.read(out, as_version=4)
    cells = [c.metadata.get("papermill", {}).get("duration") or 0.0 for c in ran.cells if c.cell_type == "code"]
    # (no load reading: the notebook runs in a kernel, another process, which a load meter would count as others)
    return {"seconds": seconds, "slowest_cell_s": max(cells, default=0.0), "machine": machine("cpu")}


def write_lines(record: dict) -> None:
    for name, rec in record["notebooks"].items():
        path = ROOT / "notebooks" / name
        nb = nbformat.read(path, as_version=4)
        src = nb.cells[0].source
        if not LINE.search(src):
            raise SystemExit(f"{name}: the first cell has no '*Run time with the defaults: ...*' line")
        nb.cells[0].source = LINE.sub(lambda _m, r=rec: statement(r), src)
        nbformat.write(nb, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--from-record", action="store_true")
    ap.add_argument("--only", nargs="*", default=None)
    a = ap.parse_args(argv)
    record = json.loads(RECORD.read_text()) if RECORD.exists() else {"notebooks": {}}
    if not a.from_record:
        for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
            if a.only and not any(path.name.startswith(o) for o in a.only):
                continue
            rec = measure(path)
            record["notebooks"][path.name] = rec
            print(f"{path.name}: {rec['seconds']:.0f} s (slowest cell {rec['slowest_cell_s']:.0f} s)", flush=True)
        if a.write:  # the record and the first cells that quote it change together (tests/notebooks checks them)
            atomic_write_text(RECORD, json.dumps(record, indent=1) + "\n")
        else:
            print(f"{RECORD.relative_to(ROOT)} left as it was: --write writes it and the first cells")
    if a.write:
        write_lines(record)
        write_teaching(record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
