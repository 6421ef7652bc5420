"""WHAT IS TRAINED: the trunk, its head families and their files.

* `config`: `ModelConfig`, the presets, the head families
* `layers`: RMSNorm, rotary positions, the KV caches, attention, MLP, `Block`, `StackedBlocks`
* `gpt`: the GPT trunk, `attach_heads`, and `deepen` (growth that keeps the function)
* `heads`: Stern heads, Meta heads, DeepSeek modules
* `kernels`: the exact linear and RMSNorm (numba): each row of a few-row call bit for bit the one-row call
* `llama`: the lab's own forward for Llama-family checkpoints (SmolLM2), each verify row as the one-token forward's
* `checkpoint`: safetensors weights plus a JSON record, written atomically, loaded without pickle
* `toy`: random models with sharp distributions, for tests and small studies

May import: the ground floor only (`errors`, `paths`, `tokenizer`, `data`, `device`).
"""
