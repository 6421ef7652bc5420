"""What a forward costs, drawn: forwards against m, the cost curve t(q)/t(1), the roofline, step times, the block
size curve, the crossover, the time split of a decode, and batches against their cost. Each returns a Figure.
"""
from __future__ import annotations

import itertools
import math
from matplotlib.figure import Figure
from mtplab.decoding.trace import Trace
from mtplab.viz.kinds import COLORS
from mtplab.viz.style import AR_COLOR, OVERLAP_COLOR, PLAIN_COLOR, _figure, _running_median


# ---------------------------------------------------------------------------------- forwards and costs
def forwards_vs_m(ms, plain: dict[int, list[int]], overlap: dict[int, list[int]]) -> Figure:
    """Measured forwards (oracle drafter, alpha = 1) against Stern's best cases, one panel per k.

    plain[k][j], overlap[k][j]: forwards for ms[j] new tokens. Lines: autoregressive m,
    Stern's 2m/k (predict + verify per block) and 1 + m/k (verify overlapped with the next predict).
    """
    ks = sorted(plain)
    fig, axes = _figure(len(ks), width=3.6, height=3.2, sharey=True)
    ms = list(ms)
    for ax, k in zip(axes[0], ks):
        ax.plot(ms, ms, color=AR_COLOR, lw=1, label="autoregressive: m")
        ax.plot(ms, [2 * m / k for m in ms], color=PLAIN_COLOR, ls="--", lw=1, label="2m/k")
        ax.plot(ms, [1 + m / k for m in ms], color=OVERLAP_COLOR, ls="--", lw=1, label="1 + m/k")
        ax.plot(ms, plain[k], "o", ms=3, color=PLAIN_COLOR, label="measured, plain")
        ax.plot(ms, overlap[k], "s", ms=3, color=OVERLAP_COLOR, label="measured, overlap")
        ax.set(title=f"k = {k}", xlabel="new tokens m")
    axes[0][0].set_ylabel("target forwards")
    axes[0][0].legend(fontsize=7, loc="upper left")
    return fig


def cost_curve(curves, *, title: str | None = None) -> Figure:
    """t(q)/t(1) against q, with the two extremes: flat (q tokens for the price of one) and linear.

    curves: a `lab.CostCurve`, a {q: ratio} dict, or {label: either}.
    """
    if hasattr(curves, "ratio") or all(isinstance(v, (int, float)) for v in dict(curves).values()):
        curves = {"measured": curves}
    fig, axes = _figure()
    ax = axes[0][0]
    qmax = 1
    for label, c in curves.items():
        r = c.ratio if hasattr(c, "ratio") else c
        qs = sorted(r)
        qmax = max(qmax, qs[-1])
        extra = f" (cache {c.context}, {c.device})" if hasattr(c, "context") else ""
        ax.plot(qs, [r[q] for q in qs], "o-", label=label + extra)
    ref = [2 ** i for i in range(int(math.log2(qmax)) + 1)]
    ax.plot(ref, ref, color="0.6", ls=":", label="t(q) = q t(1): no parallelism")
    ax.axhline(1, color="0.6", ls="--", label="t(q) = t(1): free parallelism")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set(xlabel="tokens per forward q", ylabel="t(q) / t(1)", title=title or "Cost of one forward over q new tokens")
    ax.legend(fontsize=7)
    return fig


def roofline(qs, intensity, ridge: float | None = None) -> Figure:
    """FLOPs per byte moved by one forward, against q; above the machine's ridge it is compute-bound."""
    fig, axes = _figure()
    ax = axes[0][0]
    ax.plot(list(qs), list(intensity), "o-", label="this model's forward")
    if ridge is not None:
        ax.axhline(ridge, color="tab:red", ls="--", label=f"ridge of this machine: {ridge:.1f} FLOP/byte")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set(xlabel="tokens per forward q", ylabel="FLOPs per byte moved", title="Roofline: memory-bound below the ridge")
    ax.legend(fontsize=7)
    return fig


def step_times(traces: dict[str, Trace], *, window: int = 9) -> Figure:
    """Wall time of each decoding step against the context length it saw (running median of `window`)."""
    fig, axes = _figure(width=6)
    ax = axes[0][0]
    for label, tr in traces.items():
        # the context each step saw: the prompt and every token committed before it; the first step is the prefill
        # over the whole prompt, left out
        ctx = list(itertools.accumulate((len(s.emitted) for s in tr.steps[:-1]), initial=len(tr.prompt)))[1:]
        ms = [1e3 * s.wall_s for s in tr.steps[1:]]
        dots = ax.plot(ctx, ms, ".", ms=2, alpha=0.35)[0]
        ax.plot(ctx, _running_median(ms, window), lw=1.5, label=label, color=dots.get_color())
    ax.set(xlabel="context length (tokens)", ylabel="ms per new token", title="Time per token as the context grows")
    ax.legend(fontsize=8)
    return fig


def block_size_curve(ks, values: dict[str, list[float]]) -> Figure:
    """Mean accepted length against k, tokens per step (the shape of Stern et al. 2018, Table 1, whose "block
    size" is this k and whose "mean accepted block size" is this mean accepted length)."""
    ks = list(ks)
    fig, axes = _figure()
    ax = axes[0][0]
    ax.plot(ks, ks, color="0.6", ls=":", label="every draft kept: k")
    for label, v in values.items():
        ax.plot(ks, v, "o-", label=label)
    ax.set(xlabel="k, tokens per step", ylabel="mean accepted length", xticks=ks)
    ax.legend(fontsize=8)
    return fig


def crossover(rows: list[dict]) -> Figure:
    """Wall-clock speedup of oracle-drafted speculative decoding against model size, one line per alpha."""
    fig, axes = _figure()
    ax = axes[0][0]
    for al in sorted({r["alpha"] for r in rows}):
        rs = [r for r in rows if r["alpha"] == al]
        ax.plot([r["params_M"] for r in rs], [r["speedup_wall"] for r in rs], "o-", label=f"alpha = {al}")
    ax.axhline(1.0, color="0.6", ls="--", label="no speedup")
    ax.set(xscale="log", xlabel="model parameters (millions)", ylabel="wall-clock speedup over AR",
           title="Where speculative decoding starts to pay (oracle drafts)")
    ax.legend(fontsize=7)
    return fig

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
        a_sp.plot([r["batch_size"] for r in sp], [r["speedup"] for r in sp], "-o", color=color, label=name)
    for ax in (a_tp, a_sp):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size B")
    a_tp.set(ylabel="committed tokens / s (all rows)", title="throughput")
    a_lat.set(xlabel="committed tokens / s (all rows)", ylabel="ms per token, one row", title="latency against throughput")
    a_sp.axhline(1.0, color=AR_COLOR, lw=1, ls="--")
    a_sp.set(ylabel="speculative / AR throughput", title="where speculation stops paying")
    for ax in axes[0]:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return fig


def regime_map(by_size: list[dict], by_depth: list[dict] | None = None, *, q: int = 4, machine: str = "") -> Figure:
    """Left: t(q)/t(1) against the weights' size (log scale), the last-level cache marked; right: the same trained
    heads on deeper trunks (identity blocks), wall-clock speedup against AR of the same trunk, with its range."""
    fig, axes = _figure(2 if by_depth else 1, width=5.2, height=3.6)
    ax = axes[0][0]
    xs = [r["weight_mb"] for r in by_size]
    ys = [r["ratio"][str(q)] for r in by_size]
    colors = ["tab:red" if r["fits_in_llc"] else "tab:blue" for r in by_size]
    ax.scatter(xs, ys, c=colors, s=22, zorder=3)
    for r, x, y in zip(by_size, xs, ys):
        ax.annotate(f"{r['n_layer']}x{r['n_embd']}", (x, y), fontsize=6, xytext=(3, 2), textcoords="offset points")
    llc = next((r["llc_bytes"] for r in by_size if r["llc_bytes"]), None)
    if llc:
        ax.axvline(llc / 1e6, color="0.3", ls=":", lw=1, label=f"last-level cache {llc / (1 << 20):.0f} MiB")
    ax.axhline(1, color="0.6", lw=0.8)
    ax.set(xscale="log", xlabel="weights read per forward (MB, fp32)", ylabel=f"t({q}) / t(1)")
    ax.set_title(f"verifying {q} tokens, in units of one token\nred: fits in the cache, blue: does not", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    if by_depth:
        ax = axes[0][1]
        for method in dict.fromkeys(r.get("label", r["method"]) for r in by_depth):
            rows = [r for r in by_depth if r.get("label", r["method"]) == method]
            d = [r["n_layer"] for r in rows]
            s = [r["speedup"] for r in rows]
            err = [[v - r["speedup_min"] for v, r in zip(s, rows)], [r["speedup_max"] - v for v, r in zip(s, rows)]]
            ax.errorbar(d, s, yerr=err, marker="o", ms=3, capsize=2, lw=1, label=method)
        ax.axhline(1, color="0.3", ls=":", lw=1, label="AR of the same trunk")
        ax.set(xlabel="trunk layers (the extra ones are identity blocks)", ylabel="wall clock speedup (median, range)")
        ax.set_title("the same heads, the same acceptance:\nonly the cost of a forward changes", fontsize=9)
        ax.legend(fontsize=7)
    if machine:
        fig.suptitle(machine, fontsize=7)
    return fig
