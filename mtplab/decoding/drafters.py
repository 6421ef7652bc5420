"""Drafters: everything that proposes tokens for the speculative loop (`mtplab.decoding`) to verify,
and `METHODS`, the one table that maps a method name to its drafter, schedule and checkpoint.

B batch (1), T positions, C channels, V vocabulary, n drafts asked for.

The contract (`Drafter`, after HF's CandidateGenerator, kept small):
    begin(model, tokens, out, prompt_len, *, max_new_tokens, sampling)
                                                once, after the target's prefill forward `out`
    propose(n) -> Draft                         n <= max_drafts tokens to follow tokens[-1] (maybe fewer, maybe
                                                none), their q, the calls it took
    feedback(out, n_keep, tokens)               after each target forward: its first n_keep rows are kept
                                                positions, and `tokens` now holds every committed token
`max_drafts` is the most drafts a step can take (None: no limit). The loop times propose and feedback
together as the drafter's cost. A new drafter is one class here and one row in `METHODS`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Protocol
import torch
from mtplab.model.config import ModelConfig
from mtplab.decoding.accept import Sampling, distribution
from mtplab.decoding.checks import fitted
from mtplab.errors import MtplabError
from mtplab.paths import REAL_NAMES
from mtplab.model.layers import KVCache


@dataclass
class Draft:
    """What one propose returns."""
    tokens: list[int]                 # the drafts, to follow tokens[-1]
    q: torch.Tensor | None = None     # (n, V) the drafter's distributions; None: one-hot on the drafts
    calls: int = 0                    # drafter forward passes it took (a head pass, module calls, ...)
    confidence: list[float] | None = None  # the drafter's own top-1 probability of each draft (adaptive k)


class Drafter(Protocol):
    name: str
    max_drafts: int | None
    supports_sampling: bool

    def begin(self, model, tokens: list[int], out, prompt_len: int, *, max_new_tokens: int,
              sampling: Sampling) -> None: ...

    def propose(self, n: int, stop: Callable[[float], bool] | None = None) -> Draft: ...

    def feedback(self, out, n_keep: int, tokens: list[int]) -> None: ...


class BaseDrafter:
    """Defaults for the contract: remember the options and the committed tokens."""
    name = "drafter"
    max_drafts: int | None = None
    supports_sampling = True

    def begin(self, model, tokens, out, prompt_len, *, max_new_tokens, sampling: Sampling):
        self.model, self.tokens, self.prompt_len = model, tokens, prompt_len
        self.sampling = sampling
        # positions a drafter's caches may hold: at most the committed tokens, with room to spare for one step's drafts
        self.max_len = fitted(model, len(tokens) + max_new_tokens + int(self.max_drafts or 0) + 1)

    def propose(self, n: int, stop: Callable[[float], bool] | None = None) -> Draft:
        """n drafts (or fewer). `stop` (an adaptive policy's, `mtplab.decoding.adaptive`): the DeepSeek drafter, which
        drafts one token at a time, ends the draft after the first whose confidence makes it true and saves the deeper
        drafts' work; the others ignore it (the policy cuts afterwards, where the drafter reports confidences)."""
        raise NotImplementedError

    def feedback(self, out, n_keep: int, tokens: list[int]):
        self.tokens = tokens


def _need_heads(model, family: str, who: str):
    have = model.config.heads
    if have != family:
        name = next(m.checkpoint for m in METHODS.values() if m.family == family)
        raise MtplabError(f"{who} needs a checkpoint with {family} heads, but this one has "
                          f"{'none' if have == 'none' else have + ' heads'}; use the checkpoint "
                          f"{name} (CLI: --checkpoint {name})")


def check_same_vocabulary(draft_model, target) -> None:
    """Two-model speculative decoding compares token ids: both models must share one tokenizer."""
    vd, vt = draft_model.config.vocab_size, target.config.vocab_size
    if vd != vt:
        raise MtplabError(f"the draft model's vocabulary ({vd}) differs from the target's ({vt}); "
                          "both must share one tokenizer")


def _confidence(logits: torch.Tensor) -> list[float]:
    """(n, V) logits -> each row's top-1 probability."""
    return torch.softmax(logits.float(), -1).max(-1).values.tolist()


def _top(logits: torch.Tensor, width: int) -> list[list[int]]:
    """(n, V) logits -> the top-`width` token ids of each row, best first."""
    return torch.topk(logits.float(), min(width, logits.shape[-1]), dim=-1).indices.tolist()


class _HeadsDrafter(BaseDrafter):
    """Stern's and Meta's heads: every depth reads one hidden state, so one head pass (`_logits`) drafts them all."""

    def _logits(self, n: int) -> torch.Tensor:
        """(n, V): depths 2..n+1 from the hidden state at the last kept position."""
        raise NotImplementedError

    def propose(self, n, stop=None):
        logits = self._logits(n)
        return Draft(logits.float().argmax(-1).tolist(), calls=1, confidence=_confidence(logits))

    def candidates(self, n: int, width: int) -> list[list[int]]:
        """The top-`width` tokens of depths 2..n+1, best first (token trees: one head pass gives every depth's
        candidates, since each depth reads the same hidden state)."""
        return _top(self._logits(n), width)


class SternDrafter(_HeadsDrafter):
    """Stern et al. 2018: depths 2..K read the hidden state at the last kept position."""
    name = "blockwise"

    def __init__(self, model):
        _need_heads(model, "stern", "blockwise decoding")
        self.max_drafts = model.config.n_depths - 1

    def begin(self, model, tokens, out, prompt_len, **kw):
        super().begin(model, tokens, out, prompt_len, **kw)
        self.h = out.hidden[:, -1:]  # (1, 1, C)

    def feedback(self, out, n_keep, tokens):
        self.tokens = tokens
        self.h = out.hidden[:, n_keep - 1:n_keep]  # (1, 1, C) the position that predicted tokens[-1]

    def _logits(self, n):
        # one pass of the heads: the shared h -> 4h layer, n of the 4h -> h layers, the shared output head
        return self.model.draft_unembed(self.model.mtp.hidden(self.h, n)[:, 0])[0]  # (n, V)


class MetaDrafter(_HeadsDrafter):
    """Gloeckle et al. 2024: each extra head is a transformer layer with its own KV cache over the trunk."""
    name = "meta"

    def __init__(self, model):
        _need_heads(model, "meta", "meta self-speculative decoding")
        self.max_drafts = model.config.n_depths - 1

    def _extend(self, z):
        # the K-1 head layers side by side as batched matmuls (Gloeckle et al.'s heads all read the same z)
        h = self.heads(z, self.model.rope(self.cache.length, z.shape[1]), self.cache)  # (K-1, T, C)
        self.h_last = h[:, -1].unsqueeze(0)  # (1, K-1, C)

    def begin(self, model, tokens, out, prompt_len, **kw):
        super().begin(model, tokens, out, prompt_len, **kw)
        self.cache = model.mtp.new_cache(model, max_len=self.max_len)
        self.heads = model.mtp.stacked()
        self._extend(out.pre_last)

    def feedback(self, out, n_keep, tokens):
        self.tokens = tokens
        self._extend(out.pre_last[:, :n_keep])

    def _logits(self, n):
        # the K-1 head layers ran once over the newly kept positions (in feedback): one call
        return self.model.draft_unembed(self.h_last[:, :n])[0]  # (n, V)


class DeepSeekDrafter(BaseDrafter):
    """DeepSeek-V3 modules run free: module k reads the token module k-1 just drafted.

    Module k's cache entry at position j depends on t_{j+k}. Entries whose token is still a
    draft are provisional: after drafting, each module's cache is cropped back to the positions
    whose tokens are all committed (0..L-k, with L the target cache length), and the next
    propose recomputes the rest.
    """
    name = "deepseek"

    def __init__(self, model, *, reuse: int | None = None):
        """reuse=R: apply module 1 recurrently for R drafts, each step feeding its own hidden state and its draft's
        embedding (as engines serve DeepSeek-V3's one MTP module for more speculative tokens than modules, and as
        EAGLE drafts over the target's hidden states); None: D separate modules, one draft each."""
        _need_heads(model, "deepseek", "deepseek self-speculative decoding")
        if reuse is not None and (isinstance(reuse, bool) or not isinstance(reuse, int) or not 1 <= reuse <= 16):
            raise MtplabError(f"reuse must be an integer in 1..16 drafts (got {reuse!r})")
        self.reuse = reuse
        self.max_drafts = model.config.n_modules if reuse is None else reuse
        if reuse is not None:
            self.name = "deepseek-reuse"

    def _module(self, k: int):
        return self.model.mtp.layers[0 if self.reuse is not None else k - 1]

    def begin(self, model, tokens, out, prompt_len, **kw):
        super().begin(model, tokens, out, prompt_len, **kw)
        cfg = model.config
        D = int(self.max_drafts or 0)
        p = model.wte.weight
        self.caches = [KVCache.for_config(cfg, 1, max_len=self.max_len, like=p) for _ in range(D)]
        # hidden states by depth: H[0] the main model, H[k] module k; (1, max_len, C)
        self.H = [torch.zeros(1, self.max_len, cfg.n_embd, dtype=p.dtype, device=p.device) for _ in range(D + 1)]
        P = out.hidden.shape[1]
        self.H[0][:, :P] = out.hidden

    def feedback(self, out, n_keep, tokens):
        self.tokens = tokens
        L = len(tokens) - 1  # target cache length
        self.H[0][:, L - n_keep:L] = out.hidden[:, :n_keep]

    def _depths(self, n, pick, halt=None):
        """Module k = 1..n in turn, each reading the token `pick` chose from module k-1's logits, until `halt` (of the
        logits just made) is true; then every module's cache is cropped back to its committed positions. Returns
        each depth's logits (1, V) and the tokens picked."""
        model, tokens = self.model, self.tokens
        L = len(tokens) - 1  # positions 0..L-1 are in the target cache; tokens[L] is the last committed
        ext = list(tokens)
        out = []
        for k in range(1, n + 1):
            cache = self.caches[k - 1]
            a = cache.length
            # module k at positions a..L-1 reads h^{k-1} there and Emb(t_{j+k}); the last k-1 of those tokens are drafts
            emb = model.wte(torch.tensor([ext[a + k:L + k]], device=self.H[0].device))  # (1, L-a, C)
            h = self._module(k)(model, self.H[k - 1][:, a:L], emb, cache)  # (1, L-a, C)
            self.H[k][:, a:L] = h
            out.append(model.draft_unembed(h[:, -1]).float())  # (1, V): the draft vocabulary's rows, where one is set
            ext.append(pick(out[-1]))
            if halt is not None and halt(out[-1]):
                break
        for k in range(1, n + 1):  # drop provisional entries: keep positions j with t_{j+k} committed
            self.caches[k - 1].crop(max(0, min(self.caches[k - 1].length, L - k + 1)))
        return out, ext[L + 1:]

    def propose(self, n, stop=None):
        confidence: list[float] = []

        def halt(lg):  # each depth's top-1 probability, computed once: the confidence, and what `stop` reads
            confidence.append(float(torch.softmax(lg, -1).max()))
            return stop is not None and stop(confidence[-1])
        _, drafts = self._depths(n, lambda lg: int(lg.argmax(-1)), halt)
        return Draft(drafts, calls=len(drafts), confidence=confidence)

    def candidates(self, n: int, width: int) -> list[list[int]]:
        """The top-`width` tokens of depth 2 (a token tree one depth deep: `n` must be 1). Deeper, a module reads the
        token drafted before it, so its candidates differ for each candidate above it: not the tree `build_tree`
        makes, whose depths share one list of candidates."""
        if n != 1:
            raise MtplabError(f"a token tree of DeepSeek modules is one depth deep here (widths=(w,)), not {n}: module 2 "
                              "reads the token module 1 drafted, so its candidates depend on which depth-1 candidate "
                              "precedes them")
        return _top(self._depths(1, lambda lg: 0)[0][0], width)


class DraftModelDrafter(BaseDrafter):
    """Classic two-model speculative decoding: a small model drafts, sampling from its own q."""
    name = "draft-model"

    def __init__(self, draft_model, target=None):
        if target is not None:
            check_same_vocabulary(draft_model, target)
        self.draft = draft_model

    def begin(self, model, tokens, out, prompt_len, **kw):
        super().begin(model, tokens, out, prompt_len, **kw)
        check_same_vocabulary(self.draft, model)
        # the committed tokens and one step's drafts but its last (never fed): `max_len`, within the draft's window
        self.cache = self.draft.new_cache(max_len=min(self.max_len, self.draft.config.block_size))
        self.fed: list[int] = []  # tokens whose keys/values sit in the draft cache

    def feedback(self, out, n_keep, tokens):
        self.tokens = tokens
        i = 0
        lim = min(len(self.fed), len(tokens))
        while i < lim and self.fed[i] == tokens[i]:
            i += 1
        self.cache.crop(i)
        del self.fed[i:]

    def propose(self, n, stop=None):
        dev = self.draft.wte.weight.device
        new = self.tokens[len(self.fed):]
        drafts, qs = [], []
        for _ in range(n):
            out = self.draft(torch.tensor([new], device=dev), self.cache)
            self.fed.extend(new)
            s = self.sampling
            q = distribution(out.logits[0, -1:], s.temperature, s.top_k)[0]  # (V,)
            d = int(q.argmax()) if s.greedy else int(torch.multinomial(q, 1, generator=s.generator))
            drafts.append(d)
            qs.append(q)
            new = [d]
        return Draft(drafts, torch.stack(qs) if qs else None, calls=n)


class NgramDrafter(BaseDrafter):
    """Prompt lookup (Saxena 2023, "Prompt Lookup Decoding"): find an earlier occurrence of the current suffix
    and copy what followed. Saxena's reference (`find_candidate_pred_tokens`) and transformers take the earliest
    match (earliest=True; transformers with max_ngram=2); the lab's default takes the latest match instead, its
    own variant: in code that loops, the latest occurrence is the likeliest to continue alike."""
    name = "ngram"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, *, earliest: bool = False):
        self.max_ngram, self.min_ngram, self.earliest = max_ngram, min_ngram, earliest

    def propose(self, n, stop=None):
        toks = self.tokens
        L = len(toks)
        for g in range(min(self.max_ngram, L - 1), self.min_ngram - 1, -1):
            suffix = toks[L - g:]
            starts = range(L - g) if self.earliest else range(L - g - 1, -1, -1)  # latest match first by default
            for s in starts:
                if toks[s:s + g] == suffix:
                    cont = toks[s + g:s + g + n]
                    if cont:
                        return Draft(list(cont))
        return Draft([])


class OracleDrafter(BaseDrafter):
    """Drafts the target's own greedy token with probability alpha, a wrong token otherwise.

    It knows the target's greedy continuation in advance (`reference`), so acceptance is
    i.i.d. with rate alpha: a tool for checking the theory and for cost studies, not a method.
    """
    name = "oracle"
    supports_sampling = False

    def __init__(self, reference: list[int], alpha: float, seed: int = 0):
        if not 0.0 <= alpha <= 1.0:
            raise MtplabError(f"alpha must lie in [0, 1] (got {alpha})")
        self.reference, self.alpha = list(reference), alpha
        self.rng = torch.Generator().manual_seed(seed)

    def propose(self, n, stop=None):
        pos = len(self.tokens) - self.prompt_len
        drafts = []
        for i in range(n):
            j = pos + i
            right = self.reference[j] if j < len(self.reference) else 0
            if float(torch.rand(1, generator=self.rng)) < self.alpha:
                drafts.append(right)
            else:
                V = self.model.config.vocab_size  # a wrong token: any other id of the vocabulary
                drafts.append((right + 1 + int(torch.randint(V - 1, (1,), generator=self.rng))) % V)
        return Draft(drafts)


# ------------------------------------------------------------------------------------- the methods
@dataclass(frozen=True)
class Method:
    """One way to decode: which drafter, which schedule, which shipped checkpoint by default."""
    name: str
    checkpoint: str                                   # default checkpoint (data/checkpoints/NAME)
    schedule: str                                     # 'ar', 'plain' or 'overlap'
    make: Callable[..., BaseDrafter] | None           # (model, **context) -> drafter; None for AR
    family: str | None = None                         # head family the checkpoint must carry
    max_k: Callable[[ModelConfig], int] | None = None  # most tokens per step the checkpoint supports
    needs_draft_model: bool = False                   # a second, smaller model drafts (draft-model)
    needs_reference: bool = False                     # drafts from the target's own greedy text (oracle)

    @property
    def speculative(self) -> bool:
        return self.make is not None


def _needs_draft_model(model, *, draft_model=None, **_):
    if draft_model is None:
        raise MtplabError("method draft-model needs a draft model (--draft-checkpoint draft)")
    return DraftModelDrafter(draft_model, model)


def _depths(cfg: ModelConfig) -> int:
    return cfg.n_depths


def _modules_plus_one(cfg: ModelConfig) -> int:
    return cfg.n_modules + 1


REUSE_DRAFTS = 7  # deepseek-reuse: module 1 applied recurrently for up to 7 drafts (k <= 8)

METHODS: dict[str, Method] = {m.name: m for m in [
    Method("ar", "ntp", "ar", None),
    Method("blockwise", "stern-k4", "plain", lambda model, **_: SternDrafter(model), "stern", _depths),
    Method("blockwise-overlap", "stern-k4", "overlap", lambda model, **_: SternDrafter(model), "stern", _depths),
    Method("meta", "meta-k4", "overlap", lambda model, **_: MetaDrafter(model), "meta", _depths),
    Method("deepseek", "deepseek-d1", "overlap", lambda model, **_: DeepSeekDrafter(model), "deepseek",
           _modules_plus_one),
    Method("deepseek-reuse", "deepseek-d1", "overlap", lambda model, **_: DeepSeekDrafter(model, reuse=REUSE_DRAFTS),
           "deepseek", lambda cfg: REUSE_DRAFTS + 1),
    Method("draft-model", "ntp", "overlap", _needs_draft_model, needs_draft_model=True),
    Method("ngram", "ntp", "overlap", lambda model, **_: NgramDrafter()),
    Method("oracle", "ntp", "overlap",
           lambda model, *, reference=None, alpha=0.8, seed=0, **_: OracleDrafter(reference or [], alpha, seed=seed),
           needs_reference=True),
]}


FAMILIES = tuple(dict.fromkeys(m.family for m in METHODS.values() if m.family))  # ('stern', 'meta', 'deepseek')


def default_for_family(family: str) -> Method:
    """The method that decodes a head family's checkpoint by default: the family's first overlapped method in
    `METHODS` (stern -> blockwise-overlap, meta -> meta, deepseek -> deepseek)."""
    for m in METHODS.values():
        if m.family == family and m.schedule == "overlap":
            return m
    raise MtplabError(f"no method decodes head family {family!r}; the families are {', '.join(FAMILIES)}")


class Pair(NamedTuple):
    """One shipped (method, checkpoint) pair as the benchmarks name it. k None: the most the checkpoint supports.
    model None: the classroom model; else a real model (`mtplab.hf.real.REAL_MODELS`), whose checkpoint is a heads
    file (None for AR and transformers' own methods), with the drafts' vocabulary and the dtype as fields."""
    label: str
    method: str
    checkpoint: str | None
    k: int | None
    model: str | None = None
    draft_vocab: str = "full"     # 'reduced': the heads file's draft vocabulary
    dtype: str = "fp32"           # 'bf16': faster, not exact
    kernel: str = "exact"         # 'stock': F.linear and transformers' forward (`HFTarget.use_kernel`), to compare
    widths: tuple | None = None   # a token tree's candidates per depth (`decoding.tree`); None: the chain
    stop: float | None = None     # a chain's confidence stop (`adaptive.ConfidenceStop`); None: k-1 drafts every step

    @property
    def family(self) -> str | None:
        m = METHODS.get(self.method)  # transformers' own methods ('hf-generate', 'hf-lookup') are not the lab's
        return m.family if m is not None else None


# a real model's rows are named from their fields (`real_label`), as `bench real` and the notebooks print them
REAL_METHOD_NAMES = {"ar": "AR", "hf-generate": "transformers generate", "hf-lookup": "transformers prompt lookup",
                     "ngram": "n-gram", "deepseek": "DeepSeek D=1", "deepseek-reuse": "DeepSeek D=1 reused",
                     "blockwise-overlap": "Stern K=4"}
REAL_HEADS = {"deepseek": "deepseek-d1", "stern": "stern-k4"}  # the heads file of each family (data/hf/MODEL/)


def real_label(method: str, k: int | None, draft_vocab: str = "full", dtype: str = "fp32", kernel: str = "exact",
               widths: tuple | None = None, stop: float | None = None) -> str:
    """'DeepSeek D=1 reused, k=4, reduced vocab': a real-model row's label made from its fields (a tree:
    'Stern K=4 tree 2x1x1, k=4, ...'; a confidence stop: '..., confidence stop 0.3'; the stock kernels: '..., stock
    kernels')."""
    name = REAL_METHOD_NAMES[method] + (" tree " + "x".join(map(str, widths)) if widths else "")
    head = f"{name}, {k - 1} drafts" if method == "hf-lookup" and k else (f"{name}, k={k}" if k else name)
    return (head + (", reduced vocab" if draft_vocab == "reduced" else "") + (", bf16" if dtype == "bf16" else "")
            + (f", confidence stop {stop:g}" if stop is not None else "") + (", stock kernels" if kernel == "stock" else ""))


def _real(method: str, k: int | None, draft_vocab: str = "full", dtype: str = "fp32", *, kernel: str = "exact",
          widths: tuple | None = None, stop: float | None = None) -> Pair:
    family = METHODS[method].family if method in METHODS else None
    return Pair(real_label(method, k, draft_vocab, dtype, kernel, widths, stop), method,
                REAL_HEADS.get(family) if family else None, k, REAL_NAMES[0], draft_vocab, dtype, kernel, widths, stop)


# What ships: every pair a benchmark measures; the benchmarks' tables are filters of it (`pairs`).
PAIRS: list[Pair] = [
    Pair("blockwise", "blockwise", METHODS["blockwise"].checkpoint, 4),
    Pair("blockwise-overlap", "blockwise-overlap", METHODS["blockwise-overlap"].checkpoint, 4),
    Pair("meta", "meta", METHODS["meta"].checkpoint, 4),
    Pair("deepseek D=1", "deepseek", "deepseek-d1", None),
    Pair("deepseek D=3", "deepseek", "deepseek-d3", None),
    Pair("deepseek D=1 reused", "deepseek-reuse", "deepseek-d1", None),
    Pair("draft-model", "draft-model", METHODS["draft-model"].checkpoint, 4),
    Pair("ngram", "ngram", METHODS["ngram"].checkpoint, 4),
    Pair("oracle alpha=0.8", "oracle", METHODS["oracle"].checkpoint, 4),
    # the real model (`bench real`): the baselines that need no training (transformers' generate and prompt lookup,
    # the lab's n-gram), each head family over the full and the draft vocabulary and at several k, the stock kernels
    # against the exact ones, a token tree against the chain, a confidence stop against k-1 drafts every step, and
    # the lossy bf16 mode
    _real("ar", None), _real("hf-generate", None), _real("hf-lookup", 4), _real("ngram", 3), _real("ngram", 4),
    _real("deepseek", 2), _real("deepseek", 2, "reduced"), _real("deepseek-reuse", 3, "reduced"),
    _real("deepseek-reuse", 4), _real("deepseek-reuse", 4, "reduced"), _real("deepseek-reuse", 5, "reduced"),
    _real("deepseek-reuse", 4, "reduced", stop=0.3), _real("deepseek-reuse", 5, "reduced", stop=0.3),
    _real("blockwise-overlap", 2, "reduced"), _real("blockwise-overlap", 3, "reduced"),
    _real("blockwise-overlap", 4, "reduced", stop=0.3),
    _real("blockwise-overlap", 4), _real("blockwise-overlap", 4, "reduced"),
    _real("blockwise-overlap", 4, "reduced", widths=(2, 1, 1)), _real("blockwise-overlap", 3, "reduced", widths=(2, 2)),
    _real("deepseek", 2, "reduced", widths=(2,)), _real("deepseek", 2, "reduced", widths=(3,)),
    _real("ar", None, kernel="stock"), _real("deepseek", 2, "reduced", kernel="stock"),
    _real("ar", None, dtype="bf16"), _real("deepseek-reuse", 4, "reduced", "bf16"),
]


def pairs(model: str | None = None) -> list[Pair]:
    """The shipped pairs of one model: the classroom model's (None), or a real model's by its name."""
    return [p for p in PAIRS if p.model == model]


def pair(label: str) -> Pair:
    for p in PAIRS:
        if p.label == label:
            return p
    raise MtplabError(f"no shipped pair is labelled {label!r}; choose one of {', '.join(p.label for p in PAIRS)}")


def method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise MtplabError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}") from None
