"""Checkpoints: safetensors weights plus a JSON config, written atomically, loaded without pickle.

A checkpoint whose trunk was frozen during training stores only its head weights and names
its base checkpoint (file name, the directory it was trained from, sha256); loading it finds the base
by that sha256 among regular files of that name beside it, where it was trained from, or in
data/checkpoints. A config is checked (types, ranges) and against the weights file's header before
anything is allocated.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
import torch
from safetensors import SafetensorError
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from mtplab.model.config import ModelConfig
from mtplab import paths
from mtplab.errors import MtplabError
from mtplab.model.gpt import GPT

# module attributes (tests point them elsewhere); MTPLAB_CHECKPOINTS and MTPLAB_DATA are read in mtplab.paths
SHIPPED_DIR = paths.SHIPPED_DIR
CHECKPOINT_DIR = paths.CHECKPOINT_DIR
MAX_HEADER = 100 << 20  # bytes of safetensors header we are willing to read
MAX_BLOCK = 1 << 16     # the longest context window a config may ask for


def atomic_write(path: Path, write) -> None:
    """Call write(tmp_path), then rename over `path`: a failure leaves the old file intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        with open(tmp, "rb") as f:  # the bytes reach the disk before the name points at them
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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


def _stem(p: Path) -> str:
    """NAME of NAME, NAME.json or NAME.safetensors; a dotted NAME ('my.run') keeps its dots."""
    return p.name[:-len(p.suffix)] if p.suffix in (".json", ".safetensors") else p.name


def resolve(name_or_path) -> Path:
    """A file stem in data/checkpoints/ ('ntp') or a path to NAME.safetensors / NAME.json / NAME."""
    p = Path(name_or_path)
    stem = _stem(p)
    candidates = [p, p.with_name(stem + ".safetensors")]
    if not p.is_absolute() and len(p.parts) == 1:
        candidates.append(CHECKPOINT_DIR / f"{stem}.safetensors")
    for c in candidates:
        if c.suffix == ".safetensors" and c.is_file():
            return c
    known = sorted(q.stem for q in CHECKPOINT_DIR.glob("*.safetensors"))
    raise MtplabError(f"checkpoint {str(name_or_path)!r} not found; shipped ones are {', '.join(known) or 'none'}, "
                      "or give a path to a .safetensors file")


def save(model: GPT, path, *, meta: dict | None = None, base: str | Path | None = None, dtype=None) -> Path:
    """Write PATH.safetensors and PATH.json. With `base`, store only the head weights (mtp.*)."""
    path = Path(path)
    path = path.with_name(_stem(path) + ".safetensors")
    state = {n: t.detach() for n, t in model.state_dict().items()}
    state.pop("lm_head.weight", None)  # tied to wte.weight
    info = {"config": model.config.to_dict(), "meta": meta or {}}
    if base is not None:
        base_path = resolve(base)
        state = {n: t for n, t in state.items() if n.startswith("mtp.")}
        info["base"] = {"file": base_path.name, "dir": str(base_path.resolve().parent), "sha256": sha256(base_path)}
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


def _header(path: Path) -> dict:
    """name -> shape from the safetensors header, read without loading (or trusting) the tensors."""
    try:
        with open(path, "rb") as f:  # the header's length first: a crafted length must not be read into memory
            n = int.from_bytes(f.read(8), "little")
        if not 0 < n <= min(MAX_HEADER, path.stat().st_size - 8):
            raise ValueError(f"header length {n}")
        with safe_open(str(path), framework="pt") as f:  # safetensors parses and validates the header itself
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError, SafetensorError) as e:
        raise MtplabError(f"{path} is corrupt or truncated ({e}); restore it from git or retrain") from None


def _config(info, jpath: Path) -> ModelConfig:
    """The saved config, its field types and ranges checked before any tensor is allocated."""
    raw = info.get("config") if isinstance(info, dict) else None
    if not isinstance(raw, dict):
        raise MtplabError(f"{jpath} has no 'config' object; it is not an mtplab checkpoint (retrain or restore it)")
    fields = ModelConfig.__dataclass_fields__
    for key, v in raw.items():
        want = fields[key].type if key in fields else None
        bad = (want == "int" and (isinstance(v, bool) or not isinstance(v, int) or v < 1)
               or want == "float" and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1)
               or want == "str" and not isinstance(v, str))
        if bad:
            raise MtplabError(f"{jpath}: config field {key}={v!r} is not a valid {want}; restore the file or retrain")
    if raw.get("block_size", 1) > MAX_BLOCK:
        raise MtplabError(f"{jpath}: block_size {raw['block_size']} is over {MAX_BLOCK}; restore the file or retrain")
    return ModelConfig.from_dict(raw)


def _check_header(cfg: ModelConfig, shapes: dict, path: Path) -> None:
    """The sizes that drive allocation (vocabulary, width, layers) must be those of the weights file."""
    wte = shapes.get("wte.weight")
    layers = {int(n.split(".")[1]) for n in shapes if n.startswith("blocks.") and n.split(".")[1].isdigit()}
    if wte != (cfg.vocab_size, cfg.n_embd) or len(layers) != cfg.n_layer:
        raise MtplabError(f"config does not match the weights in {path.name}: the config says vocab_size "
                          f"{cfg.vocab_size}, n_embd {cfg.n_embd}, n_layer {cfg.n_layer}; the weights have "
                          f"wte {wte} and {len(layers)} layers. Restore the config saved with them or retrain.")


def _find_base(path: Path, base) -> Path:
    """The base checkpoint with the recorded sha256: a regular file of the recorded name, beside the heads,
    in the directory it was trained from, or in data/checkpoints (nowhere else)."""
    ok = isinstance(base, dict) and isinstance(base.get("file"), str) and isinstance(base.get("sha256"), str)
    name = base["file"] if ok else ""
    if not ok or Path(name).name != name or not name.endswith(".safetensors") or name.startswith("."):
        raise MtplabError(f"{path.with_suffix('.json')}: base must name a .safetensors file (no directories, "
                          "no '..'); retrain the heads or restore the file")
    dirs = [path.parent] + ([Path(base["dir"])] if isinstance(base.get("dir"), str) else []) + [CHECKPOINT_DIR]
    seen = [d / name for d in dirs if (d / name).is_file()]
    for cand in seen:
        if sha256(cand) == base["sha256"]:
            return cand
    if seen:
        raise MtplabError(f"{path.name} was trained on a different {name} (sha256 differs from "
                          f"{', '.join(str(c) for c in seen)}); retrain the heads on the current base or restore the old base")
    raise MtplabError(f"{path.name} holds only heads; its base {name} is in none of "
                      f"{', '.join(str(d) for d in dirs)}; put it beside the heads")


def load(name_or_path, *, device="cpu", dtype=torch.float32, config: ModelConfig | None = None) -> GPT:
    """Load a checkpoint into a GPT (eval mode). `config`, if given, must match the weights."""
    path = resolve(name_or_path)
    info = read_info(path)
    cfg = config or _config(info, path.with_suffix(".json"))
    bpath = _find_base(path, info["base"]) if isinstance(info, dict) and "base" in info else None
    shapes = {**(_header(bpath) if bpath else {}), **_header(path)}
    _check_header(cfg, shapes, path)
    state = {}
    if bpath is not None:
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
