"""Figures of notebook 08: the power of the find-the-bug test, the acceptance conventions side by side,
and the teacher-forced estimate against the live loop. Each function returns a matplotlib Figure."""
from __future__ import annotations

from matplotlib.figure import Figure

from .metrics import Acceptance


def _figure(width: float = 5.6, height: float = 3.4, ncols: int = 1):
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, ncols)
    return fig, axes


def power_bars(power: dict[str, float], *, alpha: float, broken: dict[str, bool] | None = None,
               seeds: int | None = None) -> Figure:
    """Rejection rate of the chi-square test per rule; with `broken` (the answers) bars are coloured."""
    fig, ax = _figure()
    names = list(power)
    colours = ["tab:gray"] * len(names) if broken is None else \
        ["tab:red" if broken[n] else "tab:green" for n in names]
    ax.bar(names, [power[n] for n in names], color=colours)
    ax.axhline(alpha, color="k", ls=":", lw=1, label=f"alpha = {alpha:g} (a correct rule's rate)")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("rejection rate")
    ax.set_title("chi-square test against the exact p" + (f", {seeds} seeds" if seeds else ""))
    ax.tick_params(axis="x", labelrotation=30)
    ax.legend(loc="center right", fontsize=8)
    return fig


def conventions(acc: Acceptance, *, title: str = "") -> Figure:
    """Unconditional and conditional rates per draft position, the two mean lengths in the legend."""
    fig, ax = _figure()
    pos = list(range(len(acc.unconditional)))
    w = 0.38
    ax.bar([x - w / 2 for x in pos], acc.unconditional, w, label="unconditional (vLLM, llama.cpp)")
    ax.bar([x + w / 2 for x in pos], acc.conditional, w, label="conditional")
    ax.set_xticks(pos, [f"draft {j}\n(depth {j + 2})" for j in pos])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("acceptance rate")
    ax.set_title(title or f"mean accepted length {acc.mean_accepted_length:.2f} with the bonus, "
                          f"{acc.mean_accepted:.2f} without", fontsize=9)
    ax.legend(fontsize=8)
    return fig


def estimate_vs_live(results: dict[str, Acceptance], *, live: str = "live loop", title: str = "") -> Figure:
    """Unconditional and conditional rate per draft position for each estimate; the live loop in black."""
    fig, axes = _figure(width=9.0, ncols=2)
    for ax, what in zip(axes, ("unconditional", "conditional")):
        for name, acc in results.items():
            ys = getattr(acc, what)
            style = {"color": "k", "lw": 2.5, "marker": "o"} if name == live else {"marker": ".", "ls": "--"}
            ax.plot(range(len(ys)), ys, label=name, **style)
        n = len(next(iter(results.values())).unconditional)
        ax.set_xticks(range(n), [f"depth {j + 2}" for j in range(n)])
        ax.set_ylim(0, 1.05)
        ax.set_title(f"{what} acceptance per draft position", fontsize=9)
    axes[0].set_ylabel("rate")
    axes[1].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
