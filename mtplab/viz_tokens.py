"""Token kinds and the acceptance lab's figures: one colour map shared by notebooks 02 and 05 and the widget.

The colours are the Okabe-Ito palette (Okabe & Ito 2008, "Color Universal Design"), chosen to stay
distinct under the common colour-vision deficiencies; rejected and discarded drafts are also struck
through, so no kind is told apart by colour alone. Every figure function returns a matplotlib `Figure`
(no pyplot); `scale` enlarges figure and fonts for a projector.
"""
from __future__ import annotations

import io
import math

from .trace import Trace

KINDS = ("predict", "accepted", "rejected", "discarded", "bonus-target", "bonus-correction")
COLORS = {  # Okabe-Ito: sky blue, blue, vermillion, grey, bluish green, orange
    "predict": "#56B4E9",
    "accepted": "#0072B2",
    "rejected": "#D55E00",
    "discarded": "#BBBBBB",
    "bonus-target": "#009E73",
    "bonus-correction": "#E69F00",
}
TEXT_COLORS = {k: ("#ffffff" if k in ("accepted", "rejected", "bonus-target") else "#000000") for k in KINDS}
LEGEND = {
    "predict": "predict token (plain schedule)",
    "accepted": "draft accepted",
    "rejected": "draft rejected",
    "discarded": "draft discarded (after a rejection)",
    "bonus-target": "bonus from the target (all drafts accepted)",
    "bonus-correction": "bonus correction (replaces the rejected draft)",
}
STRUCK = ("rejected", "discarded")


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for k successes in n trials ((nan, nan) when n = 0)."""
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return min(p, max(0.0, centre - half)), max(p, min(1.0, centre + half))  # always holds p, despite rounding


def conditional_counts(trace: Trace) -> list[tuple[int, int]]:
    """(accepted, reached) per draft position: the counts behind `Trace.conditional_acceptance`."""
    n = max((len(s.drafted) for s in trace.steps), default=0)
    return [(sum(1 for s in trace.steps if s.accepted > i),
             sum(1 for s in trace.steps if len(s.drafted) > i and s.accepted >= i)) for i in range(n)]


def _figure(w: float, h: float, ncols: int = 1, scale: float = 1.0):
    from matplotlib.figure import (
        Figure,  # no pyplot: figures are not kept in a global registry
    )
    fig = Figure(figsize=(w * scale, h * scale))
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.2, top=0.82, wspace=0.28)  # fixed: layout engines are slow
    return fig, fig.subplots(1, ncols, squeeze=False)[0]


def _font(scale: float) -> float:
    return 8 * scale


def acceptance_figure(trace: Trace | None, *, title: str | None = None, max_drafts: int | None = None,
                      scale: float = 1.0):
    """Left: drafts proposed and accepted at every step. Right: conditional acceptance per draft position,
    P(draft i accepted | drafts 1..i-1 accepted), with its 95% Wilson interval and its sample size n."""
    fig, (ax1, ax2) = _figure(9, 2.8, 2, scale)
    steps = trace.steps if trace is not None else []
    x = list(range(len(steps)))
    ax1.bar(x, [len(s.drafted) for s in steps], color=COLORS["discarded"])
    ax1.bar(x, [s.accepted for s in steps], color=COLORS["accepted"])
    ax1.set(xlabel="step", ylabel="drafts", title="acceptance per step")
    n_pos = max(max_drafts or 0, max((len(s.drafted) for s in steps), default=0), 1)
    ax1.set_ylim(0, n_pos + 0.8)
    ax1.set_xlim(-0.6, max(len(steps), 8) - 0.4)
    from matplotlib.patches import (
        Patch,  # explicit handles: an empty bar container has no colour to show
    )
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


def speed_figure(trace: Trace | None, baseline: Trace | None, *, device_name: str = "", scale: float = 1.0):
    """Tokens per target forward and wall clock: this method against AR on the same model."""
    fig, (ax1, ax2) = _figure(9, 2.6, 2, scale)
    if trace is None or baseline is None:
        for ax in (ax1, ax2):
            ax.text(0.5, 0.5, "not decoded yet", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
        return fig
    names = ["ar", trace.method] if trace.method != "ar" else ["ar"]
    traces = [baseline, trace] if trace.method != "ar" else [baseline]
    colors = [COLORS["discarded"], COLORS["accepted"]][:len(names)]
    tpf = [t.tokens_per_forward for t in traces]
    ax1.bar(names, tpf, color=colors)
    ax1.set(title="tokens per target forward", ylim=(0, max(tpf) * 1.3))
    ms = [1000 * t.wall_s for t in traces]
    ax2.bar(names, ms, color=colors)
    ax2.set(title=f"wall clock, ms ({device_name or 'device'})", ylim=(0, max(ms) * 1.3))
    for ax, vals, fmt in ((ax1, tpf, "{:.2f}"), (ax2, ms, "{:.0f}")):
        for i, v in enumerate(vals):
            ax.text(i, v, fmt.format(v), ha="center", va="bottom", fontsize=_font(scale))
    return fig


def compare_figure(traces: dict, *, scale: float = 1.0):
    """Conditional acceptance per draft position for several decodes side by side ({label: Trace}),
    with 95% Wilson intervals; the legend gives each decode's number of drafting steps."""
    fig, (ax,) = _figure(10, 3, 1, scale)
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


def png(fig, dpi: int = 80) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()
