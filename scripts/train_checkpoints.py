"""The GPU recipe: every checkpoint and the equal-token cost study, several runs at once on one GPU.

The shipped checkpoints came from scripts/train_cpu.sh (see data/README.md); this script produced the
equal-token cost study quoted there, on an H200.

    python scripts/train_checkpoints.py --out runs/ckpt            # full size (GPU)
    python scripts/train_checkpoints.py --out /tmp/ck --scale smoke  # minutes on a CPU, to check the pipeline

Phase 1: the next-token `ntp` model, the small `draft` model, and the equal-token cost study
(next-token, Stern, Meta and DeepSeek trained jointly from scratch for the same steps).
Phase 2: head families on the frozen `ntp` trunk (the shipped regime), and Stern fine-tuned jointly
from `ntp` (for the frozen-against-fine-tuned comparison). Each run logs to OUT/NAME.log.
"""
import argparse
import os
import subprocess
import sys
import time

SCALES = {
    # name: (ntp steps, cost-study steps, head steps, batch size, ntp preset, phase-1 and phase-2 time caps in s)
    "full": (5000, 2000, 2500, 64, "classroom", 230, 170),
    "smoke": (30, 20, 20, 4, "tiny", None, None),
}


def launch(out, name, args):
    log = open(os.path.join(out, f"{name}.log"), "w")
    cmd = [sys.executable, "-m", "mtplab", "train", "--out", out, "--name", name, "--no-progress"] + args
    log.write(" ".join(cmd) + "\n")
    log.flush()
    env = dict(os.environ, OMP_NUM_THREADS="2", PYTHONUNBUFFERED="1")
    return name, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), time.time()


def wait(procs):
    ok = True
    for name, p, t0 in procs:
        rc = p.wait()
        print(f"{name}: exit {rc} after {time.time() - t0:.0f}s", flush=True)
        ok &= rc == 0
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--scale", default="full", choices=SCALES)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    ntp_steps, cost_steps, head_steps, bs, pre, t1, t2 = SCALES[a.scale]
    lim1 = ["--max-seconds", str(t1)] if t1 else []
    lim2 = ["--max-seconds", str(t2)] if t2 else []
    common = ["--corpus", "code", "--batch-size", str(bs), "--save-dtype", "fp16", "--seed", "0"]
    common1, common2 = common + lim1, common + lim2
    ev = ["--eval-every", str(max(1, cost_steps // 10))]
    phase1 = [
        launch(a.out, "ntp", common1 + ["--preset", pre, "--steps", str(ntp_steps), "--dropout", "0.1", "--lr", "2e-3"]),
        launch(a.out, "draft", common1 + ["--preset", "draft" if a.scale == "full" else "tiny", "--steps", str(ntp_steps), "--lr", "3e-3"]),
        launch(a.out, "cost-ntp", common1 + ev + ["--preset", pre, "--steps", str(cost_steps), "--dropout", "0.1", "--lr", "2e-3"]),
        launch(a.out, "cost-stern-k4", common1 + ev + ["--preset", pre, "--steps", str(cost_steps), "--dropout", "0.1", "--lr", "2e-3", "--heads", "stern", "--depths", "4"]),
        launch(a.out, "cost-meta-k4", common1 + ev + ["--preset", pre, "--steps", str(cost_steps), "--dropout", "0.1", "--lr", "2e-3", "--heads", "meta", "--depths", "4"]),
        launch(a.out, "cost-deepseek-d1", common1 + ev + ["--preset", pre, "--steps", str(cost_steps), "--dropout", "0.1", "--lr", "2e-3", "--heads", "deepseek", "--modules", "1"]),
    ]
    ok = wait(phase1[:1])
    base = os.path.join(a.out, "ntp")
    heads = ["--from", base, "--steps", str(head_steps), "--lr", "2e-3"]
    phase2 = [
        launch(a.out, "stern-k4", common2 + heads + ["--heads", "stern", "--depths", "4", "--freeze-trunk"]),
        launch(a.out, "meta-k4", common2 + heads + ["--heads", "meta", "--depths", "4", "--freeze-trunk"]),
        launch(a.out, "deepseek-d1", common2 + heads + ["--heads", "deepseek", "--modules", "1", "--freeze-trunk"]),
        launch(a.out, "deepseek-d3", common2 + heads + ["--heads", "deepseek", "--modules", "3", "--freeze-trunk"]),
        launch(a.out, "finetuned-stern-k4", common2 + heads + ["--heads", "stern", "--depths", "4", "--lr", "5e-4"]),
    ]
    ok &= wait(phase1[1:] + phase2)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
