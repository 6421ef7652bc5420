"""Text tables: a decode's steps in the glossary's words, markdown tables, the acceptance conventions side by side,
and DeepSeek-V3 eq. (24)'s label layout (which tokens each depth reads and is scored against) as text and as a
table figure.
"""
from __future__ import annotations

from mtplab.tokenizer import token_repr
import math
from matplotlib.figure import Figure
from mtplab.viz.kinds import STRUCK
from mtplab.viz.kinds import step_record
from mtplab.measuring.acceptance import Acceptance
from mtplab.training.losses import label_layout


def table(acc: Acceptance) -> str:
    """A small text table: one row per draft position, then the two mean lengths."""
    rows = ["draft  depth  unconditional  conditional"]
    for j, (a, c) in enumerate(zip(acc.unconditional, acc.conditional)):
        cs = "   -" if math.isnan(c) else f"{c:.3f}"
        rows.append(f"{j:>5}  {j + 2:>5}  {a:>13.3f}  {cs:>11}")
    rows.append(f"mean accepted drafts (no bonus): {acc.mean_accepted:.3f}")
    rows.append(f"mean accepted length (with bonus): {acc.mean_accepted_length:.3f}")
    rows.append(f"accepted / drafted tokens: {acc.draft_acceptance_rate:.3f}")
    return "\n".join(rows)


def markdown_table(rows: list[dict], cols: list[str], number=None) -> str:
    """The one markdown table of the lab (notebooks and benchmark records): a row per dict, a column per key;
    lists are joined by spaces. `number` formats floats (default: 2 decimals)."""
    def fmt(v):
        if isinstance(v, float):
            return number(v) if number is not None else f"{v:.2f}"
        if isinstance(v, list):
            return " ".join(fmt(x) for x in v)
        return str(v)
    head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    return head + "".join("| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |\n" for r in rows)


def _layout_cells(T: int, D: int):

    header = ["position i"] + [str(i) for i in range(1, T + 1)]
    rows = []
    for row in label_layout(T, D):
        if row["k"] == 0:
            rows.append(("main: reads", {i: f"t{j}" for i, j in row["reads"].items()}))
        else:
            rows.append((f"module {row['k']}: reads h^{row['k'] - 1}",
                         {i: f"h{i}" for i in row["reads"]}))
            rows.append((f"module {row['k']}: reads Emb", {i: f"t{j}" for i, j in row["reads"].items()}))
        rows.append((f"{'main' if row['k'] == 0 else 'module ' + str(row['k'])}: label",
                     {i: f"t{j}" for i, j in row["labels"].items()}))
    body = [[name] + [cells.get(i, "") for i in range(1, T + 1)] for name, cells in rows]
    return header, body


def label_layout_text(T: int = 10, D: int = 2) -> str:
    """DeepSeek-V3's training layout (sequence t1..t{T+1}) as a fixed-width text table."""
    header, body = _layout_cells(T, D)
    w0 = max(len(r[0]) for r in [header] + body)
    w = max(4, max(len(c) for r in [header] + body for c in r[1:]))
    fmt = lambda r: f"{r[0]:<{w0}} | " + " ".join(f"{c:>{w}}" for c in r[1:])  # noqa: E731
    lines = [fmt(header), "-" * len(fmt(header))]
    lines += [fmt(r) for r in body]
    return "\n".join(line.rstrip() for line in lines)


def label_layout_table(T: int = 10, D: int = 2) -> Figure:
    """The same layout as a table figure; label rows are shaded."""
    header, body = _layout_cells(T, D)
    fig = Figure(figsize=(1.8 + 0.5 * T, 0.3 * (len(body) + 1) + 0.5), layout="constrained")
    ax = fig.subplots()
    ax.axis("off")
    first = 1.8 / (1.8 + 0.5 * T)
    table = ax.table(cellText=body, colLabels=header, cellLoc="center", bbox=[0, 0, 1, 1],
                     colWidths=[first] + [(1 - first) / T] * T)
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    for (r, _), cell in table.get_celld().items():
        if r == 0:
            cell.set_facecolor("0.85")
        elif body[r - 1][0].endswith("label"):
            cell.set_facecolor("#fde7c8")
    ax.set_title(f"DeepSeek-V3 MTP training layout, T = {T}, D = {D}", fontsize=9)
    return fig


def steps_table(trace, limit: int | None = None) -> str:
    """A Trace's steps as a text table in the glossary's words; step numbers match `trace.steps` (0 = prefill)."""
    def toks(views):
        return " ".join(("~" + t.label) if t.kind in STRUCK else t.label for t in views) or "-"

    lines = [f"{trace.method} (k={trace.k}, schedule={trace.schedule}): {len(trace.tokens)} tokens in "
             f"{trace.forwards} target forwards   (~ marks rejected and discarded drafts)",
             f"{'step':>4} {'fwd':>3}  {'predict':<7}  {'drafts':<22} {'accepted':>8}  {'bonus':<20} committed"]
    for i, s in enumerate(trace.steps if limit is None else trace.steps[:limit]):
        r = step_record(i, s)
        drafts = [t for t in r.tokens if t.kind in ("accepted", *STRUCK)]
        pred = next((t.label for t in r.tokens if t.kind == "predict"), "-")
        bonus = next((f"{t.label} ({t.kind.split('-')[1]})" for t in r.tokens if t.kind.startswith("bonus")), "-")
        if i == 0:
            bonus = "prefill: " + " ".join(token_repr(t) for t in s.emitted)
        lines.append(f"{i:>4} {s.forwards:>3}  {pred:<7}  {toks(drafts):<22} {s.accepted:>8}  {bonus:<20} "
                     f"{' '.join(token_repr(t) for t in s.emitted)}")
    if limit is not None and len(trace.steps) > limit:
        lines.append(f"... {len(trace.steps) - limit} more steps")
    return "\n".join(lines)
