"""Where did the speedup go: a step's measured time split into target verify, drafter and overhead,
beside the speedup the cost curve predicts (`theory.predicted_speedup`, with the drafter's measured cost).

The split is measured (`Trace.time_split`, from `Step.target_s` / `draft_s` / `wall_s`); the drafter's
cost enters the prediction in units of t(1), the target's time for one forward over one new token,
itself measured as the AR baseline's target time per step. Overhead (the accept rule, cache bookkeeping,
Python) is what the prediction leaves out: the gap between the two columns is mostly overhead and noise.
"""
from __future__ import annotations

import json
from pathlib import Path
from mtplab.measuring import theory
from mtplab import paths
from mtplab.errors import MtplabError
from mtplab.decoding.trace import Trace

BENCH_DECODE = paths.DECODE_JSON


def tokens_per_step(trace: Trace) -> float:
    """Tokens committed per step after the prefill."""
    steps = trace.steps[1:]
    return sum(len(s.emitted) for s in steps) / max(1, len(steps))


def verify_width(trace: Trace) -> int:
    """Tokens the verify forward takes: plain feeds the k-1 drafts after the predict token, overlap feeds
    the last committed token and its k-1 drafts."""
    return max(1, trace.k - 1) if trace.schedule == "plain" else trace.k


def speedup_row(label: str, trace: Trace, baseline: Trace, cost_curve: dict[int, float]) -> dict:
    """One method's measured split (ms per step), its predicted and its measured speedup over AR."""
    split = trace.time_split()
    t1 = baseline.time_split()["target_s"]  # AR: one forward over one new token per step
    if t1 <= 0:
        raise MtplabError("the AR baseline has no timed steps; decode at least 2 new tokens")
    tps = tokens_per_step(trace)
    plain = trace.schedule == "plain"
    # plain: the predict forward costs one more t(1) per step
    predicted = theory.predicted_speedup(tps, cost_curve, verify_width(trace), draft_cost=split["draft_s"] / t1,
                                         plain=plain)
    ar_per_token = baseline.time_split()["wall_s"]
    return {"method": label, "k": trace.k, "steps": split["steps"], "tokens_per_step": tps,
            "target_ms": 1000 * split["target_s"], "draft_ms": 1000 * split["draft_s"],
            "overhead_ms": 1000 * split["overhead_s"], "step_ms": 1000 * split["wall_s"],
            "ar_step_ms": 1000 * ar_per_token, "draft_cost_t1": split["draft_s"] / t1,
            "predicted": predicted, "measured": tps * ar_per_token / split["wall_s"] if split["wall_s"] else 0.0}


def read_decode_bench(path=BENCH_DECODE) -> dict:
    """The shipped decode benchmark (written by `python -m mtplab bench decode`), read by path."""
    path = Path(path)
    if not path.exists():
        raise MtplabError(f"{path} not found; run `python -m mtplab bench decode` to write it")
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise MtplabError(f"{path} is not valid JSON ({e}); regenerate it with `python -m mtplab bench decode`") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise MtplabError(f"{path} has no 'rows' list; regenerate it with `python -m mtplab bench decode`")
    return data


# The papers' numbers, each with where it is stated; the lab's counterpart is measured by the caller.
PAPERS = [
    {"paper": "Stern et al. 2018, Table 1", "quantity": "mean accepted block size, k = 4", "paper_value": "3.27",
     "lab": "blockwise k=4: mean accepted length",
     "why": "a 4-layer byte model on code with heads on a frozen trunk, against a large word-piece Transformer "
            "on WMT translation, heads trained with the model"},
    {"paper": "Stern et al. 2018, abstract", "quantity": "speedup", "paper_value":
     "~2x iterations, no quality loss; ~7x with some loss; wall clock up to ~4x", "lab": "blockwise-overlap: wall-clock speedup",
     "why": "the 7x needs approximate acceptance and distillation, which the lab leaves out (exact greedy only); "
            "a small model on a CPU pays Python overhead per step"},
    {"paper": "Gloeckle et al. 2024, abstract and §3", "quantity": "self-speculative speedup, 4 heads", "paper_value":
     "~3x on code at 7B; byte-level models gain more from n = 8", "lab": "meta k=4: wall-clock speedup",
     "why": "each Meta head is a full layer, costly next to a 4-layer trunk; heads trained on half the tokens of "
            "the Stern heads; the paper's benefit appears from a few billion parameters up (§3.1)"},
    {"paper": "DeepSeek-V3 report 2024, §5.4.3", "quantity": "2nd-token acceptance; speedup", "paper_value":
     "85-90%; 1.8x tokens per second", "lab": "deepseek: 2nd-token acceptance; wall-clock speedup",
     "why": "671B parameters trained jointly with the module, against one module on a frozen 4-layer trunk; "
            "greedy code loops inflate the lab's acceptance"},
    {"paper": "Leviathan et al. 2023, abstract; Chen et al. 2023, abstract", "quantity": "two-model speculative speedup",
     "paper_value": "2-3x (T5-XXL); 2-2.5x (Chinchilla 70B)", "lab": "draft-model k=4: wall-clock speedup",
     "why": "the lab's draft model is about 1/8 of the target's size, but both are tiny: the target's forward is not "
            "memory-bound enough for the extra verify width to come free"},
]


def paper_table(lab_values: dict[str, str]) -> list[dict]:
    """The PAPERS rows with the lab's measured value filled in from {lab label: formatted value}."""
    return [{**row, "lab_value": lab_values.get(row["lab"], "not measured here")} for row in PAPERS]
