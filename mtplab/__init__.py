"""mtplab: a teaching lab for multi-token prediction and speculative decoding."""
from .config import PRESETS, ModelConfig, preset
from .errors import MtplabError
from .layers import KVCache
from .model import GPT

__all__ = ["GPT", "KVCache", "ModelConfig", "MtplabError", "PRESETS", "preset"]
__version__ = "0.1.0"
