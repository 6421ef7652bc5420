"""HEADS FOR A HUGGING FACE MODEL: `train --hf` (your own model, on a text corpus), and the distillation that made the
heads shipped in data/hf/NAME (`python -m mtplab distill`, from the model's own answers, on two CPU cores or one GPU).

* `pipeline`: the stages, each resumable in a work folder: answers, held-out answers, trunk cache, draft vocabulary,
  the DeepSeek and Stern heads, ship
* `chatdata`: the model's own training prompts and greedy answers (scripts/make_chat_data.py writes them)
* `trunkcache`: one trunk forward per answer, kept (hidden states and the target's top-k), so training never runs it
* `vocab`: the draft vocabulary, chosen by measurement
* `live`: `train --hf`, heads trained on a text corpus while the trunk runs
* `workfiles`: validated, bounded readers of the work folders' shards

The heads train on the lab's one loop (`training.heads`), with the cached-trunk losses (`training.losses`); the
model is loaded through `hf`.

May import `hf` and every layer below it; `chatdata` imports transformers itself (its batched greedy answers keep a
`DynamicCache`). `bench` and `teaching` never import it (an import-linter contract in pyproject.toml).
"""
