"""The acceptance lab's decode on a GPU, for every method: what the widget would show, and where the time goes.

    python scripts/gpu_widget_check.py                    # CUDA (the default), every method, 5 timed pairs each
    python scripts/gpu_widget_check.py --device cpu       # the same on the CPU (a dry run of this script)
    python scripts/gpu_widget_check.py --quick            # 2 timed pairs and 24 new tokens: a few seconds a method

It drives the lab's own functions (the ones the widget's buttons call): `session.decoded` picks the device the way
the widget's device dropdown does and races the decode (probe=True: what each step's accept rule saw) against AR,
`repeats` interleaved rounds through `mtplab.measuring.race`, every clock read after a device sync; `state.run_all`
reveals every step. For each method it prints tokens per
forward, the wall clock (median and range), the speedup over AR and the decode's time split (target forwards,
drafter, the rest of the loop), and checks that greedy output equals AR token for token. Then it builds the
widget itself (`AcceptanceLab`, when ipywidgets is installed) with device='auto' and checks that it decoded on
the device asked for. It stops starting new methods when --budget-s is spent (default 480 s: under the 10
minutes a lent GPU gives one command). Exit status 1 when a method failed or greedy output differed from AR.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from mtplab.decoding.drafters import METHODS  # noqa: E402
from mtplab.device import machine_line  # noqa: E402
from mtplab.teaching.acceptance_lab import session as lab_session, state as lab_state  # noqa: E402

# (label, settings): every method on its default checkpoint, and DeepSeek's D = 3 beside D = 1
CASES = [(name, dict(method=name, k=4 if name != "ar" else 1)) for name in METHODS if name != "deepseek"]
CASES[3:3] = [("deepseek D=1", dict(method="deepseek", k=2)),
              ("deepseek D=3", dict(method="deepseek", k=4, checkpoint="deepseek-d3"))]
PROMPT = lab_state.DEFAULT_PROMPT


def row(label: str, st: lab_state.LabState) -> dict:
    method = st.method
    walls_ar, walls = st.walls["ar"], st.walls[method]
    split = st.splits[method]
    steps = max(1, st.total_steps - 1)
    return {"case": label, "method": method, "k": st.k, "checkpoint": st.checkpoint_name, "device": st.device_name,
            "tokens": len(st.trace.tokens), "steps": st.total_steps, "tokens_per_forward": st.trace.tokens_per_forward,
            "wall_ms": 1e3 * statistics.median(walls), "wall_ms_range": [1e3 * min(walls), 1e3 * max(walls)],
            "ar_ms": 1e3 * statistics.median(walls_ar), "ar_ms_range": [1e3 * min(walls_ar), 1e3 * max(walls_ar)],
            "speedup": statistics.median(walls_ar) / statistics.median(walls),
            "split_ms": {k: 1e3 * v for k, v in split.items()},
            "step_ms": {k: 1e3 * v / steps for k, v in split.items()},
            "greedy_equal_ar": (st.trace.tokens == st.baseline.tokens) if float(st.temperature) == 0 else None,
            "parts_within_wall": sum(split.values()) <= max(walls) * 1.02}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N, cpu or mps")
    ap.add_argument("--repeats", type=int, default=5, help="timed (AR, method) pairs per method (default 5)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="2 pairs, 24 new tokens")
    ap.add_argument("--budget-s", type=float, default=480.0, help="start no new method after this many seconds")
    ap.add_argument("--out", type=Path, help="also write the rows as JSON here")
    a = ap.parse_args(argv)
    repeats, m = (2, 24) if a.quick else (a.repeats, a.max_new_tokens)
    t_start = time.perf_counter()
    try:
        where = machine_line(a.device if a.device != "auto" else "cpu")
    except Exception as e:  # noqa: BLE001 - no such device: each method's decode says so below
        where = f"device {a.device}: {e}"
    print(where, flush=True)
    models = lab_session.ModelCache()
    rows, failed = [], []
    for label, settings in CASES:
        if time.perf_counter() - t_start > a.budget_s:
            failed.append((label, f"skipped: the {a.budget_s:.0f} s budget is spent"))
            continue
        t0 = time.perf_counter()
        st = lab_state.run_all(lab_session.decoded(lab_state.LabState(prompt=PROMPT, device=a.device, max_new_tokens=m,
                                                                      repeats=repeats, **settings), models))
        if st.error:
            failed.append((label, st.error))
            print(f"{label:18s} FAILED: {st.error}", flush=True)
            continue
        r = row(label, st)
        rows.append(r)
        s = r["step_ms"]
        print(f"{label:18s} k={r['k']} {r['device']}: {r['tokens_per_forward']:.2f} tok/fwd, "
              f"{r['wall_ms']:.1f} ms [{r['wall_ms_range'][0]:.1f}, {r['wall_ms_range'][1]:.1f}] vs AR "
              f"{r['ar_ms']:.1f} ms [{r['ar_ms_range'][0]:.1f}, {r['ar_ms_range'][1]:.1f}] -> {r['speedup']:.2f}x; "
              f"per step: target {s['target_s']:.2f} ms, drafter {s['draft_s']:.2f} ms, rest {s['rest_s']:.2f} ms; "
              f"greedy == AR: {r['greedy_equal_ar']}; {time.perf_counter() - t0:.1f} s", flush=True)
        if r["greedy_equal_ar"] is False:
            failed.append((label, "greedy output differs from AR"))
        if not r["parts_within_wall"]:
            failed.append((label, "target + drafter + rest exceed the synced wall clock: a timer is not synced"))
    # the widget itself, device 'auto': the dropdown's default must land on the device asked for
    try:
        from mtplab.teaching.acceptance_lab.view import AcceptanceLab

        lab = AcceptanceLab(models=models, device="auto" if a.device.startswith("cuda") else a.device,
                            max_new_tokens=m, repeats=repeats).step(3)
        want = a.device.split(":")[0]
        ok = lab.state.error == "" and lab.state.device_name.startswith(want)
        print(f"widget, device auto: {lab.state.device_name or lab.state.error}; {lab.state.method} k={lab.state.k}; "
              f"{'ok' if ok else 'NOT on ' + want}", flush=True)
        if not ok:
            failed.append(("widget", lab.state.error or f"decoded on {lab.state.device_name}, not {want}"))
    except ImportError as e:
        print(f"widget: not built ({e})")
    if a.out:
        a.out.write_text(json.dumps({"machine": where, "max_new_tokens": m, "repeats": repeats,
                                     "rows": rows, "failed": failed}, indent=1))
    print(f"{len(rows)} of {len(CASES)} methods in {time.perf_counter() - t_start:.0f} s"
          + ("; failed: " + "; ".join(f"{k}: {v}" for k, v in failed) if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
