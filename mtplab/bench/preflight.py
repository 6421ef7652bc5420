"""`python -m mtplab preflight`: is this laptop ready for the lab, and what will it measure?

It checks the install (torch, the notebook stack, transformers, the real model), times a forward of the classroom
model (`ntp`, 12 x 256) and of SmolLM2-135M-Instruct over 1, 2 and 4 new tokens on this machine, and lists each
shipped head family's row with what the shipped records measured (tokens per step, and the drafter's cost in units
of t(1)): the inputs from which a student predicts that row's speedup here with this machine's cost curve (the
laptop assignment, `mtplab.teaching.classroom.ASSIGNMENT`). It neither prints nor stores that prediction: the
grader (`classroom.check_laptop_prediction`) recomputes it from the record's inputs. It reads the machine's load
while it measures and says plainly when the machine was too busy for the numbers to mean anything. It writes a
small JSON record (default `build/preflight.json`): a class pools those records in one folder (each student:
`python -m mtplab preflight --out FOLDER/NAME.json`), and notebook 01's going-further section plots them with
`mtplab.teaching.classroom`: a speedup is a property of the machine.
"""
from __future__ import annotations

import importlib.util
import json
import os
import platform
import stat
from pathlib import Path

import torch

from mtplab import paths
from mtplab.bench.report import curve_record, curve_words
from mtplab.device import machine, machine_words, pick
from mtplab.errors import MtplabError
from mtplab.hf.real import REAL_MODELS, gguf_path
from mtplab.measuring.race import NOT_MEASURED, LoadMeter, busy_reason
from mtplab.measuring.record import Record
from mtplab.measuring.timing import measure_cost_curve
from mtplab.model import checkpoint
from mtplab.files import atomic_write_text, finite, os_reason

REAL = next(iter(REAL_MODELS))  # the real model preflight times (hf.real.REAL_MODELS names it)
NEEDS = {"notebooks": ("matplotlib", "ipywidgets", "jupyterlab", "papermill"), "hf": ("transformers", "gguf")}


def install_checks() -> dict:
    """What is installed, and the one line that installs what is missing."""
    out = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.cuda.is_available()}
    for extra, mods in NEEDS.items():
        missing = [m for m in mods if importlib.util.find_spec(m) is None]
        out[extra] = "ok" if not missing else f"missing {', '.join(missing)}: pip install -e \".[{extra}]\""
    try:
        gguf_path(REAL_MODELS[REAL])
        out[REAL] = "ok"
    except MtplabError as e:
        out[REAL] = str(e)
    return out


def _curve(model, qs, repeats, *, name: str) -> dict:
    """t(1) and t(q)/t(1) with 128 tokens in the cache; `name` says which weights (the class compares like with like)."""
    return {"model": name, **curve_record(measure_cost_curve(model, qs, context=128, repeats=repeats))}


def _to_predict(rows: list[dict]) -> list[dict]:
    """Each shipped row's inputs for a prediction on this machine (its method, k, tokens per step, the drafter's cost
    in units of t(1), the speedup raced on the record's machine); the prediction itself is the student's to make."""
    return [{"row": r["row"], "method": r["method"], "k": r["k"], "tokens_per_step": r["tps"],
             "draft_t1": r.get("draft_t1", 0.0), "measured_there": r.get("measured")}
            for r in rows if r.get("tps") is not None and r.get("k")]


def _pos(x) -> bool:
    return finite(x) and x > 0


def _shipped_record(p: Path, read) -> list[dict]:
    """The rows `read` takes from a shipped benchmark record, every shape it does not expect one line that names
    the file and the fix (read before anything is measured)."""
    if not os.path.lexists(p):
        return []
    try:
        rows = read(Record.load(p))
        bad = next((r for r in rows if not (isinstance(r["row"], str) and isinstance(r["method"], str)
                                            and type(r["k"]) is int and r["k"] >= 1 and _pos(r["tps"])
                                            and finite(r["draft_t1"]) and r["draft_t1"] >= 0
                                            and (r["measured"] is None or _pos(r["measured"])))),
                   None)
    except (KeyError, TypeError, AttributeError, IndexError, ValueError, ZeroDivisionError) as e:
        if isinstance(e, MtplabError):
            raise
        raise MtplabError(f"{p} is not the benchmark record preflight reads ({type(e).__name__}: {str(e)[:60]}); "
                          f"restore it from git (git checkout -- {p})") from None
    if bad is not None:
        raise MtplabError(f"{p} has a row preflight cannot read ({str(bad.get('row'))[:40]}: a label, a method, k >= 1 "
                          f"and positive rates); restore it from git (git checkout -- {p})")
    return rows


def _classroom_rows() -> list[dict]:
    return _shipped_record(paths.DECODE_JSON, lambda rec: [
        {"row": r["label"], "method": r["method"], "k": r["k"], "tps": r.get("tokens_per_step"),
         "draft_t1": r.get("drafter_cost_t1", 0) or 0, "measured": r.get("speedup_wall")}
        for r in rec.rows if not r["method"].startswith("oracle") and r.get("tokens_per_step") is not None and r["k"]])


def _real_rows() -> list[dict]:
    def read(rec):
        t1 = rec["threads"]["1"]["ar_ms_per_token"]
        out = []
        for r in (r for r in rec["rows"] if r["threads"] == 1):
            if (r.get("family") is None or r.get("dtype", "fp32") != "fp32" or "split" not in r
                    or "acceptance" not in r):  # a tree row has no chain acceptance to predict from
                continue
            acc = r["acceptance"]["pooled"]
            tps = 1 + sum(acc["accepted"]) / max(1, acc["steps"])
            out.append({"row": r["label"], "method": r["method"], "k": r["k"], "tps": tps,
                        "draft_t1": r["split"]["draft_ms"] / t1, "measured": r["speedup"]})
        return out
    return _shipped_record(paths.BENCH_DIR / "real.json", read)


def check_out(path: Path) -> None:
    """--out checked before anything is measured: a new or regular file (never a device, a pipe, a link or a
    folder, which the atomic write would replace), outside what the lab ships, in a folder that can be written."""
    checkpoint.check_path("--out", path)
    if os.path.lexists(path):
        mode = os.lstat(path).st_mode
        if not stat.S_ISREG(mode):
            kind = "a link" if stat.S_ISLNK(mode) else "a folder" if stat.S_ISDIR(mode) else "a device or a pipe"
            raise MtplabError(f"--out {path} is {kind}, not a regular file (writing the record would replace it); "
                              "give --out a new file name, e.g. build/preflight.json")
    shipped = paths.shipped_folder(path)
    if shipped is not None and not paths.may_write_shipped():
        raise MtplabError(f"--out {path} is inside {shipped}, which the lab ships; give --out a file outside it")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise MtplabError(f"cannot write {path} ({parent} is not a writable folder); give --out a writable file")


def run_preflight(*, out: str | None = None, quick: bool = False, device: str = "cpu", log=print) -> dict:
    dev = pick(device)
    path = Path(out or paths.ROOT / "build" / "preflight.json")
    check_out(path)
    shipped_rows = {"classroom": _classroom_rows(), REAL: _real_rows()}  # read (and checked) before measuring
    rec: dict = {"install": install_checks(), "machine": machine(dev)}
    qs, reps = ((1, 2, 4), 3) if quick else ((1, 2, 4, 8), 5)
    meter = LoadMeter().start()
    ntp = checkpoint.load("ntp", device=dev)
    rec["classroom"] = _curve(ntp, qs, reps, name=f"ntp, {ntp.config.n_layer} x {ntp.config.n_embd}")
    if rec["install"][REAL] == "ok" and rec["install"]["hf"] == "ok":
        from mtplab.hf.target import load_hf  # transformers
        rec[REAL] = _curve(load_hf(REAL, device=dev), qs, reps, name="SmolLM2-135M-Instruct, float32")
    others = meter.stop()
    rec["others_cores"] = others
    rec["busy"] = busy_reason(others, None)
    rec["predictions"] = {"classroom": _to_predict(shipped_rows["classroom"])}
    if REAL in rec:
        rec["predictions"][REAL] = _to_predict(shipped_rows[REAL])
    try:
        atomic_write_text(path, json.dumps(rec, indent=1) + "\n")
    except OSError as e:
        raise MtplabError(f"cannot write {path} ({os_reason(e)}); give --out a writable file") from None
    rec["path"] = str(path)
    if log:
        log(report(rec))
    return rec


def load_line(rec: dict) -> str:
    """What the load reading says about these numbers: busy, measured and quiet, or not measured (never "idle"
    without a reading)."""
    if rec.get("busy"):
        return (f"the machine was too busy for these numbers to mean anything: {rec['busy']}; close other work and "
                "rerun")
    if rec.get("others_cores") is None:
        return f"{NOT_MEASURED}: read these numbers as rough, and close other work while it runs"
    return (f"the machine was idle enough (other processes used {rec['others_cores']:.2f} cores): these numbers hold "
            "for this laptop")


def report(rec: dict) -> str:
    m = rec["machine"]
    lines = [machine_words(m)]
    lines += [f"install {k}: {v}" for k, v in rec["install"].items()]
    for name in ("classroom", REAL):
        if name in rec:
            lines.append(f"{name}: {curve_words(rec[name])}")
    for name, rows in rec["predictions"].items():
        for r in rows:
            there = f"; raced on the record's machine: {r['measured_there']:.2f}x" if r["measured_there"] else ""
            lines.append(f"to predict: {name}, {r['row']}, k={r['k']}: {r['tokens_per_step']:.2f} tokens per step, "
                         f"drafter {r['draft_t1']:.2f} t(1){there}")
    lines.append(load_line(rec))
    lines.append(f"record: {rec.get('path', '-')}")
    return "\n".join(lines)
