"""The real model's own chat data (data/chat/MODEL: its questions and greedy answers), as `distill` reads it.

The data is written by scripts/make_chat_data.py (its docstring has the recipe); what ships is data, not lab code.
Here: its folder (`DataWork`: shards read back validated, their summed CPU and wall seconds), the batched decoder its
answers were made with (`decode_rows`, which the held-out answers reuse), their length cap (`ANSWER_TOKENS`) and the
order partial work is done in (`spread`).
"""
from __future__ import annotations

from pathlib import Path
import torch
from mtplab.distill.workfiles import data_shards

ANSWER_TOKENS = 256


@torch.inference_mode()
def decode_rows(hf, prompts: list[list[int]], *, max_new: int, stop: int, pad: int = 0, temperature: float = 0.0,
                top_p: float = 0.95, seed: int = 0) -> list[list[int]]:
    """Each row's new tokens (up to and including `stop`), greedy at temperature 0, else sampled (top-p).

    Left padding; a finished row leaves the batch (its cache rows are dropped), so a batch costs what its live
    rows cost, not 64 rows times the longest answer. The bookkeeping and the sampling stay on the CPU (the seeded
    generator draws the same tokens on any device); only the model's inputs go to its device."""
    import inspect
    from transformers import DynamicCache
    kw = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"  # renamed in 5.x
    B, W = len(prompts), max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (W - len(p)) + list(p) for p in prompts])
    mask = (torch.arange(W)[None] >= torch.tensor([W - len(p) for p in prompts])[:, None]).long()
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    cache = DynamicCache(config=hf.config)
    dev = hf.device
    gen = torch.Generator().manual_seed(seed)
    out: list[list[int]] = [[] for _ in range(B)]
    alive = list(range(B))
    logits = hf(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev), use_cache=True,
                logits_to_keep=1, **{kw: cache}).logits[:, -1].float().cpu()
    last = pos[:, -1]
    for _ in range(max_new):
        if temperature > 0:
            probs = torch.softmax(logits / temperature, -1)
            sp, si = probs.sort(-1, descending=True)
            sp[(sp.cumsum(-1) - sp) > top_p] = 0
            nxt = si.gather(-1, torch.multinomial(sp, 1, generator=gen)).squeeze(-1)
        else:
            nxt = logits.argmax(-1)
        keep = []
        for j, r in enumerate(alive):
            out[r].append(int(nxt[j]))
            if out[r][-1] != stop and len(out[r]) < max_new:
                keep.append(j)
        if not keep:
            break
        if len(keep) < len(alive):
            idx = torch.tensor(keep)
            cache.batch_select_indices(idx.to(dev))
            mask, nxt, last, alive = mask[idx], nxt[idx], last[idx], [alive[j] for j in keep]
        mask = torch.cat([mask, torch.ones(len(alive), 1, dtype=mask.dtype)], 1)
        last = last + 1
        logits = hf(input_ids=nxt[:, None].to(dev), attention_mask=mask.to(dev), position_ids=last[:, None].to(dev),
                    use_cache=True, **{kw: cache}).logits[:, -1].float().cpu()
    return out


class DataWork:
    """questions/, prompts.json and answers/ in one folder; shards written atomically, read back validated."""

    def __init__(self, folder):
        self.dir = Path(folder)
        for sub in ("questions", "answers"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)

    def shard(self, sub: str, b: int) -> Path:
        return self.dir / sub / f"{b:05d}.json"

    def rows(self, sub: str) -> list[dict]:
        """Every row of a stage's shards, each shard validated (`distill.workfiles.read_data_shard`)."""
        return [r for d in data_shards(self.dir, sub) for r in d["rows"]]

    def costs(self, sub: str) -> dict:
        """Summed CPU seconds, wall seconds and tokens of a stage's shards."""
        tot = {"shards": 0, "cpu_s": 0.0, "wall_s": 0.0, "tokens": 0}
        for d in data_shards(self.dir, sub):
            tot["shards"] += 1
            for k in ("cpu_s", "wall_s", "tokens"):
                tot[k] += d.get(k, 0)
        return tot


def spread(n: int) -> list[int]:
    """0..n-1 in bit-reversed order (0, n/2, n/4, 3n/4, ...): the batches done after any stop are spread over the
    whole range, so a partial set of answers covers short and long prompts (every category) alike."""
    bits = max(1, (n - 1).bit_length())
    return [b for b in sorted(range(1 << bits), key=lambda b: int(f"{b:0{bits}b}"[::-1], 2)) if b < n]

