"""The look shared by every figure: the figure factory (no pyplot: figures are not kept in a global registry), the
method colours, bars, y-limits that one spike cannot set, and PNG bytes for HTML views.

k tokens per step (at most k committed a step), m new tokens, q tokens fed to one forward, K depths.
"""
from __future__ import annotations

import io
import math
import os

from matplotlib.figure import Figure

AR_COLOR, PLAIN_COLOR, OVERLAP_COLOR = "0.35", "tab:orange", "tab:blue"


def _figure(ncols: int = 1, nrows: int = 1, width: float = 5.0, height: float = 3.4, *, scale: float = 1.0,
            fixed: bool = False, **kw):
    """The one figure factory: a Figure of nrows x ncols panels, each width x height inches (times `scale`, for
    projector mode), and its axes as a 2-D array. fixed=True sets the margins once instead of running a layout
    engine (the widget redraws on every click, and layout engines are slow)."""
    fig = Figure(figsize=(width * ncols * scale, height * nrows * scale), layout=None if fixed else "constrained")
    if fixed:
        fig.subplots_adjust(left=0.08, right=0.98, bottom=0.2, top=0.82, wspace=0.28)
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def _running_median(xs, window: int):
    h = window // 2
    return [sorted(xs[max(0, i - h):i + h + 1])[len(xs[max(0, i - h):i + h + 1]) // 2] for i in range(len(xs))]


def _finite(xs):
    return [x if x is not None and not (isinstance(x, float) and math.isnan(x)) else float("nan") for x in xs]


def bars(values: dict[str, float], *, ylabel: str, title: str = "", fmt: str = "{:.2f}",
         reference: float | tuple[float, float] | None = None, reference_label: str = "",
         errors: dict[str, tuple[float, float]] | None = None) -> Figure:
    """One bar per label, each with its value written on top; an optional reference line,
    or a shaded band when `reference` is a (low, high) pair. `errors` maps a label to its (low, high) interval,
    drawn as a whisker; the value is then written beside the whisker's top, never under it."""
    fig, axes = _figure(width=max(4.0, 1.3 * len(values) + 1.5))
    ax = axes[0][0]
    labels = list(values)
    vals = [values[k] for k in labels]
    b = ax.bar(range(len(labels)), vals, color=[f"C{i}" for i in range(len(labels))])
    errors = errors or {}
    for i, k in enumerate(labels):
        if k in errors:  # the whisker, and the value beside its top, so that the whisker does not cross the number
            lo, hi = errors[k]
            ax.errorbar([i], [values[k]], yerr=[[values[k] - lo], [hi - values[k]]], color="black", capsize=4)
            ax.annotate(fmt.format(values[k]), (i, hi), xytext=(6, 0), textcoords="offset points", ha="left",
                        va="center", fontsize=8)
    ax.bar_label(b, labels=[fmt.format(v) if k not in errors else "" for k, v in zip(labels, vals)], fontsize=8)
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


def _font(scale: float) -> float:
    return 8 * scale


def png(fig, dpi: int = 80) -> bytes:
    if _PROJECTOR["on"]:
        fig, dpi = for_projector(fig), max(dpi, PROJECTOR_DPI)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


# ---------------------------------------------------------------------------------- projector mode, for every figure
# The widget has its own projector mode (larger chips and text). This is the same for matplotlib: one switch,
# `viz.projector(True)` (or MTPLAB_PROJECTOR=1 in the environment before Jupyter starts), and every figure shown
# afterwards, whoever made it, is drawn larger and sharper: no text under PROJECTOR_MIN_PT points, text scaled up
# by PROJECTOR_TEXT, the figure PROJECTOR_SIZE times as large so the larger text still fits, at PROJECTOR_DPI.
# At the defaults an 8-point tick label (11 px at 100 dpi) becomes 14 points at 150 dpi: 29 px, legible from the
# back of a lecture room on a 1080p projector.
PROJECTOR_MIN_PT = 14.0
PROJECTOR_TEXT = 1.3
PROJECTOR_SIZE = 1.4
PROJECTOR_DPI = 150
_PROJECTOR: dict = {"on": False, "previous": None}


def for_projector(fig: Figure) -> Figure:
    """Scale one figure for a projector, in place, once: every text at least PROJECTOR_MIN_PT points, the figure
    PROJECTOR_SIZE times as large, its dpi PROJECTOR_DPI. Returns the figure."""
    if getattr(fig, "_mtplab_projector", False):
        return fig
    from matplotlib import rcParams
    from matplotlib.font_manager import FontProperties
    from matplotlib.text import Text

    w, h = fig.get_size_inches()
    fig.set_size_inches(w * PROJECTOR_SIZE, h * PROJECTOR_SIZE)
    fig.set_dpi(PROJECTOR_DPI)
    for t in fig.findobj(Text):
        t.set_fontsize(max(PROJECTOR_MIN_PT, PROJECTOR_TEXT * t.get_fontsize()))
    for ax in fig.axes:  # tick labels made later, at draw time, take the axes' tick size: set it too
        for name in ("x", "y"):
            labels = getattr(ax, f"get_{name}ticklabels")()
            size = labels[0].get_fontsize() if labels else FontProperties(size=rcParams[f"{name}tick.labelsize"]).get_size()
            ax.tick_params(axis=name, which="both", labelsize=max(PROJECTOR_MIN_PT, PROJECTOR_TEXT * size))
    fig._mtplab_projector = True
    return fig


def _png_for_display(fig: Figure) -> bytes:
    buf = io.BytesIO()
    for_projector(fig).savefig(buf, format="png", dpi=PROJECTOR_DPI, bbox_inches="tight")
    return buf.getvalue()


def projector(on: bool = True) -> bool:
    """The one switch for figures. On: every matplotlib Figure a notebook shows from now on goes through
    `for_projector` (an IPython display formatter for Figure, registered after `%matplotlib inline`'s), and `png`
    (the HTML views) does the same. Off: the formatter that was there before comes back. Returns the new state."""
    _PROJECTOR["on"] = bool(on)
    try:
        from IPython import get_ipython
    except ImportError:  # no notebook: png() alone follows the switch
        return _PROJECTOR["on"]
    ip = get_ipython()
    if ip is None:
        return _PROJECTOR["on"]
    fmt = ip.display_formatter.formatters["image/png"]
    if on and _PROJECTOR["previous"] is None:
        _PROJECTOR["previous"] = (fmt.for_type(Figure, _png_for_display),)
    elif not on and _PROJECTOR["previous"] is not None:
        prev = _PROJECTOR["previous"][0]
        if prev is None:
            fmt.pop(Figure, None)
        else:
            fmt.for_type(Figure, prev)
        _PROJECTOR["previous"] = None
    return _PROJECTOR["on"]


if os.environ.get("MTPLAB_PROJECTOR") == "1":
    projector(True)
