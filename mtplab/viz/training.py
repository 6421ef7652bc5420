"""Training, drawn: loss and bpb curves, accuracy by depth, the memory of the head-by-head backward, and the three
head families side by side. Each returns a Figure.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from mtplab.viz.kinds import COLORS
from mtplab.viz.style import _figure


def memory_curve(mem: dict[str, dict[int, float]], *, what: str = "peak memory of one training step (MiB)") -> Figure:
    """Peak memory against the number of heads K, one line per backward order."""
    fig, axes = _figure()
    ax = axes[0][0]
    for label, d in mem.items():
        ks = sorted(d)
        ax.plot(ks, [d[k] for k in ks], "o-", label=label)
    ax.set(xlabel="heads K", ylabel=what, title="Meta heads: backward head by head vs all at once")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    return fig


def depth_accuracy(acc: dict[str, list[float]], *, ylabel: str = "top-1 accuracy", title: str = "",
                   first_offset: int = 1) -> Figure:
    """Grouped bars by prediction offset: depth d predicts the token d positions ahead.

    acc[label][j] is the value at offset first_offset + j."""
    fig, axes = _figure(width=5.5)
    ax = axes[0][0]
    n = len(acc)
    w = 0.8 / max(1, n)
    K = max(len(v) for v in acc.values())
    for j, (label, vals) in enumerate(acc.items()):
        xs = [d + first_offset + (j - (n - 1) / 2) * w for d in range(len(vals))]
        b = ax.bar(xs, vals, width=w, label=label)
        ax.bar_label(b, labels=[f"{v:.2f}" for v in vals], fontsize=6)
    offsets = range(first_offset, first_offset + K)
    ax.set_xticks(list(offsets), [f"+{d}" for d in offsets])
    ax.set(xlabel="offset of the predicted token (depth)", ylabel=ylabel, title=title)
    ax.margins(y=0.15)
    ax.legend(fontsize=7)
    return fig


def training_curves(histories) -> Figure:
    """Training loss and per-depth validation bits per byte against step.

    histories: one history (a list of dicts from `train.fit` or a checkpoint's meta.history) or {label: history}.
    """
    if isinstance(histories, list):
        histories = {"run": histories}
    fig, axes = _figure(2, width=4.6)
    for j, (label, hist) in enumerate(histories.items()):
        steps = [r["step"] for r in hist]
        axes[0][0].plot(steps, [r["loss"] for r in hist], "o-", ms=3, color=f"C{j}", label=label)
        K = len(hist[-1].get("val_bpb_depth", [])) if hist else 0
        for d in range(K):
            axes[0][1].plot(steps, [r["val_bpb_depth"][d] for r in hist], ls=["-", "--", "-.", ":"][d % 4],
                            color=f"C{j}", label=f"{label}, depth {d + 1}")
    axes[0][0].set_title("training loss (the family's objective)")
    axes[0][1].set_title("validation bits per byte, by depth")
    for ax in axes[0]:
        ax.set_xlabel("step")
        ax.legend(fontsize=6)
    return fig


def training_lineage(phases: dict[str, list[dict]]) -> Figure:
    """A head set's whole training record, phase after phase (`teaching.blockwise.heads_history`), against tokens.

    Left: validation bits per byte at each depth, measured on the same fixed windows every time (depth 1 is the
    frozen trunk: flat within a phase). Right: the training loss, which the record keeps for one batch at each
    point, so it moves from batch to batch. A dotted line marks where a phase started from the previous one."""
    fig, axes = _figure(2, width=4.6)
    left, right = axes[0]
    offset, styles = 0, ["-", "--", "-.", ":"]
    for j, (label, hist) in enumerate(phases.items()):
        if not hist:
            continue
        xs = [(offset + r["tokens"]) / 1e6 for r in hist]
        if offset:
            for ax in (left, right):
                ax.axvline(offset / 1e6, color="0.5", ls=":", lw=1)
        for d in range(len(hist[-1]["val_bpb_depth"])):
            left.plot(xs, [r["val_bpb_depth"][d] for r in hist], styles[d % 4], marker="o", ms=3, color=f"C{d}",
                      label=f"depth {d + 1}" if j == len(phases) - 1 else None)
        right.plot(xs, [r["loss"] for r in hist], "o-", ms=3, lw=0.8, color=f"C{j}", label=label)
        left.annotate(label, (xs[0], 1.0), xycoords=("data", "axes fraction"), xytext=(2, -10),
                      textcoords="offset points", fontsize=6, color="0.3")
        offset += hist[-1]["tokens"]
    left.set_title("validation bits per byte, same windows each time", fontsize=9)
    right.set_title("training loss of the one batch at each point", fontsize=9)
    for ax in (left, right):
        ax.set_xlabel("tokens seen (millions), all phases")
        ax.legend(fontsize=6)
    return fig


# family -> boxes from the trunk up: (label, kind); kind "trunk", "head" or "shared"
_DIAGRAMS = {
    "stern": [("trunk, all L layers -> h", "trunk"), ("shared FFN h -> 4h (ReLU)", "head"),
              ("per depth: FFN 4h -> h,\nplus h (residual), x(K-1)", "head"),
              ("shared final norm +\nvocabulary projection", "shared"), ("depths 2..K, in parallel", None)],
    "meta": [("trunk, layers 1..L-1 -> z", "trunk"),
             ("per depth: one transformer\nlayer on z, x(K-1)\n(depth 1 = layer L)", "head"),
             ("shared final norm +\nvocabulary projection", "shared"), ("depths 2..K, in parallel", None)],
    "deepseek": [("trunk, all L layers -> h^0", "trunk"),
                 ("module k: [norm(h^(k-1)); norm(Emb(t_(i+k)))]\n-> M_k (2d -> d) -> block", "head"),
                 ("shared final norm +\nvocabulary projection", "shared"),
                 ("depth k+1; h^k feeds module k+1:\nD modules in sequence", None)],
}
_BOX = {"trunk": "#dddddd", "head": COLORS["predict"], "shared": "#f5e6b3"}


def _diagram(ax, family: str) -> None:
    from matplotlib.patches import FancyBboxPatch

    boxes = _DIAGRAMS[family]
    ys = [0.08 + i * 0.84 / (len(boxes) - 1) for i in range(len(boxes))]
    for (label, kind), y in zip(boxes, ys):
        if kind is not None:
            ax.add_patch(FancyBboxPatch((0.08, y - 0.065), 0.84, 0.13, boxstyle="round,pad=0.01",
                                        fc=_BOX[kind], ec="#555555"))
        ax.text(0.5, y, label, ha="center", va="center", fontsize=7.5)
    for y0, y1 in zip(ys, ys[1:]):
        ax.annotate("", (0.5, y1 - 0.07), (0.5, y0 + 0.07), arrowprops=dict(arrowstyle="->", color="#333333"))
    if family == "deepseek":  # the embedding of the next true (or committed) token enters each module
        ax.annotate("Emb(t_(i+k))\n(shared)", (0.92, ys[1]), (1.0, ys[0] + 0.02), fontsize=6.5, ha="center",
                    arrowprops=dict(arrowstyle="->", color="#333333"))
    ax.set(xlim=(0, 1.05), ylim=(0, 1))
    ax.axis("off")


def head_families(rows: list[dict]) -> Figure:
    """The three head families side by side as block diagrams. Each panel's title gives the heads' parameters
    as a fraction of the trunk and the drafter's ms per step against the target's, all read from `rows`
    (`lesson_data.head_families`: family, checkpoint, method, head_params, trunk_params, step_ms_drafter,
    step_ms_target, source); the caption names the source of the timings."""
    fig = Figure(figsize=(4 * len(rows), 4.6))
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.1, top=0.8, wspace=0.08)
    axes = fig.subplots(1, len(rows), squeeze=False)[0]
    titles = {"stern": "Stern et al. 2018", "meta": "Gloeckle et al. 2024 (Meta)", "deepseek": "DeepSeek-V3 MTP"}
    for ax, r in zip(axes, rows):
        _diagram(ax, r["family"])
        params = r["head_params"] / r["trunk_params"]
        cost = r["step_ms_drafter"] / r["step_ms_target"]
        ax.set_title(f"{titles.get(r['family'], r['family'])}: {r['checkpoint']}\n"
                     f"heads {r['head_params'] / 1e6:.2f}M params = {params:.0%} of the trunk's "
                     f"{r['trunk_params'] / 1e6:.2f}M\n"
                     f"drafter {r['step_ms_drafter']:.2f} ms per step = {cost:.0%} of the target's "
                     f"{r['step_ms_target']:.2f} ms", fontsize=8)
    sources = sorted({r["source"] for r in rows})
    fig.text(0.5, 0.02, "Parameters: the shipped checkpoints (model.mtp against the rest). ms per step: "
             + ", ".join(sources) + " (methods " + ", ".join(f"{r['method']!r}" for r in rows) + ").",
             ha="center", fontsize=7.5)
    return fig
