"""Benchmarks (run alone: two torch processes on 2 cores slow each other down 30-200x).

    python -m mtplab bench train       tokens/s and peak memory of training, next-token vs each family at k=4
    python -m mtplab bench cost-curve  t(q)/t(1) of one cached forward over q new tokens, q = 1..16
    python -m mtplab bench decode      every method on the shipped checkpoints, against AR of the same model
    python -m mtplab bench crossover   oracle drafts on random models of growing width: where MTP starts to pay
    python -m mtplab bench batch       throughput and latency against batch size (mtplab.bench.batch)
    python -m mtplab bench tree        chain vs token trees (mtplab.bench.batch)
    python -m mtplab bench k           every family at k = 2..8, adaptive k, one module reused
    python -m mtplab bench regime      t(q)/t(1) against model size and the cache; the same heads on deeper trunks
    python -m mtplab bench peers       mtplab's loop beside transformers' generate on one HF model (--hf PATH)
    python -m mtplab bench domain      code against prose: acceptance and wall clock of one head family
    python -m mtplab bench real        SmolLM2-135M-Instruct with its shipped heads on held-out chat prompts

Compared runs are interleaved and reported as medians and ratios. Each writes OUT/NAME.json and
OUT/NAME.md (and a PNG where there is a figure), each naming the machine (`bench.report`).

* `costs`: train, cost-curve, crossover
* `decode`: every method against AR of the same checkpoint
* `batch`: batches and token trees
* `regime`: the cost of a forward against model size, and the same heads on deeper trunks
* `engines`: the best k, adaptive k, one DeepSeek module reused (`bench k`)
* `peers`: mtplab's loop beside Hugging Face's own `generate` on one model (`bench peers --hf PATH`)
* `domain`: code against prose, two trunks of one recipe with the same heads (`bench domain`)
* `real`: the real model (SmolLM2-135M-Instruct) with the heads trained on its trunk (`bench real`)
* `report`: the records, atomically written, each naming its machine

May import every layer below but `distill` (`viz` lazily: matplotlib), never `teaching` (the notebooks' companions).
"""
from __future__ import annotations

import json
from pathlib import Path

from mtplab.bench.batch import run_batch, run_tree
from mtplab.bench.costs import run_cost_curve, run_crossover, run_train
from mtplab.bench.decode import record_name, run_decode
from mtplab.bench.domain import run_domain
from mtplab.bench.engines import run_k
from mtplab.bench.peers import run_peers
from mtplab.bench.real import run_real
from mtplab.bench.regime import run_regime
from mtplab.errors import MtplabError

RUNS = {"train": run_train, "cost-curve": run_cost_curve, "decode": run_decode, "crossover": run_crossover,
        "batch": run_batch, "tree": run_tree, "regime": run_regime,
        "k": run_k, "peers": run_peers, "domain": run_domain,
        "real": run_real}


def main(a) -> None:
    if a.what not in RUNS:
        raise MtplabError(f"unknown benchmark {a.what!r}; choose one of {', '.join(RUNS)}")
    data = RUNS[a.what](a)
    if a.json:
        print(json.dumps(data))
    else:
        # the record's name as its run wrote it: these four by their settings, the others NAME (NAME-quick with --quick)
        named = {"cost-curve": f"cost-curve-{a.preset}-{a.dtype}", "decode": record_name(a),
                 "crossover": f"crossover-{a.dtype}", "train": "train"}
        name = named.get(a.what) or (f"{a.what}-quick" if a.quick else a.what)
        print(Path(a.out, f"{name}.md").read_text())
