"""Pictures for the notebooks: every function takes numbers, a `Trace` or a training history and
returns a `matplotlib.figure.Figure`. Nothing here shows, prints or touches pyplot's global state.

In a notebook, run `%matplotlib inline` once; a returned Figure then displays as the cell's value.
k tokens per step (at most k committed a step), m new tokens, q tokens fed to one forward, K depths.
(The one exception, `label_layout_text`, lives with its table in `viz_layout` and returns the layout as text.)
"""
from __future__ import annotations

import math

from matplotlib.figure import Figure

from .trace import Trace
from .tokenizer import token_repr

AR_COLOR, PLAIN_COLOR, OVERLAP_COLOR = "0.35", "tab:orange", "tab:blue"


def _figure(ncols: int = 1, nrows: int = 1, width: float = 5.0, height: float = 3.4, **kw):
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def _running_median(xs, window: int):
    h = window // 2
    return [sorted(xs[max(0, i - h):i + h + 1])[len(xs[max(0, i - h):i + h + 1]) // 2] for i in range(len(xs))]


def _finite(xs):
    return [x if x is not None and not (isinstance(x, float) and math.isnan(x)) else float("nan") for x in xs]


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
        ax.set_title(f"k = {k}")
        ax.set_xlabel("new tokens m")
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
    ax.set_xlabel("tokens per forward q")
    ax.set_ylabel("t(q) / t(1)")
    ax.set_title(title or "Cost of one forward over q new tokens")
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
    ax.set_xlabel("tokens per forward q")
    ax.set_ylabel("FLOPs per byte moved")
    ax.set_title("Roofline: memory-bound below the ridge")
    ax.legend(fontsize=7)
    return fig


def step_times(traces: dict[str, Trace], *, window: int = 9) -> Figure:
    """Wall time of each decoding step against the context length it saw (running median of `window`)."""
    fig, axes = _figure(width=6)
    ax = axes[0][0]
    for label, tr in traces.items():
        ctx, ms = [], []
        n = len(tr.prompt)
        for s in tr.steps:
            ctx.append(n)
            ms.append(1e3 * s.wall_s)
            n += len(s.emitted)
        ctx, ms = ctx[1:], ms[1:]  # the first step is the prefill over the whole prompt
        dots = ax.plot(ctx, ms, ".", ms=2, alpha=0.35)[0]
        ax.plot(ctx, _running_median(ms, window), lw=1.5, label=label, color=dots.get_color())
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("ms per new token")
    ax.set_title("Time per token as the context grows")
    ax.legend(fontsize=8)
    return fig


def bars(values: dict[str, float], *, ylabel: str, title: str = "", fmt: str = "{:.2f}",
         reference: float | tuple[float, float] | None = None, reference_label: str = "") -> Figure:
    """One bar per label, each with its value written on top; an optional reference line,
    or a shaded band when `reference` is a (low, high) pair."""
    fig, axes = _figure(width=max(4.0, 1.3 * len(values) + 1.5))
    ax = axes[0][0]
    labels = list(values)
    vals = [values[k] for k in labels]
    b = ax.bar(range(len(labels)), vals, color=[f"C{i}" for i in range(len(labels))])
    ax.bar_label(b, labels=[fmt.format(v) for v in vals], fontsize=8)
    ax.set_xticks(range(len(labels)), labels, fontsize=8, rotation=15 if len(labels) > 3 else 0)
    if isinstance(reference, tuple):
        ax.axhspan(*reference, color="tab:red", alpha=0.2, label=reference_label)
        ax.legend(fontsize=8)
    elif reference is not None:
        ax.axhline(reference, color="tab:red", ls="--", label=reference_label)
        ax.legend(fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.margins(y=0.15)
    return fig


def memory_curve(mem: dict[str, dict[int, float]], *, what: str = "peak memory of one training step (MiB)") -> Figure:
    """Peak memory against the number of heads K, one line per backward order."""
    fig, axes = _figure()
    ax = axes[0][0]
    for label, d in mem.items():
        ks = sorted(d)
        ax.plot(ks, [d[k] for k in ks], "o-", label=label)
    ax.set_xlabel("heads K")
    ax.set_ylabel(what)
    ax.set_title("Meta heads: backward head by head vs all at once")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    return fig


# ---------------------------------------------------------------------------------- acceptance
def trace_steps(trace: Trace) -> Figure:
    """Per step of a speculative Trace: drafts kept, drafts rejected, and the target's extra token."""
    steps = [s for s in trace.steps if s.drafted or s.predict_token is not None]
    fig, axes = _figure(width=min(12.0, max(5.0, 2 + 0.18 * len(steps))), height=3)
    ax = axes[0][0]
    x = range(len(steps))
    kept = [s.accepted for s in steps]
    rejected = [len(s.drafted) - s.accepted for s in steps]
    extra = [len(s.emitted) - s.accepted for s in steps]
    ax.bar(x, extra, color="tab:green", label="from the target (predict / bonus / correction)")
    ax.bar(x, kept, bottom=extra, color="tab:blue", label="drafts kept")
    ax.bar(x, rejected, bottom=[a + b for a, b in zip(extra, kept)], color="tab:red", alpha=0.35,
           label="drafts thrown away")
    ax.set_xlabel("step")
    ax.set_ylabel("tokens")
    ax.set_ylim(0, trace.k + 0.5)
    ax.set_title(f"{trace.method}, k = {trace.k}: {len(trace.tokens)} tokens in {trace.forwards} forwards")
    fig.legend(fontsize=7, loc="outside lower center", ncol=3)
    return fig


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


def block_size_curve(ks, values: dict[str, list[float]]) -> Figure:
    """Mean accepted length against k, tokens per step (the shape of Stern et al. 2018, Table 1, whose "block
    size" is this k and whose "mean accepted block size" is this mean accepted length)."""
    ks = list(ks)
    fig, axes = _figure()
    ax = axes[0][0]
    ax.plot(ks, ks, color="0.6", ls=":", label="every draft kept: k")
    for label, v in values.items():
        ax.plot(ks, v, "o-", label=label)
    ax.set_xlabel("k, tokens per step")
    ax.set_ylabel("mean accepted length")
    ax.set_xticks(ks)
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
    ax.set_xlabel("offset of the predicted token (depth)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
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


# ---------------------------------------------------------------------------------- DeepSeek layout
def sampling_histogram(counts: dict, target, *, others: dict | None = None, labels=None, title: str = "") -> Figure:
    """Empirical frequencies (one bar group per label in `counts`) against the target distribution (black marks).

    counts: {label: (V,) counts}; target: (V,) probabilities; others: {label: (V,) probabilities} drawn as
    grey crosses (e.g. the drafter's own distribution). Only tokens with some mass are drawn.
    """
    import torch

    target = torch.as_tensor(target, dtype=torch.float64)
    freqs = {k: torch.as_tensor(v, dtype=torch.float64) / max(1.0, float(torch.as_tensor(v).sum()))
             for k, v in counts.items()}
    mass = target.clone()
    for f in freqs.values():
        mass = mass + f
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
    ax.set_xlabel("token")
    ax.set_ylabel("frequency")
    ax.set_title(title)
    ax.legend(fontsize=7)
    return fig


def crossover(rows: list[dict]) -> Figure:
    """Wall-clock speedup of oracle-drafted speculative decoding against model size, one line per alpha."""
    fig, axes = _figure()
    ax = axes[0][0]
    for al in sorted({r["alpha"] for r in rows}):
        rs = [r for r in rows if r["alpha"] == al]
        ax.plot([r["params_M"] for r in rs], [r["speedup_wall"] for r in rs], "o-", label=f"alpha = {al}")
    ax.axhline(1.0, color="0.6", ls="--", label="no speedup")
    ax.set_xscale("log")
    ax.set_xlabel("model parameters (millions)")
    ax.set_ylabel("wall-clock speedup over AR")
    ax.set_title("Where speculative decoding starts to pay (oracle drafts)")
    ax.legend(fontsize=7)
    return fig


from .viz_layout import label_layout_table, label_layout_text  # noqa: E402,F401  (eq. 24's layout, notebook 04)
