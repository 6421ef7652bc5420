"""WHAT IT COSTS AND HOW OFTEN DRAFTS SURVIVE: numbers read from decodes and forwards, no pictures.

* `race`: the lab's one race of contenders (interleaved rounds, synced clock) and its busy-machine guard
* `record`: the one reader of benchmark records: rows found by method and checkpoint, and their machine line
* `choice`: what a real model's decode runs with when its flags are left out: the record's best k and confidence stop
* `theory`: forward counts, expected tokens per step and its inverse, the predicted speedup
* `acceptance`: the acceptance conventions, converted into each other, with Wilson intervals
* `teacher_forced`: acceptance without decoding; two models' agreement position by position
* `timing`: the cost curve t(q), batch costs, the roofline's numbers, peak memory
* `speedup`: where a speedup went (target, drafter, rest), and the papers' numbers beside the lab's
* `quality`: greedy text that loops, counted plainly
* `regime`: where a forward is memory-bound: cost against model size, the same heads on deeper trunks
* `domain`: code against prose: acceptance by position and wall clock of one head family on each text

May import: `decoding`, `model` and the ground floor. Never `training`, never `viz`.
"""
