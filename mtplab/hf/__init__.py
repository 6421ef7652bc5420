"""YOUR OWN MODEL: a local Hugging Face causal LM as the lab's target, with heads trained on its frozen trunk.

* `target`: `HFTarget`, `load_hf`, saving and loading heads-only files
* `run`: `train --hf` and `generate --hf`
* `own`: a small Llama of your own with a byte tokenizer, trained here (`train-hf-model`)

May import `training`, `decoding`, `measuring`, `model` and the ground floor; the only importers of transformers.
"""
