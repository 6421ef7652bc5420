"""HOW IT IS USED: the speculative loop, its drafters and its record.

* `trace`: `Step` and `Trace`, what a decode did, and the counts read from it
* `accept`: the accept rule (greedy prefix, or min(1, p/q) with the residual), `distribution`, `sample`
* `checks`: the decoders' input checks, one line each that names the fix
* `drafters`: the `Drafter` contract, every drafter for one row, and `METHODS`, the one table of methods
* `loop`: prefill -> predict -> propose -> verify -> accept -> commit; `iter_steps`, `speculative`, `autoregressive`
* `tree`: token trees verified in one forward (greedy)
* `batch`: B > 1 ragged rows, the batched loop and its batched drafters
* `generate`: method name -> checkpoint -> a decode (`load_for`, `decode_with`, `run_prompts`)

May import: `model` and the ground floor. Never `training`.
"""
