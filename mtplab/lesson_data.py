"""The numbers behind two lesson figures in `mtplab.viz_lessons`, computed here so the figures only draw:
one verify forward laid out row by row, and the three head families' sizes and measured costs."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from . import checkpoint
from .errors import MtplabError
from .tokenizer import token_repr

# family -> (shipped checkpoint, row of docs/bench/decode.json measured with it)
FAMILIES = {"stern": ("stern-k4", "blockwise-overlap"),
            "meta": ("meta-k4", "meta"),
            "deepseek": ("deepseek-d3", "deepseek D=3")}
DECODE_JSON = Path(__file__).resolve().parent.parent / "docs" / "bench" / "decode.json"


@torch.no_grad()
def verify_example(model, prompt: list[int], k: int) -> dict:
    """One verify forward on `prompt`, laid out row by row (`viz_lessons.verify_forward` draws it).

    The prefill gives the target's next token P (depth 1, committed) and k-1 drafts (depths 2..k). Verify feeds
    [P, draft 1, ..., draft k-1] in one forward; the target's argmax after fed token j is compared with draft
    j+1, and the argmax after the last draft is the bonus (the plain schedule does not feed the last draft, so
    it stops one row short). Returns printable labels: the prompt's last token, fed, predicted and drafts."""
    if model.mtp is None or k > model.config.n_depths:
        raise MtplabError(f"verify_example needs a checkpoint with at least k = {k} depths, e.g. stern-k4")
    dev = model.wte.weight.device
    first = model.depth_logits(torch.tensor([prompt], device=dev))[0, -1, :k].argmax(-1).tolist()  # (k,)
    logits = model(torch.tensor([prompt + first], device=dev)).logits  # (1, T + k, V): one forward
    predicted = logits[0, len(prompt):].argmax(-1).tolist()            # (k,) the target's token after each
    return {"context": token_repr(prompt[-1]), "fed": [token_repr(t) for t in first],
            "predicted": [token_repr(t) for t in predicted], "drafts": [token_repr(t) for t in first[1:]]}


def head_families(bench_path=DECODE_JSON) -> list[dict]:
    """Per family: parameters of the heads (`model.mtp`) and of the trunk (everything else, shared output head
    included) from the shipped checkpoint, and ms per step of drafter and target from the decode benchmark."""
    path = Path(bench_path)
    if not path.exists():
        raise MtplabError(f"{path} not found; run the decode benchmark (mtplab bench decode) or pass bench_path")
    bench = {r["method"]: r for r in json.loads(path.read_text())["rows"]}
    rows = []
    for family, (name, method) in FAMILIES.items():
        if method not in bench:
            raise MtplabError(f"{path} has no row for method {method!r}; rerun the decode benchmark")
        model = checkpoint.load(name)
        heads = sum(p.numel() for p in model.mtp.parameters())
        rows.append({"family": family, "checkpoint": name, "method": method, "k": bench[method]["k"],
                     "head_params": heads, "trunk_params": model.num_params() - heads,
                     "step_ms_drafter": bench[method]["step_ms_drafter"],
                     "step_ms_target": bench[method]["step_ms_target"], "source": f"docs/bench/{path.name}"})
    return rows
