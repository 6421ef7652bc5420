"""Where speculative decoding pays: the regime of a forward, measured on the machine at hand.

The textbook regime argument: while a forward's time goes into streaming the weights from memory (a 7B model on a
GPU, or a model larger than the CPU's last-level cache), and its kernel reads every weight once for all q tokens,
t(q)/t(1) stays near 1 and verifying k drafts costs about what one token costs; while the weights sit in the cache,
the arithmetic and the fixed cost per op dominate, t(q)/t(1) grows with q, and the verify eats the gain. Whether
that holds here is what this module measures. On the CPUs the lab measured, it did not decide: with the exact
kernel (`mtplab.model.kernels`, one read of the weights per block of rows) the record's random models from 6.6 MB
to 680 MB, in the cache or 20 times too large for it, all gave t(4)/t(1) 1.15-1.24 and t(8)/t(1) 1.48-1.57
(`docs/bench/regime.md`): the kernel and the per-row work set the curve.

* `cost_by_size`: t(1), t(q)/t(1) and the weight bytes of random models of growing size (the cost does not
  depend on the weights' values), beside the last-level cache read from the machine.
* `speedup_by_depth`: the same trained heads on trunks grown with `deepen` (identity blocks): acceptance and
  output stay fixed, only the forward's cost changes, so the speedup shows the regime alone.

Every timer syncs the device before it reads the clock. Run alone: a second torch process on 2 cores slows
both down 30-200x.
"""
from __future__ import annotations

import torch

from mtplab.device import machine
from mtplab.errors import MtplabError
from mtplab.measuring.timing import interleaved_race, measure_cost_curve
from mtplab.model.config import ModelConfig
from mtplab.model.gpt import GPT, deepen

MAX_PARAMS = 2_000_000_000  # a random model larger than this is refused: 8 GB of fp32 weights


def weight_bytes(model) -> int:
    """Bytes of the weights one forward reads (the tied embedding counted once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


@torch.inference_mode()
def cost_by_size(shapes, *, qs=(1, 2, 4, 8), context: int = 128, repeats: int = 7, device="cpu",
                 dtype=torch.float32, progress: bool = False) -> list[dict]:
    """For each (n_layer, n_embd): t(1) in ms, t(q)/t(1), and the weight bytes against the last-level cache.

    A random model of that shape (4 heads of width n_embd / 4 where it divides, the classroom's context) stands
    in for a trained one: a forward's cost depends on the shapes, not on the values."""
    llc = machine(device)["llc_bytes"]
    rows = []
    it = list(shapes)
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc="cost by size", unit="shape")
    for n_layer, n_embd in it:
        if not (isinstance(n_layer, int) and isinstance(n_embd, int) and n_layer >= 1 and n_embd >= 8):
            raise MtplabError(f"a shape is (n_layer >= 1, n_embd >= 8), integers (got {(n_layer, n_embd)})")
        cfg = ModelConfig(n_layer=n_layer, n_embd=n_embd, n_head=max(1, n_embd // 64), block_size=context + max(qs))
        if 12 * n_layer * n_embd ** 2 > MAX_PARAMS:
            raise MtplabError(f"shape {n_layer} x {n_embd} has more than {MAX_PARAMS:,} parameters; pick a smaller one")
        torch.manual_seed(0)
        model = GPT(cfg).to(device=device, dtype=dtype).eval()
        curve = measure_cost_curve(model, qs, context=context, repeats=repeats)
        b = weight_bytes(model)
        rows.append({"n_layer": n_layer, "n_embd": n_embd, "params": model.num_params(), "weight_bytes": b,
                     "weight_mb": b / 1e6, "llc_bytes": llc, "fits_in_llc": bool(llc and b <= llc),
                     "t1_ms": curve.seconds[1] * 1e3, "ms_per_layer": curve.seconds[1] * 1e3 / n_layer,
                     "ratio": {str(q): r for q, r in curve.ratio.items()},
                     "samples_ms": {str(q): [s * 1e3 for s in v] for q, v in curve.samples.items()},
                     "busy": curve.busy})  # the race's verdict: why this row's timings are not valid here (None: valid)
        del model
    return rows


@torch.inference_mode()
def speedup_by_depth(models: dict, prompts, depths, *, max_new_tokens: int = 128, repeats: int = 3,
                     progress: bool = False, checkpoints: dict | None = None) -> list[dict]:
    """models: label -> (method, trained model with heads); checkpoints: label -> the checkpoint's name, stored in
    the rows beside the label and the method. For every trunk depth in `depths`, each model is
    grown to that depth with `deepen` (the function is unchanged) and decoded against AR of the same grown
    model: AR and the method interleaved per prompt, `repeats` rounds, medians. Greedy output must equal AR's
    (in fp32 it does; a mismatch is counted, not hidden)."""
    rows = []
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(depths) * len(models) * repeats * len(prompts), desc="speedup by depth", unit="pair")
    for depth in depths:
        for label, (method, base) in models.items():
            model = base if depth == base.config.n_layer else deepen(base, depth).eval()
            r = interleaved_race(method, model, prompts, max_new_tokens=max_new_tokens, repeats=repeats, bar=bar)
            rows.append({"label": label, "method": method, "checkpoint": (checkpoints or {}).get(label),
                         "n_layer": depth, "k": r["k"], "tokens_per_forward": r["tokens_per_forward"],
                         "ar_ms_per_token": r["ar_ms_per_token"], "speedup": r["speedup"],
                         "speedup_min": r["speedup_min"], "speedup_max": r["speedup_max"], "identical": r["identical"],
                         "prompts": len(prompts), "busy": r["busy"]})
    if bar is not None:
        bar.close()
    return rows


