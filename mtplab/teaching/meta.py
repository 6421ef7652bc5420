"""Notebook 03, Meta's multi-token prediction (Gloeckle et al. 2024): the memory of the head-by-head backward, its
gradients against the joint backward, the packed loss's shift, and the three head families side by side.
"""
from __future__ import annotations

import math
import torch
from mtplab.training.losses import multi_token_loss
from mtplab.measuring.timing import peak_memory
from mtplab.model import checkpoint
from mtplab.errors import MtplabError
from mtplab.measuring.record import Record
from mtplab.decoding.drafters import default_for_family, pairs
from mtplab.teaching.check import Check, _call, _number
from mtplab.paths import DECODE_JSON
from mtplab.data import get_batch, load_corpus
from mtplab.model.config import preset as get_preset
from mtplab.model.gpt import GPT
from mtplab.training.steps import meta_step
from mtplab.measuring.acceptance import wilson
from mtplab.teaching.blockwise import heads_history, lineage_words
from mtplab.teaching.words import overlap, wall_reps


# ---------------------------------------------------------------------------------- notebook 03
def _pooled_mean(logits, x, K) -> float:
    """The tempting wrong reduction: one mean over every valid (position, head) pair."""
    import torch.nn.functional as F
    T = logits.shape[1]
    ces = [F.cross_entropy(logits[:, :T - j, j].reshape(-1, logits.shape[-1]), x[:, 1 + j:T + 1].reshape(-1),
                           reduction="sum") for j in range(K)]
    n = sum(logits.shape[0] * (T - j) for j in range(K))
    return float(sum(ces) / n)


def _shift_case(B: int, T: int, K: int, V: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fixed logits (B, T, K, V) and a window x (B, T+1), made without a random generator so that the hard-coded
    losses below hold on every machine."""
    i = torch.arange(B * T * K * V, dtype=torch.float64)
    logits = (3 * torch.sin(0.7 * i + 0.11 * (i % 5) ** 2)).float().reshape(B, T, K, V)
    j = torch.arange(B * (T + 1))
    return logits, ((j * 7 + 3 + j // 4) % V).reshape(B, T + 1)


# (B, T, K, V) -> (the loss, the loss with the inputs themselves as targets), computed once for the lab's tests
_SHIFT_CASES = {(2, 9, 3, 11): (4.589099407196045, 3.6917340755462646),
                (1, 6, 4, 7): (3.453587532043457, 3.364961624145508),
                (3, 12, 2, 5): (3.145549774169922, 3.255366325378418)}


def check_shift(fn) -> Check:
    """fn(logits, x, K) -> the multi-token loss.

    logits: (B, T, K, V), head k at position i; x: (B, T+1) a window of token ids. Head k (0-based)
    must be scored against the token k+1 positions ahead, the mean over heads of each head's mean
    cross-entropy. Compared with losses computed once on fixed cases, not with the package's loss.
    """
    name = "multi-token loss shift"
    for (B, T, K, V), (want, copy) in _SHIFT_CASES.items():
        logits, x = _shift_case(B, T, K, V)
        got, err = _call(fn, logits.clone(), x.clone(), K)
        if err:
            return Check(name, False, f"on logits {tuple(logits.shape)}, x {tuple(x.shape)} your function raised {err}")
        gv = _number(got)
        if gv is None:
            return Check(name, False, f"your function returned {type(got).__name__}; return a scalar loss")
        if not math.isclose(gv, want, rel_tol=1e-4, abs_tol=1e-5):
            hint = ""
            if math.isclose(gv, _pooled_mean(logits, x, K), rel_tol=1e-4):
                hint = (" The shift is right, but you took one mean over all valid (position, head) pairs; take each "
                        "head's mean cross-entropy, then the mean over the K heads.")
            if math.isclose(gv, copy, rel_tol=1e-4):
                hint = (" You scored head k against x[i+k]: the inputs themselves. Head 0 would learn to copy "
                        "the token it reads; targets must be the next-token shift.")
            return Check(name, False, f"wrong on a case like B={B}, T={T}, K={K}, V={V}, where you gave {gv:.5f}.{hint}")
    return Check(name, True, "each head is scored against the token its depth looks ahead to, and the positions "
                             "whose target lies past the window are dropped")


# (alpha, n_drafts) -> expected tokens per step, computed once
_TOKENS_CASES = {(0.8, 3): 2.952, (0.5, 1): 1.5, (0.0, 4): 1.0, (0.9, 6): 5.217031, (1.0, 3): 4.0, (0.3, 0): 1.0,
                 (0.6, 2): 1.96}


def check_expected_tokens(fn) -> Check:
    """fn(alpha, n_drafts) -> expected tokens per step: the accepted prefix plus the target's token,
    when each draft is kept with probability alpha given the ones before it were."""
    name = "expected tokens per step"
    for (alpha, n), want in _TOKENS_CASES.items():
        got, err = _call(fn, alpha, n)
        if err:
            return Check(name, False, f"fn(alpha={alpha}, n_drafts={n}) raised {err}"
                         + (" (alpha = 1 needs its own case)" if alpha == 1 else ""))
        gv = _number(got)
        if gv is None or not math.isclose(gv, want, rel_tol=1e-6, abs_tol=1e-9):
            hint = ""
            if gv is not None and math.isclose(gv, 1 + alpha * n, rel_tol=1e-6):
                hint = (" That treats drafts as independent; a draft counts only if every draft before it was "
                        "kept too.")
            elif gv is not None and math.isclose(gv, want - 1, rel_tol=1e-6, abs_tol=1e-9):
                hint = " Add the token the target itself contributes every step (bonus or correction)."
            return Check(name, False, f"wrong on a case like fn(alpha={alpha}, n_drafts={n}), which gave {got!r}.{hint}")
    return Check(name, True, "the target's own token, plus each draft weighted by the chance that it and every "
                             "draft before it were kept")


def meta_backward_memory(ks=(2, 4, 8), *, preset: str = "tiny", batch_size: int = 8, device="cpu",
                         seed: int = 0, progress: bool = False) -> dict[str, dict[int, float]]:
    """Peak memory (MiB) of one `train.meta_step` for K heads, memory-efficient against joint backward."""

    data = load_corpus("code", "train")
    out: dict[str, dict[int, float]] = {"memory-efficient": {}, "joint backward": {}}
    if progress:
        from tqdm.auto import tqdm
        ks = tqdm(list(ks), desc="peak memory", unit="K")
    for K in ks:
        cfg = get_preset(preset).with_heads("meta", K)
        torch.manual_seed(seed)
        model = GPT(cfg).to(device).train()
        x = get_batch(data, batch_size, cfg.block_size, torch.Generator().manual_seed(seed)).to(device)
        for label, eff in (("memory-efficient", True), ("joint backward", False)):
            model.zero_grad(set_to_none=True)
            step = lambda m=model, x=x, e=eff: meta_step(m, x, freeze_trunk=False, memory_efficient=e)
            out[label][K] = peak_memory(step, device) / 2 ** 20
    return out


def meta_gradients_agree(*, preset: str = "tiny", K: int = 4, batch_size: int = 4, seed: int = 0) -> float:
    """Largest absolute difference between the gradients of the two `meta_step` backward orders."""

    cfg = get_preset(preset).with_heads("meta", K)
    torch.manual_seed(seed)
    model = GPT(cfg).train()
    x = get_batch(load_corpus("code", "train"), batch_size, cfg.block_size, torch.Generator().manual_seed(seed))
    grads = []
    for eff in (True, False):
        model.zero_grad(set_to_none=True)
        meta_step(model, x, freeze_trunk=False, memory_efficient=eff)
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    return max(float((a - b).abs().max()) for a, b in zip(*grads))


# ---------------------------------------------------------------------------------- the losses' shift
def shift_table(T: int, K: int) -> str:
    """Which token each head is scored against in `losses.multi_token_loss` (targets = next-token shift).

    Rows are heads k = 0..K-1, columns positions i = 0..T-1; a cell names the input token x[j]
    that head k at position i must predict (j = i + k + 1), or '.' where the target lies past the window.
    """
    lines = ["head  " + " ".join(f"i={i:<3}" for i in range(T))]
    for k in range(K):
        cells = [f"x[{i + k + 1}]" if i + k + 1 <= T else "." for i in range(T)]
        lines.append(f"k={k:<3} " + " ".join(f"{c:<5}" for c in cells))
    return "\n".join(lines)


def peaked_logits(x: torch.Tensor, K: int, V: int, *, shift: int, strength: float = 8.0) -> torch.Tensor:
    """Packed (B, T, K*V) logits for x of shape (B, T+1) in which head k at position i puts its mass
    on x[i + k + shift] (uniform where that lies past the window): a model that is perfect at `shift`."""
    B, T1 = x.shape
    T = T1 - 1
    logits = torch.zeros(B, T, K, V)
    for k in range(K):
        for i in range(T):
            j = i + k + shift
            if j < T1:
                logits[torch.arange(B), i, k, x[:, j]] = strength
    return logits.view(B, T, K * V)  # (B, T, K*V)


def shift_losses(x: torch.Tensor, K: int, V: int) -> dict[str, tuple[float, float]]:
    """Section 2's two toy models (`peaked_logits` at shift 1, "predicts ahead", and 0, "copies") scored by seed
    000's loss with next-token targets x[:, 1:] and with the inputs x[:, :-1] as targets: {model: (right, inputs)}."""
    out = {}
    for name, shift in (("predicts ahead", 1), ("copies", 0)):
        packed = peaked_logits(x, K, V, shift=shift)  # (B, T, K*V)
        out[name] = (float(multi_token_loss(packed, x[:, 1:], K)), float(multi_token_loss(packed, x[:, :-1], K)))
    return out

# family -> the shipped pair decode.json measured it with: the family's default method, on its deepest checkpoint
# (the last such pair of the classroom model: deepseek D=3)
FAMILIES = {p.family: p for p in pairs() if p.family and p.method == default_for_family(p.family).name}


def head_families(bench_path=DECODE_JSON) -> list[dict]:
    """Per family: parameters of the heads (`model.mtp`) and of the trunk (everything else, shared output head
    included) from the shipped checkpoint, and ms per step of drafter and target from the decode benchmark."""
    rec = Record.load(bench_path)
    rows = []
    for family, p in FAMILIES.items():
        r = rec.row(method=p.method, checkpoint=p.checkpoint)
        if r is None:
            raise MtplabError(f"{rec.path} has no row for method {p.method!r} on {p.checkpoint}; rerun the decode "
                              "benchmark (python -m mtplab bench decode)")
        model = checkpoint.load(p.checkpoint)
        heads = sum(q.numel() for q in model.mtp.parameters())
        rows.append({"family": family, "checkpoint": p.checkpoint, "method": p.label, "k": r["k"],
                     "head_params": heads, "trunk_params": model.num_params() - heads,
                     "step_ms_drafter": r["step_ms_drafter"], "step_ms_target": r["step_ms_target"],
                     "source": f"docs/bench/{rec.path.name}"})
    return rows


def compare_lines(pairs: dict[str, str], bench_path=DECODE_JSON) -> list[str]:
    """Notebook 03 §5: two shipped head sets ({checkpoint: its decode method}, the reference first) side by side,
    from their training records and the decode benchmark, and which differences the numbers can tell apart:
    acceptance by its 95% Wilson intervals, speed by the range of the repeats. The records give validation accuracy
    without an n, so its gap is printed as a size only."""
    rec = Record.load(bench_path)
    (a, ma), (b, mb) = pairs.items()
    info, rows, out = {}, {}, []
    for name, method in pairs.items():
        info[name] = m = checkpoint.read_info(name)["meta"]
        rows[name] = rec.row(method=method, checkpoint=name)
        extra = sum(p.numel() for p in checkpoint.load(name).mtp.parameters())
        acc = m["val"]["val_acc_depth"]
        out.append(f"{name}: {extra:,} extra parameters; trained {lineage_words(name)}; validation accuracy at depths "
                   f"2..{len(acc)} " + " ".join(f"{x:.3f}" for x in acc[1:]))
    total = {n: sum(checkpoint.read_info(p)["meta"].get("tokens") or 0 for p in heads_history(n)) for n in pairs}
    out.append(f"{b} saw {info[b]['tokens'] / info[a]['tokens']:.2f} times the tokens of {a} in its last phase, "
               f"{total[b] / total[a]:.2f} times over the whole record")
    gap = max(abs(x - y) for x, y in zip(info[a]["val"]["val_acc_depth"][1:], info[b]["val"]["val_acc_depth"][1:]))
    out.append(f"validation accuracy: the largest gap at the draft depths is {gap:.3f} (the records give no n: a "
               "size, not a verdict)")
    if rows[a] is None or rows[b] is None:
        return out + [f"{rec.path.name} has no row for both, so acceptance and speed are not compared"]
    ra, rb = rows[a], rows[b]
    told = []
    for i, (ka, kb) in enumerate(zip(ra["accepted"], rb["accepted"])):
        ia, ib = wilson(ka, ra["drafting_steps"]), wilson(kb, rb["drafting_steps"])
        told.append(f"position {i + 1} {ka / ra['drafting_steps']:.2f} vs {kb / rb['drafting_steps']:.2f} "
                    + ("(95% intervals overlap)" if overlap(ia, ib) else "(95% intervals apart)"))
    out.append(f"benchmark, unconditional acceptance {a} vs {b} (n = {ra['drafting_steps']} and "
               f"{rb['drafting_steps']} drafting steps): " + "; ".join(told))
    sa, sb = wall_reps(ra), wall_reps(rb)
    out.append(f"benchmark, speedup {a} {ra['speedup_wall']:.2f}x (range {min(sa):.2f}-{max(sa):.2f}) vs {b} "
               f"{rb['speedup_wall']:.2f}x (range {min(sb):.2f}-{max(sb):.2f}): the ranges "
               + ("overlap" if overlap(sa, sb) else "are apart")
               + f"; drafter {ra['step_ms_drafter']:.2f} vs {rb['step_ms_drafter']:.2f} ms a step, target "
               f"{ra['step_ms_target']:.2f} vs {rb['step_ms_target']:.2f} ms")
    return out
