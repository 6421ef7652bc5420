"""mtplab: a teaching lab for multi-token prediction and speculative decoding."""
from mtplab.model.config import PRESETS, ModelConfig, preset
from mtplab.errors import MtplabError
from mtplab.model.layers import KVCache
from mtplab.model.gpt import GPT

__all__ = ["GPT", "KVCache", "ModelConfig", "MtplabError", "PRESETS", "preset"]
__version__ = "0.1.0"
