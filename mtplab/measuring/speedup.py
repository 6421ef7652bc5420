"""Where did the speedup go: a step's measured time split into target verify, drafter and overhead,
beside the speedup the cost curve predicts (`theory.predicted_speedup`, with the drafter's measured cost).

The split is measured (`Trace.time_split`, from `Step.target_s` / `draft_s` / `wall_s`); the drafter's
cost enters the prediction in units of t(1), the target's time for one forward over one new token,
itself measured as the AR baseline's target time per step. Overhead (the accept rule, cache bookkeeping,
Python) is what the prediction leaves out. Measured, it is small (well under a tenth of a millisecond a step
here), so a gap between the two columns is mostly timing noise and the difference between the cost curve's
cache length and the decode's; overhead can only make the measured speedup *lower* than predicted. A single
decode is one sample: `timing.interleaved_race` repeats interleaved decodes and reports the median and range, and
`record.Record` reads the shipped benchmark's figure for the same pair to print beside it.
"""
from __future__ import annotations

from mtplab.measuring import theory
from mtplab.errors import MtplabError
from mtplab.decoding.trace import Trace

def tokens_per_step(trace: Trace) -> float:
    """Tokens committed per step after the prefills."""
    steps = trace.decoding_steps
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


# The papers' numbers, each with where it is stated; the lab's counterpart is measured by the caller.
PAPERS = [
    {"paper": "Stern et al. 2018, Table 1 (WMT14 En-De, k = 4)", "quantity": "mean accepted block size, k = 4",
     "paper_value": "1.73 frozen base (Regular), 1.85 frozen base on distilled data; 3.27 with distillation + "
                    "fine-tuning (Both)",
     "lab": "blockwise k=4: mean accepted length",
     "why": "compare the lab's frozen-trunk heads with 1.73 / 1.85, not 3.27; the lab's heads are self-distilled "
            "(trained on the frozen target's own predictions) and decode byte-level code that loops, against "
            "transformer_base translating with word pieces; in Stern even the 'frozen' depth 1 passes through the "
            "new layer, the lab's depth 1 is the untouched trunk head"},
    {"paper": "Stern et al. 2018, abstract; §7.1 and §7.3", "quantity": "speedup", "paper_value":
     "translation: up to 3.3x wall clock (k = 8, Both); ~2x iterations with no quality loss; the 7x iterations and "
     "4x wall clock are image super-resolution with approximate acceptance", "lab": "blockwise-overlap: wall-clock speedup",
     "why": "the lab does exact greedy acceptance only (no approximate acceptance) on a model small enough that "
            "widening the verify forward is not free (01's cost curve)"},
    {"paper": "Gloeckle et al. 2024, §3.2, Table S2", "quantity": "self-speculative speedup", "paper_value":
     "3.0x on code at 7B with 4 heads (2.5 of 3 drafts accepted); 6.4x for a byte-level model with 8 heads "
     "(Table S3, n = 8, batch 16)",
     "lab": "meta k=4: wall-clock speedup",
     "why": "§3.2: heads pretrained jointly with the trunk are much more accurate than heads fine-tuned later; "
            "the lab's heads are trained afterwards on a frozen trunk, self-distilled; each head is a full layer, "
            "costly next to the lab's trunk; and Gloeckle keep parameters equal (n-1 layers moved from the trunk "
            "to the heads), the lab adds head layers on a fixed trunk"},
    {"paper": "DeepSeek-V3 report 2024, §5.4.3 (D = 1)", "quantity": "2nd-token acceptance; speedup", "paper_value":
     "85-90%; 1.8x tokens per second", "lab": "deepseek D=1: 2nd-token acceptance; wall-clock speedup",
     "why": "671B parameters trained jointly with the module on corpus labels, against one module on a frozen "
            "trunk, self-distilled, decoding code greedily (loops are easy to draft); the report gives no batch, "
            "hardware or baseline for the 1.8x"},
    {"paper": "Leviathan et al. 2023, abstract; Chen et al. 2023, abstract", "quantity": "two-model speculative speedup",
     "paper_value": "2-3x (T5-XXL); 2-2.5x (Chinchilla 70B)", "lab": "draft-model k=4: wall-clock speedup",
     "why": "the lab's draft model is much smaller than the target, but both are tiny; a k-token verify costs about "
            "one token's forward only with a kernel that reads each weight once for all k rows (mtplab.model.kernels, "
            "the exact default, reads them once per block of up to 8 rows with AVX-512, 3 without), and what "
            "widening costs here is the target's cost curve t(k)/t(1) (notebook 01)"},
]


def paper_table(lab_values: dict[str, str]) -> list[dict]:
    """The PAPERS rows with the lab's measured value filled in from {lab label: formatted value}."""
    return [{**row, "lab_value": lab_values.get(row["lab"], "not measured here")} for row in PAPERS]
