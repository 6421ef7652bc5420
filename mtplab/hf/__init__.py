"""YOUR OWN MODEL: a local Hugging Face causal LM as the lab's target, with heads trained on its frozen trunk.

* `target`: `HFTarget`, `load_hf`, `load_target`
* `heads_file`: heads saved alone for a base model, with their draft vocabulary (`save_heads`, `load_heads`)
* `run`: `train --hf` and `generate --hf`
* `workfiles`: validated, bounded readers of every file the real model's commands read back
* `chatdata`: the real model's own training data (its questions and greedy answers; scripts/make_chat_data.py
  writes it), read by `distill --data`
* `real`: the real models of `paths.REAL_MODELS` (SmolLM2-135M-Instruct), converted once; their bare names anywhere
* `distill`: heads for a real model: its own answers (from `chatdata`), a trunk cache, training on it (`distill`)
* `prompts`: the held-out prompts, as text or as one chat turn in a model's ids
* `study`: the real model with every shipped head family, raced against AR (`bench real`, notebooks)

May import `training`, `decoding`, `measuring`, `model` and the ground floor; the only importers of transformers.
"""
