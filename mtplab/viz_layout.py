"""DeepSeek-V3 eq. (24)'s label layout: which tokens each depth reads and is scored against, as text and as a
table Figure (notebook 04)."""
from __future__ import annotations

from matplotlib.figure import Figure


def _layout_cells(T: int, D: int):
    from .lab import label_layout

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


# ---------------------------------------------------------------------------------- sampling
