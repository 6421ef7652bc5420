"""RECORDS IN, FIGURE OR TEXT OUT. Every function takes numbers, a `Trace`, an `Acceptance`, a `CostCurve`, a
training history or benchmark rows, and returns a `matplotlib.figure.Figure` or a string. Nothing here runs a
model, shows, prints or touches pyplot's global state; matplotlib is imported only here and above.

* `style`: the figure factory, method colours, bars, robust y-limits, PNG bytes
* `kinds`: the token kinds (accepted, rejected, ...) and their one colour map, shared by figures, tables and widget
* `decode`: what a decode did: acceptance, step kinds, one verify forward, the KV crop, a tree step, speed and time split
* `cost`: what a forward costs: cost curve, roofline, step times, crossover, time split, batches
* `training`: training curves, accuracy by depth, memory, the head families side by side
* `stats`: sampling histograms, p-values, test power, acceptance conventions, estimate against live
* `text`: text tables: the steps table, markdown tables, eq. 24's label layout, the acceptance conventions

May import: `measuring`, `training` (eq. 24's layout), `decoding` (records), `model` (configs), the ground floor.
The names are re-exported here, so a notebook writes `viz.cost_curve(...)`.
"""
from mtplab.viz.cost import (batch_tradeoff, block_size_curve, cost_curve, crossover, forwards_vs_m, regime_map, roofline,
                             step_times, time_split)
from mtplab.viz.decode import (acceptance_bars, acceptance_figure, compare_figure, decode_split, domain_panels, kv_cache_crop,
                               speed_figure, step_kinds, tree_step, verify_forward)
from mtplab.viz.kinds import COLORS, KINDS, LEGEND, STRUCK, TEXT_COLORS, StepRecord, TokenView, step_record
from mtplab.viz.stats import conventions, estimate_vs_live, power_bars, pvalue_histogram, sampling_histogram
from mtplab.viz.style import AR_COLOR, OVERLAP_COLOR, PLAIN_COLOR, bars, png, projector, robust_ylim
from mtplab.viz.text import label_layout_table, label_layout_text, markdown_table, steps_table, table
from mtplab.viz.training import depth_accuracy, head_families, memory_curve, training_curves, training_lineage

__all__ = ["AR_COLOR", "COLORS", "KINDS", "LEGEND", "OVERLAP_COLOR", "PLAIN_COLOR", "STRUCK", "TEXT_COLORS", "StepRecord",
           "TokenView", "acceptance_bars", "acceptance_figure", "bars", "batch_tradeoff", "block_size_curve",
           "compare_figure", "conventions", "cost_curve", "crossover", "decode_split", "depth_accuracy",
           "domain_panels", "estimate_vs_live",
           "forwards_vs_m", "head_families", "kv_cache_crop", "label_layout_table", "label_layout_text",
           "markdown_table", "memory_curve", "png", "power_bars", "projector",
           "pvalue_histogram", "regime_map", "robust_ylim", "roofline",
           "sampling_histogram", "speed_figure", "step_kinds", "step_record", "step_times", "steps_table", "table",
           "time_split", "training_curves", "training_lineage", "tree_step", "verify_forward"]
