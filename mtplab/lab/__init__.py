"""Measurements and small text tables that the teaching notebooks share, split by topic:

* `lab.timing`: the cost curve t(q), decode timings, roofline numbers, INT8 quantization, peak memory
* `lab.blockwise`: decoding many prompts, pooled traces, forward counts, step tables
* `lab.meta`: the head-by-head backward's memory and gradients, the packed loss's shift
* `lab.deepseek`: eq. (24)'s label layout, teacher forcing against free running
* `lab.sampling`: exact counts of what the accept rule emits, chi-square against the target

Everything returns numbers, records or strings; pictures are `mtplab.viz`, checkers `mtplab.exercises`.
The names are re-exported here, so notebooks write `lab.measure_cost_curve(...)`.
"""
from ..toys import random_model
from .blockwise import format_steps, oracle_forward_counts, pooled, run_prompts
from .deepseek import forced_and_free, label_layout, layout_matches_model
from .meta import meta_backward_memory, meta_gradients_agree, peaked_logits, shift_table
from .sampling import accept_counts, acceptance_by_rule, chi_square, second_token_counts, second_token_marginal
from .timing import (CostCurve, forward_cost, machine_balance, measure_cost_curve, memory_method, ms_per_token,
                     peak_memory, quantize_int8, sync, timed_decodes)

__all__ = ["CostCurve", "accept_counts", "acceptance_by_rule", "chi_square", "forced_and_free", "format_steps",
           "forward_cost", "label_layout", "layout_matches_model", "machine_balance", "measure_cost_curve",
           "memory_method", "meta_backward_memory", "meta_gradients_agree", "ms_per_token", "oracle_forward_counts",
           "peak_memory", "peaked_logits", "pooled", "quantize_int8", "random_model", "run_prompts",
           "second_token_counts", "second_token_marginal", "shift_table", "sync", "timed_decodes"]
