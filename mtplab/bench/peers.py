"""`python -m mtplab bench peers --hf PATH [--draft-hf PATH]`: mtplab's loop beside what a user would pick
instead, Hugging Face's own `generate`, on the same model and the same drafts.

Rows (greedy, m new tokens, the held-out prompts, every pair interleaved per prompt, medians of rounds):
* `generate()` against mtplab's AR;
* `generate(prompt_lookup_num_tokens=k-1)` against mtplab's loop with the same lookup rule (2-gram, earliest
  match: the same drafts), and mtplab's own n-gram drafter (up to 4-gram, latest match) at the same k;
* `generate(assistant_model=draft)` with k-1 drafts a round (the same drafts as mtplab's draft-model method)
  and with transformers' defaults, against mtplab's draft-model method (with --draft-hf);
* mtplab's heads on the model (`train --hf`, then --heads-checkpoint), which HF has no counterpart for.
Each reports tokens per target forward (counted by a hook on the forward that row calls: transformers' model
for HF's rows, the lab's target for mtplab's, whose Llama-family forward is the lab's own, not transformers'),
wall clock against HF's
plain greedy, and whether its tokens equal HF's plain greedy output. End-of-text never stops a decode here
(every run makes exactly m tokens), so the rows compare the same work. Run alone.
"""
from __future__ import annotations

import statistics
from pathlib import Path

import torch

from mtplab.bench.report import held_out_count, _md, _write
from mtplab.data import held_out_prompts
from mtplab.decoding.drafters import NgramDrafter, check_same_vocabulary, default_for_family
from mtplab.decoding.generate import decode_with, max_k
from mtplab.decoding.loop import speculative
from mtplab.device import now, pick
from mtplab.errors import MtplabError
from mtplab.measuring.race import race
from mtplab.measuring.timing import untimed_output


BASE = "HF generate, greedy"


class _Counter:
    """Counts forward calls of a torch module."""

    def __init__(self, module):
        self.n = 0
        self.handle = module.register_forward_pre_hook(self._hit)

    def _hit(self, *_):
        self.n += 1


def _forward_of(who: str, model):
    """The module whose forward is one target (or draft) forward for a row by `who`: transformers' model for HF's
    rows; the lab's `HFTarget` for mtplab's, whose forward is the lab's own for Llama-family models (transformers'
    forward is then never called) and calls transformers' model once otherwise."""
    return model.hf if who == "hf" else model


def _generate(hf, ids: list[int], m: int, **kw) -> list[int]:
    from mtplab.hf.run import generate_ids  # transformers
    return generate_ids(hf, ids, m, **kw)


def hf_assisted(hf, draft_hf, ids: list[int], m: int, *, drafts: int | None) -> list[int]:
    """HF's assisted generation with a draft model. drafts=None: transformers' own defaults (20 drafts a round,
    cut short below 0.4 confidence); drafts=n: exactly n greedy drafts every round, the drafts mtplab's
    draft-model method makes at k = n+1."""
    g = draft_hf.generation_config
    saved = (g.num_assistant_tokens, g.num_assistant_tokens_schedule, g.assistant_confidence_threshold)
    if drafts is not None:
        g.num_assistant_tokens, g.num_assistant_tokens_schedule, g.assistant_confidence_threshold = drafts, "constant", 0.0
    try:
        return _generate(hf, ids, m, assistant_model=draft_hf)
    finally:
        g.num_assistant_tokens, g.num_assistant_tokens_schedule, g.assistant_confidence_threshold = saved


def lookup_hf_rule(target, ids: list[int], m: int, k: int) -> list[int]:
    """mtplab's loop with transformers' prompt-lookup rule (the earliest match of the last 2 tokens, else of the
    last 1): the drafts `generate(prompt_lookup_num_tokens=k-1)` makes, so the two rows differ only in the loop."""
    drafter = NgramDrafter(max_ngram=2, earliest=True)
    return speculative(target, drafter, ids, max_new_tokens=m, k=k, schedule="overlap", method="ngram-hf-rule").tokens


def variants(target, draft, k: int, heads=None):
    """label -> (who, a function ids, m -> new ids); HF and mtplab side by side on the same drafts.
    heads: the target with mtplab heads attached (DeepSeek D = 1 from `train --hf`): a row with no HF peer."""
    hf = target.hf
    out = {BASE: ("hf", lambda ids, m: _generate(hf, ids, m)),
           "mtplab AR": ("mtplab", lambda ids, m: decode_with("ar", target, ids, max_new_tokens=m).tokens),
           f"HF prompt lookup, {k - 1} drafts": ("hf", lambda ids, m: _generate(hf, ids, m,
                                                                                prompt_lookup_num_tokens=k - 1)),
           f"mtplab n-gram, HF's rule, k={k}": ("mtplab", lambda ids, m: lookup_hf_rule(target, ids, m, k)),
           f"mtplab n-gram, k={k}": ("mtplab", lambda ids, m: decode_with("ngram", target, ids, max_new_tokens=m,
                                                                          k=k).tokens)}
    if draft is not None:
        out[f"HF assisted, {k - 1} drafts"] = ("hf", lambda ids, m: hf_assisted(hf, draft.hf, ids, m, drafts=k - 1))
        out["HF assisted, its defaults"] = ("hf", lambda ids, m: hf_assisted(hf, draft.hf, ids, m, drafts=None))
        out[f"mtplab draft-model, k={k}"] = ("mtplab", lambda ids, m: decode_with(
            "draft-model", target, ids, max_new_tokens=m, k=k, draft_model=draft).tokens)
    if heads is not None:
        method = default_for_family(heads.config.heads).name
        kh = max_k(method, heads)  # the most the heads give
        out[f"mtplab {heads.config.heads} heads, k={kh} (no HF peer)"] = ("mtplab", lambda ids, m: decode_with(
            method, heads, ids, max_new_tokens=m, k=kh).tokens)
    return out


@torch.inference_mode()
def peer_rows(target, draft, prompts: list[list[int]], *, m: int = 64, k: int = 4, repeats: int = 3,
              heads=None, only: list[str] | None = None) -> list[dict]:
    """Every variant (or those named in `only`; HF's plain greedy is always run, as the baseline) on every prompt,
    interleaved, `repeats` rounds; rows with the median wall clock against HF's plain greedy, tokens per target
    forward, and how many prompts equal HF's plain greedy output."""
    if not prompts:
        raise MtplabError("give at least one prompt")
    dev = target.wte.weight.device
    table = variants(target, draft, k, heads)
    if isinstance(only, str):  # one row named as text, not its characters
        only = [only]
    if only is not None:  # a row by its name or by a prefix only it starts with ("HF prompt lookup")
        named = []
        for n in only:
            hits = [r for r in table if r == n] or [r for r in table if isinstance(n, str) and r.startswith(n)]
            if len(hits) != 1:
                raise MtplabError(f"no {'single ' if hits else ''}peer row named {n!r}; choose among {', '.join(table)}")
            named += hits
        table = {n: v for n, v in table.items() if n == BASE or n in named}
    counters = {who: _Counter(_forward_of(who, target)) for who in ("hf", "mtplab")}
    forwards = {label: 0 for label in table}

    def contender(label, who, fn):
        def run(p):
            counters[who].n = 0
            toks = fn(p, m)
            forwards[label] += counters[who].n
            return toks
        return run
    try:
        res = race({label: contender(label, who, fn) for label, (who, fn) in table.items()}, prompts, baseline=BASE,
                   rounds=repeats, device=dev, warmup=lambda label, _r: table[label][1](prompts[0], 4))
    finally:
        for c in counters.values():
            c.handle.remove()
    n = len(prompts)
    rows = []
    for label, (who, _) in table.items():
        sp = res.row(label)
        rows.append({"method": label, "who": who, "tokens_per_forward": m * n * repeats / max(1, forwards[label]),
                     "speedup_vs_hf_greedy": sp["speedup"], "speedup_min": sp["speedup_min"],
                     "speedup_max": sp["speedup_max"], "identical_to_hf_greedy": sp["identical"], "prompts": n,
                     "valid": res.valid, "busy": res.busy, "verdict": res.verdict()})
    return rows


def _loop_code(f) -> bool:
    """A cProfile entry of the loop around the model: Python code outside torch and the model's own modules."""
    path, _, name = f
    return not (path == "~" or "/torch/" in path or "/modeling_" in path or "/integrations/" in path)


class _Stopwatch:
    """Seconds spent inside a module's forward (pre-hook starts, hook stops; the device is synced at both)."""

    def __init__(self, module, dev):
        self.s, self.n, self.dev, self._t0 = 0.0, 0, dev, 0.0
        self.handles = [module.register_forward_pre_hook(self._start), module.register_forward_hook(self._stop)]

    def _start(self, *_):
        self._t0 = now(self.dev)

    def _stop(self, *_):
        self.s += now(self.dev) - self._t0
        self.n += 1

    def remove(self):
        for h in self.handles:
            h.remove()


@torch.inference_mode()
def forward_call_costs(target, *, context: int = 160, q: int = 4, repeats: int = 21) -> dict:
    """What a call costs beside the model's work, two ways on the same model: one verify forward over q new tokens
    at a cached context, as mtplab's loop calls it (ids and the cache) and as transformers' assisted loop calls it
    (plus a full 2-D attention mask and `logits_to_keep`); and a whole decode of one token from the same prompt
    (the prefill plus each loop's setup), mtplab's AR against `generate`. Raced (`race`), medians in ms."""
    dev = target.wte.weight.device
    g = torch.Generator().manual_seed(0)
    V = target.config.vocab_size
    prompt = torch.randint(V - 1, (1, context), generator=g).to(dev)
    new = torch.randint(V - 1, (1, q), generator=g).to(dev)
    cache = target.new_cache()
    kv = {target._cache_kw: cache.kv, "use_cache": True}  # the cache's keyword in this transformers version
    target.hf(input_ids=prompt, **kv)
    mask = torch.ones(1, context + q, dtype=torch.long, device=dev)
    pos = torch.arange(context, context + q, device=dev)
    ways = {"mtplab": lambda: target.hf(input_ids=new, **kv),
            "transformers": lambda: target.hf(input_ids=new, **kv, attention_mask=mask, cache_position=pos,
                                              logits_to_keep=q)}
    ids = prompt[0].tolist()
    calls = {"mtplab": lambda: decode_with("ar", target, ids, max_new_tokens=1),
             "transformers": lambda: _generate(target.hf, ids, 1)}
    verify = race({w: untimed_output(lambda fn=fn: (fn(), cache.crop(context))) for w, fn in ways.items()}, [None],
                  baseline="mtplab", rounds=repeats, device=dev)  # each call cropped back to the same cache
    one = race({w: untimed_output(fn) for w, fn in calls.items()}, [None], baseline="mtplab", rounds=repeats,
               device=dev)
    times = {w: verify.round_totals(w) for w in ways}
    return {"context": context, "q": q, "repeats": repeats, "busy": verify.busy or one.busy,
            **{f"{w}_one_token_decode_ms": 1e3 * statistics.median(one.round_totals(w)) for w in calls},
            **{f"{w}_ms": 1e3 * statistics.median(t) for w, t in times.items()},
            **{f"{w}_range_ms": [1e3 * min(t), 1e3 * max(t)] for w, t in times.items()}}


@torch.inference_mode()
def profile_rows(target, draft, prompt: list[int], *, m: int, k: int = 4, heads=None, top: int = 6,
                 only: list[str] | None = None, repeats: int = 3) -> dict[str, dict]:
    """Where one decode's time goes, per row (after a warm-up; the median of `repeats` decodes by wall clock):
    inside the target's forward, inside the draft model's forward, and the rest (the loop around them: setup,
    drafting, verification bookkeeping); then a cProfile run of the same decode listing the loop's own Python
    functions (outside torch and the model's modules) with the most time of their own."""
    import cProfile
    import pstats

    dev = target.wte.weight.device
    table = variants(target, draft, k, heads)
    out = {}
    for label, (who, fn) in table.items():
        if only is not None and label not in only:
            continue
        fn(prompt, 4)
        runs = []
        for _ in range(repeats):  # the median run by wall clock, with its own split
            watches = [_Stopwatch(_forward_of(who, target), dev)] + (
                [_Stopwatch(_forward_of(who, draft), dev)] if draft is not None else [])
            try:
                t0 = now(dev)
                fn(prompt, m)
                wall = now(dev) - t0
            finally:
                for w in watches:
                    w.remove()
            runs.append((wall, watches))
        wall, watches = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
        t_fwd, d_fwd = watches[0].s, (watches[1].s if len(watches) > 1 else 0.0)
        prof = cProfile.Profile()
        prof.enable()
        fn(prompt, m)
        prof.disable()
        stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
        own = sorted(((v[2], v[1], f"{Path(f[0]).name}:{f[2]}") for f, v in stats.items() if _loop_code(f)),
                     reverse=True)[:top]
        out[label] = {"wall_s": wall, "target_forward_s": t_fwd, "target_forwards": watches[0].n,
                      "draft_forward_s": d_fwd, "rest_s": wall - t_fwd - d_fwd,
                      "top_own_time": [{"function": n, "own_s": t, "calls": c} for t, c, n in own]}
    return out


def run_peers(a) -> dict:
    from mtplab.hf.target import load_heads, load_hf  # transformers

    if not getattr(a, "hf", None):
        raise MtplabError("bench peers needs a Hugging Face model folder: --hf PATH (and --draft-hf PATH for the "
                          "draft-model rows, --heads-checkpoint PATH for mtplab's heads on it)")
    if getattr(a, "dtype", "fp32") != "fp32":
        raise MtplabError("bench peers compares fp32 decodes (transformers' generate and mtplab's loop on the same "
                          "weights); drop --dtype")
    held_out_count(a)
    dev = pick(a.device)
    target = load_hf(a.hf, device=dev)
    draft = load_hf(a.draft_hf, device=dev) if getattr(a, "draft_hf", None) else None
    if draft is not None:
        check_same_vocabulary(draft, target)
    heads = load_heads(target, a.heads_checkpoint) if getattr(a, "heads_checkpoint", None) else None
    n, m, reps = (2, 16, 1) if a.quick else (held_out_count(a), 128, 3)
    prompts = [target.encode(p) for p in held_out_prompts("code", n, 160)]
    rows = peer_rows(target, draft, prompts, m=m, k=4, repeats=reps, heads=heads)
    split = profile_rows(target, draft, prompts[0], m=m, k=4, heads=heads)
    calls = forward_call_costs(target, repeats=5 if a.quick else 21)
    for r in rows:
        sp = split[r["method"]]
        r.update(ms_per_token=1e3 * sp["wall_s"] / m, forward_share=sp["target_forward_s"] / sp["wall_s"],
                 draft_share=sp["draft_forward_s"] / sp["wall_s"], rest_share=sp["rest_s"] / sp["wall_s"],
                 ms_per_target_forward=1e3 * sp["target_forward_s"] / max(1, sp["target_forwards"]))
    data = {"hf": Path(a.hf).name, "draft_hf": Path(a.draft_hf).name if getattr(a, "draft_hf", None) else None,
            "heads_checkpoint": Path(a.heads_checkpoint).name if heads is not None else None, "prompts": n,
            "max_new_tokens": m, "repeats": reps, "k": 4, "rows": rows, "profile": split,
            "forward_call": calls}
    table = (f"peers: {Path(a.hf).name}, greedy, m = {m}, {n} held-out prompts, {reps} interleaved rounds (median, "
             "range) against HF's plain greedy generate\n\n"
             + _md(rows, ["method", "who", "tokens_per_forward", "speedup_vs_hf_greedy", "speedup_min", "speedup_max",
                          "identical_to_hf_greedy", "prompts"])
             + "\n\nwhere one decode's time went (the first prompt, the median of 3 decodes after a warm-up): the "
             "share inside the target's forward, inside the draft model's forward, and the rest (the loop). One "
             "decode's absolute time is noisier than the race above, which is the speed measurement\n\n"
             + _md(rows, ["method", "forward_share", "draft_share", "rest_share"])
             + "\n\nthe functions with the most time of their own (cProfile, one decode)\n\n"
             + "\n".join(f"* {label}: " + "; ".join(f"{t['function']} {1e3 * t['own_s']:.1f} ms ({t['calls']} calls)"
                                                     for t in sp["top_own_time"][:4]) for label, sp in split.items())
             + f"\n\none verify forward over {calls['q']} tokens at {calls['context']} cached tokens, median of "
             f"{calls['repeats']} interleaved calls: as mtplab calls it {calls['mtplab_ms']:.2f} ms, as transformers' "
             f"assisted loop calls it (attention mask, logits_to_keep) {calls['transformers_ms']:.2f} ms; a one-token "
             f"decode of a {calls['context']}-token prompt: mtplab's AR {calls['mtplab_one_token_decode_ms']:.2f} ms, "
             f"generate() {calls['transformers_one_token_decode_ms']:.2f} ms")
    _write(Path(a.out), "peers-quick" if a.quick else "peers", data, table, device=dev)
    return data
