"""Rewrite the shipped records once into flat rows (issue 38, item 3): every row of docs/bench/*.json carries method,
checkpoint, k, draft_vocab, dtype and threads (`measuring.record.flat`), so that `Record.row` finds it by fields alone
and the reader no longer parses labels. Run from the repository root: python scripts/flat_records.py

* Rows written before rows kept `method` and `checkpoint` beside the label (decode*.json, k.json, regime.json's
  by_depth) held the label in `method` ('deepseek D=3'); each gains its pair's label, method, checkpoint and k from
  `decoding.drafters.PAIRS` (regime's by_depth measured the 4-layer family: checkpoint + '-l4'). Rows that match no
  shipped label (peers: transformers' methods) or ran on other checkpoints (domain) keep their method as the label.
* real.json nested its rows under thread counts; they move to one `rows` list with `threads` (an int), `model` and
  `checkpoint` (the heads file's name, None for AR and transformers' rows) as fields. Each thread count's run
  (verdict, machine, rounds, ...) stays under `threads`, without its rows.
Numbers are not touched: only fields are added or moved. Running it again changes nothing.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mtplab.decoding.drafters import PAIRS  # noqa: E402
from mtplab.measuring.record import flat, row_tables  # noqa: E402

OLD_LABELS = {"stern overlapped": "blockwise-overlap"}  # bench k's label before the catalogue
OTHER = ("domain", "peers")  # methods that ran on other checkpoints, or are not the lab's
REAL_HEADS = {"deepseek": "deepseek-d1", "stern": "stern-k4"}  # data/hf/smollm2/NAME.safetensors, by family


def labelled(name: str, row: dict) -> dict:
    """An old row's label, method, checkpoint and k, from the label its `method` held."""
    if "label" in row:
        return row
    if name.startswith("crossover") and "method" not in row:  # oracle drafts on random-weights models (bench costs)
        row = {"method": "oracle", **row}
    label = row.get("method")
    if "checkpoint" in row or name.split("-")[0] in OTHER or label is None:
        return {"label": label, **row}
    pair = next((p for p in PAIRS if p.label == OLD_LABELS.get(label, label)), None)
    if pair is None:
        return {"label": label, **row}
    checkpoint = pair.checkpoint + ("-l4" if name.startswith("regime") else "")
    return {**row, "label": label, "method": pair.method, "checkpoint": checkpoint, "k": row.get("k", pair.k)}


def real(data: dict) -> dict:
    """real.json: one flat `rows` list, each row with its thread count, the model and its heads file."""
    if "rows" in data:
        return data
    rows, runs = [], {}
    for n, run in data["threads"].items():
        rows += [{**r, "threads": int(n), "model": data["model"],
                  "checkpoint": REAL_HEADS.get(r.get("family")) if r.get("family") else None} for r in run["rows"]]
        runs[n] = {k: v for k, v in run.items() if k != "rows"}
    return {**data, "threads": runs, "rows": rows}


def rewrite(path: Path) -> bool:
    raw = path.read_text()
    data = json.loads(raw)
    if not isinstance(data, dict):
        return False
    if path.stem == "real":
        data = real(data)
    new = {**data, **{key: [labelled(path.stem, r) for r in data[key]] for key in row_tables(data)}}
    new = flat(new)
    text = json.dumps(new, indent=2) + "\n"
    if text == raw or not row_tables(new):
        return False
    path.write_text(text)
    return True


if __name__ == "__main__":
    for p in sorted((ROOT / "docs" / "bench").glob("*.json")):
        if rewrite(p):
            print("rewrote", p.relative_to(ROOT))
