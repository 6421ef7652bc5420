"""The class's first points (data/classroom/*.json): the machines this lab was measured on, read from git.

    python -m tools.classroom_points           # print what it would write
    python -m tools.classroom_points --write   # write data/classroom/*.json

Every number is copied from a benchmark record as a commit holds it (`git show COMMIT:FILE`); each point names
that commit and file in its `provenance`. A point is a preflight record (`mtplab.bench.preflight`) without the
install checks, plus `measured`: the speedups the lab raced on that machine. tests/teaching/test_classroom.py reads the
commits again and checks every number.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "data" / "classroom"

# 9e669cd's decode record names no machine; the README of the same commit does ("What it measures on this
# hardware"): a 2-core AMD EPYC VM (AVX2), PyTorch 2.13 CPU, fp32, 2 threads, the 4-layer classroom model.
EPYC_MACHINE = {"cpu": "AMD EPYC (2-core VM, AVX2)", "cores": 2, "threads": 2, "llc_bytes": None, "llc": "not recorded",
                "torch": "2.13 (CPU build)", "device": "cpu"}
# the records' own method names, in the lab's current words (09's record called them deepseek and deepseek-d3)
RENAME = {"deepseek": "deepseek D=1", "deepseek-d3": "deepseek D=3"}


def git_json(commit: str, path: str) -> dict:
    out = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def decode_rows(rec: dict) -> list[dict]:
    """The raced rows of a `bench decode` record (the oracle is no drafter a laptop has; left out)."""
    rows = []
    for r in rec["rows"]:
        if r["method"].startswith("oracle"):
            continue
        row = {"row": RENAME.get(r["method"], r["method"]), "k": r["k"], "speedup": r["speedup_wall"],
               "tokens_per_forward": r["tokens_per_forward"]}
        if r["method"] in RENAME:
            row["label_in_record"] = r["method"]
        rows.append(row)
    return rows


def real_rows(rec: dict, threads: str) -> list[dict]:
    """The float32 rows of `bench real` at one thread count (bf16 rows, lossy, left out)."""
    return [{"row": r["label"], "k": r.get("k"), "speedup": r["speedup"],
             "tokens_per_forward": r.get("tokens_per_forward")}
            for r in _rows_at(rec, threads) if r.get("dtype", "fp32") == "fp32" and r["label"] != "AR"]


def _rows_at(rec: dict, threads: str) -> list[dict]:
    """A bench real record's rows at one thread count: flat rows with `threads` (from scripts/flat_records.py on),
    or the older records' rows nested under each thread count (these points read a committed older record)."""
    nested = rec["threads"][threads].get("rows")
    return nested if nested is not None else [r for r in rec["rows"] if r["threads"] == int(threads)]


def points() -> dict[str, dict]:
    out = {}
    real = ("ec07274", "docs/bench/real.json")
    for name, (commit, path), threads in (("xeon-300mib-1thread", ("e0393f3", "docs/bench/decode.json"), "1"),
                                          ("xeon-300mib-2threads", ("e0393f3", "docs/bench/decode-2threads.json"), "2")):
        d, r = git_json(commit, path), git_json(*real)
        out[name] = {
            "machine": d["machine"],
            "classroom": {"model": "ntp, 12 x 256", "t1_ms": d["t1_ms"], "ratio": d["cost_curve"]},
            "measured": {"classroom": decode_rows(d), "smollm2": real_rows(r, threads)},
            "provenance": [
                {"commit": commit, "file": path, "what": f"bench decode: {d['prompts']} held-out prompts, m = "
                 f"{d['max_new_tokens']}, {d['repeats']} interleaved repeats, fp32, {d['threads']} thread(s)"},
                {"commit": real[0], "file": real[1], "what": f"bench real, threads {threads!r}: "
                 f"{r['threads'][threads]['verdict']}; float32 rows"}]}
    d = git_json("9e669cd", "docs/bench/decode.json")
    out["epyc-avx2-2threads"] = {
        "machine": EPYC_MACHINE,
        "classroom": {"model": "the classroom model of 2026-11-30 (4 x 256)", "ratio": d["cost_curve"]},
        "measured": {"classroom": decode_rows(d)},
        "provenance": [
            {"commit": "9e669cd", "file": "docs/bench/decode.json",
             "what": f"bench decode: {d['prompts']} held-out prompts, m = 128, {d['repeats']} interleaved repeats, fp32, "
                     f"{d['threads']} threads; another model and other prompts than today's"},
            {"commit": "9e669cd", "file": "README.md", "what": "the machine, from its section 'What it measures on "
             "this hardware' (the record itself names none; its last-level cache was not recorded)"}]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args(argv)
    for name, rec in points().items():
        text = json.dumps(rec, indent=1) + "\n"
        if a.write:
            OUT.mkdir(parents=True, exist_ok=True)
            (OUT / f"{name}.json").write_text(text)
        print(f"{name}: {rec['machine']['cpu']}, {rec['machine']['threads']} thread(s), "
              f"{sum(len(v) for v in rec['measured'].values())} raced rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
