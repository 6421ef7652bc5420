"""The one reader of benchmark records: docs/bench/NAME.json, each written by a `python -m mtplab bench ...` command.

    rec = Record.load("decode")                             # or a path; missing: one line naming the command
    rec.row(method="deepseek", checkpoint="deepseek-d3")    # the row of that pair, or None
    rec.machine_text()                                      # 'measured on <cpu>, 1 of 2 cores, ...'

A record is read bounded in size (`files.read_json`), and every failure is one line that names the file and
the command that writes it again. Rows are found by what they measured (method, checkpoint, k, or any other field),
never by parsing a label: every row carries method, checkpoint, k, draft_vocab, dtype and threads (`flat`; the
records written before those fields were rewritten once by scripts/flat_records.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mtplab import paths
from mtplab.device import machine_words
from mtplab.errors import MtplabError
from mtplab.files import read_json

LIMIT = 16 << 20  # bytes: the largest record the lab writes is well under 1 MB
BENCHES = ("cost-curve", "crossover", "decode", "domain", "train", "batch", "regime", "peers", "tree", "real", "k")


def command(name: str) -> str | None:
    """The command that writes docs/bench/NAME.json ('python -m mtplab bench decode --quick --dtype bf16'), read
    from the name the bench gave it; None for a record no bench command writes."""
    what = next((b for b in BENCHES if name == b or name.startswith(b + "-")), None)
    if what is None:
        return None
    rest = name[len(what) + 1:].split("-") if name != what else []
    opts = []
    if what == "cost-curve" and rest:
        opts.append(f"--preset {rest[0]}")
    if "quick" in rest:
        opts.append("--quick")
    if "bf16" in rest:
        opts.append("--dtype bf16")
    threads = [r[:-len("threads")] for r in rest if r.endswith("threads")]
    tail = f" (with {threads[0]} torch threads, OMP_NUM_THREADS={threads[0]})" if threads else ""
    if what == "peers":
        opts.append("--hf PATH")
    return " ".join(["python -m mtplab bench", what, *opts]) + tail


def machine_text(m, *, device=None, threads=None) -> str:
    """The line naming the machine a record was measured on, in the words `device.machine_line` uses live.
    `m`: the record's machine dict (or an older record's string); without one, its device and threads."""
    if isinstance(m, dict) and m.get("cpu"):
        return machine_words(m, device)
    if isinstance(m, str) and m:
        return f"measured on {m}"
    n = threads if threads is not None else "?"
    return f"measured on {device or 'an unknown device'}, {n} thread{'' if n == 1 else 's'} (machine not recorded)"


# ------------------------------------------------------------------------------------ flat rows
FIELDS = ("method", "checkpoint", "k", "draft_vocab", "dtype", "threads")  # every row of every record carries these


def row_tables(data: dict) -> list[str]:
    """The keys of a record that hold rows (a list of dicts): 'rows'; regime: 'by_size', 'by_depth'."""
    return [k for k, v in data.items() if isinstance(v, list) and v and all(isinstance(r, dict) for r in v)]


def flat(data: dict) -> dict:
    """The record with every row carrying FIELDS, so that `Record.row(method=..., checkpoint=..., k=...,
    draft_vocab=..., dtype=..., threads=...)` finds it by fields alone: what a row does not say is what the whole
    record measured (its `dtype`, else fp32; its `threads`, else the machine's; the full vocabulary; no method,
    checkpoint or k where the row measured none, as a random-weights model's). `bench.report` writes every record
    through it."""
    m = data.get("machine")
    threads = data.get("threads") if isinstance(data.get("threads"), int) else (
        m.get("threads") if isinstance(m, dict) else None)
    fill = {"method": None, "checkpoint": None, "k": data.get("k") if isinstance(data.get("k"), int) else None,
            "draft_vocab": "full", "dtype": data.get("dtype", "fp32"), "threads": threads}
    out = dict(data)
    for key in row_tables(data):
        out[key] = [{**r, **{f: v for f, v in fill.items() if f not in r}} for r in data[key]]
    return out


# ------------------------------------------------------------------------------------ the reader
@dataclass
class Record:
    name: str      # NAME of docs/bench/NAME.json (the file's stem)
    path: Path
    data: dict     # the record as written

    @classmethod
    def load(cls, name_or_path="decode") -> "Record":
        """docs/bench/NAME.json by name, or any record by path."""
        s = str(name_or_path)
        path = Path(s) if s.endswith(".json") or "/" in s else paths.BENCH_DIR / f"{s}.json"
        cmd = command(path.stem)
        fix = f"`{cmd}` writes it" if cmd else "restore it from git"
        if not path.exists():
            raise MtplabError(f"{path} is missing; {fix}")
        data = read_json(path, limit=LIMIT, what="a benchmark record", fix=fix)
        if not isinstance(data, dict):
            raise MtplabError(f"{path} is not a benchmark record (no JSON object); {fix}")
        return cls(path.stem, path, data)

    def __getitem__(self, key):
        return self.data[key]

    def get(self, key, default=None):
        return self.data.get(key, default)

    def table(self, key: str = "rows") -> list[dict]:
        """The record's rows under `key` ('rows'; regime: 'by_size', 'by_depth'), each with label, method and
        checkpoint where it measured a shipped pair."""
        rows = self.data.get(key)
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            cmd = command(self.name)
            raise MtplabError(f"{self.path} has no {key!r} list of rows; "
                              + (f"run `{cmd}` again" if cmd else "restore it from git"))
        return rows

    @property
    def rows(self) -> list[dict]:
        return self.table("rows")

    def row(self, key: str = "rows", **match) -> dict | None:
        """The first row whose fields equal `match` (method=..., checkpoint=..., k=..., label=..., batch_size=...),
        or None when the record has none."""
        return next((r for r in self.table(key) if all(r.get(f) == v for f, v in match.items())), None)

    def source_line(self) -> str:
        """'docs/bench/decode.json: 6 prompts, m = 64, median of 3 interleaved repeats, fp32, measured on ...': the
        record named beside a figure read from it."""
        return (f"docs/bench/{self.path.name}: {self.get('prompts')} prompts, m = {self.get('max_new_tokens')}, "
                f"median of {self.get('repeats')} interleaved repeats, {self.get('dtype')}, {self.machine_text()}")

    def machine_text(self) -> str:
        return machine_text(self.data.get("machine"), device=self.data.get("device"),
                            threads=self.data.get("threads"))

    def kernel(self) -> str:
        """The kernel the record's linears ran through, 'exact' or 'stock' (`mtplab.model.kernels`): its `kernel`
        field, else the one its rows all name, else 'exact' for a record whose cost curves raced 'stock kernels' beside
        the default ones (bench real since the exact kernel), else 'stock': such records predate the exact kernel."""
        named = {r.get("kernel") for r in self.data.get("rows") or [] if isinstance(r, dict)}
        if self.data.get("kernel") or (len(named) == 1 and None not in named):
            return str(self.data.get("kernel") or named.pop())
        curves = self.data.get("cost_curves")
        both = isinstance(curves, dict) and any("stock kernels" in str(name) for per in curves.values()
                                                if isinstance(per, dict) for name in per)
        return "exact" if both else "stock"

    def device(self) -> str:
        """The device the record was measured on ('cpu', 'cuda (NVIDIA H200)'), '' when it does not say."""
        m = self.data.get("machine")
        return str((m.get("device") if isinstance(m, dict) else None) or self.data.get("device") or "")


def speedup_span(row: dict) -> tuple[float, float]:
    """A record row's speedup range over its rounds; a row measured once (no speedup_min/max) is its own range."""
    return row.get("speedup_min", row["speedup"]), row.get("speedup_max", row["speedup"])


def speedup_text(row: dict) -> str:
    """'1.22x AR, range 1.15-1.40': a record row's speedup, with its range where the rounds gave one."""
    lo, hi = speedup_span(row)
    return f"{row['speedup']:.2f}x AR" + (f", range {lo:.2f}-{hi:.2f}" if (lo, hi) != (row["speedup"],) * 2 else "")
