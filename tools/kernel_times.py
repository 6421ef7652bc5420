"""t(q)/t(1) of the linears of one SmolLM2-135M forward, stock F.linear against the exact kernel (mtplab.model.kernels).

The shapes are SmolLM2's (30 layers x q, k, v, o, gate, up, down: 576->576, 576->192 twice, 576->576, 576->1536
twice, 1536->576) and the tied 49,152 x 576 output projection: 211 linears, 537 MB of float32 weights, more than a
laptop's cache holds, so one pass streams the weights from memory as a forward does. Random weights: the time of a
linear does not depend on its values. One timed unit is one pass over all 211 linears with q rows each; the kernels,
thread counts and row counts are timed in interleaved rounds, in an order that rotates each round, and each keeps
its median and range. The machine is named under the table. Development numbers only on a busy machine.

    python -m tools.kernel_times                       # 1 and 2 threads, q = 1, 2, 4, 8, 16, 7 rounds
    python -m tools.kernel_times --threads 1 --rounds 3 --layers 4
"""
from __future__ import annotations

import argparse
import statistics

import torch

from mtplab.device import machine_line, now
from mtplab.model import kernels

LAYER = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]  # (out, in)
HEAD = (49152, 576)


def weights(layers: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(m, n, generator=g) * 0.02 for _ in range(layers) for m, n in LAYER] + \
        [torch.randn(*HEAD, generator=g) * 0.02]


def one_pass(ws: list[torch.Tensor], xs: dict, q: int, stock: bool) -> float:
    """Seconds for every linear once on q rows."""
    with torch.inference_mode(), kernels.use_stock(stock):
        t0 = now()
        for w in ws:
            kernels.linear(xs[q, w.shape[1]], w)
        return now() - t0


def measure(layers: int, qs: list[int], threads: list[int], rounds: int) -> dict:
    ws = weights(layers)
    g = torch.Generator().manual_seed(1)
    xs = {(q, n): torch.randn(q, n, generator=g) for q in qs for n in (576, 1536)}
    units = [(t, kind, q) for t in threads for kind in ("stock", "exact") for q in qs]
    times: dict = {u: [] for u in units}
    saved = torch.get_num_threads()
    try:
        for r in range(rounds + 1):  # round 0 warms up (packs the weights, compiles) and is not kept
            order = units[r % len(units):] + units[:r % len(units)]
            for t, kind, q in order:
                torch.set_num_threads(t)
                s = one_pass(ws, xs, q, kind == "stock")
                if r:
                    times[t, kind, q].append(s)
    finally:
        torch.set_num_threads(saved)
    return times


def report(times: dict, qs: list[int], threads: list[int]) -> str:
    lines = [f"{'threads':>7} {'kernel':>6} {'t(1) ms':>16} " + " ".join(f"{f't({q})/t(1)':>17}" for q in qs[1:])]
    for t in threads:
        for kind in ("stock", "exact"):
            base = statistics.median(times[t, kind, 1])
            cells = [f"{1e3 * base:6.1f} ({1e3 * min(times[t, kind, 1]):.1f}-{1e3 * max(times[t, kind, 1]):.1f})"]
            for q in qs[1:]:
                s = times[t, kind, q]
                cells.append(f"{statistics.median(s) / base:5.2f} ({min(s) / base:.2f}-{max(s) / base:.2f})")
            lines.append(f"{t:>7} {kind:>6} " + " ".join(f"{c:>17}" for c in cells))
    lines.append("medians over rounds (range: fastest-slowest round, each against the median t(1)); "
                 + machine_line() + "; " + kernels.status())
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--qs", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--layers", type=int, default=30, help="SmolLM2 has 30; fewer for a quick look")
    a = ap.parse_args(argv)
    qs = sorted(set(a.qs) | {1})
    print(report(measure(a.layers, qs, a.threads, a.rounds), qs, a.threads))


if __name__ == "__main__":
    main()
