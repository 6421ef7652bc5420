"""What a decode of a real model runs with when its flags are left out: the k and the confidence stop of the fastest
exact row of `bench real`'s record for the heads that are loaded (`choose_k`).

    c = choose_k("smollm2", "deepseek-reuse", heads=path, draft_vocab="reduced", limit=8)
    c.k, c.stop, c.source, c.why    # 4, 0.3, 'record', 'k=4, confidence stop 0.3, the highest median of ...'

The record names the heads file each row decoded with by its sha256, so a default is taken only from rows of the
very heads that are loaded; without such a row the choice says so and falls back to `FALLBACK_K` drafts every step.
A confidence stop (`decoding.adaptive.ConfidenceStop`) changes how many drafts a step verifies, never the output.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from mtplab import paths
from mtplab.errors import MtplabError
from mtplab.files import sha256
from mtplab.measuring.record import Record, speedup_text

REAL_JSON, RERUN = paths.REAL_JSON, paths.REAL_RERUN  # `bench real`'s record, and what rewrites it
FALLBACK_K = 4  # no matching row: the most the heads support, at most this (`decode_with` alone takes the most)


@dataclass(frozen=True)
class KChoice:
    """The k a decode runs with, its confidence stop (None: k-1 drafts every step), and where they came from: 'given'
    (--k), 'record' (the exact row of these heads with the highest median in `bench real`'s record; `why` gives every
    compared row's median and range and makes no ranking of its own: `teaching.real.k_words` says whether the ranges
    rank them) or 'default' (no such row: `FALLBACK_K`, or fewer where the heads allow fewer)."""
    k: int
    source: str
    why: str
    rows: tuple = field(default=(), compare=False)  # 'record': the rows compared, at one thread count, the chosen
    # one first (record rows are dicts: left out of == and hash(), which the other fields decide)
    stop: float | None = None


def heads_sha256(path) -> str | None:
    """The sha256 of a heads file: what a `bench real` row names the heads it decoded with by."""
    return sha256(Path(path)) if path is not None else None


def record_rows(rec: Record, name: str, method: str, *, heads_sha: str | None, draft_vocab: str, kernel: str,
                dtype: str = "fp32") -> list[dict]:
    """The record's chain rows of this method (with or without a confidence stop) that decoded exactly (every prompt
    equal to AR) with these heads (by sha256; none for a method without heads), this draft vocabulary, kernel and
    dtype."""
    if rec.get("model") != name:
        return []
    return [r for r in rec.rows if r.get("method") == method and r.get("heads_sha256") == heads_sha and not r.get("widths")
            and r.get("draft_vocab", "full") == draft_vocab and (r.get("kernel") or rec.kernel()) == kernel
            and r.get("dtype", "fp32") == dtype and isinstance(r.get("k"), int) and r.get("valid", True)
            and r.get("identical_to_ar") == r.get("prompts")]


# said under a table of record rows with a confidence stop (`bench real`'s, the README's): their acceptance column
STOP_NOTE = ("A row with a confidence stop counts its first drafts over the steps that drafted: a step whose first "
             "draft fell under the threshold drafted nothing and is not counted, so its rate is not comparable with "
             "the rows that draft k-1 every step.")


def row_stop(row: dict) -> float | None:
    """A record row's confidence stop: its threshold where it adapted by confidence (`adapt`, as bench k names the
    policies), else None (k-1 drafts every step)."""
    return row.get("threshold") if row.get("adapt") == "confidence" else None


def setting(k: int, stop: float | None) -> str:
    """'k=4, confidence stop 0.3' (or 'k=4'): a decode's setting in the words of the row labels."""
    return f"k={k}" + (f", confidence stop {stop:g}" if stop is not None else "")


def choose_k(name: str, method: str, *, k: int | None = None, heads=None, draft_vocab: str = "full",
             kernel: str = "exact", limit: int | None = None, dtype: str = "fp32", threads: int | None = None,
             record=None, stop: float | None = None, fixed: bool = False) -> KChoice:
    """The k and confidence stop of a decode of `method` on the real model `name`: k (and `stop`) when given; else
    those of the record's exact row with the highest median of these heads (`heads`: the heads file, by its sha256)
    on this kernel, draft vocabulary and dtype, at `threads` (default: torch's now) when the record has such rows,
    else at any thread count; else `FALLBACK_K` with no stop, capped at `limit` (the most the heads support). `fixed`:
    only rows of k-1 drafts every step (a caller that cannot stop drafts early, as the widget's step view).
    `record`: default `REAL_JSON`. `why` says which, in one line: the only row, or the highest median of several
    with every one's median and range (at the chosen row's thread count), never 'fastest', which their ranges may
    not carry."""
    if k is not None:
        return KChoice(k, "given", f"{setting(k, stop)}, given", stop=stop)
    record = REAL_JSON if record is None else record
    fallback = min(FALLBACK_K, limit) if limit else FALLBACK_K
    threads = threads or torch.get_num_threads()
    sha = heads_sha256(heads) if heads is not None else None
    where = Path(record).name
    try:
        rows = record_rows(Record.load(record), name, method, heads_sha=sha, draft_vocab=draft_vocab, kernel=kernel,
                           dtype=dtype) if Path(record).is_file() else []
    except MtplabError:
        rows = []
    rows = [r for r in rows if (limit is None or r["k"] <= limit) and (stop is None or row_stop(r) == stop)
            and not (fixed and row_stop(r) is not None)]
    here = [r for r in rows if r.get("threads") == threads] or rows
    only = (f", confidence stop {stop:g}" if stop is not None else "") + (", k-1 drafts every step" if fixed else "")
    if not here:
        of = f" with these heads (sha256 {sha[:12]})" if sha else ""
        return KChoice(fallback, "default", f"{setting(fallback, stop)}, the default (the most the heads support, at "
                       f"most {FALLBACK_K}): {where} has no exact row of {method}{of}, {draft_vocab} vocabulary, "
                       f"{kernel} kernel{only}; {RERUN} measures them", stop=stop)
    best = max(here, key=lambda r: r["speedup"])
    same = [best] + sorted((r for r in here if r is not best and r.get("threads") == best.get("threads")),
                           key=lambda r: -r["speedup"])  # like with like: one thread count
    of = (f"exact row{'s' if len(same) > 1 else ''} of {method}{only} in {where}" + (" with these heads" if sha else "")
          + f" at {best['threads']} thread{'s' if best['threads'] != 1 else ''}")
    what = setting(best["k"], row_stop(best))
    if len(same) == 1:
        why = f"{what}, the only {of} ({best['label']}: {speedup_text(best)}), so the record compares no other k"
        if limit == best["k"]:
            why += f"; {method} drafts at most k={limit} with these heads"
    else:  # the highest median, every compared row with its range: 'fastest' is the teaching layer's verdict to make
        why = (f"{what}, the highest median of the {len(same)} {of} ("
               + "; ".join(f"{r['label']}: {speedup_text(r)}" for r in same) + ")")
    return KChoice(best["k"], "record", why, tuple(same), row_stop(best))
