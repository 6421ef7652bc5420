"""The distillation's trunk cache: its work folder (`Work`) with its answers and their held-back split (`split`), one
trunk forward per answered prompt (`cache_tensors`) and every cached sequence in memory for training (`TrunkCache`).
`mtplab.distill.pipeline` runs the stages on them.

B batch, T time, C channels (hidden size).
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
import torch
from mtplab.device import now
from mtplab.errors import MtplabError
from mtplab.files import MAX_JSON, atomic_write, atomic_write_text, json_file
from mtplab.distill import workfiles as wf
from mtplab.training.heads import held_back

TOPK = 8  # target probabilities kept per position in the cache
VAL_ROWS = 128             # prompts held back for validation (`training.heads.held_back`), never counted or trained on


class Work:
    """The distillation's work folder: answers/NNNNN.json shards, cache/NNNNN.safetensors shards, vocab-N.json,
    times.json and the heads' save sets. Every file is written atomically; a stage skips what is done."""

    def __init__(self, folder):
        self.dir = Path(folder)
        for sub in ("answers", "cache"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.V, self.ctx, self.C = 1 << 24, 1 << 24, None  # the model's sizes the files are checked against

    def limits(self, target) -> "Work":
        """Check the files against this model: token ids against its vocabulary, lengths against its context,
        cached hidden states against its width."""
        self.V, self.ctx, self.C = target.config.vocab_size, target.config.block_size, target.config.n_embd
        return self

    def read_answers(self, shard: Path) -> list[dict]:
        return wf.read_answer_shard(shard, vocab_size=self.V, context=self.ctx)

    def write_json(self, name: str, obj) -> None:
        atomic_write_text(self.dir / name, json.dumps(obj) + "\n")

    @contextmanager
    def timed(self, stage: str):
        """Add this stage's CPU seconds (all threads of this process) and wall seconds to times.json."""
        cpu, wall = time.process_time(), now()
        try:
            yield
        finally:
            t = wf.read_times(self.dir / "times.json") if os.path.lexists(self.dir / "times.json") else {}
            c, w = t.get(stage, [0.0, 0.0])
            t[stage] = [c + time.process_time() - cpu, w + now() - wall]
            self.write_json("times.json", t)

    def shards(self, sub: str) -> list[Path]:
        return wf.shards(self.dir / sub, suffix=".json" if sub == "answers" else ".safetensors")

    def answers(self) -> list[dict]:
        """Every answered prompt of answers/, in shard order."""
        return [r for s in self.shards("answers") for r in self.read_answers(s)]


def check_cached(work: Work) -> None:
    """Every answer shard has its cache shard, else one line naming both ways on."""
    have, want = {p.stem for p in work.shards("cache")}, {p.stem for p in work.shards("answers")}
    if want - have:
        raise MtplabError(f"{work.dir / 'cache'} holds {len(have & want)} of {len(want)} answer shards: run the cache "
                          "stage to the end, or the trim stage to train on the shards cached")


def fingerprint(rows: list[dict]) -> str:
    return hashlib.sha256(json.dumps([r["prompt_ids"] for r in rows]).encode()).hexdigest()


def split(work: Work, rows: list[dict] | None = None, *, val_rows: int = VAL_ROWS, seed: int = 0):
    """(held back, trained): `training.heads.held_back` over this work folder's rows, drawn from the rows before it grew when
    it did (split.json, checked against their fingerprint)."""
    rows = work.answers() if rows is None else rows
    return held_back(len(rows), val_rows=val_rows, seed=seed, drawn=drawn_rows(work, rows))


def drawn_rows(work: Work, rows: list[dict]) -> int | None:
    """The rows the held-back split is drawn from: all (None) unless the folder grew (split.json)."""
    path = work.dir / "split.json"
    if not os.path.lexists(path):
        return None
    s = json_file(path, limit=MAX_JSON, what="the held-back split", fix="restore it from a backup")
    n = s.get("rows") if isinstance(s, dict) else None
    if not isinstance(n, int) or isinstance(n, bool) or not 0 < n <= len(rows) \
            or fingerprint(rows[:n]) != s.get("fingerprint"):
        raise MtplabError(f"{path} does not fit the answers in {work.dir / 'answers'} (the first rows were moved or "
                          "changed since the folder grew); put them back, or start a new work folder")
    return n


@torch.inference_mode()
def cache_tensors(target, rows: list[dict]) -> dict:
    """The trunk over answered prompts ({"prompt_ids", "answer_ids"} each), one sequence per forward (nothing padded
    is computed, and one sequence's logits at a time are in memory), stored right-padded: tokens, hidden (bf16), the
    target's top-k ids and probabilities, lengths and prompt lengths."""
    seqs = [r["prompt_ids"] + r["answer_ids"] for r in rows]
    B, T, C = len(seqs), max(len(s) for s in seqs), target.config.n_embd
    out = {"tokens": torch.zeros(B, T, dtype=torch.long), "hidden": torch.zeros(B, T, C, dtype=torch.bfloat16),
           "top_i": torch.zeros(B, T, TOPK, dtype=torch.int32), "top_p": torch.zeros(B, T, TOPK, dtype=torch.half),
           "length": torch.tensor([len(s) for s in seqs]),
           "prompt_len": torch.tensor([len(r["prompt_ids"]) for r in rows])}
    for b, s in enumerate(seqs):
        n = len(s)
        out["tokens"][b, :n] = torch.tensor(s)
        res = target(out["tokens"][b:b + 1, :n].to(target.wte.weight.device))
        top_p, top_i = torch.softmax(res.logits[0].float(), -1).topk(TOPK, dim=-1)  # (n, TOPK)
        out["hidden"][b, :n] = res.hidden[0].to(torch.bfloat16).cpu()
        out["top_i"][b, :n], out["top_p"][b, :n] = top_i.int().cpu(), top_p.half().cpu()
    return out


def write_cache(path: Path, target, rows: list[dict]) -> None:
    """`cache_tensors` of the rows, written atomically as one safetensors shard."""
    from safetensors.torch import save_file
    t = cache_tensors(target, rows)
    atomic_write(path, lambda tmp: save_file({k: v.contiguous() for k, v in t.items()}, tmp))


# ------------------------------------------------------------------------------------------- training on the cache
class TrunkCache:
    """Every cached sequence in memory: hidden (bf16), tokens, the target's top-k, lengths and prompt lengths."""

    def __init__(self, shards: list[dict]):
        self.rows: list[dict] = []
        for t in shards:
            for b in range(t["tokens"].shape[0]):
                n = int(t["length"][b])
                self.rows.append({"tokens": t["tokens"][b, :n], "hidden": t["hidden"][b, :n],
                                  "top_i": t["top_i"][b, :n].long(), "top_p": t["top_p"][b, :n].float(),
                                  "prompt_len": int(t["prompt_len"][b])})
        if not self.rows:
            raise MtplabError("the trunk cache holds no sequences; run the answers and cache stages first")

    @classmethod
    def load(cls, work: Work, *, limit: int | None = None) -> "TrunkCache":
        return cls([wf.read_cache_shard(p, vocab_size=work.V, hidden=work.C, topk=TOPK, context=work.ctx)
                    for p in work.shards("cache")[:limit]])

    @property
    def tokens(self) -> int:
        return sum(len(r["tokens"]) - r["prompt_len"] for r in self.rows)

    def batch(self, idx: list[int], device="cpu") -> dict:
        rows = [self.rows[i] for i in idx]
        T = max(len(r["tokens"]) for r in rows)
        C = rows[0]["hidden"].shape[-1]
        out = {"tokens": torch.zeros(len(rows), T, dtype=torch.long), "hidden": torch.zeros(len(rows), T, C),
               "top_i": torch.zeros(len(rows), T, TOPK, dtype=torch.long), "top_p": torch.zeros(len(rows), T, TOPK),
               "answer": torch.zeros(len(rows), T, dtype=torch.bool)}
        for b, r in enumerate(rows):
            n = len(r["tokens"])
            for k in ("tokens", "hidden", "top_i", "top_p"):  # hidden: bf16 in the cache, float32 in the batch
                out[k][b, :n] = r[k]
            out["answer"][b, r["prompt_len"]:n] = True  # positions whose token is part of the answer
        return {k: v.to(device) for k, v in out.items()}


def heldout_cache(work: Work) -> tuple[list[dict], "TrunkCache"]:
    """The held-out prompts' answers and their trunk cache (the heldout stage's files)."""
    path, cpath = work.dir / "heldout.json", work.dir / "heldout.safetensors"
    if not (os.path.lexists(path) and os.path.lexists(cpath)):
        raise MtplabError(f"{work.dir} holds no held-out answers and cache; run the heldout stage first "
                          "(--stages heldout)")
    rows = work.read_answers(path)
    cache = TrunkCache([wf.read_cache_shard(cpath, vocab_size=work.V, hidden=work.C, topk=TOPK, context=work.ctx)])
    if len(cache.rows) != len(rows):
        raise MtplabError(f"{work.dir} holds {len(rows)} held-out answers and {len(cache.rows)} cached rows: "
                          f"{cpath.name} is stale; delete it and rerun the heldout stage")
    return rows, cache
