"""Bring your own model: a local Hugging Face causal LM as the lab's target, with MTP heads on its frozen trunk.

B batch, T time (new tokens in this call), C channels (the model's hidden size), V vocabulary (rows of its
output layer), L layers.

`HFTarget` gives a `transformers` causal LM the face the decoders and drafters expect of `mtplab.model.gpt.GPT`:
`forward(idx, cache) -> TrunkOutput(hidden, logits, pre_last)`, `new_cache()` (the transformers cache, with
`length` and `crop(n)`), `wte`, `unembed`, `rope`, `config` (a `ModelConfig` read off the model), `mtp`.
The head families of `mtplab.model.heads` then sit on its hidden states unchanged:

* hidden: the last decoder layer's output, before the final norm (caught by a hook on that norm);
* unembed(h) = lm_head(final_norm(h)): the model's own output head, shared by every depth;
* pre_last: the input of the last decoder layer (Meta heads branch off there, beside the model's last layer);
* rope: rotary factors for the heads' own attention layers (Meta, DeepSeek); the trunk keeps its own positions.

Which forward computes the trunk (`kernel`, `forward_path`): for a Llama-family model (SmolLM2), by default the lab's
own (`mtplab.model.llama.LlamaForward`) with the exact kernel (`mtplab.model.kernels`): row i of a verify is bit for bit
the one-token forward's, so greedy speculative output equals greedy AR by construction. The heads and the draft
vocabulary's projection go through the same kernel (the heads' layers are `mtplab.model.layers`, whose linears are the
kernel's). kernel="stock" (and any other architecture, with the reason in `forward_path`) runs transformers' forward
with its stock kernels, and the output head F.linear: equality is then observed, not guaranteed. `kernels.use_stock()`
puts every linear, the heads' included, back on F.linear.

Heads are saved alone, with their draft vocabulary, in a heads file (`mtplab.hf.heads_file`).
`transformers` is an optional extra (pip install -e ".[hf]"); only the modules of `mtplab.hf` import it.

Nothing in a model folder is ever run: every transformers call passes `trust_remote_code=False`, and a folder
whose config.json names its own code (`auto_map`) is refused before transformers reads it.
"""
from __future__ import annotations

import inspect
import pickle
from pathlib import Path
import torch
import torch.nn as nn
from safetensors import SafetensorError
from mtplab.files import read_json
from mtplab.model.config import FAMILY, ModelConfig
from mtplab.errors import MtplabError
from mtplab.model.heads import build_heads
from mtplab.model.layers import KVCache, RaggedKVCache, rotary_table
from mtplab.model.gpt import GPT, TrunkOutput
from mtplab.hf.real import REAL_MODELS, quiet_transformers, real_model, resolve_model
from mtplab.model.llama import LlamaForward, unsupported
from mtplab.hf.heads_file import load_heads, read_heads_info, save_heads  # noqa: F401  (re-exported for teaching.peers, bench.peers)
from mtplab.model import kernels
try:
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, DynamicCache
except ImportError:  # the core runs without it; only this module needs it
    transformers = None

MAX_CONTEXT = 2048  # the heads' rotary table and the DeepSeek drafter's buffers are this long at most
MAX_CONFIG = 1 << 20  # bytes of config.json we are willing to read
FINAL_NORMS = ("norm", "ln_f", "final_layernorm", "final_layer_norm", "norm_f")
LAYER_LISTS = ("layers", "h", "blocks", "layer")
KERNELS = ("exact", "stock")  # exact: the lab's forward and kernel (Llama family); stock: transformers' forward
RESTORE = "restore the config.json saved with the model"  # the fix for a config.json mtplab refuses


def _need_transformers():
    if transformers is None:
        raise MtplabError('--hf needs the transformers package; install the extra: pip install -e ".[hf]"')


def _find(module: nn.Module, names, what: str, path):
    for n in names:
        m = getattr(module, n, None)
        if m is not None:
            return m
    raise MtplabError(f"cannot find the {what} of {type(module).__name__} in {path} (looked for "
                      f"{', '.join(names)}); mtplab.hf supports decoder-only models such as GPT-2, Llama, Qwen, Mistral")


class HFCache:
    """The transformers cache behind the lab's cache contract: `length`, `crop(n)` keeps positions 0..n-1."""

    def __init__(self, hf_config):
        self.kv = DynamicCache(config=hf_config)

    @property
    def length(self) -> int:
        return int(self.kv.get_seq_length())

    def crop(self, n: int):
        have = self.length
        if n < 0 or n > have:
            raise ValueError(f"crop({n}) outside 0..{have}")
        if n < have:
            self.kv.crop(n - have)  # a negative count removes that many positions (both old and new APIs)


class HFTarget(nn.Module):
    """A Hugging Face causal LM (frozen, eval mode) as the lab's target, with an optional head family `mtp`."""

    def __init__(self, hf, tokenizer, *, path: str, kernel: str = "exact"):
        super().__init__()
        self.hf = hf.eval().requires_grad_(False)
        self.tokenizer, self.path = tokenizer, str(path)
        hc = hf.config
        base = hf.base_model
        self.wte = hf.get_input_embeddings()
        self.lm_head = hf.get_output_embeddings()
        if self.lm_head is None:
            raise MtplabError(f"{path} has no output layer (lm_head); load a causal LM, not a bare encoder")
        self.norm = _find(base, FINAL_NORMS, "final norm", path)
        layers = _find(base, LAYER_LISTS, "decoder layers", path)
        C, H, L = hc.hidden_size, hc.num_attention_heads, hc.num_hidden_layers
        if C % H or (C // H) % 2:
            H = 1 if C % 2 == 0 else H  # the heads' own attention needs an even head size
        ctx = min(int(getattr(hc, "max_position_embeddings", None) or getattr(hc, "n_positions", MAX_CONTEXT)), MAX_CONTEXT)
        self.config = ModelConfig(vocab_size=self.lm_head.out_features, n_layer=L, n_head=H, n_embd=C,
                                  block_size=ctx)
        self._rot = rotary_table(ctx, C // H)
        self._seen: dict = {}
        self.norm.register_forward_pre_hook(lambda m, args: self._seen.__setitem__("hidden", args[0]))
        layers[-1].register_forward_pre_hook(self._catch_pre_last, with_kwargs=True)
        self._cache_kw = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
        self.mtp = None
        self.chat = False
        self.draft_vocab: torch.Tensor | None = None
        self._draft_rows: torch.Tensor | None = None
        self._draft_rows16: torch.Tensor | None = None
        self._vocab_rows: dict = {}  # the last few draft vocabularies' rows, so that switching back costs nothing
        self._lab: LlamaForward | None = None  # built at the first forward that needs it, on the weights' device
        self.use_kernel(kernel)

    # ---- which forward and which kernel ---------------------------------------------------
    def use_kernel(self, kernel: str) -> "HFTarget":
        """'exact': the lab's forward with the exact kernel where the architecture allows (Llama family);
        'stock': transformers' forward, and F.linear for the output head, the path to compare with. Returns self."""
        if kernel not in KERNELS:
            raise MtplabError(f"unknown kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
        self.kernel = kernel
        self._why_stock = "kernel='stock'" if kernel == "stock" else unsupported(self.hf)
        return self

    @property
    def lab_forward(self) -> LlamaForward | None:
        """The lab's forward of this model, or None when transformers' forward computes it (`forward_path` says why)."""
        if self._why_stock is not None:
            return None
        if self._lab is None or self._lab.embed.device != self.wte.weight.device:
            with torch.inference_mode(False):  # plain tensors, even when the first forward runs in inference mode
                self._lab = LlamaForward(self.hf, self.config.block_size)
        return self._lab

    @property
    def forward_path(self) -> str:
        """One line: which forward and kernel compute the trunk, and what that promises."""
        if self._why_stock is None:
            return f"the lab's Llama forward; {kernels.status()}"
        return (f"transformers' forward with stock kernels ({self._why_stock}): greedy equality with AR is observed, "
                "not guaranteed")

    def _catch_pre_last(self, module, args, kwargs):
        self._seen["pre_last"] = args[0] if args else kwargs["hidden_states"]

    def train(self, mode: bool = True):
        super().train(mode)
        self.hf.eval()  # the trunk is frozen: no dropout, whatever the heads do
        return self

    # ---- what the head families and drafters use ---------------------------------------
    # the heads' own rotary factors and the teacher-forced logits of every depth: the lab model's, read off the
    # same attributes (config, wte, _rot, mtp, forward)
    rope = GPT.rope
    depth_logits = GPT.depth_logits

    def unembed(self, h):
        """The model's own output head: final norm, then lm_head."""
        lab = self.lab_forward
        return self.lm_head(self.norm(h)) if lab is None else lab.unembed(h)

    def draft_unembed(self, h):
        """A drafter's projection: over the heads' draft vocabulary when they carry one (`load_heads`), every other token
        at -inf; otherwise `unembed`. Only drafts go through it: the target verifies over the full vocabulary, so
        the output is the same either way and only the drafts' cost and acceptance change. The exact kernel reads
        the rows rounded to bf16 (half the bytes: a near-tie between two drafts may fall the other way)."""
        if self.draft_vocab is None or self._draft_rows is None:  # set together (`_use_draft_vocab`)
            return self.unembed(h)
        lab = self.lab_forward
        linear = nn.functional.linear if self.kernel == "stock" else kernels.linear  # transformers' forward's projection
        if lab is None:
            small = linear(self.norm(h), self._draft_rows)  # (..., N)
        else:  # the exact kernel reads the rows' bf16 copy: half the bytes; drafts only, the verify reads float32
            small = lab.unembed(h, self._draft_rows16 if kernels.exact_rows(h) else self._draft_rows)
        full = small.new_full((*small.shape[:-1], self.config.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.draft_vocab, small)

    def _use_draft_vocab(self, ids) -> "HFTarget":
        """Draft over these token ids only (None: the full vocabulary again); returns self. The ids travel with the
        heads (`save_heads` writes them, `load_heads` applies them), as EAGLE-3's d2t travels with its draft."""
        if ids is None:
            self.draft_vocab = self._draft_rows = self._draft_rows16 = None
            return self
        ids = torch.as_tensor(ids, dtype=torch.long).flatten().unique()
        V = self.config.vocab_size
        if len(ids) == 0 or int(ids.min()) < 0 or int(ids.max()) >= V:
            raise MtplabError(f"a draft vocabulary is a non-empty set of token ids in 0..{V - 1}")
        ids = ids.to(self.wte.weight.device)
        w = self.lm_head.weight
        key = (w.data_ptr(), w.dtype, ids.cpu().numpy().tobytes())  # a race switches vocabularies at every decode
        rows = self._vocab_rows.pop(key, None)
        if rows is None:
            rows = w.detach()[ids].contiguous()  # (N, C)
            rows = rows, rows.to(torch.bfloat16)  # what the exact kernel drafts with is the bf16 copy (`kernels.compact`)
        self._vocab_rows = {**dict(list(self._vocab_rows.items())[-3:]), key: rows}  # the last four used
        self.draft_vocab = ids
        self._draft_rows, self._draft_rows16 = rows
        return self

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> HFCache | KVCache:
        lab = self.lab_forward
        return HFCache(self.hf.config) if lab is None else lab.new_cache(batch, max_len or self.config.block_size)

    def new_ragged_cache(self, batch: int) -> RaggedKVCache:
        """A cache of `batch` rows, each at its own length (`mtplab.decoding.batch`), on the lab's forward only."""
        lab = self.lab_forward
        if lab is None:
            raise MtplabError(f"batched decoding of ragged rows needs the lab's forward; {self.forward_path}")
        return RaggedKVCache(lab.n_layer, batch, lab.Hkv, self.config.block_size, lab.D, dtype=lab.embed.dtype,
                             device=lab.embed.device)

    def forward(self, idx, cache: HFCache | KVCache | None = None, *, positions=None, mask=None) -> TrunkOutput:
        """idx: (B, T) token ids. With a cache, they sit at positions cache.length..cache.length+T-1.

        `positions` (B, T) and `mask` (B or 1, 1, T, P+T) bool override that, as `GPT.forward` takes them (token
        trees): the lab's forward only."""
        lab = self.lab_forward
        if cache is not None and isinstance(cache, (KVCache, RaggedKVCache)) != (lab is not None):
            raise MtplabError("this cache was made for the other forward (before use_kernel); make a new one with "
                              "target.new_cache()")
        if lab is not None:
            return lab(idx, cache, positions=positions, mask=mask)
        if positions is not None or mask is not None:
            raise MtplabError(f"positions and mask (token trees) need the lab's forward; {self.forward_path}")
        self.rope(cache.length if cache is not None else 0, idx.shape[1])  # the context-window error, as GPT's
        kw = {self._cache_kw: cache.kv, "use_cache": True} if cache is not None else {"use_cache": False}
        self._seen.clear()
        res = self.hf(input_ids=idx, **kw)
        return TrunkOutput(hidden=self._seen["hidden"], logits=res.logits, pre_last=self._seen["pre_last"])

    # ---- the heads ----------------------------------------------------------------------
    def attach(self, heads: str, n_depths: int) -> "HFTarget":
        """Put a fresh head family on the frozen trunk (in place; returns self)."""
        self.config = self.config.with_heads(heads, n_depths)
        mtp = build_heads(self.config)  # meta: fresh layers (the model's own last layer is another architecture)
        if mtp is not None:
            for m in mtp.modules():
                if isinstance(m, nn.Linear) and FAMILY[heads].normal_init:
                    nn.init.normal_(m.weight, std=0.02)
            p = self.wte.weight
            mtp = mtp.to(device=p.device, dtype=p.dtype)
        self.mtp = mtp
        return self

    def save_heads(self, path, **kw) -> Path:
        """The heads alone as a heads file (`mtplab.hf.heads_file.save_heads`), what `training.heads` saves."""
        return save_heads(self, path, **kw)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids])

    def token_repr(self, i: int) -> str:
        """A printable label for one token (what `mtplab.tokenizer.token_repr` is for byte tokens)."""
        return self.decode([i]).replace("\n", "\\n").replace("\t", "\\t").replace(" ", "␣") or f"<{int(i)}>"


# ---------------------------------------------------------------------------------- loading
def _read_config(p: Path) -> dict:
    """config.json read by mtplab first (bounded, plain JSON), so that a folder that asks to run its own code
    is refused before transformers sees it."""
    cj = p / "config.json"
    if cj.is_dir():
        raise MtplabError(f"{cj} is a directory, not a file; the model folder needs the config.json that "
                          "save_pretrained writes")
    raw = read_json(cj, limit=MAX_CONFIG, what="a model config", fix="restore it", invalid_fix=RESTORE)
    if not isinstance(raw, dict):
        raise MtplabError(f"{cj} is not a JSON object; {RESTORE}")
    if not isinstance(raw.get("model_type", ""), str):
        raise MtplabError(f"{cj}: model_type = {raw['model_type']!r} is not a name such as 'llama'; {RESTORE}")
    if "auto_map" in raw:
        raise MtplabError(f"{cj} names custom code (auto_map): loading it would run Python from the model folder, "
                          "which mtplab never does; use a model whose architecture transformers ships, saved "
                          "without auto_map")
    _check_sizes(raw, cj)
    return raw


SIZE_KEYS = {"num_hidden_layers": (1, 1024), "n_layer": (1, 1024), "hidden_size": (2, 65536), "n_embd": (2, 65536),
             "num_attention_heads": (1, 1024), "n_head": (1, 1024), "vocab_size": (2, 4_000_000),
             "intermediate_size": (1, 1 << 20), "max_position_embeddings": (1, 1 << 24), "n_positions": (1, 1 << 24)}


def _check_sizes(raw: dict, cj: Path) -> None:
    """The sizes in config.json, checked before transformers builds anything from them: a crafted layer count or
    width is one line here instead of gigabytes of freshly initialised layers, and the weights the config describes
    must be about the size of the weight files beside it."""
    for k, (lo, hi) in SIZE_KEYS.items():
        v = raw.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi):
            raise MtplabError(f"{cj}: {k} = {v!r} is not an integer in {lo}..{hi}; {RESTORE}")
    L = raw.get("num_hidden_layers", raw.get("n_layer"))
    C = raw.get("hidden_size", raw.get("n_embd"))
    H = raw.get("num_attention_heads", raw.get("n_head"))
    V = raw.get("vocab_size")
    pad = raw.get("pad_token_id")
    if V and pad is not None and (isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad < V):
        raise MtplabError(f"{cj}: pad_token_id = {pad!r} is not a token id of its {V}-token vocabulary; {RESTORE}")
    if C and H and C % H:
        raise MtplabError(f"{cj}: hidden size {C} is not a multiple of {H} attention heads; {RESTORE}")
    if L and C and V:
        need = L * 4 * C * C + V * C  # at least the attention projections and the embedding, in parameters
        have = sum(p.stat().st_size for p in cj.parent.glob("*.safetensors") if p.is_file())
        if have and need * 2 > 4 * have:  # even in 16-bit, the config asks for 4x more than the weights hold
            raise MtplabError(f"{cj} describes a model of at least {need / 1e6:.0f}M parameters, but the weight files "
                              f"beside it hold {have / 2**20:.0f} MiB; restore the config.json saved with these weights")


def _from_pretrained(p: Path, path, dtype):
    """The causal LM's weights and transformers' loading report, every failure one line."""
    try:
        with quiet_transformers():
            return AutoModelForCausalLM.from_pretrained(p, local_files_only=True, dtype=dtype,
                                                        output_loading_info=True, trust_remote_code=False)
    except pickle.UnpicklingError:
        raise MtplabError(f"{path} holds pickled weights (pytorch_model.bin) that torch refuses to load safely "
                          "(weights_only); nothing was run: convert them to model.safetensors on a machine you trust "
                          "(save_pretrained(..., safe_serialization=True)) or use another copy of the model") from None
    except ValueError as e:  # a config class with no causal-LM model
        raise MtplabError(f"{path} is not a causal language model ({str(e).splitlines()[0][:160]})") from None
    except OSError as e:
        raise MtplabError(f"cannot load the weights in {path}: {str(e).splitlines()[0][:200]}") from None
    except SafetensorError as e:
        raise MtplabError(f"the weights in {path} are corrupt or truncated ({str(e).splitlines()[0][:120]}); restore "
                          "model.safetensors from where the model came from") from None
    except RuntimeError as e:  # sizes in config.json that differ from the weights (ignore_mismatched_sizes)
        if "mismatch" in str(e) or "size" in str(e):
            raise MtplabError(f"the weights in {path} do not match its config.json (the sizes differ); restore the "
                              "config.json saved with these weights") from None
        raise MtplabError(f"cannot load the weights in {path} ({str(e).splitlines()[0][:160]})") from None
    except Exception as e:  # what transformers raises for a config it cannot build (KeyError, ImportError, ...)
        first = str(e).splitlines()[0][:160] if str(e) else ""
        raise MtplabError(f"transformers cannot build the model in {path} ({type(e).__name__}: {first}); "
                          f"{RESTORE}") from None


def load_hf(path, *, device="cpu", dtype=torch.float32, kernel: str = "exact") -> HFTarget:
    """A local model directory (config.json, weights, tokenizer) as an `HFTarget`. Nothing is downloaded and
    nothing in the folder is run (trust_remote_code=False; an auto_map config is refused). `kernel`: see
    `HFTarget.use_kernel`."""
    _need_transformers()
    if kernel not in KERNELS:
        raise MtplabError(f"unknown kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
    if isinstance(path, bool) or not isinstance(path, (str, Path)) or str(path) == "":
        raise MtplabError(f"a Hugging Face model is a local folder path or {', '.join(REAL_MODELS)} (got {path!r})")
    chat = real_model(path) is not None and not Path(path).is_dir()
    path = resolve_model(path)
    p = Path(path)
    if not p.is_dir() or not (p / "config.json").exists():
        old = p.with_name(f".{p.name}.old")
        if not p.exists() and (old / "config.json").is_file():  # a train-hf-model save cut between its two renames
            raise MtplabError(f"{path} is missing: a save of train-hf-model was cut between its two renames and "
                              f"{old} holds the last complete save; continue the run with the same command plus "
                              f"--resume (its next save puts the folder back), or rename {old} to {p}")
        raise MtplabError(f"{path} is not a Hugging Face model directory (no config.json); give the folder "
                          "that holds config.json, the weights and the tokenizer (save_pretrained writes one)")
    _read_config(p)
    try:
        with quiet_transformers():
            hc = AutoConfig.from_pretrained(p, local_files_only=True, trust_remote_code=False)
    except Exception as e:  # any config transformers cannot read is one line
        raise MtplabError(f"cannot read {p / 'config.json'}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    arch = getattr(hc, "architectures", None) or []
    arch = [arch] if isinstance(arch, str) else [str(a) for a in arch]
    if arch and not any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in arch):
        raise MtplabError(f"{path} holds a {', '.join(arch)}, which has no causal LM head; save the model with its "
                          "head (e.g. AutoModelForCausalLM ... save_pretrained) and point --hf at that")
    hf, info = _from_pretrained(p, path, dtype)
    missing = [k for k in info.get("missing_keys", []) if "rotary" not in k]
    extra = [k for k in info.get("unexpected_keys", []) if "rotary" not in k]
    if extra:  # a config.json that builds fewer layers than the weights hold would load as another model
        raise MtplabError(f"the weights in {path} hold {extra[:2]}{'...' if len(extra) > 2 else ''}, which its "
                          "config.json does not build; restore the config.json saved with these weights"
                          + (" (a converted model: delete its folder and run python -m mtplab convert again)"
                             if chat else ""))
    if missing:
        raise MtplabError(f"the weights in {path} lack {missing[:3]}{'...' if len(missing) > 3 else ''}; "
                          "they are not this causal LM's weights (a base model without its head?)")
    try:
        tok = AutoTokenizer.from_pretrained(p, local_files_only=True, trust_remote_code=False)
    except (ValueError, OSError, TypeError, KeyError, AttributeError) as e:
        raise MtplabError(f"{path} has no usable tokenizer ({str(e).splitlines()[0][:160]}); save the model's "
                          "tokenizer beside it (tokenizer.save_pretrained)") from None
    if len(tok) <= 1 or not tok.encode("def main(x):", add_special_tokens=False):
        raise MtplabError(f"{path} has no usable tokenizer (it encodes text to no tokens: tokenizer files missing?); "
                          "save the model's tokenizer beside it (tokenizer.save_pretrained)")
    target = HFTarget(hf, tok, path=str(p), kernel=kernel)
    target.chat = chat  # a real chat model named bare: prompts become one user turn of its chat template
    V = target.config.vocab_size
    if len(tok) > V:
        raise MtplabError(f"the tokenizer in {path} has {len(tok)} tokens but the model's output layer has {V}; "
                          "this tokenizer belongs to another model: save the model's own tokenizer beside it")
    return target.to(device)


def load_target(hf_path, heads_checkpoint=None, *, device="cpu", dtype=torch.float32,
                kernel: str = "exact", draft_vocab: bool = True) -> HFTarget:
    """An HF model and (optionally) its heads checkpoint, ready for `mtplab.decoding.generate.decode_with`:
    the one call a widget or notebook needs."""
    target = load_hf(hf_path, device=device, dtype=dtype, kernel=kernel)
    return load_heads(target, heads_checkpoint, draft_vocab=draft_vocab) if heads_checkpoint else target
