"""DeepSeek-V3 MTP modules: the label layout of eq. (24), and teacher forcing against free running."""
from __future__ import annotations


import torch

from ..drafters import DeepSeekDrafter
from ..errors import MtplabError
from ..model import TrunkOutput


# ---------------------------------------------------------------------------------- DeepSeek
def label_layout(T: int = 10, D: int = 1) -> list[dict]:
    """DeepSeek-V3's training layout for a sequence t_1..t_{T+1} (1-based token numbers).

    Row 'main': position i reads t_i and is scored against t_{i+1}, i = 1..T.
    Row 'module k': position i (i = 1..T-k) reads the depth-(k-1) hidden state at i and Emb(t_{i+k}),
    and is scored against t_{i+k+1}: labels t_{2+k..T+1}, eq. (24).
    Each row maps position i -> (token read, label).
    """
    if T < 1 or D < 0:
        raise MtplabError(f"need T >= 1 and D >= 0 (got T={T}, D={D})")
    rows = [{"name": "main model", "k": 0, "reads": {i: i for i in range(1, T + 1)},
             "labels": {i: i + 1 for i in range(1, T + 1)}}]
    for k in range(1, D + 1):
        rows.append({"name": f"MTP module {k}", "k": k, "reads": {i: i + k for i in range(1, T - k + 1)},
                     "labels": {i: i + k + 1 for i in range(1, T - k + 1)}})
    return rows


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
