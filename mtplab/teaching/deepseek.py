"""Notebook 04, DeepSeek-V3's MTP modules: eq. (24)'s layout checked against the model by perturbation, teacher
forcing against free running; and the checkers of its exercises.
"""
from __future__ import annotations

import torch
from mtplab.measuring import theory
from mtplab.decoding.drafters import DeepSeekDrafter
from mtplab.errors import MtplabError
from mtplab.model.gpt import TrunkOutput
from mtplab.teaching.check import Check
from mtplab.teaching.check import _call
from mtplab.teaching.check import _number
from mtplab.measuring.teacher_forced import greedy_windows
from mtplab.training.losses import label_layout


def forced_and_free_greedy(model, windows: torch.Tensor, prompt_lens, *, progress: bool = False) -> dict:
    """`lab.forced_and_free`, scored against the target's own greedy path instead of the true text.

    Returns {"teacher-forced": [(correct, n) per depth 2..D+1], "free-running": [...], "n": positions}."""

    D = model.config.n_modules
    sums = {"teacher-forced": [0.0] * D, "free-running": [0.0] * D}
    n = 0
    for P in prompt_lens:
        if P + D + 1 > model.config.block_size:
            continue
        ff = forced_and_free(model, greedy_windows(model, windows, P, D + 1), [P], progress=progress)
        for key in sums:
            sums[key] = [s + a * ff["n"] for s, a in zip(sums[key], ff[key])]
        n += ff["n"]
    return {key: [(round(s), n) for s in vals] for key, vals in sums.items()} | {"n": n}


# ---------------------------------------------------------------------------------- notebook 04
def check_deepseek_labels(fn) -> Check:
    """fn(T, k) -> (reads, labels): the 1-based token numbers depth k reads and is scored against,
    position by position, for a training sequence t_1..t_{T+1}. k = 0 is the main model
    (reads t_i); k >= 1 is MTP module k (reads Emb(t_{i+k}) beside the depth k-1 hidden state)."""

    name = "DeepSeek label layout"
    for T, k in ((10, 0), (10, 1), (10, 2), (7, 3), (5, 1)):
        row = label_layout(T, max(k, 1))[k]
        want = ([row["reads"][i] for i in sorted(row["reads"])], [row["labels"][i] for i in sorted(row["labels"])])
        got, err = _call(fn, T, k)
        if err:
            return Check(name, False, f"fn(T={T}, k={k}) raised {err}")
        try:
            got = (list(int(t) for t in got[0]), list(int(t) for t in got[1]))
        except (TypeError, ValueError, IndexError):
            return Check(name, False, f"fn(T={T}, k={k}) returned {got!r}; return two lists of token numbers")
        if got != want:
            hint = ""
            if got[1] and want[1] and got[1][0] == want[1][0] - 1:
                hint = " Your labels start one token early: depth k at position i predicts t_(i+k+1)."
            elif got[1] and want[1] and got[1][-1] != want[1][-1]:
                hint = f" The last label is t_{T + 1}: eq. (24) scores labels t_(2+k)..t_(T+1)."
            if len(got[0]) != len(want[0]):
                hint += f" Module {k} has T-k = {T - k} positions: it needs t_(i+k) to exist."
            return Check(name, False, f"T={T}, k={k}: you gave reads {got[0]}, labels {got[1]}; "
                                      f"expected reads {want[0]}, labels {want[1]}.{hint}")
    return Check(name, True, "depth k at position i = 1..T-k reads t_(i+k) and is scored against t_(i+k+1): "
                             "labels t_(2+k)..t_(T+1), eq. (24)")


def check_deepseek_forwards(fn) -> Check:
    """fn(m, D) -> target forwards of self-speculative decoding with D modules when every draft is kept."""
    name = "DeepSeek self-speculation forwards"
    for m, D in ((12, 1), (12, 3), (9, 2), (1, 1), (20, 3), (7, 1)):
        want = theory.deepseek_forwards(m, D)
        got, err = _call(fn, m, D)
        if err:
            return Check(name, False, f"fn(m={m}, D={D}) raised {err}")
        if _number(got) != want:
            hint = ""
            if _number(got) == theory.overlap_forwards(m, D):
                hint = " D modules give D drafts, so a step commits D+1 tokens (k = D+1 tokens per step)."
            return Check(name, False, f"fn(m={m}, D={D}) gave {got!r}, mtplab counts {want}.{hint}")
    return Check(name, True, "D drafts a step make blocks of D+1 tokens on the overlapped schedule: "
                             "1 + ceil((m-1)/(D+1)) (theory.deepseek_forwards)")


@torch.inference_mode()
def layout_matches_model(model, *, T: int = 10, seed: int = 0) -> bool:
    """Check `label_layout` against the model itself, by perturbing one token at a time.

    For every depth and position of the layout: changing the token the depth reads changes its
    logits there, and changing its label (and everything after it) does not.
    """
    D = model.config.n_modules
    dev = model.wte.weight.device
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(V, (1, T), generator=g).to(dev)  # t_1..t_T at 0-based indices 0..T-1
    base = model.depth_logits(x)  # (1, T, D+1, V)

    def bumped(from_token: int):  # add 1 to t_j for every j >= from_token (1-based)
        y = x.clone()
        y[0, from_token - 1:] = (y[0, from_token - 1:] + 1) % V
        return model.depth_logits(y)

    def one(token: int):
        y = x.clone()
        y[0, token - 1] = (y[0, token - 1] + 1) % V
        return model.depth_logits(y)

    for row in label_layout(T, D):
        d = row["k"]  # depth index: 0 the main model, k module k
        for i, reads in row["reads"].items():
            label = row["labels"][i]
            if torch.allclose(one(reads)[0, i - 1, d], base[0, i - 1, d]):  # must see what it reads
                return False
            if label <= T and not torch.equal(bumped(label)[0, i - 1, d], base[0, i - 1, d]):
                return False
    return True


@torch.inference_mode()
def forced_and_free(model, windows: torch.Tensor, prompt_lens, *, progress: bool = False) -> dict[str, list[float]]:
    """Accuracy of DeepSeek depths 2..D+1 against the true tokens, teacher-forced against free-running.

    For each window x and prompt length P: the main model reads x[:P] and guesses g = the token at P.
    Teacher forcing (training): module k reads the true x[P-1+k] and predicts x[P+k].
    Free running (inference): module 1 reads g, module k > 1 reads the draft of module k-1, and
    predicts the same x[P+k]. Returns per-depth accuracy under each, and the main model's own.
    """
    D = model.config.n_modules
    if D < 1:
        raise MtplabError("forced_and_free needs a DeepSeek checkpoint (deepseek-d1, deepseek-d3)")
    dev = model.wte.weight.device
    forced = torch.zeros(D)
    free = torch.zeros(D)
    main = 0
    n = 0
    it = windows
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(windows, desc="forced and free", unit="window")
    for x in it:
        x = x.tolist()
        for P in prompt_lens:
            if P + D + 1 > len(x) or P + D + 1 > model.config.block_size:
                continue
            ids = torch.tensor([x[:P + D]], device=dev)
            full = model(ids)  # the trunk is causal: its first P positions are the prompt's own forward
            logits = model.mtp.train_logits(model, ids, full)  # (1, P+D, D, V) teacher-forced modules
            out = TrunkOutput(hidden=full.hidden[:, :P], logits=full.logits[:, :P], pre_last=full.pre_last[:, :P])
            g = int(out.logits[0, -1].argmax())
            drafter = DeepSeekDrafter(model)
            drafter.begin(model, x[:P] + [g], out, P, max_new_tokens=D + 1, generator=None,
                          temperature=0.0, top_k=None)
            drafts = drafter.propose(D).tokens
            for k in range(1, D + 1):
                truth = x[P + k]
                forced[k - 1] += int(logits[0, P - 1, k - 1].argmax()) == truth
                free[k - 1] += drafts[k - 1] == truth
            main += g == x[P]
            n += 1
    if n == 0:
        raise MtplabError("no (window, prompt length) pair fits; use longer windows or shorter prompts")
    return {"main": [main / n], "teacher-forced": (forced / n).tolist(), "free-running": (free / n).tolist(),
            "n": n}
