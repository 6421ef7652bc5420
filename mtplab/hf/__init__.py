"""YOUR OWN MODEL: a local Hugging Face causal LM as the lab's target, and the file of heads trained on its frozen trunk.

* `target`: `HFTarget`, `load_hf`, `load_target`
* `heads_file`: heads saved alone for a base model, with their draft vocabulary (`save_heads`, `load_heads`), and the
  bounded readers of what ships in data/hf/NAME
* `run`: `generate --hf`, and transformers' own greedy `generate` as the reference (`generate_ids`)
* `real`: the real models of `paths.REAL_MODELS` (SmolLM2-135M-Instruct), converted once; their bare names anywhere
* `prompts`: the held-out prompts, as text or as one chat turn in a model's ids
* `study`: the real model with every shipped head family, raced against AR (`bench real`, notebooks)

How heads are trained for it (`train --hf`, and the distillation that made the shipped heads) is `mtplab.distill`,
the floor above.

May import `training`, `decoding`, `measuring`, `model` and the ground floor; with `distill` (its batched greedy
answers), the only importers of transformers.
"""
