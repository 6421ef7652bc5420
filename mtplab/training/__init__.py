"""HOW IT IS TRAINED: losses, one step per head family, a run's directory, `fit`.

* `config`: `TrainConfig`, every knob of a run, and `check`, every input check before anything runs
* `losses`: per-depth cross-entropy, the packed multi-token loss, DeepSeek eq. 24 and its label layout, self-distillation
* `steps`: `train_step` per family, the learning-rate schedule, autocast, per-depth validation
* `runs`: a run's directory: checked, locked, saved as one atomic set, resumed bit for bit
* `distributed`: torchrun shards and the one all_reduce
* `fit`: `fit(TrainConfig)`, the training loop
* `heads`: heads on a frozen trunk (a Hugging Face one, live or cached) in the same loop and save set

May import: `model` and the ground floor. Never `decoding` (the two are independent; `hf` and `distill` join them).
"""
