"""Train heads on a Hugging Face model and decode with it: what `python -m mtplab train --hf` and
`generate --hf` run (the adapter itself is `mtplab.hf`).

B batch, T time, K depths, V vocabulary.

Training is self-distillation on the frozen trunk: depth d at position i learns the target's own distribution
for token i+d (`mtplab.losses.self_distill_cross_entropies`), because greedy verification keeps a draft only
when it is the target's own choice. Stern and DeepSeek heads go through the lab's `train_step`; Meta heads
through the same loss here (the lab's `meta_step` runs the lab's own blocks, which an HF model does not have).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable
import torch
from mtplab.data import CORPORA, corpus_path, get_batch, val_windows
from mtplab.decoding.checks import check_options, check_prompt
from mtplab.errors import MtplabError
from mtplab.training.losses import family_loss, self_distill_cross_entropies
from mtplab.decoding.trace import Trace
from mtplab.training.steps import evaluate, lr_at, train_step
from mtplab.training.config import TrainConfig
from mtplab.decoding.drafters import method as get_method
from mtplab.decoding.generate import DTYPES, decode_with
from mtplab.device import describe, pick
from mtplab.hf.target import load_hf, load_target
from mtplab.hf.target import save_heads
from mtplab.training.config import default_name

HF_LABELS = ("self", "self-argmax")


def corpus_ids(target, corpus: str, split: str = "train") -> torch.Tensor:
    """A shipped corpus name (code, prose) or a path to a UTF-8 text file, in the model's own token ids."""
    path = corpus_path(corpus, split) if corpus in CORPORA else Path(corpus)
    if not path.is_file():
        raise MtplabError(f"corpus {corpus!r} is neither one of {', '.join(CORPORA)} nor a text file")
    text = path.read_text(encoding="utf-8", errors="replace")
    return torch.tensor(target.encode(text), dtype=torch.long)


def hf_train_step(target, x: torch.Tensor, *, lam: float = 0.3, labels: str = "self") -> float:
    """One self-distillation step of the heads on a frozen HF trunk. x: (B, T+1) token ids."""
    if target.config.heads != "meta":
        return train_step(target, x, freeze_trunk=True, lam=lam, labels=labels)
    idx = x[:, :-1]
    with torch.no_grad():
        out = target(idx)
    extra = target.mtp.train_logits(target, idx, out)  # (B, T, K-1, V)
    logits = torch.cat([out.logits.unsqueeze(2), extra], dim=2)  # (B, T, K, V)
    ces = self_distill_cross_entropies(logits, out.logits, hard=labels == "self-argmax")
    loss = family_loss("meta", ces, lam=lam, freeze_trunk=True)
    loss.backward()
    return loss.item()


def train_heads(target, *, heads: str, n_depths: int | None = None, n_modules: int | None = None,
                corpus: str = "code", steps: int = 100, batch_size: int = 8, seq_len: int = 128, lr: float = 1e-3,
                warmup: int | None = None, lam: float = 0.3, labels: str = "self", seed: int = 0,
                eval_windows: int = 8, max_seconds: float | None = None, log=None) -> list[dict]:
    """Attach a fresh head family to `target` and train it (the trunk stays frozen). Returns the history:
    one record at the end (and every steps/10 with `log`), with `evaluate`'s per-depth agreement."""
    if heads not in ("stern", "meta", "deepseek"):
        raise MtplabError(f"--hf trains heads on a frozen model: choose --heads stern, meta or deepseek (got {heads!r})")
    if labels not in HF_LABELS:
        raise MtplabError(f"--hf heads learn the model's own predictions: --labels self or self-argmax (got {labels!r})")
    if steps is None or steps < 1:
        raise MtplabError(f"steps must be a positive integer (got {steps})")
    seq_len = min(seq_len, target.config.block_size - 1)
    data, val = corpus_ids(target, corpus, "train"), corpus_ids(target, corpus, "val") if corpus in CORPORA else None
    if len(data) < seq_len + 2:
        raise MtplabError(f"the corpus has {len(data)} tokens, fewer than one window of {seq_len + 1}; "
                          "give a longer text or a smaller --seq-len")
    val = val if val is not None and len(val) > seq_len + 1 else data
    torch.manual_seed(seed)
    target.attach(heads, TrainConfig(heads=heads, n_depths=n_depths, n_modules=n_modules).depths())
    target.train()
    params = [p for p in target.mtp.parameters()]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    warmup = warmup if warmup is not None else max(1, min(100, steps // 20))
    windows = val_windows(val, seq_len, eval_windows)
    dev = target.wte.weight.device
    history, t0 = [], time.perf_counter()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup)
        loss = hf_train_step(target, get_batch(data, batch_size, seq_len, gen).to(dev), lam=lam, labels=labels)
        if loss != loss:
            raise MtplabError(f"training diverged at step {step} (loss {loss}); lower --lr")
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        done = step + 1
        out_of_time = max_seconds is not None and time.perf_counter() - t0 > max_seconds
        if done == steps or out_of_time or (log is not None and done % max(1, steps // 10) == 0):
            rec = {"step": done, "loss": loss, "elapsed_s": time.perf_counter() - t0}
            rec.update(evaluate(target, windows, batch_size=batch_size))
            history.append(rec)
            if log is not None:
                log(f"step {done}: loss {loss:.3f}, agreement with the target by depth "
                    + " ".join(f"{a:.3f}" for a in rec["val_agree_depth"]))
        if out_of_time:
            break
    target.eval()
    return history


def run_hf_train(*, hf: str, heads: str, n_depths=None, n_modules=None, out: str, name: str | None = None,
                 device="cpu", **kw) -> dict:
    """Load the model, train the heads, save them: OUT/NAME.safetensors (heads only, naming their base)."""

    target = load_hf(hf, device=pick(device))
    hist = train_heads(target, heads=heads, n_depths=n_depths, n_modules=n_modules, **kw)
    name = name or default_name(heads, target.config.n_depths)
    path = save_heads(target, Path(out) / name, meta={"history": hist, **{k: v for k, v in kw.items()
                                                                         if k != "log"}})
    return {"checkpoint": str(path), "history": hist}


@torch.inference_mode()
def reference_generate(target, prompt_ids, *, max_new_tokens: int) -> list[int]:
    """The model's own `generate`, greedy, exactly max_new_tokens new tokens (no stop at EOS, as the lab's
    decoders do not stop either): what every lab method must reproduce token for token."""
    from transformers import GenerationConfig

    check_options(max_new_tokens=max_new_tokens, temperature=0.0, top_k=None)
    prompt = check_prompt(target, prompt_ids, max_new_tokens)
    ids = torch.tensor([prompt], device=target.wte.weight.device)
    gc = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=0, eos_token_id=None,
                          pad_token_id=0, num_beams=1)
    out = target.hf.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gc)
    return out[0, len(prompt):].tolist()


@dataclass
class HFTrace(Trace):
    """A Trace whose `text` comes from the model's own tokenizer (the lab's Trace decodes bytes)."""
    detokenize: Callable[[list[int]], str] | None = None

    @property
    def text(self) -> str:
        return self.detokenize(self.tokens)

    @classmethod
    def of(cls, trace: Trace, target) -> "HFTrace":
        return cls(**{f.name: getattr(trace, f.name) for f in fields(Trace)}, detokenize=target.decode)


def run_hf_generate(*, hf: str, heads_checkpoint=None, method="ar", prompt: str, max_new_tokens=64, k=None,
                    temperature=0.0, top_k=None, seed=0, alpha=0.8, draft_hf=None, device="auto",
                    dtype="fp32") -> dict:
    """`generate --hf`: decode with any method; `tokens` are the model's own token ids, `text` its decoding."""

    m = get_method(method)
    if dtype not in DTYPES:
        raise MtplabError(f"unknown dtype {dtype!r}; use fp32 or bf16")
    if m.family is not None and heads_checkpoint is None:
        raise MtplabError(f"method {method} needs {m.family} heads on this model: pass --heads-checkpoint "
                          f"(train them with python -m mtplab train --hf {hf} --heads {m.family} ...)")
    if not prompt:
        raise MtplabError("the prompt is empty; give some text with --prompt")
    dev = pick(device)
    target = load_target(hf, heads_checkpoint if m.family is not None else None, device=dev, dtype=DTYPES[dtype])
    if m.family is not None and target.config.heads != m.family:
        raise MtplabError(f"method {method} needs {m.family} heads, but {Path(heads_checkpoint).name} holds "
                          f"{target.config.heads} heads; train {m.family} heads with python -m mtplab train --hf "
                          f"{hf} --heads {m.family} ...")
    draft = None
    if method == "draft-model":
        if draft_hf is None:
            raise MtplabError("method draft-model with --hf needs a smaller model with the same tokenizer: --draft-hf PATH")
        draft = load_hf(draft_hf, device=dev, dtype=DTYPES[dtype])
    ids = target.encode(prompt)
    t0 = time.perf_counter()
    trace = decode_with(method, target, ids, max_new_tokens=max_new_tokens, k=k, temperature=temperature,
                        top_k=top_k, seed=seed, alpha=alpha, draft_model=draft)
    res = HFTrace.of(trace, target).summary()
    res.update(checkpoint=heads_checkpoint or target.path, hf=target.path,
               device=describe(dev), wall_s=time.perf_counter() - t0)
    return res
