"""Model configuration: one frozen dataclass and a table of named presets."""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from mtplab.errors import MtplabError


@dataclass(frozen=True)
class Family:
    """What the code needs to know of a head family: looked up here, never branched on by name."""
    default_depths: int     # K when neither --depths nor --modules (D) is given
    sequential: bool        # depth d runs on depth d-1's hidden state, counted as D = K-1 modules (DeepSeek)
    layers: bool            # each depth past the first is a transformer layer (the memory estimate counts it)
    min_layers: int = 1     # trunk layers the family needs (Meta: the last layer is head 1)
    normal_init: bool = True  # fresh linear layers start at N(0, 0.02) on a Hugging Face trunk (Stern keeps its own)
    weights: str = ""       # checkpoint tensors numbered by depth ('mtp.blocks.'); '' : one stacked tensor (Stern)


FAMILY = {"none": Family(1, False, False), "stern": Family(4, False, False, normal_init=False),
          "meta": Family(4, False, True, min_layers=2, weights="mtp.blocks."),
          "deepseek": Family(2, True, True, weights="mtp.layers.")}
HEAD_FAMILIES = tuple(FAMILY)
MAX_DEPTHS = 64       # prediction depths K a config may ask for (k tokens per step is at most K)
MAX_BLOCK = 1 << 16   # the longest context window a config may ask for


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 256
    block_size: int = 384   # context window in tokens
    dropout: float = 0.0
    heads: str = "none"     # head family: none | stern | meta | deepseek
    n_depths: int = 1       # prediction depths K: depth d at position i predicts token i+d (deepseek: 1 + D)

    def __post_init__(self):
        if self.heads not in HEAD_FAMILIES:
            raise MtplabError(f"unknown head family {self.heads!r}; choose one of {', '.join(HEAD_FAMILIES)}")
        if self.n_depths < 1:
            raise MtplabError(f"n_depths must be >= 1 (got {self.n_depths})")
        if self.n_depths > MAX_DEPTHS:
            raise MtplabError(f"n_depths {self.n_depths} is more than {MAX_DEPTHS} prediction depths; use at most "
                              f"{MAX_DEPTHS} (acceptance falls off long before that)")
        if not 1 <= self.block_size <= MAX_BLOCK:
            raise MtplabError(f"block_size must lie in 1..{MAX_BLOCK} (got {self.block_size})")
        if self.heads == "none" and self.n_depths != 1:
            raise MtplabError("heads='none' predicts one token per position: use n_depths=1 or pick a head family")
        if self.heads != "none" and self.n_depths < 2:
            raise MtplabError(f"heads={self.heads!r} needs n_depths >= 2 (got {self.n_depths})")
        if self.n_embd % self.n_head:
            raise MtplabError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if (self.n_embd // self.n_head) % 2:
            raise MtplabError(f"n_embd / n_head = {self.n_embd // self.n_head} is odd; rotary positions turn channel "
                              f"pairs, so the head size must be even: choose n_head so that n_embd / n_head is even")
        if self.n_layer < FAMILY[self.heads].min_layers:
            raise MtplabError(f"{self.heads} heads need n_layer >= {FAMILY[self.heads].min_layers}: the last layer is "
                              "head 1, the rest is the trunk")

    @property
    def n_modules(self) -> int:
        """DeepSeek's D: sequential MTP modules (0 for other families)."""
        return self.n_depths - 1 if FAMILY[self.heads].sequential else 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        if "k" in d and "n_depths" not in d:  # checkpoints written before the rename
            d = {("n_depths" if n == "k" else n): v for n, v in d.items()}
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise MtplabError(f"unknown config keys {sorted(unknown)}; is this an mtplab checkpoint config?")
        return cls(**d)

    def with_heads(self, heads: str, n_depths: int) -> "ModelConfig":
        return replace(self, heads=heads, n_depths=n_depths if heads != "none" else 1)


PRESETS: dict[str, ModelConfig] = {
    # trains in seconds: for tests
    "tiny": ModelConfig(n_layer=2, n_head=2, n_embd=64, block_size=128),
    # a small, fast draft model for two-model speculative decoding (same context as classroom)
    "draft": ModelConfig(n_layer=2, n_head=4, n_embd=128, block_size=384),
    # the shipped default: 12 layers x 256 (9.5M parameters, 38 MB in fp32), where the drafters are a small share of
    # the step and speculative decoding paid on the benchmark's CPU (data/README.md gives the measurements); grown
    # from classroom-l4 with mtplab.model.gpt.deepen
    "classroom": ModelConfig(n_layer=12, n_head=4, n_embd=256, block_size=384),
    # the old 4-layer shape (13 MB in fp32, the *-l4 family): notebook 01's section 5 runs the same heads on it and on
    # deeper trunks, where three Meta head layers are 75% of this trunk and 25% of the 12-layer one
    "classroom-l4": ModelConfig(n_layer=4, n_head=4, n_embd=256, block_size=384),
    # a larger width, for cost-curve studies
    "wide": ModelConfig(n_layer=4, n_head=8, n_embd=768, block_size=384),
}


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise MtplabError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None
