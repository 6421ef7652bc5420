"""The class as data (notebook 01, going further): one speedup per laptop, against its cores, cache and threads.

Each student runs `python -m mtplab preflight --out NAME.json`; the teacher collects the files in one folder.
`read_records` reads such a folder (`read_class`: the lab's own points, then the class's): preflight records, which
hold that laptop's cost curve and each shipped row's inputs (tokens per step, drafter cost), from which `points`
forecasts the row's speedup there (the record itself holds no forecast: predicting it is the students' assignment),
and the lab's own points in data/classroom/, which hold the same fields plus `measured`: the
speedups the lab *raced* on that machine, with the commit and file they were copied from (`provenance`; `python -m
tools.classroom_points`). `points` flattens the records into one row per (record, model, row); `figure` draws a
speedup against cores, last-level cache and threads, raced filled and predicted hollow; `spread` says in words how
far they differ."""
from __future__ import annotations

import statistics
from pathlib import Path

from mtplab.decoding.drafters import METHODS
from mtplab.errors import MtplabError
from mtplab.files import finite, read_json
from mtplab.measuring import theory
from mtplab.paths import DATA_DIR
from mtplab.teaching.check import Check, _number

SHIPPED = DATA_DIR / "classroom"  # the machines this lab was measured on: its first points
LIMIT = 1 << 20                   # a preflight record is a few kB
MAX_COUNT = 1 << 16               # cores or threads of one machine
MAX_SPEEDUP = 1000.0              # no decoding method here is a thousand times faster than AR
FIX = "each student writes one with: python -m mtplab preflight --out FOLDER/NAME.json"


def read_records(folder=SHIPPED) -> list[dict]:
    """Every *.json in `folder` that names its machine, sorted by file name; each gains `source` (its file name)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise MtplabError(f"{folder} is not a folder of records; {FIX}")
    out = [{**check_record(p, read_json(p, limit=LIMIT, what="a preflight record", fix=FIX)), "source": p.name}
           for p in sorted(folder.glob("*.json"))]
    if not out:
        raise MtplabError(f"{folder} holds no *.json record; {FIX}")
    return out


def _count(x, top: int = MAX_COUNT) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= top


def _speedup(x) -> bool:
    return finite(x) and 0 < x <= MAX_SPEEDUP


def check_record(p: Path, rec) -> dict:
    """A record as `points` and `figure` read it, or one line that names the file and what in it is wrong: the
    machine's cpu (text), threads and cores (counts), and every raced or predicted row of every model a dict with
    its `row` (text) and speedup (a positive finite number: 0 or a negative one is no speedup)."""
    def bad(why: str) -> MtplabError:
        return MtplabError(f"{p} is not a preflight record ({why}); {FIX}")
    m = rec.get("machine") if isinstance(rec, dict) else None
    if not isinstance(m, dict) or not {"cpu", "threads"} <= set(m):
        raise MtplabError(f"{p} names no machine (cpu, threads), so it is no preflight record; {FIX}")
    if not isinstance(m["cpu"], str) or not _count(m["threads"]) or not (m.get("cores") is None or _count(m["cores"])):
        raise bad(f"machine cpu {m['cpu']!r:.40}, threads {m['threads']!r:.40}, cores {m.get('cores')!r:.40}: want a "
                  f"name and counts from 1 to {MAX_COUNT}")
    for key, field in (("measured", "speedup"), ("predictions", "tokens_per_step")):
        models = rec.get(key)
        if not models:
            continue
        if not isinstance(models, dict):
            raise bad(f"{key} is a {type(models).__name__}, not a dict of model -> rows")
        for model, rows in models.items():
            if not isinstance(rows, list) or not isinstance(rec.get(model) or {}, dict):
                raise bad(f"{key}.{model} is not a list of rows, or {model} is not a dict")
            for r in rows:
                if not isinstance(r, dict) or not isinstance(r.get("row"), str) or not _speedup(r.get(field)):
                    shown = r.get(field) if isinstance(r, dict) else r
                    raise bad(f"a row of {key}.{model} has {field} {shown!r:.40}: want a dict with a row name and a "
                              f"number above 0, at most {MAX_SPEEDUP}")
                d = r.get("draft_t1", 0.0)
                if key == "predictions" and not (_count(r.get("k"), 1024) and finite(d) and d >= 0):
                    raise bad(f"a row of {key}.{model} has k {r.get('k')!r:.40}, draft_t1 {d!r:.40}: want a count "
                              "and a drafter cost of 0 or more")
                if r.get("measured_there") is not None and not _speedup(r["measured_there"]):
                    raise bad(f"a row of {key}.{model} has measured_there {r['measured_there']!r:.40}: want none or a "
                              "speedup above 0")
        if key == "predictions":
            for model in models:
                ratio = (rec.get(model) or {}).get("ratio")
                if not isinstance(ratio, dict) or "1" not in ratio or not all(
                        isinstance(q, str) and q.isdigit() and _speedup(v) for q, v in ratio.items()):
                    raise bad(f"{model}.ratio {ratio!r:.40} is not this machine's cost curve "
                              "(t(q)/t(1) by q, with q = 1)")
    return rec


def forecast(row: dict, ratio: dict) -> float:
    """A preflight row's speedup forecast on the machine whose cost curve `ratio` ({q: t(q)/t(1)}) is given: the
    record's tokens per step over a step's cost in one-token forwards (`theory.predicted_speedup`)."""
    curve = {int(q): float(v) for q, v in ratio.items()}
    m = METHODS.get(row.get("method"))
    plain = bool(row["plain"]) if "plain" in row else (m is not None and m.schedule == "plain")
    q = min(row["k"] - 1 if plain else row["k"], max(curve))
    return theory.predicted_speedup(row["tokens_per_step"], curve, q, draft_cost=row.get("draft_t1", 0.0), plain=plain)


def read_class(folder=None) -> list[dict]:
    """The lab's own points (data/classroom), then the class's records in `folder` when one is given."""
    return read_records(SHIPPED) + (read_records(folder) if folder is not None else [])


def _llc_mib(m: dict) -> float | None:
    b = m.get("llc_bytes")
    return b / 2**20 if isinstance(b, (int, float)) and b > 0 else None


def points(records: list[dict]) -> list[dict]:
    """One row per (record, model, row): the machine's cores, threads and cache beside the speedup, `kind` raced
    (measured there) or predicted (a preflight's forecast from that machine's cost curve)."""
    out = []
    for rec in records:
        m = rec["machine"]
        base = {"source": rec["source"], "cpu": m["cpu"], "cores": m.get("cores"), "threads": m["threads"],
                "llc_mib": _llc_mib(m), "busy": bool(rec.get("busy"))}
        for key, kind in (("measured", "raced"), ("predictions", "predicted")):
            for model, rows in (rec.get(key) or {}).items():
                variant = (rec.get(model) or {}).get("model")  # which weights: the lab's models changed over time
                out += [{**base, "model": model, "variant": variant, "row": r["row"], "kind": kind,
                         "speedup": r["speedup"] if kind == "raced" else forecast(r, rec[model]["ratio"])}
                        for r in rows]
    return out


def select(pts: list[dict], row: str, model: str = "classroom") -> list[dict]:
    chosen = [p for p in pts if p["model"] == model and p["row"] == row]
    if not chosen:
        have = sorted({p["row"] for p in pts if p["model"] == model})
        raise MtplabError(f"no record holds the row {row!r} of {model}; choose among: {', '.join(have) or 'none'}")
    return chosen


def spread(pts: list[dict], row: str, model: str = "classroom") -> str:
    """The lowest and highest speedup of one row across the records, in words read off the numbers."""
    chosen = select(pts, row, model)
    lo, hi = min(chosen, key=lambda p: p["speedup"]), max(chosen, key=lambda p: p["speedup"])

    def where(p):
        return f"{p['cpu']}, {p['threads']} thread(s), {p['kind']} ({p['source']})"
    machines = len({p["source"] for p in chosen})
    text = (f"{row} ({model}) on {machines} record(s): from {lo['speedup']:.2f}x ({where(lo)}) to "
            f"{hi['speedup']:.2f}x ({where(hi)}), median {statistics.median(p['speedup'] for p in chosen):.2f}x")
    if lo["speedup"] < 1 < hi["speedup"]:
        text += "; slower than plain decoding on one machine and faster on another"
    elif hi["speedup"] / lo["speedup"] >= 1.1:
        text += f"; the fastest machine gains {hi['speedup'] / lo['speedup']:.2f}x what the slowest does"
    variants = sorted({p["variant"] for p in chosen if p["variant"]})
    if len(variants) > 1:
        text += f"; the records raced different weights ({'; '.join(variants)}), so part of the spread is the model's"
    busy = sum(p["busy"] for p in chosen)
    if busy:
        text += f" ({busy} record(s) say their machine was busy: their numbers mean little)"
    return text


def figure(pts: list[dict], row: str, model: str = "classroom"):
    """Speedup of one row against cores, last-level cache (MiB, log scale) and threads: raced filled, predicted
    hollow, a busy machine's point crossed; the line at 1 is plain decoding."""
    from matplotlib.figure import Figure
    chosen = select(pts, row, model)
    fig = Figure(figsize=(10.5, 3.4))
    fig.subplots_adjust(bottom=0.17, left=0.07, right=0.98, wspace=0.28, top=0.83)
    axes = fig.subplots(1, 3, sharey=True)
    no_cache = sum(p["llc_mib"] is None for p in chosen)
    for ax, key, label in zip(axes, ("cores", "llc_mib", "threads"),
                              ("cores", "last-level cache (MiB)", "threads the run used")):
        for p in chosen:
            x = p[key]
            if x is None:
                continue
            raced = p["kind"] == "raced"
            ax.scatter([x], [p["speedup"]], s=46, marker="x" if p["busy"] else "o",
                       facecolors="#0072B2" if raced else "none", edgecolors="#0072B2")
            ax.annotate(Path(p["source"]).stem, (x, p["speedup"]), xytext=(4, 2), textcoords="offset points", fontsize=6)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel(label + (f" ({no_cache} record(s) without one)" if key == "llc_mib" and no_cache else ""))
        if key == "llc_mib":
            ax.set_xscale("log")
        else:
            ax.set_xticks(sorted({p[key] for p in chosen if p[key] is not None}))
    axes[0].set_ylabel(f"speedup over AR, {row}")
    raced = sum(p["kind"] == "raced" for p in chosen)
    fig.suptitle(f"{model}, {row}: {len({p['source'] for p in chosen})} record(s); {raced} raced (filled), "
                 f"{len(chosen) - raced} predicted by preflight (hollow); dashed: plain decoding", fontsize=9)
    return fig


# ---------------------------------------------------------------------------------- the laptop assignment
ASSIGNMENT = """Predict your own laptop's speedup (graded from your preflight record):
1. Run `python -m mtplab preflight --out preflight/NAME.json` with nothing else open.
2. Pick one classroom row the record lists (its `predictions.classroom`: the rows to predict). From the record's
   own numbers (the row's tokens per step and method, your t(q)/t(1) in `classroom.ratio`, the drafter's cost)
   predict its speedup on your laptop by hand, and write down how you got it. Where the q you need is not among
   the record's (q = 1, 2 and 4, and 8 without --quick), interpolate linearly between the two nearest, as the grader does.
3. Race the same row (`python -m mtplab bench decode --quick`, or notebook 05's race) and explain the gap between
   your prediction and your race with the time split (target, drafter, rest)."""


def check_laptop_prediction(record: dict, row: str, predicted, measured=None, *, tolerance: float = 0.03):
    """Grade step 2 of ASSIGNMENT against the student's own preflight record: the prediction must match what the
    record's inputs give for that row (`forecast`, recomputed here: the record holds no forecast) within `tolerance`
    (relative). A record taken on a busy machine, or whose load
    was not measured, is said so; the record machine's number (measured_there) copied instead of this laptop's
    is caught. `measured` (step 3) is only checked for being a speedup; the gap's explanation is read by a person."""
    name = f"your laptop's speedup, {row}"
    rows = {r.get("row"): r for r in ((record.get("predictions") or {}).get("classroom") or [])}
    if row not in rows:
        return Check(name, False, f"the record predicts no classroom row {row!r}; choose among: "
                                  f"{', '.join(map(str, rows)) or 'none (rerun preflight)'}")
    if record.get("busy"):
        return Check(name, False, f"the record was taken on a busy machine ({record['busy']}): close other work, "
                                  "rerun preflight and predict from the new record")
    p = _number(predicted)
    if p is None or p <= 0:
        return Check(name, False, f"give your prediction as a positive number (got {predicted!r})")
    ratio = (record.get("classroom") or {}).get("ratio")
    if not isinstance(ratio, dict) or "1" not in ratio:
        return Check(name, False, "the record holds no cost curve (classroom.ratio): rerun preflight")
    want = forecast(rows[row], ratio)
    there = rows[row].get("measured_there")
    if abs(p - want) > tolerance * want:
        if there and abs(p - there) <= 1e-3 * there:
            return Check(name, False, "that is the speedup raced on the record's machine, not a prediction for "
                                      "your laptop: use your own t(q)/t(1)")
        return Check(name, False, f"{p:.2f}x is not what your own record's numbers give for {row}: recheck the "
                                  "verify width (k tokens, or k - 1 for the plain schedule) and the drafter's cost")
    note = "" if record.get("others_cores") is not None else " (the record's load was not measured: rough)"
    if measured is not None:
        m = _number(measured)
        if m is None or m <= 0:
            return Check(name, False, f"give your raced speedup as a positive number (got {measured!r})")
        note += f"; raced {m:.2f}x, {m / p:.2f} of the prediction: explain the gap with the time split"
    return Check(name, True, f"{p:.2f}x from your own laptop's numbers{note}")


def grade_class(folder, submissions: dict[str, dict]) -> list[dict]:
    """One row per submission {record file name: {"row", "predicted", "measured"}}, graded against that student's
    own record in `folder` (read_records), so a classmate's numbers do not pass on another laptop."""
    records = {r["source"]: r for r in read_records(folder)}
    out = []
    for source, sub in submissions.items():
        rec = records.get(source)
        if rec is None:
            out.append({"source": source, "ok": False, "why": f"no record {source} in {folder}"})
            continue
        c = check_laptop_prediction(rec, sub.get("row"), sub.get("predicted"), sub.get("measured"))
        out.append({"source": source, "ok": c.ok, "why": c.why})
    return out
