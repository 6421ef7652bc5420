"""What a decode did, drawn: acceptance by position, one step's token kinds, the KV cache crop, one verify forward
row by row, the acceptance lab's charts, and a token tree's step. Each returns a Figure.
"""
from __future__ import annotations

import statistics

from matplotlib.figure import Figure
from mtplab.decoding.trace import Trace, conditional_counts
from mtplab.decoding.tree import TreeStep
from mtplab.measuring.acceptance import wilson
from mtplab.tokenizer import token_repr
from mtplab.viz.kinds import COLORS, KINDS, LEGEND, TEXT_COLORS, step_record
from mtplab.viz.style import OVERLAP_COLOR, _figure, _finite, _font


# ---------------------------------------------------------------------------------- acceptance
def acceptance_bars(traces) -> Figure:
    """Acceptance by draft position: conditional (given the earlier drafts were kept) and unconditional."""
    if isinstance(traces, Trace):
        traces = {traces.method: traces}
    fig, axes = _figure(2, width=4.6)
    n = len(traces)
    w = 0.8 / max(1, n)
    for j, (label, tr) in enumerate(traces.items()):
        for ax, vals in ((axes[0][0], tr.conditional_acceptance), (axes[0][1], tr.acceptance_rate_per_position)):
            xs = [i + 1 + (j - (n - 1) / 2) * w for i in range(len(vals))]
            ax.bar(xs, _finite(vals), width=w, label=label)
    axes[0][0].set_title("conditional: P(kept | earlier drafts kept)")
    axes[0][1].set_title("unconditional: kept / steps (vLLM)")
    for ax in axes[0]:
        ax.set_xlabel("draft position (1 = the 2nd token of the step)")
        ax.set_ylim(0, 1.05)
        ax.xaxis.get_major_locator().set_params(integer=True)
    axes[0][0].set_ylabel("acceptance")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="outside lower center", ncol=max(1, n))
    return fig


def step_kinds(trace) -> Figure:
    """Every step of a Trace as a stacked bar of its tokens by kind, in the shared token colours; step numbers
    match `trace.steps` and the step table (0 = the prefill, which commits one token)."""

    recs = [step_record(i, s) for i, s in enumerate(trace.steps)]
    fig = Figure(figsize=(min(12.0, max(7.5, 2 + 0.22 * len(recs))), 3.8))
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.36, top=0.9)
    ax = fig.subplots()
    bottom = [0] * len(recs)
    for kind in ("prefill", "predict", "accepted", "bonus-target", "bonus-correction", "rejected", "discarded"):
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
    fig = Figure(figsize=(max(6.0, 0.55 * (verify - lo) + 2) + 1.8, 2.4))
    fig.subplots_adjust(left=0.16, right=0.74, bottom=0.22, top=0.82)
    ax = fig.subplots()
    n_written = verify - before
    drafts = (["accepted"] * step.accepted + ["rejected"] * (len(step.drafted) > step.accepted)
              + ["discarded"] * max(0, len(step.drafted) - step.accepted - 1))[:rec["drafts_fed"]]
    kinds = ["committed"] * (n_written - len(drafts)) + drafts  # committed: the token(s) the drafts follow
    for y, length in ((1, verify), (0, crop)):
        for pos in range(lo, length):
            kind = "cached" if pos < before else kinds[pos - before]
            color = {"cached": "#dddddd", "committed": "#999999"}.get(kind) or COLORS[kind]
            ax.add_patch(Rectangle((pos, y + 0.1), 0.9, 0.8, color=color,
                                   hatch="//" if kind in ("rejected", "discarded") else None))
    names = {"cached": "in the cache before the step", "committed": "written: the last committed token",
             "accepted": "written: accepted draft", "rejected": "written: rejected draft",
             "discarded": "written: discarded draft"}
    shown = ["cached"] + [k for k in names if k != "cached" and k in kinds]
    ax.legend(handles=[Rectangle((0, 0), 1, 1, color={"cached": "#dddddd", "committed": "#999999"}.get(k) or COLORS[k],
                                 hatch="//" if k in ("rejected", "discarded") else None, label=names[k]) for k in shown],
              fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
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


def _fixed_figure(w: float, h: float, ncols: int = 1, scale: float = 1.0):
    """The widget's charts: one row of panels, w x h inches in all, fixed margins (`style._figure`)."""
    fig, axes = _figure(ncols, width=w / ncols, height=h, scale=scale, fixed=True)
    return fig, axes[0]


def acceptance_figure(trace: Trace | None, *, title: str | None = None, max_drafts: int | None = None,
                      scale: float = 1.0):
    """Left: drafts proposed and accepted at every step. Right: conditional acceptance per draft position,
    P(draft i accepted | drafts 1..i-1 accepted), with its 95% Wilson interval and its sample size n."""
    fig, (ax1, ax2) = _fixed_figure(9, 2.8, 2, scale)
    steps = trace.steps if trace is not None else []
    x = list(range(len(steps)))
    ax1.bar(x, [len(s.drafted) for s in steps], color=COLORS["discarded"])
    ax1.bar(x, [s.accepted for s in steps], color=COLORS["accepted"])
    ax1.set(xlabel="step", ylabel="drafts", title="acceptance per step")
    longest = max((len(s.drafted) for s in steps), default=0)
    n_pos = max(min(max_drafts or 0, 16), longest, 1)  # an absurd k draws 16 positions, not k-1 bars
    ax1.set_ylim(0, n_pos + 0.8)
    ax1.set_xlim(-0.6, max(len(steps), 8) - 0.4)
    from matplotlib.patches import Patch  # explicit handles: an empty bar container has no colour to show
    ax1.legend(handles=[Patch(color=COLORS["discarded"], label="drafted"),
                        Patch(color=COLORS["accepted"], label="accepted")], loc="upper right", fontsize=_font(scale))
    counts = conditional_counts(trace) if trace is not None else []
    pos = list(range(1, n_pos + 1))
    kn = [counts[p - 1] if p - 1 < len(counts) else (0, 0) for p in pos]
    vals = [k / n if n else 0.0 for k, n in kn]
    ax2.bar(pos, vals, color=COLORS["accepted"])  # one container: bar i is draft position i
    for p, v, (k, n) in zip(pos, vals, kn):
        if n == 0:
            ax2.text(p, 0.05, "n/a", ha="center", fontsize=_font(scale))
            continue
        lo, hi = wilson(k, n)
        ax2.errorbar(p, v, yerr=[[max(0.0, v - lo)], [max(0.0, hi - v)]], color="black", capsize=3, lw=1)
        ax2.text(p, hi + 0.04, f"{v:.2f}\nn={n}", ha="center", fontsize=_font(scale))
    ax2.set(xlabel="draft position (draft i is depth i+1)", ylabel="P(accept | earlier accepted)",
            title="conditional acceptance, 95% interval", ylim=(0, 1.35), xticks=pos)
    if title:
        fig.suptitle(title, fontsize=10 * scale)
    return fig


def decode_split(trace: Trace) -> dict[str, float]:
    """A whole decode's seconds: in target forwards, in the drafter, and the rest of the loop (accept rule, cache
    bookkeeping, Python), as its steps measured them."""
    target, draft = trace.target_s, trace.draft_s
    return {"target_s": target, "draft_s": draft, "rest_s": max(0.0, trace.wall_s - target - draft)}


SPLIT_COLORS = {"target_s": "#0072B2", "draft_s": "#E69F00", "rest_s": "#BBBBBB"}


def speed_figure(trace: Trace | None, baseline: Trace | None, *, device_name: str = "", scale: float = 1.0,
                 walls: dict[str, list[float]] | None = None, splits: dict[str, dict[str, float]] | None = None):
    """This method against AR on the same model: tokens per target forward; wall clock, the median of the
    interleaved repeats in `walls` ({name: seconds per decode}) with their range drawn from min to max; and the
    decode's time split (`splits`, {name: decode_split}), target forwards / drafter / the rest, in ms.
    Without `walls` and `splits`, the one decode of each trace is drawn (n = 1)."""
    fig, (ax1, ax2, ax3) = _fixed_figure(12, 2.6, 3, scale)
    if trace is None or baseline is None:
        for ax in (ax1, ax2, ax3):
            ax.text(0.5, 0.5, "not decoded yet", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
        return fig
    names = ["ar", trace.method] if trace.method != "ar" else ["ar"]
    traces = [baseline, trace] if trace.method != "ar" else [baseline]
    walls = walls or {n: [t.wall_s] for n, t in zip(names, traces)}
    splits = splits or {n: decode_split(t) for n, t in zip(names, traces)}
    colors = [COLORS["discarded"], COLORS["accepted"]][:len(names)]
    tpf = [t.tokens_per_forward for t in traces]
    ax1.bar(names, tpf, color=colors)
    ax1.set(title="tokens per target forward", ylim=(0, max(tpf) * 1.3))
    ms = [[1000 * w for w in walls[n]] for n in names]
    med = [statistics.median(m) for m in ms]
    lo = [m - min(v) for m, v in zip(med, ms)]
    hi = [max(v) - m for m, v in zip(med, ms)]
    ax2.bar(names, med, color=colors, yerr=[lo, hi], capsize=4)
    n_runs = min(len(v) for v in ms)
    ax2.set(title=f"wall clock, ms: median of {n_runs} ({device_name or 'device'})",
            ylim=(0, max(max(v) for v in ms) * 1.35))
    for ax, vals, fmt in ((ax1, tpf, "{:.2f}"), (ax2, med, "{:.0f}")):
        for i, v in enumerate(vals):
            ax.text(i + 0.3, v, fmt.format(v), ha="left", va="bottom", fontsize=_font(scale))
    bottom = [0.0] * len(names)
    for part, label in (("target_s", "target"), ("draft_s", "drafter"), ("rest_s", "rest")):
        vals = [1000 * splits[n][part] for n in names]
        ax3.bar(names, vals, bottom=bottom, color=SPLIT_COLORS[part], label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax3.set(title="time split of the decode, ms", ylim=(0, max(bottom + [1e-3]) * 1.3))
    ax3.legend(fontsize=_font(scale), loc="upper left", ncol=3)
    return fig


def compare_figure(traces: dict, *, scale: float = 1.0):
    """Conditional acceptance per draft position for several decodes side by side ({label: Trace}),
    with 95% Wilson intervals; the legend gives each decode's number of drafting steps."""
    fig, (ax,) = _fixed_figure(10, 3, 1, scale)
    fig.subplots_adjust(right=0.6)  # the legend sits to the right of the bars
    n = max((len(t.conditional_acceptance) for t in traces.values()), default=0)
    width = 0.8 / max(1, len(traces))
    for j, (label, t) in enumerate(traces.items()):
        counts = conditional_counts(t)
        xs = [i + 1 + (j - (len(traces) - 1) / 2) * width for i in range(len(counts))]
        vals = [a / r if r else 0.0 for a, r in counts]
        ci = [wilson(a, r) if r else (0.0, 0.0) for a, r in counts]
        ax.bar(xs, vals, width=width, yerr=[[max(0.0, v - lo) for v, (lo, _) in zip(vals, ci)],
                                            [max(0.0, hi - v) for v, (_, hi) in zip(vals, ci)]], capsize=2,
               label=f"{label} (mean accepted length {t.mean_accepted_length:.2f}, {t.num_drafts} steps)")
    ax.set(xlabel="draft position (draft i is depth i+1)", ylabel="P(accept | earlier accepted)", ylim=(0, 1.1),
           xticks=list(range(1, n + 1)), title="conditional acceptance by draft position, 95% intervals")
    ax.legend(fontsize=_font(scale), loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return fig


def tree_step(ts: TreeStep, *, root_token: int | None = None, label=token_repr) -> Figure:
    """One verified token tree: depth left to right, the accepted path in green, pruned nodes in grey,
    and the target's bonus token (dashed) after the path."""
    tree = ts.tree
    fig, axes = _figure(1, 1, width=6.5, height=max(2.6, 0.32 * max(1, len(tree)) + 1.2))
    ax = axes[0][0]
    on_path = {r - 1 for r in ts.path[1:]}
    # y: leaves in order, a parent at the mean of its children
    leaves = [i for i in range(len(tree)) if not tree.children(i)]
    y: dict[int, float] = {i: -float(j) for j, i in enumerate(leaves)}
    for i in sorted(range(len(tree)), key=lambda i: -tree.depth[i]):
        if i not in y:
            kids = tree.children(i)
            y[i] = sum(y[c] for c in kids) / len(kids)
    y_root = sum(y[c] for c in tree.children(-1)) / max(1, len(tree.children(-1)))
    pos = {-1: (0.0, y_root)} | {i: (float(tree.depth[i]), y[i]) for i in range(len(tree))}
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
    # no count in the title: the root (leftmost) goes through the forward too, and notebook 07's exercise 1 asks
    # for the number of positions
    ax.set_title(f"the root and every node in one forward: {len(ts.path) - 1} accepted (green) + bonus "
                 f"({ts.step.bonus_source}); grey = pruned", fontsize=9)
    for s in ("top", "right", "left"):
        ax.spines[s].set_visible(False)
    return fig


def domain_panels(rows: list[dict], *, machine: str = "") -> Figure:
    """`bench domain`'s rows: left, acceptance by draft position of the reused module (k = 4) for each trunk on
    each text, with Wilson intervals; right, the wall clock against AR of the same trunk, median and range, one
    group of bars per method. Colour is the trunk; solid (left) and plain bars (right) are a trunk on its own
    text, dashed and hatched ones on the other corpus."""
    fig, axes = _figure(2, width=5.2, height=3.6)
    left, right = axes[0]
    colors = {"code": "#1f77b4", "prose": "#d62728"}
    for r in (r for r in rows if r["method"] == "deepseek-reuse"):
        pos = list(range(1, len(r["acceptance_by_position"]) + 1))
        lo = [a - iv[0] for a, iv in zip(r["acceptance_by_position"], r["acceptance_interval"])]
        hi = [iv[1] - a for a, iv in zip(r["acceptance_by_position"], r["acceptance_interval"])]
        left.errorbar(pos, r["acceptance_by_position"], yerr=[lo, hi], marker="o", capsize=3,
                      color=colors.get(r["trained_on"], "grey"), ls="-" if r["trained_on"] == r["text"] else "--",
                      label=f"{r['trained_on']} trunk, {r['text']} text")
    left.set(xlabel="draft position", ylabel="acceptance (unconditional)", ylim=(0, 1),
             title="module 1 reused, k = 4: acceptance by position")
    left.set_xticks([1, 2, 3])
    left.legend(fontsize=8)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    combos = list(dict.fromkeys((r["trained_on"], r["text"]) for r in rows))
    width = 0.8 / max(1, len(combos))
    for j, (trunk, text) in enumerate(combos):
        xs, meds, lo, hi = [], [], [], []
        for i, m in enumerate(methods):
            r = next((r for r in rows if r["method"] == m and (r["trained_on"], r["text"]) == (trunk, text)), None)
            if r is None:
                continue
            xs.append(i - 0.4 + width * (j + 0.5))
            meds.append(r["speedup"])
            lo.append(r["speedup"] - r["speedup_min"])
            hi.append(r["speedup_max"] - r["speedup"])
        right.bar(xs, meds, width=width * 0.95, color=colors.get(trunk, "grey"), alpha=0.85, yerr=[lo, hi], capsize=2,
                  hatch=None if trunk == text else "//", edgecolor="white", label=f"{trunk} trunk, {text} text")
    right.axhline(1.0, color="k", lw=0.8)
    right.set_xticks(range(len(methods)))
    right.set_xticklabels([f"{m} k={next(r['k'] for r in rows if r['method'] == m)}" for m in methods], fontsize=8)
    right.set(ylabel="speedup over AR (median, range)", title="wall clock, each trunk against its own AR")
    right.legend(fontsize=7)
    if machine:
        fig.suptitle(machine, fontsize=7)
    return fig
