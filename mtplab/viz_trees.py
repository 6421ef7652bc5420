"""Pictures for batches and token trees (notebook 07). Every function returns a matplotlib Figure.

B batch size. Rows come from `mtplab.bench_batch.measure_batch`; a tree step from `mtplab.trees.iter_tree_steps`.
"""
from __future__ import annotations

from matplotlib.figure import Figure

from .tokenizer import token_repr
from .trees import TreeStep
from .viz import AR_COLOR, OVERLAP_COLOR, _figure


def batch_tradeoff(rows_by_method: dict[str, list[dict]]) -> Figure:
    """Three panels against batch size B: throughput (tokens/s), per-token latency against throughput (the
    curve a server moves along), and speculation's speedup over AR at the same B (below 1: it stops paying).

    rows_by_method[name]: rows of `measure_batch` (kind 'ar' or 'spec', batch_size, tokens_per_s, ...)."""
    fig, axes = _figure(3, 1, width=4.4, height=3.4)
    a_tp, a_lat, a_sp = axes[0]
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for (name, rows), color in zip(rows_by_method.items(), colors):
        for kind, style, label in (("ar", ":", f"AR ({name} model)"), ("spec", "-", name)):
            rs = sorted((r for r in rows if r["kind"] == kind), key=lambda r: r["batch_size"])
            B = [r["batch_size"] for r in rs]
            tp = [r["tokens_per_s"] for r in rs]
            lat = [r["latency_ms_per_token"] for r in rs]
            c = AR_COLOR if kind == "ar" and len(rows_by_method) == 1 else color
            a_tp.plot(B, tp, style, marker="o", color=c, label=label)
            a_lat.plot(tp, lat, style, marker="o", color=c, label=label)
            for b, x, y in zip(B, tp, lat):
                a_lat.annotate(f"B={b}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        sp = sorted((r for r in rows if r["kind"] == "spec"), key=lambda r: r["batch_size"])
        a_sp.plot([r["batch_size"] for r in sp], [r["speedup_vs_ar"] for r in sp], "-o", color=color, label=name)
    for ax in (a_tp, a_sp):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size B")
    a_tp.set_ylabel("committed tokens / s (all rows)")
    a_tp.set_title("throughput")
    a_lat.set_xlabel("committed tokens / s (all rows)")
    a_lat.set_ylabel("ms per token, one row")
    a_lat.set_title("latency against throughput")
    a_sp.axhline(1.0, color=AR_COLOR, lw=1, ls="--")
    a_sp.set_ylabel("speculative / AR throughput")
    a_sp.set_title("where speculation stops paying")
    for ax in axes[0]:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return fig


def tree_step(ts: TreeStep, *, root_token: int | None = None, label=token_repr) -> Figure:
    """One verified token tree: depth left to right, the accepted path in green, pruned nodes in grey,
    and the target's bonus token (dashed) after the path."""
    tree = ts.tree
    fig, axes = _figure(1, 1, width=6.5, height=max(2.6, 0.32 * max(1, len(tree)) + 1.2))
    ax = axes[0][0]
    on_path = {r - 1 for r in ts.path[1:]}
    # y: leaves in order, a parent at the mean of its children
    y: dict[int, float] = {}
    leaves = [i for i in range(len(tree)) if not tree.children(i)]
    for j, i in enumerate(leaves):
        y[i] = -float(j)
    for i in sorted(range(len(tree)), key=lambda i: -tree.depth[i]):
        if i not in y:
            kids = tree.children(i)
            y[i] = sum(y[c] for c in kids) / len(kids)
    y_root = sum(y[c] for c in tree.children(-1)) / max(1, len(tree.children(-1)))
    pos = {-1: (0.0, y_root)}
    pos.update({i: (float(tree.depth[i]), y[i]) for i in range(len(tree))})
    for i in range(len(tree)):
        (x0, y0), (x1, y1) = pos[tree.parent[i]], pos[i]
        good = i in on_path and (tree.parent[i] == -1 or tree.parent[i] in on_path)
        ax.plot([x0, x1], [y0, y1], color="tab:green" if good else "0.8", lw=2.2 if good else 1, zorder=1)
    ax.scatter(*pos[-1], s=420, color="tab:blue", zorder=2)
    ax.annotate(label(root_token) if root_token is not None else "last", pos[-1], ha="center", va="center",
                color="white", fontsize=9, zorder=3)
    for i in range(len(tree)):
        ax.scatter(*pos[i], s=420, color="tab:green" if i in on_path else "0.85", zorder=2)
        ax.annotate(label(tree.tokens[i]), pos[i], ha="center", va="center", fontsize=9, zorder=3)
    end = pos[ts.path[-1] - 1] if len(ts.path) > 1 else pos[-1]
    bx = end[0] + 1
    ax.plot([end[0], bx], [end[1], end[1]], ls="--", color=OVERLAP_COLOR, zorder=1)
    ax.scatter(bx, end[1], s=420, facecolor="white", edgecolor=OVERLAP_COLOR, ls="--", zorder=2)
    ax.annotate(label(ts.step.bonus), (bx, end[1]), ha="center", va="center", fontsize=9, zorder=3)
    last = int(max([bx] + [float(d) for d in tree.depth]))
    ax.set_xticks(range(0, last + 1))
    ax.set_xticklabels(["last\ncommitted"] + [f"+{d}" for d in range(1, last + 1)])
    ax.set_xlabel("tokens after the last committed one (dashed: the target's bonus token)")
    ax.set_yticks([])
    ax.set_title(f"{len(tree)} nodes in one forward: {len(ts.path) - 1} accepted (green) + bonus "
                 f"({ts.step.bonus_source}); grey = pruned", fontsize=9)
    for s in ("top", "right", "left"):
        ax.spines[s].set_visible(False)
    return fig
