"""SmolLM2's draft heads retrained in one sitting on a GPU, within a time budget.

    MTPLAB_WRITE_SHIPPED=1 python scripts/distill_gpu.py runs/gpu --budget 420 --ship data/hf/smollm2

The stages of `mtplab distill` on every answer of data/chat/smollm2, in one process: import, the held-out answers,
the trunk cache (`--cache-seconds` cuts it and trims, as distill's --max-seconds does); then the draft vocabulary
of the shipped heads is kept (`keep_vocab`: its size was chosen by measurement on a CPU, where drafts are
projected, and the heads files keep their shape); then the DeepSeek module and the Stern heads, each given a share
of the time left (`--shares`; a family whose share is 0 is not trained, and ship keeps its last save set). Each
family's step count comes from a timed probe (an 80-step run less a 40-step one, after a warm-up run) times
`--probe-factor`, so that its warm-up-then-cosine schedule ends inside its share; a time limit stays as a
backstop. `--ship` writes what ships with the record, which names the GPU and its host. `--model DIR` and
`--answers N` run the same path on another Llama folder with the SmolLM2 tokenizer and fewer answers (a tiny random
Llama checked it on the GPU before the real run). data/chat/README.md says how the shipped heads were made with it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from mtplab.device import now, pick  # noqa: E402
from mtplab.distill import pipeline as d  # noqa: E402
from mtplab.hf.heads_file import read_heads_record, read_vocab  # noqa: E402
from mtplab.hf.real import real_model  # noqa: E402
from mtplab.training.heads import fit_heads  # noqa: E402
from mtplab.hf.target import load_hf  # noqa: E402
from mtplab.distill.trunkcache import TrunkCache, Work, split  # noqa: E402
from mtplab.distill.vocab import coverage, load_vocab, token_counts  # noqa: E402
from mtplab.paths import DATA_DIR  # noqa: E402

T0 = now()


def log(msg: str) -> None:
    print(f"[{now() - T0:6.1f} s] {msg}", flush=True)


def keep_vocab(work: Work, shipped: Path) -> int:
    """The shipped heads' draft vocabulary as this work folder's choice: vocab-study.json from the shipped record
    (its sizes, coverages and projection times were measured when it was chosen) and vocab-N.json with the same ids,
    its coverage measured on this folder's held-back answers. Returns N."""
    ids = read_vocab(shipped / "draft-vocab.json", vocab_size=work.V, shipped=True)
    study = read_heads_record(shipped / "record.json").get("draft_vocab")
    if not isinstance(study, dict):
        raise SystemExit(f"{shipped / 'record.json'} holds no draft vocabulary study; restore it from git")
    rows = work.answers()
    back = token_counts(rows[i] for i in split(work, rows)[0])
    work.write_json(f"vocab-{len(ids)}.json", {"n": len(ids), "ids": ids, "coverage": coverage(back, ids)})
    work.write_json("vocab-study.json", {**study, "chosen": len(ids),
                                         "kept": f"the draft vocabulary of the heads in {shipped} before this sitting"})
    return len(ids)


def probe(target, cache, vocab, fam: str, opts: dict) -> float:
    """Seconds per training step of `fam` at these options: after a 20-step warm-up run, an 80-step run less a
    40-step one, over 40 (both validate 20 times on 8 rows, so the difference is 40 steps alone)."""
    spent = []
    for steps in (20, 40, 80):
        t = now()
        fit_heads(target, cache, vocab, heads=fam, **{**opts, "steps": steps, "val_rows": 8})
        if target.wte.weight.is_cuda:
            torch.cuda.synchronize()
        spent.append(now() - t)
    return max(1e-3, (spent[2] - spent[1]) / 40)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("work")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--data", default=None, help="default data/chat/smollm2")
    ap.add_argument("--answers", type=int, default=None, help="import this many answers (default all)")
    ap.add_argument("--budget", type=float, required=True, help="seconds for the whole run")
    ap.add_argument("--shares", default="0.6,0.4", help="shares of the training time: deepseek,stern")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-steps", type=int, default=8000)
    ap.add_argument("--probe-factor", type=float, default=1.1,
                    help="a step's cost over the probe's (the run's 20 validations on the held-back rows)")
    ap.add_argument("--min-steps", type=int, default=50)
    ap.add_argument("--held-out-tokens", type=int, default=None, help="cap on each held-out answer (default 256)")
    ap.add_argument("--cache-seconds", type=float, default=None,
                    help="cut the trunk cache after this long and train on the shards cached (trim)")
    ap.add_argument("--reserve", type=float, default=60.0, help="seconds kept for shipping")
    ap.add_argument("--ship", default=None, help="folder to ship into (data/hf/smollm2 for the real model)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--warm", action="store_true",
                    help="start each family from its shipped heads (data/hf/smollm2/FAMILY-*.safetensors)")
    ap.add_argument("--lr", type=float, default=None, help="peak learning rate (default the recipe's)")
    a = ap.parse_args(argv)
    dev = pick(a.device)
    rm = real_model(a.model)
    data = Path(a.data) if a.data else DATA_DIR / "chat" / "smollm2"
    shipped = DATA_DIR / "hf" / "smollm2"
    work = Work(a.work)
    target = load_hf(a.model, device=dev)
    work.limits(target)
    log(f"model on {dev} ({torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu'}), torch {torch.__version__}")
    with work.timed("answers"):
        d.stage_import(target, work, data, limit=a.answers, log=log)
    with work.timed("heldout"):
        d.stage_heldout(target, work, max_new=a.held_out_tokens, log=log)
    with work.timed("cache"):
        d.stage_cache(target, work, log=None, max_seconds=a.cache_seconds)
    if a.cache_seconds is not None:
        d.keep_cached(work, log=log)
    log(f"cache: {len(work.shards('cache'))} shards")
    n = keep_vocab(work, shipped)
    vocab = load_vocab(work, n)
    cache = TrunkCache.load(work)
    log(f"{len(cache.rows)} sequences, {cache.tokens} answer tokens, draft vocabulary {n}")
    shares = dict(zip(("deepseek", "stern"), (float(x) for x in a.shares.split(","))))
    left = a.budget - (now() - T0) - a.reserve
    plan = {}
    for fam, share in [(f, x) for f, x in shares.items() if x > 0]:
        opts = {k: v for k, v in d.GPU_RECIPE["heads"][fam].items() if k != "steps"}
        opts["batch_size"] = a.batch_size
        if a.lr is not None:
            opts["lr"] = a.lr
        if a.warm:
            found = sorted(shipped.glob(f"{fam}-*.safetensors"))
            if len(found) != 1:
                raise SystemExit(f"--warm needs one {fam}-*.safetensors in {shipped}; found {len(found)}")
            opts["init"] = str(found[0])
        per = probe(target, cache, vocab, fam, opts)
        plan[fam] = (opts, per, share)
        log(f"{fam}: {per * 1e3:.1f} ms a step at batch {a.batch_size}")
    left = a.budget - (now() - T0) - a.reserve
    for i, (fam, (opts, per, share)) in enumerate(plan.items()):
        mine = max(0.0, share * left)
        later = sum(p[2] for p in list(plan.values())[i + 1:]) * left  # what the families after this one need
        hard = max(10.0, a.budget - a.reserve - (now() - T0) - later)  # the backstop never eats their time
        steps = int(max(a.min_steps, min(a.max_steps, mine / (per * a.probe_factor))))
        log(f"{fam}: {steps} steps in about {steps * per * a.probe_factor:.0f} s")
        d.stage_heads(target, work, fam, {"heads": {fam: opts}}, steps=steps, log=log, cache=cache, overwrite=True,
                      max_seconds=min(1.3 * mine + 10, hard))
    if a.ship:
        os.environ["MTPLAB_WRITE_SHIPPED"] = "1"
        out = Path(a.ship)
        like = rm if rm is not None and out.resolve() == rm.heads_dir.resolve() else SimpleNamespace(
            name=a.model, package="-", version="-", gguf_sha256="-", heads_dir=out)
        d.ship(target, work, like, log=log, data=data, cache=cache)
        rec = json.loads((out / "record.json").read_text())
        for name, h in rec["heads"].items():
            ag = h.get("agreement", {})
            log(f"{name}: {h['steps']} steps; held-back {[round(x, 3) for x in ag.get('held_back', [])]}, held-out "
                f"{[round(x, 3) for x in ag.get('held_out', [])]}")
    log(f"done in {time.process_time():.0f} CPU s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
