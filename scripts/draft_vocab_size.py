"""SmolLM2's draft vocabulary sized by decoding: the shipped heads' vocabulary and its most frequent tokens, raced.

    python scripts/draft_vocab_size.py                          # measure and print (run it alone: it times)
    MTPLAB_WRITE_SHIPPED=1 python scripts/draft_vocab_size.py --ship

The heads were trained over the draft vocabulary that the distillation's vocab stage chose by coverage (the smallest
size holding 98% of the held-out answers' tokens, else every token counted). Decoding weighs more than coverage: each
draft is projected onto every row of the vocabulary, so a smaller one makes every draft cheaper and loses the drafts
of the tokens it left out. `mtplab.distill.vocab.decode_sizes` races the sizes (DeepSeek D=1 reused, k=4) against AR on
the held-out prompts that `bench real` does not time (three per category), so that the size is not tuned on the
prompts that measure it. The tokens are ranked by their count in the model's own answers (data/chat/MODEL; that count
includes the answers of the 128 prompts held back from training, which no figure here is measured on; the held-out
prompts are in none of them). The coverage of the 24 held-out prompts' greedy answers (up to 256 tokens,
transformers' forward, batched) is measured beside it.

--ship rewrites the draft vocabulary inside both shipped heads files (their weights unchanged, bit for bit),
draft-vocab.json, and the record's `draft_vocab.decode` (the race, the machine, the coverage). `bench real` must then
be run again: its rows name the heads files by their sha256.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from mtplab.files import atomic_write_text  # noqa: E402
from mtplab.distill import workfiles as wf  # noqa: E402
from mtplab.distill.chatdata import ANSWER_TOKENS, decode_rows  # noqa: E402
from mtplab.hf.heads_file import load_heads, read_heads_info, read_heads_record, save_heads  # noqa: E402
from mtplab.hf.prompts import heldout_ids  # noqa: E402
from mtplab.hf.real import end_of_turn, real_model  # noqa: E402
from mtplab.hf.target import load_hf  # noqa: E402
from mtplab.distill.vocab import DECODE_SIZES, decode_sizes  # noqa: E402
from mtplab.paths import DATA_DIR, may_write_shipped  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--sizes", default=",".join(map(str, DECODE_SIZES)))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--m", type=int, default=128, help="new tokens per decode of the race")
    ap.add_argument("--ship", action="store_true", help="write the chosen vocabulary into what ships")
    a = ap.parse_args(argv)
    rm = real_model(a.model)
    if rm is None:
        raise SystemExit(f"{a.model} is not a real model the lab ships")
    if a.ship and not may_write_shipped():
        raise SystemExit("--ship replaces what the lab ships; set MTPLAB_WRITE_SHIPPED=1 to do it on purpose")
    out = rm.heads_dir
    target = load_hf(a.model)
    load_heads(target, out / "deepseek-d1.safetensors")
    counts: Counter = Counter()
    for shard in wf.data_shards(DATA_DIR / "chat" / rm.name, "answers"):
        counts.update(t for r in shard["rows"] for t in r["answer_ids"])
    stop = end_of_turn(target)
    every, cats = heldout_ids(target)
    # the race leaves out the first prompt of each category, the ones `bench real` times: the size is not tuned on them
    prompts = [p for i, (p, c) in enumerate(zip(every, cats)) if c in cats[:i]]
    answers = Counter(t for r in decode_rows(target.hf, every, max_new=ANSWER_TOKENS, stop=stop) for t in r)
    study = decode_sizes(target, prompts, counts, sizes=[int(s) for s in a.sizes.split(",")], m=a.m,
                         rounds=a.rounds, stop=stop, held_out=answers)
    print(f"{'size':>6} {'speedup':>8} {'range':>12} {'tok/fwd':>8} {'accept 1':>9} {'ms/draft':>9} {'held-out':>9}")
    for r in study["sizes"]:
        print(f"{r['size']:>6} {r['speedup']:>7.3f}x {r['speedup_min']:.2f}-{r['speedup_max']:.2f}x"
              f" {r['tokens_per_forward']:>8.2f} {r['first_draft_acceptance']:>9.3f} {r['ms_per_draft']:>9.2f}"
              f" {r['coverage_held_out']:>9.4f}")
    print(f"chosen: {study['chosen']} ({study['rule']}); busy: {study['busy']}; machine: {study['machine']}")
    if not a.ship:
        return 0
    if study["busy"]:
        raise SystemExit(f"not shipped: the race was not valid ({study['busy']}); run it again alone")
    ids = study.pop("ids")
    for name in ("deepseek-d1", "stern-k4"):  # the weights are read back and written in bf16 again: unchanged
        meta = read_heads_info(out / f"{name}.safetensors", tensors=False)["meta"]
        load_heads(target, out / f"{name}.safetensors")
        save_heads(target, out / name, dtype=torch.bfloat16, meta=meta, vocab=ids)
    held_out = next(r["coverage_held_out"] for r in study["sizes"] if r["size"] == len(ids))
    atomic_write_text(out / "draft-vocab.json", json.dumps({"n": len(ids), "coverage": held_out,
                                                            "coverage_of": "the held-out prompts' greedy answers",
                                                            "ids": ids}) + "\n")
    record = read_heads_record(out / "record.json")
    record["draft_vocab"]["decode"] = study
    atomic_write_text(out / "record.json", json.dumps(record, indent=1) + "\n")
    print(f"shipped the {len(ids):,}-token draft vocabulary into {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
