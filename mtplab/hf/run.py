"""Decode with a Hugging Face model: what `python -m mtplab generate --hf` runs (the adapter itself is
`mtplab.hf.target`; `train --hf`, which trains heads for it, is `mtplab.distill.live`), and transformers' own greedy
`generate` as the reference.
"""
from __future__ import annotations

from pathlib import Path
import torch
from mtplab.errors import MtplabError
from mtplab.decoding import adaptive
from mtplab.decoding.drafters import method as get_method
from mtplab.decoding.generate import DTYPES, decode_with
from mtplab.device import describe, now, pick
from mtplab.hf.real import chat_ids, end_of_turn, quiet_transformers, shipped_heads
from mtplab.hf.target import load_hf, load_target
from mtplab.model import kernels


def generate_ids(hf, ids: list[int], m: int, stop: int | None = None, **kw) -> list[int]:
    """transformers' greedy `generate` for exactly m new tokens (no early stop at end-of-text), the new ids; with
    `stop` (a chat model's end of turn), at most m, ending with it; `kw` goes to `generate` (prompt_lookup_num_tokens,
    assistant_model, ...)."""
    x = torch.tensor([ids], device=hf.device)
    with quiet_transformers():  # its notes about its own argument handling, once per call
        out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=m, min_new_tokens=m if stop is None
                          else 0, do_sample=False, num_beams=1, pad_token_id=0, eos_token_id=stop, **kw)
    return out[0, len(ids):].tolist()


@torch.inference_mode()
def warm_up(target, ids: list[int]) -> float:
    """One forward of the prompt's first token, untimed and thrown away, before a timed decode: what a process pays
    once (the exact kernel packs each weight into panels at its first use, numba loads its compiled code) is then
    not in `wall_s` of a one-off `generate`, which `bench real` leaves out by its warm-up rounds. Returns its
    seconds (`warm_s`)."""
    t0 = now()
    target(torch.tensor([ids[:1]], device=target.wte.weight.device))
    return now() - t0


def run_hf_generate(*, hf: str, heads_checkpoint=None, method="ar", prompt: str, max_new_tokens=64, k=None,
                    temperature=0.0, top_k=None, seed=0, alpha=0.8, draft_hf=None, device="auto",
                    dtype="fp32", chat: bool = False, draft_vocab: str = "full", kernel: str = "exact",
                    confidence: float | None = None) -> dict:
    """`generate --hf`: decode with any method; `tokens` are the model's own token ids, `text` its decoding.
    For a real model named by its bare name (`smollm2`), a head method finds the heads the lab ships for it;
    `chat` wraps the prompt as one user turn and ends the decode at the end of the model's turn (`end_of_turn`);
    `answer` is the new text without that token; `draft_vocab='reduced'` drafts over the vocabulary saved with the
    heads (`save_heads`), and the trace records its size. `kernel='stock'` decodes through transformers' forward and
    F.linear everywhere (the old path, to compare with the exact default); `forward` says which ran. `confidence`: a
    confidence stop (`decoding.adaptive.ConfidenceStop`): a step's drafts end at the first the drafter is less sure
    of; it changes the speed, never the output."""

    m = get_method(method)
    if dtype not in DTYPES:
        raise MtplabError(f"unknown dtype {dtype!r}; use fp32 or bf16")
    if draft_vocab not in ("full", "reduced"):
        raise MtplabError(f"--draft-vocab is full or reduced (got {draft_vocab!r})")
    if m.family is not None and heads_checkpoint is None:
        heads_checkpoint = shipped_heads(hf, m.family)
    if m.family is not None and heads_checkpoint is None:
        raise MtplabError(f"method {method} needs {m.family} heads on this model: pass --heads-checkpoint "
                          f"(train them with python -m mtplab train --hf {hf} --heads {m.family} ...)")
    if not prompt:
        raise MtplabError("the prompt is empty; give some text with --prompt")
    dev = pick(device)
    target = load_target(hf, heads_checkpoint if m.family is not None else None, device=dev, dtype=DTYPES[dtype],
                         kernel=kernel, draft_vocab=draft_vocab == "reduced")
    if m.family is not None and target.config.heads != m.family:
        raise MtplabError(f"method {method} needs {m.family} heads, but {Path(heads_checkpoint).name} holds "
                          f"{target.config.heads} heads; train {m.family} heads with python -m mtplab train --hf "
                          f"{hf} --heads {m.family} ...")
    if draft_vocab == "reduced" and m.family is not None and target.draft_vocab is None:
        raise MtplabError(f"{Path(heads_checkpoint).name} carries no draft vocabulary; use --draft-vocab full")
    draft = None
    if m.needs_draft_model:
        if draft_hf is None:
            raise MtplabError("method draft-model with --hf needs a smaller model with the same tokenizer: --draft-hf PATH")
        draft = load_hf(draft_hf, device=dev, dtype=DTYPES[dtype], kernel=kernel)
    ids = chat_ids(target, prompt) if chat else target.encode(prompt)
    stop = end_of_turn(target) if chat else None
    with kernels.use_stock(kernel == "stock"):  # the heads' linears too
        warm = warm_up(target, ids) + (warm_up(draft, ids) if draft is not None else 0.0)
        t0 = now()
        trace = decode_with(method, target, ids, max_new_tokens=max_new_tokens, k=k, temperature=temperature,
                            top_k=top_k, seed=seed, alpha=alpha, draft_model=draft, stop=stop,
                            **adaptive.stop_at(confidence))
        wall = now() - t0
    res = trace.summary(target.decode)  # the text by the model's own tokenizer
    res.update(checkpoint=str(heads_checkpoint) if heads_checkpoint else target.path, hf=target.path,
               device=describe(dev), wall_s=wall, warm_s=warm, kernel=kernel, forward=target.forward_path,
               draft_vocab=draft_vocab, draft_vocab_size=trace.draft_vocab, chat=chat, confidence_stop=confidence,
               answer=target.decode(trace.tokens[:-1] if trace.tokens[-1:] == [stop] else trace.tokens),
               ended_turn=stop is not None and trace.tokens[-1:] == [stop])
    return res
