"""Figures for the benchmark reports (matplotlib; each returns a Figure)."""
from __future__ import annotations

from matplotlib.figure import Figure


def cost_curve_figure(ratios: dict, label: str = "") -> Figure:
    """ratios: {series name: {q: t(q)/t(1)}}."""
    fig = Figure(figsize=(5.5, 3.6))
    ax = fig.subplots()
    for name, r in ratios.items():
        qs = sorted(int(q) for q in r)
        ax.plot(qs, [r[q] if q in r else r[str(q)] for q in qs], marker="o", label=name)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("q: new tokens in one forward (KV cache warm)")
    ax.set_ylabel("t(q) / t(1)")
    ax.set_title(f"cost curve {label}".strip())
    ax.legend()
    return fig


def crossover_figure(rows: list[dict]) -> Figure:
    fig = Figure(figsize=(5.5, 3.6))
    ax = fig.subplots()
    for al in sorted({r["alpha"] for r in rows}):
        rs = [r for r in rows if r["alpha"] == al]
        ax.plot([r["params_M"] for r in rs], [r["speedup_wall"] for r in rs], marker="o", label=f"alpha={al}")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_xlabel("model parameters (millions)")
    ax.set_ylabel("wall-clock speedup over AR")
    ax.set_title("where speculative decoding starts to pay (oracle drafts, k=4)")
    ax.legend()
    return fig
