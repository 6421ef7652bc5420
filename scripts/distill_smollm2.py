"""The real model's distillation, resumable: python scripts/distill_smollm2.py WORK [stage ...] [--resume]

Stages: prompts answers cache (data), deepseek stern (heads on the cache). One thread: run it beside other work.
"""
import sys
import time
import torch
from mtplab.hf.distill import HeadsRun, TrunkCache, Work, fit_heads, load_vocab, stage_answers, stage_cache, \
    stage_prompts
from mtplab.hf.real import resolve_model
from mtplab.hf.target import load_hf

HEADS = {"deepseek": dict(n_depths=2, steps=1200, batch_size=8, lr=1e-3, unroll=3),
         "stern": dict(n_depths=4, steps=1200, batch_size=8, lr=1e-3, unroll=3)}
VOCAB = 8192


def log(msg):
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    resume = "--resume" in sys.argv
    work = Work(args[0])
    stages = args[1:] or ["prompts", "answers", "cache"]
    torch.set_num_threads(1)
    target = load_hf(resolve_model("smollm2"))
    prompts = stage_prompts(target, work, n_magpie=320, n_template=1120, log=log)
    log(f"{len(prompts)} prompts")
    if "answers" in stages:
        stage_answers(target, work, prompts, max_new_tokens=128, batch_size=24, log=log)
    if "cache" in stages:
        stage_cache(target, work, log=log)
    for fam in ("deepseek", "stern"):
        if fam not in stages:
            continue
        opts = HEADS[fam]
        cache = TrunkCache.load(work)
        vocab = load_vocab(work, VOCAB)
        log(f"{fam}: {len(cache.rows)} sequences, {cache.tokens} answer tokens, draft vocabulary {len(vocab)}")
        run = HeadsRun(work.dir / f"{fam}.pt", resume=resume, settings={"heads": fam, "vocab": VOCAB, **opts})
        fit_heads(target, cache, vocab, heads=fam, run=run, log=log, **opts)


if __name__ == "__main__":
    main()
