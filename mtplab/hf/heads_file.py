"""The heads file: head weights alone, for a Hugging Face trunk, in one safetensors file (`save_heads`) whose
metadata names the base model (the sha256 of its config and a fingerprint of its output weights) and which carries
the draft vocabulary the heads draft over (the int64 tensor `draft_vocab`, as EAGLE-3's d2t travels with its draft).
`load_heads` refuses heads trained on another base, checks every shape from the header before allocating, and
applies the draft vocabulary.

Also the bounded readers of what ships in data/hf/NAME (`read_heads_record`, `read_vocab`, `check_heads_file`; a bad
shipped file's fix is to restore it from git, `shipped_fix`); `read_vocab` reads the distillation's vocab-N.json too.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
import torch
from mtplab.errors import MtplabError
from mtplab.files import MAX_JSON, atomic_write, bad_file, finite, ids_ok, ids_why, json_file, regular, safetensors_header
from mtplab.paths import shipped_folder
from mtplab.model.config import HEAD_FAMILIES, MAX_DEPTHS
from mtplab.model.heads import build_heads

HEADS_FORMAT = "mtplab-hf-heads"
DRAFT_VOCAB = "draft_vocab"  # the heads file's tensor of draft token ids (int64, (N,))
MAX_HEADS_FILE = 2 << 30  # bytes of a heads .safetensors file


def config_hash(hf_config) -> str:
    """sha256 of the model's config (architecture and sizes), without fields that do not change the model."""
    d = hf_config.to_dict()
    for k in ("transformers_version", "_name_or_path", "dtype", "torch_dtype", "architectures", "use_cache",
              "_attn_implementation_autoset", "output_attentions", "output_hidden_states"):
        d.pop(k, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()


def weights_fingerprint(target) -> str:
    """sha256 over a sample of rows of the output layer (at most 256, in bf16 so a fp32 and a bf16 load agree):
    two models with one config but other weights (a fine-tune, another seed) get other fingerprints."""
    w = target.lm_head.weight.detach()
    rows = w[:: max(1, w.shape[0] // 256)].to("cpu", torch.bfloat16).view(torch.int16)
    return hashlib.sha256(rows.numpy().tobytes()).hexdigest()


def base_record(target) -> dict:
    return {"path": target.path, "name": Path(target.path).name, "model_type": target.hf.config.model_type,
            "config_sha256": config_hash(target.hf.config), "weights_fingerprint": weights_fingerprint(target)}


def save_heads(target, path, *, meta: dict | None = None, dtype=torch.float32, vocab=None) -> Path:
    """Write the head weights alone (mtp.*) to PATH.safetensors, in `dtype` (bf16 halves what ships); the metadata
    names the base model. The draft vocabulary the heads draft over (`vocab`, else the one in use) is written
    beside them as the int64 tensor `draft_vocab` (its token ids), which `load_heads` applies."""
    from safetensors.torch import save_file
    if target.mtp is None:
        raise MtplabError("this model has no heads to save; attach and train some first")
    path = Path(path)
    if path.suffix != ".safetensors":  # a dotted name (my-run.v2) keeps its dots
        path = path.with_name(path.name + ".safetensors")
    state = {f"mtp.{n}": t.detach().to(dtype).contiguous().cpu() for n, t in target.mtp.state_dict().items()}
    ids = target.draft_vocab if vocab is None else torch.as_tensor(vocab, dtype=torch.long)
    if ids is not None:
        state[DRAFT_VOCAB] = ids.detach().to(torch.long).flatten().contiguous().cpu()
    info = {"format": HEADS_FORMAT, "heads": target.config.heads, "n_depths": target.config.n_depths,
            "base": base_record(target), "meta": meta or {}, "draft_vocab": None if ids is None else len(ids)}
    atomic_write(path, lambda tmp: save_file(state, tmp, metadata={"mtplab": json.dumps(info)}))
    return path


def read_heads_info(path, *, tensors: bool = True) -> dict:
    """The metadata of a heads file written by `save_heads`, checked (types, family, depths) and with the
    tensors' shapes from the header; `tensors=True` also loads the weights (after the checks)."""
    from safetensors.torch import load_file
    if isinstance(path, bool) or not isinstance(path, (str, Path)) or str(path) == "":
        raise MtplabError(f"a heads checkpoint is a path to a .safetensors file (got {path!r})")
    p = Path(path)
    if p.suffix != ".safetensors" and not p.exists():
        p = p.with_name(p.name + ".safetensors")
    if p.is_dir():
        raise MtplabError(f"{path} is a directory; give the heads file that train --hf wrote (OUT/NAME.safetensors)")
    if not p.exists():
        raise MtplabError(f"heads checkpoint {path} not found; train one with python -m mtplab train --hf ...")
    check_heads_file(p)  # a regular file of bounded size, before it is opened
    try:
        shapes, dtypes, meta = safetensors_header(p)
    except Exception as e:
        raise MtplabError(f"{p} is corrupt or truncated ({e}); retrain the heads") from None
    bad = f"{p} has heads metadata mtplab does not understand"
    try:
        info = json.loads(meta.get("mtplab", "{}"))
    except (ValueError, RecursionError):
        raise MtplabError(f"{bad} (not JSON); retrain the heads with python -m mtplab train --hf ...") from None
    if not isinstance(info, dict) or info.get("format") != HEADS_FORMAT:
        raise MtplabError(f"{p} is not an mtplab heads checkpoint for a Hugging Face model "
                          "(lab checkpoints go to --checkpoint)")
    base = info.get("base")
    if not isinstance(base, dict) or not all(isinstance(base.get(k), str) for k in
                                             ("name", "model_type", "config_sha256", "weights_fingerprint")):
        raise MtplabError(f"{bad} (its base record is missing or malformed); retrain the heads")
    n = info.get("n_depths")
    if info.get("heads") not in HEAD_FAMILIES[1:] or isinstance(n, bool) or not isinstance(n, int) \
            or not 2 <= n <= MAX_DEPTHS:
        raise MtplabError(f"{bad} (heads {info.get('heads')!r} with n_depths {n!r}; want stern, meta or deepseek "
                          f"with 2..{MAX_DEPTHS} depths); retrain the heads")
    odd = sorted(k for k, d in dtypes.items() if d not in ("F32", "F16", "BF16")
                 and not (k == DRAFT_VOCAB and d == "I64" and len(shapes[k]) == 1))
    if odd:  # as the lab's checkpoints: integer weights would decode, silently, to drafts that are never accepted
        raise MtplabError(f"{p} holds {dtypes[odd[0]]} tensors ({odd[0]}); head weights are F32, F16 or BF16: retrain "
                          "the heads")
    info["shapes"] = shapes
    info["path"] = p
    if tensors:
        try:
            info["tensors"] = load_file(str(p))
        except Exception as e:
            raise MtplabError(f"{p} is corrupt or truncated ({e}); retrain the heads") from None
    return info


def load_heads(target, path, *, draft_vocab: bool = True):
    """`_load_heads`; for a heads file that ships in data/hf, every refusal names git as the fix (no command
    rewrites a shipped file in place)."""
    try:
        return _load_heads(target, path, draft_vocab=draft_vocab)
    except MtplabError as e:
        if isinstance(path, (str, Path)) and in_shipped(path) and "git checkout" not in str(e):
            raise MtplabError(f"{str(e).split('; ')[0]}; {shipped_fix(path)}") from None
        raise


def _load_heads(target, path, *, draft_vocab: bool = True):
    """Attach the heads saved in `path` to `target` (in place), after checking they were trained on it and,
    from the header alone, that their shapes are those its config builds; with `draft_vocab`, they draft over the
    vocabulary saved with them (if any), else over the full one."""
    info = read_heads_info(path, tensors=False)
    base, here = info["base"], base_record(target)
    if base["config_sha256"] != here["config_sha256"]:
        raise MtplabError(f"{Path(path).name} was trained on another base model ({base['name']}, a "
                          f"{base['model_type']} with another config); train heads on {target.path} "
                          "with python -m mtplab train --hf ...")
    if base["weights_fingerprint"] != here["weights_fingerprint"]:
        raise MtplabError(f"{Path(path).name} was trained on another base model ({base['name']}: same config, "
                          f"other weights); train heads on {target.path} with python -m mtplab train --hf ...")
    cfg = target.config.with_heads(info["heads"], info["n_depths"])
    with torch.device("meta"):  # the shapes this config builds, compared with the header before allocating
        want = {f"mtp.{n}": tuple(t.shape) for n, t in build_heads(cfg).state_dict().items()}
    shapes = {n: s for n, s in info["shapes"].items() if n != DRAFT_VOCAB}
    if want != shapes:
        odd = sorted(set(want) ^ set(shapes)) or sorted(n for n in want if want[n] != shapes[n])
        raise MtplabError(f"{Path(path).name} does not match its own head config ({info['heads']}, {info['n_depths']} "
                          f"depths: {odd[0]} differs); retrain the heads")
    tensors = read_heads_info(path)["tensors"]
    ids = tensors.pop(DRAFT_VOCAB, None)
    bad = next((n for n, t in tensors.items() if not torch.isfinite(t).all()), None)
    if bad is not None:
        raise MtplabError(f"{Path(path).name} holds NaN or infinite weights ({bad}): every draft would be rejected; "
                          "retrain the heads (with a lower --lr)")
    target.attach(info["heads"], info["n_depths"])
    state = {n[len("mtp."):]: t for n, t in tensors.items()}
    try:
        target.mtp.load_state_dict(state)
    except RuntimeError as e:
        raise MtplabError(f"{Path(path).name} does not match its own head config ({str(e).splitlines()[0]}); "
                          "retrain the heads") from None
    p = target.wte.weight
    target.mtp.to(device=p.device, dtype=p.dtype)
    try:
        return target._use_draft_vocab(ids if draft_vocab else None)
    except MtplabError as e:
        raise MtplabError(f"{Path(path).name}: {e}; retrain the heads") from None


# ------------------------------------------------------------------------------------------- what ships in data/hf/NAME
def in_shipped(path) -> bool:
    """The file lies in what the lab ships (its folder does: a link there to elsewhere is still a shipped file)."""
    return shipped_folder(Path(path).absolute().parent) is not None


def shipped_fix(path) -> str:
    """The fix for a bad file that ships in data/: restore it, since no command rewrites it in place."""
    return f"restore it from git (git checkout -- {Path(path).parent})"


def read_vocab(path, *, vocab_size: int, shipped: bool = False) -> list[int]:
    """A draft vocabulary ({"n": N, "ids": [id], ...}): N distinct token ids in 0..vocab_size-1, sorted. `shipped`:
    data/hf/NAME/draft-vocab.json (the fix is to restore it); else distill's vocab-N.json (rerun the stage)."""
    what = "a draft vocabulary"
    fix = shipped_fix(path) if shipped else "delete it and rerun the deepseek or stern stage with --resume"
    d = json_file(path, limit=4 << 20, what=what, fix=fix)
    ids = d.get("ids") if isinstance(d, dict) else None
    if not isinstance(ids, list) or not ids:
        raise bad_file(path, what, "a JSON object with a non-empty list of token ids, 'ids'", fix)
    if not ids_ok(ids, vocab_size):
        raise bad_file(path, what, ids_why(ids, vocab_size, "ids"), fix)
    n = d.get("n", len(set(ids)))
    if type(n) is not int or n != len(set(ids)):
        raise bad_file(path, what, f"n = {str(n)[:20]} but it lists {len(set(ids))} distinct ids", fix)
    if "coverage" in d and not (finite(d["coverage"]) and 0 <= d["coverage"] <= 1):
        raise bad_file(path, what, "its coverage is not a fraction in 0..1", fix)
    return sorted(set(ids))


def read_heads_record(path) -> dict:
    """data/hf/NAME/record.json: a JSON object whose "heads" (if any) maps names to objects."""
    what, fix = "the shipped heads' record", shipped_fix(path)
    d = json_file(path, limit=MAX_JSON, what=what, fix=fix)
    if not isinstance(d, dict) or not isinstance(d.get("heads", {}), dict) or not all(
            isinstance(v, dict) for v in d.get("heads", {}).values()):
        raise bad_file(path, what, "a JSON object with a 'heads' object of records", fix)
    return d


def check_heads_file(path) -> Path:
    """A heads .safetensors file (shipped or given) checked to be a regular file of bounded size before safetensors
    opens it (a FIFO would block its open forever); the fix names git for a shipped one."""
    p = Path(path)
    fix = shipped_fix(p) if in_shipped(p) else "give the heads file that train --hf wrote"
    regular(p, limit=MAX_HEADS_FILE, what="a heads file", fix=fix)
    return p
