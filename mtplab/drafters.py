"""Drafters: everything that proposes tokens for `decoding.speculative` to verify.

B batch (1), T positions, C channels, V vocabulary, n drafts asked for.

The contract (after HF's CandidateGenerator, kept small):
    begin(model, tokens, out, prompt_len, ...)  once, after the target's prefill forward `out`
    propose(n) -> (drafts, q)                   n tokens to follow tokens[-1]; q: (n, V) or None = one-hot
    feedback(out, n_keep, tokens)               after each target forward: its first n_keep rows are kept
                                                positions, and `tokens` now holds every committed token
    last_forwards                               drafter forward passes spent by the last propose
`max_drafts` is the most drafts a step can take (None: no limit).
"""
from __future__ import annotations

import torch

from .decoding import distribution
from .errors import MtplabError
from .model import KVCache


class Drafter:
    name = "drafter"
    max_drafts: int | None = None
    supports_sampling = True
    last_forwards = 0

    def begin(self, model, tokens, out, prompt_len, *, max_new_tokens, generator, temperature, top_k):
        self.model, self.tokens, self.prompt_len = model, tokens, prompt_len
        self.temperature, self.top_k, self.generator = temperature, top_k, generator

    def propose(self, n: int):
        raise NotImplementedError

    def feedback(self, out, n_keep: int, tokens: list[int]):
        self.tokens = tokens


def _argmax_list(logits) -> list[int]:
    return logits.float().argmax(-1).tolist()


FAMILY_CHECKPOINT = {"stern": "stern-k4", "meta": "meta-k4", "deepseek": "deepseek-d1"}


def _need_heads(model, family: str, who: str):
    have = model.config.heads
    if have != family:
        raise MtplabError(f"{who} needs a checkpoint with {family} heads, but this one has "
                          f"{'none' if have == 'none' else have + ' heads'}; use the checkpoint "
                          f"{FAMILY_CHECKPOINT[family]} (CLI: --checkpoint {FAMILY_CHECKPOINT[family]})")


class SternDrafter(Drafter):
    """Stern et al. 2018: depths 2..K read the hidden state at the last kept position."""
    name = "blockwise"

    def __init__(self, model):
        _need_heads(model, "stern", "blockwise decoding")
        self.max_drafts = model.config.k - 1

    def begin(self, model, tokens, out, prompt_len, **kw):
        super().begin(model, tokens, out, prompt_len, **kw)
        self.h = out.hidden[:, -1:]  # (1, 1, C)

    def feedback(self, out, n_keep, tokens):
        self.tokens = tokens
        self.h = out.hidden[:, n_keep - 1:n_keep]  # (1, 1, C) the position that predicted tokens[-1]

    def propose(self, n):
        self.last_forwards = 0
        logits = self.model.unembed(self.model.mtp.hidden(self.h)[:, 0, :n])  # (1, n, V)
        return _argmax_list(logits[0]), None


class MetaDrafter(Drafter):
    """Gloeckle et al. 2024: each extra head is a transformer layer with its own KV cache over the trunk."""
    name = "meta"

    def __init__(self, model):
        _need_heads(model, "meta", "meta self-speculative decoding")
        self.max_drafts = model.config.k - 1

    def _extend(self, z):
        h = self.model.mtp.hidden(self.model, z, self.cache)  # (1, T, K-1, C)
        self.h_last = h[:, -1]  # (1, K-1, C)

    def begin(self, model, tokens, out, prompt_len, **kw):
        super().begin(model, tokens, out, prompt_len, **kw)
        self.cache = model.mtp.new_cache(model)
        self._extend(out.pre_last)

    def feedback(self, out, n_keep, tokens):
        self.tokens = tokens
        self._extend(out.pre_last[:, :n_keep])

    def propose(self, n):
        self.last_forwards = 1  # the K-1 head layers ran once over the newly kept positions (in feedback)
        return _argmax_list(self.model.unembed(self.h_last[:, :n])[0]), None


class DeepSeekDrafter(Drafter):
    """DeepSeek-V3 modules run free: module k reads the token module k-1 just drafted.

    Module k's cache entry at position j depends on t_{j+k}. Entries whose token is still a
    draft are provisional: after drafting, each module's cache is cropped back to the positions
    whose tokens are all committed (0..L-k, with L the target cache length), and the next
    propose recomputes the rest.
    """
    name = "deepseek"

    def __init__(self, model):
        _need_heads(model, "deepseek", "deepseek self-speculative decoding")
        self.max_drafts = model.config.n_modules

    def begin(self, model, tokens, out, prompt_len, **kw):
        super().begin(model, tokens, out, prompt_len, **kw)
        cfg = model.config
        D = cfg.n_modules
        p = model.wte.weight
        self.caches = [KVCache(1, 1, cfg.n_head, cfg.block_size, cfg.n_embd // cfg.n_head,
                               dtype=p.dtype, device=p.device) for _ in range(D)]
        # hidden states by depth: H[0] the main model, H[k] module k; (1, block_size, C)
        self.H = [torch.zeros(1, cfg.block_size, cfg.n_embd, dtype=p.dtype, device=p.device) for _ in range(D + 1)]
        P = out.hidden.shape[1]
        self.H[0][:, :P] = out.hidden

    def feedback(self, out, n_keep, tokens):
        self.tokens = tokens
        L = len(tokens) - 1  # target cache length
        self.H[0][:, L - n_keep:L] = out.hidden[:, :n_keep]

    def propose(self, n):
        model, tokens = self.model, self.tokens
        L = len(tokens) - 1  # positions 0..L-1 are in the target cache; tokens[L] is the last committed
        ext = list(tokens)
        drafts = []
        for k in range(1, n + 1):
            cache = self.caches[k - 1]
            a = cache.length
            # module k at positions a..L-1 reads h^{k-1} there and Emb(t_{j+k}); the last k-1 of those tokens are drafts
            emb = model.wte(torch.tensor([ext[a + k:L + k]], device=self.H[0].device))  # (1, L-a, C)
            h = model.mtp.layers[k - 1](model, self.H[k - 1][:, a:L], emb, cache)  # (1, L-a, C)
            self.H[k][:, a:L] = h
            d = int(model.unembed(h[:, -1]).float().argmax(-1))
            drafts.append(d)
            ext.append(d)
        for k in range(1, n + 1):  # drop provisional entries: keep positions j with t_{j+k} committed
            self.caches[k - 1].crop(max(0, min(self.caches[k - 1].length, L - k + 1)))
        self.last_forwards = n
        return drafts, None


class DraftModelDrafter(Drafter):
    """Classic two-model speculative decoding: a small model drafts, sampling from its own q."""
    name = "draft-model"

    def __init__(self, draft_model, target=None):
        if target is not None and draft_model.config.vocab_size != target.config.vocab_size:
            raise MtplabError(f"the draft model's vocabulary ({draft_model.config.vocab_size}) differs from the "
                              f"target's ({target.config.vocab_size}); both must share one tokenizer")
        self.draft = draft_model

    def begin(self, model, tokens, out, prompt_len, **kw):
        super().begin(model, tokens, out, prompt_len, **kw)
        if self.draft.config.vocab_size != model.config.vocab_size:
            raise MtplabError("the draft model's vocabulary differs from the target's; both must share one tokenizer")
        self.cache = self.draft.new_cache()
        self.fed: list[int] = []  # tokens whose keys/values sit in the draft cache

    def feedback(self, out, n_keep, tokens):
        self.tokens = tokens
        i = 0
        lim = min(len(self.fed), len(tokens))
        while i < lim and self.fed[i] == tokens[i]:
            i += 1
        self.cache.crop(i)
        del self.fed[i:]

    def propose(self, n):
        dev = self.draft.wte.weight.device
        new = self.tokens[len(self.fed):]
        drafts, qs = [], []
        for j in range(n):
            out = self.draft(torch.tensor([new], device=dev), self.cache)
            self.fed.extend(new)
            q = distribution(out.logits[0, -1:], self.temperature, self.top_k)[0]  # (V,)
            d = int(q.argmax()) if self.temperature == 0 else int(torch.multinomial(q, 1, generator=self.generator))
            drafts.append(d)
            qs.append(q)
            new = [d]
        self.last_forwards = n
        return drafts, torch.stack(qs) if qs else None


class NgramDrafter(Drafter):
    """Prompt lookup: find the latest earlier occurrence of the current suffix and copy what followed."""
    name = "ngram"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, n):
        self.last_forwards = 0
        toks = self.tokens
        L = len(toks)
        for g in range(min(self.max_ngram, L - 1), self.min_ngram - 1, -1):
            suffix = toks[L - g:]
            for s in range(L - g - 1, -1, -1):  # latest match first
                if toks[s:s + g] == suffix:
                    cont = toks[s + g:s + g + n]
                    if cont:
                        return list(cont), None
        return [], None


class OracleDrafter(Drafter):
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

    def propose(self, n):
        self.last_forwards = 0
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
        return drafts, None


def oracle_for(model, prompt_ids, *, max_new_tokens: int, k: int, alpha: float, seed: int = 0) -> OracleDrafter:
    """An oracle drafter for `model` and this prompt (runs the target greedily once, untimed)."""
    from .decoding import autoregressive

    ref = autoregressive(model, prompt_ids, max_new_tokens=max_new_tokens).tokens
    return OracleDrafter(ref, alpha, seed=seed)


def for_method(method: str, model, *, draft_model=None, reference=None, alpha: float = 1.0, seed: int = 0):
    """The drafter and schedule each CLI method uses."""
    if method == "blockwise":
        return SternDrafter(model), "plain"
    if method == "blockwise-overlap":
        return SternDrafter(model), "overlap"
    if method == "meta":
        return MetaDrafter(model), "overlap"
    if method == "deepseek":
        return DeepSeekDrafter(model), "overlap"
    if method == "draft-model":
        if draft_model is None:
            raise MtplabError("method draft-model needs a draft model (--draft-checkpoint draft)")
        return DraftModelDrafter(draft_model, model), "overlap"
    if method == "ngram":
        return NgramDrafter(), "overlap"
    if method == "oracle":
        return OracleDrafter(reference, alpha, seed=seed), "overlap"
    raise MtplabError(f"unknown method {method!r}; choose ar, blockwise, blockwise-overlap, meta, deepseek, "
                      "draft-model, ngram or oracle")
