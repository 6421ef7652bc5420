"""Statistics, drawn: sampling histograms against the target, p-values over many seeds, the find-the-bug test's power,
the acceptance conventions side by side, and the teacher-forced estimate against the live loop.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from mtplab.tokenizer import token_repr
from mtplab.viz.kinds import COLORS
from mtplab.measuring.acceptance import Acceptance
from mtplab.viz.style import _figure


# ---------------------------------------------------------------------------------- sampling and power
def sampling_histogram(counts: dict, target, *, others: dict | None = None, labels=None, title: str = "") -> Figure:
    """Empirical frequencies (one bar group per label in `counts`) against the target distribution (black marks).

    counts: {label: (V,) counts}; target: (V,) probabilities; others: {label: (V,) probabilities} drawn as
    grey crosses (e.g. the drafter's own distribution). Only tokens with some mass are drawn.
    """
    import torch

    target = torch.as_tensor(target, dtype=torch.float64)
    freqs = {k: torch.as_tensor(v, dtype=torch.float64) / max(1.0, float(torch.as_tensor(v).sum()))
             for k, v in counts.items()}
    mass = sum(freqs.values(), target)  # target + each frequency, in order
    shown = [i for i in range(len(target)) if mass[i] > 1e-3]
    if len(shown) > 24:  # a large vocabulary: the 24 most likely tokens
        shown = sorted(sorted(range(len(target)), key=lambda i: -float(mass[i]))[:24])
    fig, axes = _figure(width=max(5.0, 0.35 * len(shown) * max(1, len(freqs)) + 2))
    ax = axes[0][0]
    n = len(freqs)
    w = 0.8 / max(1, n)
    for j, (label, f) in enumerate(freqs.items()):
        xs = [i + (j - (n - 1) / 2) * w for i in range(len(shown))]
        ax.bar(xs, [float(f[t]) for t in shown], width=w, alpha=0.8, label=label)
    ax.plot(range(len(shown)), [float(target[t]) for t in shown], "k_", ms=18, mew=2, label="target p")
    for j, (label, probs) in enumerate((others or {}).items()):
        probs = torch.as_tensor(probs, dtype=torch.float64)
        ax.plot(range(len(shown)), [float(probs[t]) for t in shown], "x", color=f"{0.3 + 0.2 * j:.1f}", ms=7,
                mew=1.5, label=label)
    if labels is not None:
        names = [labels[t] for t in shown]
    else:
        names = [token_repr(t) if len(target) == 256 else str(t) for t in shown]
    ax.set_xticks(range(len(shown)), names, fontsize=8)
    ax.set(xlabel="token", ylabel="frequency", title=title)
    ax.legend(fontsize=7)
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


def power_bars(power: dict[str, float], *, alpha: float, broken: dict[str, bool] | None = None,
               seeds: int | None = None) -> Figure:
    """Rejection rate of the chi-square test per rule; with `broken` (the answers) bars are coloured."""
    fig, axes = _figure(width=5.6)
    ax = axes[0][0]
    names = list(power)
    colours = ["tab:gray"] * len(names) if broken is None else \
        ["tab:red" if broken[n] else "tab:green" for n in names]
    ax.bar(names, [power[n] for n in names], color=colours)
    ax.axhline(alpha, color="k", ls=":", lw=1, label=f"alpha = {alpha:g} (a correct rule's rate)")
    ax.set(ylim=(0, 1.05), ylabel="rejection rate",
           title="chi-square test against the exact p" + (f", {seeds} seeds" if seeds else ""))
    ax.tick_params(axis="x", labelrotation=30)
    ax.legend(loc="center right", fontsize=8)
    return fig


def conventions(acc: Acceptance, *, title: str = "", intervals: dict | None = None, n: int | None = None) -> Figure:
    """Unconditional and conditional rates per draft position, the two mean lengths in the legend; `intervals`
    ({kind: [(low, high), ...]}) draws whiskers, `n` (drafting steps) goes under the title."""
    fig, axes = _figure(width=5.6)
    ax = axes[0][0]
    pos = list(range(len(acc.unconditional)))
    w = 0.38
    for shift, kind, lab in ((-w / 2, "unconditional", "unconditional (vLLM, llama.cpp)"), (w / 2, "conditional",
                                                                                          "conditional")):
        ys = getattr(acc, kind)
        iv = (intervals or {}).get(kind)
        yerr = None if iv is None else [[y - lo for y, (lo, _) in zip(ys, iv)], [hi - y for y, (_, hi) in zip(ys, iv)]]
        ax.bar([x + shift for x in pos], ys, w, label=lab, yerr=yerr, capsize=3 if yerr else 0)
    ax.set_xticks(pos, [f"draft {j}\n(depth {j + 2})" for j in pos])
    ax.set(ylim=(0, 1.05), ylabel="acceptance rate")
    ax.set_title((title or f"mean accepted length {acc.mean_accepted_length:.2f} with the bonus, "
                           f"{acc.mean_accepted:.2f} without")
                 + (f"\nn = {n} drafting steps" + ("; whiskers: 95% Wilson" if intervals else "") if n else ""),
                 fontsize=9)
    ax.legend(fontsize=8)
    return fig


def estimate_vs_live(results: dict[str, Acceptance], *, live: str = "live loop", title: str = "",
                     live_intervals: dict | None = None, n: int | None = None) -> Figure:
    """Unconditional and conditional rate per draft position for each estimate; the live loop in black, with
    whiskers from `live_intervals` ({kind: [(low, high), ...]}) and its n drafting steps in the title."""
    fig, axes = _figure(2, width=4.5)
    axes = axes[0]
    for ax, what in zip(axes, ("unconditional", "conditional")):
        for name, acc in results.items():
            ys = getattr(acc, what)
            style = {"color": "k", "lw": 2.5, "marker": "o"} if name == live else {"marker": ".", "ls": "--"}
            ax.plot(range(len(ys)), ys, label=name, **style)
            iv = (live_intervals or {}).get(what) if name == live else None
            if iv:
                ax.errorbar(range(len(ys)), ys, yerr=[[y - lo for y, (lo, _) in zip(ys, iv)],
                                                      [hi - y for y, (_, hi) in zip(ys, iv)]],
                            fmt="none", color="k", capsize=3)
        depths = len(next(iter(results.values())).unconditional)
        ax.set_xticks(range(depths), [f"depth {j + 2}" for j in range(depths)])
        ax.set_ylim(0, 1.05)
        ax.set_title(f"{what} acceptance per draft position", fontsize=9)
    axes[0].set_ylabel("rate")
    axes[1].legend(fontsize=7)
    if title or n:
        fig.suptitle((title or "") + (f" (live loop: n = {n} drafting steps" + ("; whiskers: 95% Wilson)" if
                                                                                 live_intervals else ")") if n else ""),
                     fontsize=10)
    return fig
