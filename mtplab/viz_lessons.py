"""Figures the lessons need beyond `mtplab.viz`: where a step's time goes, and p-values over many seeds.
Every function returns a matplotlib `Figure` (no pyplot)."""
from __future__ import annotations

from matplotlib.figure import Figure

from .viz_tokens import COLORS, TEXT_COLORS

PARTS = (("target_ms", "target verify (and predict)", COLORS["accepted"]),
         ("draft_ms", "drafter", COLORS["bonus-correction"]),
         ("overhead_ms", "overhead (accept rule, cache, Python)", COLORS["discarded"]))


def time_split(rows: list[dict], *, title: str = "") -> Figure:
    """Left: ms per step, stacked: target, drafter, overhead, per method, with AR's ms per token as a line
    of reference. Right: predicted against measured speedup over AR (rows from `speedup.speedup_row`)."""
    fig = Figure(figsize=(10, 3.4))
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.3, top=0.84, wspace=0.3)
    ax1, ax2 = fig.subplots(1, 2)
    names = [r["method"] for r in rows]
    x = range(len(rows))
    bottom = [0.0] * len(rows)
    for key, label, color in PARTS:
        vals = [r[key] for r in rows]
        ax1.bar(x, vals, bottom=bottom, color=color, label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]
    if rows:
        ax1.axhline(rows[0]["ar_step_ms"], color="black", ls="--", lw=1, label="AR: one step = one token")
    ax1.set_xticks(list(x), names, rotation=20, ha="right", fontsize=8)
    ax1.set(ylabel="ms per step", title="one step's measured time", ylim=(0, 1.7 * max(bottom + [1e-3])))
    ax1.legend(fontsize=7, loc="upper left")
    w = 0.38
    ax2.bar([i - w / 2 for i in x], [r["predicted"] for r in rows], width=w, color=COLORS["predict"],
            label="predicted: cost curve + measured drafter")
    ax2.bar([i + w / 2 for i in x], [r["measured"] for r in rows], width=w, color=COLORS["accepted"],
            label="measured")
    for i, r in enumerate(rows):
        ax2.text(i + w / 2, r["measured"], f"{r['measured']:.2f}x", ha="center", va="bottom", fontsize=7)
    ax2.axhline(1.0, color="black", ls="--", lw=1)
    top = max([r["predicted"] for r in rows] + [r["measured"] for r in rows] + [1.0])
    ax2.set_ylim(0, 1.6 * top)
    ax2.set_xticks(list(x), names, rotation=20, ha="right", fontsize=8)
    ax2.set(ylabel="speedup over AR", title="prediction beside measurement")
    ax2.legend(fontsize=7, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def pvalue_histogram(pvalues: dict[str, list[float]], *, bins: int = 10) -> Figure:
    """Histogram of p-values over many seeds, one panel per rule: a correct rule gives a flat histogram
    (p is uniform under the null hypothesis), a wrong one piles up near 0."""
    fig = Figure(figsize=(3.2 * max(1, len(pvalues)), 2.8))
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.2, top=0.8, wspace=0.3)
    axes = fig.subplots(1, max(1, len(pvalues)), squeeze=False)[0]
    for ax, (label, ps) in zip(axes, pvalues.items()):
        ax.hist(ps, bins=bins, range=(0, 1), color=COLORS["accepted"], edgecolor="white")
        ax.axhline(len(ps) / bins, color="black", ls="--", lw=1, label="uniform")
        small = sum(p < 0.05 for p in ps)
        ax.set(title=f"{label}\n{small}/{len(ps)} seeds with p < 0.05", xlabel="p-value", xlim=(0, 1))
        ax.title.set_fontsize(9)
    axes[0].set_ylabel("seeds")
    return fig


def robust_ylim(fig: Figure, *, quantile: float = 0.98, margin: float = 1.4) -> Figure:
    """Set every axes' y-range from the `quantile` of its plotted line data, so that one noise spike (a
    context switch on a shared CPU) cannot set the scale; says in the title how many points lie above."""
    for ax in fig.axes:
        ys = sorted(y for line in ax.get_lines() for y in line.get_ydata() if y == y)
        if not ys:
            continue
        top = margin * ys[min(len(ys) - 1, int(quantile * len(ys)))]
        above = sum(y > top for y in ys)
        ax.set_ylim(0, top)
        if above:
            ax.set_title(f"{ax.get_title()}\n({above} of {len(ys)} points above the axis: timing noise)", fontsize=9)
    return fig


def step_kinds(trace) -> Figure:
    """Every step of a Trace as a stacked bar of its tokens by kind, in the shared token colours; step numbers
    match `trace.steps` and the step table (0 = the prefill, which commits one token)."""
    from .viz_tokens import KINDS, LEGEND
    from .widget_state import step_record

    recs = [step_record(i, s) for i, s in enumerate(trace.steps)]
    fig = Figure(figsize=(min(12.0, max(7.5, 2 + 0.22 * len(recs))), 3.8))
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.36, top=0.9)
    ax = fig.subplots()
    bottom = [0] * len(recs)
    for kind in ("predict", "accepted", "bonus-target", "bonus-correction", "rejected", "discarded"):
        vals = [sum(t.kind == kind for t in r.tokens) for r in recs]
        ax.bar(range(len(recs)), vals, bottom=bottom, color=COLORS[kind], label=LEGEND[kind],
               hatch="//" if kind in ("rejected", "discarded") else None, edgecolor="white")
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set(xlabel="step (0 = prefill)", ylabel="tokens", ylim=(0, max(bottom + [1]) + 0.5),
           title=f"{trace.method}, k = {trace.k}: {len(trace.tokens)} tokens in {trace.forwards} target forwards")
    ax.xaxis.get_major_locator().set_params(integer=True)
    handles = {h.get_label(): h for h in ax.containers}
    fig.legend([handles[LEGEND[k]] for k in KINDS if LEGEND[k] in handles], [LEGEND[k] for k in KINDS if LEGEND[k] in handles],
               fontsize=7, loc="lower center", ncol=2)
    return fig


def kv_cache_crop(rec: dict, *, window: int = 10) -> Figure:
    """One step's KV cache, from `compare.cache_lengths`: top, after the verify forward wrote the last committed
    token and the drafts; bottom, after `KVCache.crop` removed the rejected and discarded drafts' entries."""
    from matplotlib.patches import Rectangle

    step, before, verify, crop = rec["step"], rec["before"], rec["after_verify"], rec["after_crop"]
    lo = max(0, before - window // 2)
    fig = Figure(figsize=(max(6.0, 0.55 * (verify - lo) + 2), 2.4))
    fig.subplots_adjust(left=0.2, right=0.98, bottom=0.22, top=0.82)
    ax = fig.subplots()
    n_written = verify - before
    drafts = (["accepted"] * step.accepted + ["rejected"] * (len(step.drafted) > step.accepted)
              + ["discarded"] * max(0, len(step.drafted) - step.accepted - 1))[:rec["drafts_fed"]]
    kinds = ["committed"] * (n_written - len(drafts)) + drafts  # committed: the token(s) the drafts follow
    for y, length in ((1, verify), (0, crop)):
        for pos in range(lo, length):
            kind = "committed" if pos < before else kinds[pos - before]
            color = "#dddddd" if kind == "committed" else COLORS[kind]
            ax.add_patch(Rectangle((pos, y + 0.1), 0.9, 0.8, color=color,
                                   hatch="//" if kind in ("rejected", "discarded") else None))
    ax.set(xlim=(lo, verify + 0.5), ylim=(0, 2), yticks=[0.5, 1.5],
           xlabel="cache position", title=f"KV cache: {before} entries, +{n_written} written by verify, "
                                           f"cropped to {crop} ({step.accepted} of {len(step.drafted)} drafts kept)")
    ax.set_yticklabels([f"after crop: {crop}", f"after verify: {verify}"], fontsize=8)
    ax.title.set_fontsize(9)
    return fig


def _verdicts(predicted: list[str], drafts: list[str]) -> list[str]:
    """Kind of each verify row: accepted / rejected (its prediction is the correction) / discarded / bonus."""
    out, wrong = [], False
    for j in range(len(predicted)):
        if wrong:
            out.append("discarded")
        elif j < len(drafts):
            wrong = predicted[j] != drafts[j]
            out.append("rejected" if wrong else "accepted")
        else:
            out.append("bonus-target")
    return out


def verify_forward(ex: dict) -> Figure:
    """Why verification is one forward: the causal mask over the fed tokens [P, draft 1, ..., draft k-1] (left)
    and, per row, the target's next-token prediction lined up against the draft it checks (right). `ex` comes
    from `lesson_data.verify_example` (keys context, fed, predicted, drafts)."""
    from matplotlib.patches import Rectangle

    fed, pred, drafts = ex["fed"], ex["predicted"], ex["drafts"]
    n = len(fed)
    kinds = _verdicts(pred, drafts)
    fig = Figure(figsize=(10, 1.2 + 0.55 * n))
    fig.subplots_adjust(left=0.02, right=0.99, bottom=0.2, top=0.84)
    ax = fig.subplots()
    names = ["P (target)"] + [f"draft {j}" for j in range(1, n)]
    for r in range(n):
        y = n - 1 - r
        ax.text(-0.1, y + 0.45, f"{names[r]} {fed[r]!r}", ha="right", va="center", fontsize=8)
        ax.add_patch(Rectangle((0, y + 0.05), 0.9, 0.8, color="#dddddd"))
        for c in range(n):
            ax.add_patch(Rectangle((1 + c, y + 0.05), 0.9, 0.8, color=COLORS["predict"] if c <= r else "white",
                                   ec="#999999", lw=0.5))
        verdict = {"accepted": "= draft {d} {t!r}: accepted", "rejected": "!= draft {d} {t!r}: rejected; this is the correction",
                   "discarded": "draft {d} {t!r}: discarded (row read a rejected draft)",
                   "bonus-target": "after the last draft: bonus (overlapped schedule)"}[kinds[r]]
        if r >= len(drafts) and kinds[r] == "discarded":
            verdict = "after the last draft: unused (a draft was rejected)"
        text = verdict.format(d=r + 1, t=drafts[r] if r < len(drafts) else "")
        ax.annotate("", (n + 2.2, y + 0.45), (n + 1.1, y + 0.45), arrowprops=dict(arrowstyle="->"))
        ax.text(n + 2.4, y + 0.45, f"predicts {pred[r]!r}", va="center", fontsize=8)
        ax.add_patch(Rectangle((n + 4.6, y + 0.05), 5.6, 0.8, color=COLORS[kinds[r]], alpha=0.85))
        ax.text(n + 4.7, y + 0.45, text, va="center", fontsize=8, color=TEXT_COLORS[kinds[r]])
    for c, t in enumerate(["prompt ...\n" + repr(ex["context"])] + [repr(t) for t in fed]):
        ax.text(c + 0.45, n + 0.1, t, ha="center", va="bottom", fontsize=7)
    ax.set(xlim=(-3.2, n + 10.4), ylim=(-0.1, n + 0.8))
    ax.axis("off")
    ax.set_title("One verify forward: row j attends to the prompt (grey, in the KV cache) and fed tokens 0..j "
                 "(causal mask, blue) and predicts the token after it", fontsize=9)
    fig.text(0.5, 0.03, "Training reads every row at once the same way (teacher forcing): row j's prediction is "
             "scored against the true next token; here it is compared with the draft.", ha="center", fontsize=8)
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
