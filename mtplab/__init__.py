"""mtplab: a teaching lab for multi-token prediction and speculative decoding."""
from .config import PRESETS, ModelConfig, preset
from .errors import MtplabError
from .model import GPT, KVCache

__all__ = ["GPT", "KVCache", "ModelConfig", "MtplabError", "PRESETS", "preset"]
__version__ = "0.1.0"
