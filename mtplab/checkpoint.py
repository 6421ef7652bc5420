"""Checkpoints: safetensors weights plus a JSON config, written atomically, loaded without pickle.

A checkpoint whose trunk was frozen during training stores only its head weights and names
its base checkpoint (file stem and sha256); loading it loads the base first.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .config import ModelConfig
from .errors import MtplabError
from .model import GPT

# MTPLAB_CHECKPOINTS points elsewhere (e.g. freshly trained checkpoints) without touching data/
CHECKPOINT_DIR = Path(os.environ.get("MTPLAB_CHECKPOINTS") or Path(__file__).resolve().parent.parent / "data" / "checkpoints")


def atomic_write(path: Path, write) -> None:
    """Call write(tmp_path), then rename over `path`: a failure leaves the old file intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    def w(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    atomic_write(path, w)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def resolve(name_or_path) -> Path:
    """A file stem in data/checkpoints/ ('ntp') or a path to NAME.safetensors / NAME.json / NAME."""
    p = Path(name_or_path)
    candidates = [p, p.with_suffix(".safetensors")] if p.suffix != ".json" else [p.with_suffix(".safetensors")]
    if not p.is_absolute() and len(p.parts) == 1:
        candidates.append(CHECKPOINT_DIR / f"{p.stem}.safetensors")
    for c in candidates:
        if c.suffix == ".safetensors" and c.exists():
            return c
    known = sorted(q.stem for q in CHECKPOINT_DIR.glob("*.safetensors"))
    raise MtplabError(f"checkpoint {str(name_or_path)!r} not found; shipped ones are {', '.join(known) or 'none'}, "
                      "or give a path to a .safetensors file")


def save(model: GPT, path, *, meta: dict | None = None, base: str | Path | None = None, dtype=None) -> Path:
    """Write PATH.safetensors and PATH.json. With `base`, store only the head weights (mtp.*)."""
    path = Path(path).with_suffix(".safetensors")
    state = {n: t.detach() for n, t in model.state_dict().items()}
    state.pop("lm_head.weight", None)  # tied to wte.weight
    info = {"config": model.config.to_dict(), "meta": meta or {}}
    if base is not None:
        base_path = resolve(base)
        state = {n: t for n, t in state.items() if n.startswith("mtp.")}
        info["base"] = {"file": base_path.name, "sha256": sha256(base_path)}
    state = {n: (t.to(dtype) if dtype is not None and t.is_floating_point() else t).contiguous().cpu()
             for n, t in state.items()}
    atomic_write(path, lambda tmp: save_file(state, tmp, metadata={"format": "mtplab"}))
    atomic_write_text(path.with_suffix(".json"), json.dumps(info, indent=2) + "\n")
    return path


def read_info(path) -> dict:
    path = resolve(path)
    jpath = path.with_suffix(".json")
    if not jpath.exists():
        raise MtplabError(f"{jpath} is missing: a checkpoint is NAME.safetensors plus NAME.json")
    try:
        return json.loads(jpath.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MtplabError(f"{jpath} is not valid JSON ({e}); restore it or retrain the checkpoint") from None


def _read_tensors(path: Path) -> dict:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise MtplabError(f"{path} is corrupt or truncated ({e}); restore it from git or retrain") from None


def load(name_or_path, *, device="cpu", dtype=torch.float32, config: ModelConfig | None = None) -> GPT:
    """Load a checkpoint into a GPT (eval mode). `config`, if given, must match the weights."""
    path = resolve(name_or_path)
    info = read_info(path)
    if "config" not in info:
        raise MtplabError(f"{path.with_suffix('.json')} has no 'config'; it is not an mtplab checkpoint")
    cfg = config or ModelConfig.from_dict(info["config"])
    state = {}
    if "base" in info:
        bpath = path.parent / info["base"]["file"]
        if not bpath.exists():
            bpath = CHECKPOINT_DIR / info["base"]["file"]
        if not bpath.exists():
            raise MtplabError(f"{path.name} holds only heads; its base {bpath} is missing")
        if sha256(bpath) != info["base"]["sha256"]:
            raise MtplabError(f"{path.name} was trained on a different {bpath.name} (sha256 differs); "
                              "retrain the heads on the current base or restore the old base")
        state.update(_read_tensors(bpath))
    state.update(_read_tensors(path))
    model = GPT(cfg)
    expected = {n: t.shape for n, t in model.state_dict().items() if n != "lm_head.weight"}
    got = {n: t.shape for n, t in state.items()}
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    wrong = sorted(n for n in set(expected) & set(got) if tuple(expected[n]) != tuple(got[n]))
    if missing or extra or wrong:
        parts = []
        if missing:
            parts.append(f"missing {missing[:4]}{'...' if len(missing) > 4 else ''}")
        if extra:
            parts.append(f"unexpected {extra[:4]}{'...' if len(extra) > 4 else ''}")
        if wrong:
            parts.append("wrong shape " + ", ".join(f"{n} {tuple(got[n])} vs {tuple(expected[n])}" for n in wrong[:3]))
        raise MtplabError(f"config does not match the weights in {path.name}: " + "; ".join(parts) +
                          ". Load it with the config saved beside it (omit config=) or retrain.")
    model.load_state_dict({n: t.float() for n, t in state.items()}, strict=False)
    model.lm_head.weight = model.wte.weight
    return model.to(device=device, dtype=dtype).eval()
