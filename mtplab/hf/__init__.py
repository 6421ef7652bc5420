"""YOUR OWN MODEL: a local Hugging Face causal LM as the lab's target, with heads trained on its frozen trunk.

* `target`: `HFTarget`, `load_hf`, `load_target`
* `heads_file`: heads saved alone for a base model, with their draft vocabulary (`save_heads`, `load_heads`), and the
  bounded readers of what ships in data/hf/NAME
* `run`: `train --hf` and `generate --hf`
* `real`: the real models of `paths.REAL_MODELS` (SmolLM2-135M-Instruct), converted once; their bare names anywhere
* `prompts`: the held-out prompts, as text or as one chat turn in a model's ids
* `study`: the real model with every shipped head family, raced against AR (`bench real`, notebooks)

How the shipped heads were trained is `mtplab.distill`, the floor above.

May import `training`, `decoding`, `measuring`, `model` and the ground floor; with `distill` (its batched greedy
answers), the only importers of transformers.
"""
