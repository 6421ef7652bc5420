"""Checkpoints: safetensors weights plus a JSON config, written atomically, loaded without pickle.

A checkpoint whose trunk was frozen during training stores only its head weights and names
its base checkpoint (file name, the directory it was trained from, sha256); loading it finds the base
by that sha256 among regular files of that name beside it, where it was trained from, or in
data/checkpoints. A config is checked (types, ranges) and against the weights file's header before
anything is allocated: vocabulary, width, layers, prediction depths, and (where the weights file records its
config, as every save since 2026-12 does) n_head and block_size. NAME.json records the sha256 of its weights
(`weights_sha256`): a file whose bytes changed, a relabelled dtype included, is refused; a JSON without the
field (the shipped checkpoints) is "not recorded" and checked by its header alone.

A bare name ('ntp') is a shipped checkpoint (data/checkpoints, or MTPLAB_CHECKPOINTS / MTPLAB_DATA) before
anything in the current directory; give a path ('./ntp', 'runs/x/ntp') to load a file of your own.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from mtplab.model.config import FAMILY, MAX_BLOCK, MAX_DEPTHS, ModelConfig
from mtplab import files, paths
from mtplab.device import pick
from mtplab.errors import MtplabError
from mtplab.files import MAX_JSON, os_reason, read_json
from mtplab.model.gpt import GPT

# module attributes (tests point them elsewhere); MTPLAB_CHECKPOINTS and MTPLAB_DATA are read in mtplab.paths
SHIPPED_DIR = paths.SHIPPED_DIR
CHECKPOINT_DIR = paths.CHECKPOINT_DIR
WEIGHT_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
SAVE_DTYPES = (None, torch.float32, torch.float16, torch.bfloat16)
_ = MAX_BLOCK  # re-exported: callers read checkpoint.MAX_BLOCK


def check_path(flag: str, path) -> None:
    """A path the lab will hand to safetensors (Rust), which opens UTF-8 paths only: a folder name with other bytes
    would train and save, then fail to load ('corrupt'). Refused before anything is written."""
    raw = os.fspath(path)
    if isinstance(raw, bytes):
        raw = os.fsdecode(raw)
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = os.fsencode(raw[e.start:e.end])
        raise MtplabError(f"{flag} {ascii(raw)} is not valid UTF-8 (byte {bad.hex()}), and the weights files cannot be "
                          "opened under such a path; choose a name of UTF-8 characters") from None


def _stem(p: Path) -> str:
    """NAME of NAME, NAME.json or NAME.safetensors; a dotted NAME ('my.run') keeps its dots."""
    return p.name[:-len(p.suffix)] if p.suffix in (".json", ".safetensors") else p.name


def _is_bare(raw: str) -> bool:
    """'ntp', 'stern-k4', 'ntp.json': a name, looked up among the shipped checkpoints first. Anything with a
    directory in it ('./ntp', 'runs/x/ntp', '/abs/ntp') is a path."""
    return "/" not in raw and os.sep not in raw and not raw.startswith(".")


def _shipped_where() -> str:
    """The shipped checkpoints' folder, with the variable that moved it (MTPLAB_CHECKPOINTS, else MTPLAB_DATA)."""
    env = next((v for v in ("MTPLAB_CHECKPOINTS", "MTPLAB_DATA") if os.environ.get(v)), None)
    return f"{CHECKPOINT_DIR} ({env})" if env else str(CHECKPOINT_DIR)


def resolve(name_or_path) -> Path:
    """A shipped checkpoint's name ('ntp'), then a path to NAME.safetensors / NAME.json / NAME."""
    if isinstance(name_or_path, bool) or not isinstance(name_or_path, (str, os.PathLike)) or str(name_or_path) == "":
        raise MtplabError(f"a checkpoint is a name such as 'ntp' or a path to a .safetensors file (got "
                          f"{name_or_path!r})")
    raw = os.fspath(name_or_path)
    raw = raw if isinstance(raw, str) else os.fsdecode(raw)
    if "\0" in raw:
        raise MtplabError(f"checkpoint {raw!r} has a NUL character in its name; give a plain name or path")
    p = Path(raw)
    stem = _stem(p)
    local = [p, p.with_name(stem + ".safetensors")] if stem else []
    shipped = [CHECKPOINT_DIR / f"{stem}.safetensors"] if _is_bare(raw) and stem else []
    for c in shipped:  # a bare name is the shipped one: a local ntp.safetensors never shadows it
        if c.is_file():
            return c
    for c in local:  # a path; one in the cwd comes back absolute, so that resolving it again finds it again
        if c.suffix == ".safetensors" and c.is_file():
            return c.absolute() if _is_bare(str(c)) else c
    known = sorted(q.stem for q in CHECKPOINT_DIR.glob("*.safetensors")) if CHECKPOINT_DIR.is_dir() else []
    if p.is_dir() and (p / "config.json").is_file():
        raise MtplabError(f"{raw} is a Hugging Face model folder, not an mtplab checkpoint; pass it as --hf {raw} "
                          "(API: mtplab.hf.target.load_hf)")
    if not known:
        raise MtplabError(f"checkpoint {raw!r} not found, and there are no shipped checkpoints in {_shipped_where()}; "
                          "point MTPLAB_DATA at mtplab's data folder (or MTPLAB_CHECKPOINTS at a checkpoint folder), "
                          "or give a path to a .safetensors file")
    raise MtplabError(f"checkpoint {raw!r} not found; shipped ones are {', '.join(known)}, "
                      "or give a path to a .safetensors file")


def save(model: GPT, path, *, meta: dict | None = None, base: str | Path | None = None, dtype=None) -> Path:
    """Write PATH.safetensors and PATH.json. With `base`, store only the head weights (mtp.*).
    The weights file records the config in its metadata, and the JSON the weights' sha256."""
    try:
        return write_files(model, path, meta=meta, base=base, dtype=dtype)
    except OSError as e:
        raise MtplabError(f"cannot write the checkpoint {path} ({os_reason(e)}); choose a writable directory") from None


def write_files(model: GPT, path, *, meta: dict | None = None, base: str | Path | None = None, dtype=None) -> Path:
    """`save` without turning a failed write (OSError) into MtplabError: a training run names its own fix."""
    if not isinstance(model, GPT):
        raise MtplabError(f"checkpoint.save takes an mtplab GPT (got {type(model).__name__}); Hugging Face heads are "
                          "saved with mtplab.hf.target.save_heads")
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)) or str(path) in ("", "."):
        raise MtplabError(f"checkpoint.save needs a path such as runs/x/ntp (got {path!r})")
    if dtype not in SAVE_DTYPES:
        raise MtplabError(f"save dtype must be torch.float32, torch.float16 or torch.bfloat16 (got {dtype}); "
                          "integer weights would be rounded to whole numbers")
    path = Path(path)
    path = path.with_name(_stem(path) + ".safetensors")
    if path.parent.exists() and not path.parent.is_dir():
        raise MtplabError(f"cannot write the checkpoint {path}: {path.parent} is a file, not a directory")
    state = {n: t.detach() for n, t in model.state_dict().items()}
    state.pop("lm_head.weight", None)  # tied to wte.weight
    info = {"config": model.config.to_dict(), "meta": meta or {}}
    if base is not None:
        base_path = resolve(base)
        state = {n: t for n, t in state.items() if n.startswith("mtp.")}
        info["base"] = {"file": base_path.name, "dir": str(base_path.resolve().parent), "sha256": files.sha256(base_path)}
    state = {n: (t.to(dtype) if dtype is not None and t.is_floating_point() else t).contiguous().cpu()
             for n, t in state.items()}
    header = {"format": "mtplab", "config": json.dumps(model.config.to_dict(), sort_keys=True)}
    digest: dict = {}

    def write(tmp):
        save_file(state, tmp, metadata=header)
        digest["sha256"] = files.sha256(Path(tmp))

    files.atomic_write(path, write)
    info["weights_sha256"] = digest["sha256"]
    files.atomic_write_text(path.with_suffix(".json"), json.dumps(info, indent=2) + "\n")
    return path


def read_info(path) -> dict:
    """NAME.json of a checkpoint (a name or a path, as `resolve` takes it), checked to be a JSON object."""
    return _info_at(resolve(path))


def _info_at(path: Path) -> dict:
    """NAME.json beside an already resolved NAME.safetensors (never looked up again by name)."""
    jpath = path.with_suffix(".json")
    if not jpath.is_file():
        try:
            hf_heads = "mtplab-hf-heads" in str(_header(path, with_meta=True)[1].get("mtplab", ""))
        except MtplabError:
            hf_heads = False
        if hf_heads:
            raise MtplabError(f"{path} holds heads for a Hugging Face model (train --hf wrote it), not a lab checkpoint; "
                              "use it with generate --hf MODEL --heads-checkpoint")
        raise MtplabError(f"{jpath} is missing: a checkpoint is NAME.safetensors plus NAME.json")
    info = read_json(jpath, limit=MAX_JSON, what="a checkpoint config", fix="restore it or retrain",
                     invalid_fix="restore it or retrain the checkpoint")
    if not isinstance(info, dict):
        raise MtplabError(f"{jpath} has no 'config' object; it is not an mtplab checkpoint (retrain or restore it)")
    return info


def _read_tensors(path: Path) -> dict:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise MtplabError(f"{path} is corrupt or truncated ({e}); restore it from git or retrain") from None


def _header(path: Path, *, with_meta: bool = False):
    """name -> shape from the safetensors header (`files.safetensors_header`: read without loading or trusting the
    tensors); with_meta: also the header's metadata. Tensors that are not F32, F16 or BF16 are refused (weights are
    floats)."""
    try:
        shapes, dtypes, meta = files.safetensors_header(path)
    except RecursionError:
        raise MtplabError(f"{path} is corrupt (its header is nested too deeply); restore it from git or retrain") from None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise MtplabError(f"{path} is corrupt or truncated ({str(e)[:160]}); restore it from git or retrain") from None
    odd = sorted(k for k, d in dtypes.items() if d not in WEIGHT_DTYPES)
    if odd:
        raise MtplabError(f"{path} holds {dtypes[odd[0]]} tensors ({odd[0]}{', ...' if len(odd) > 1 else ''}); weights "
                          "are F32, F16 or BF16: restore the file from git or retrain")
    return (shapes, meta) if with_meta else shapes


def _config(info, jpath: Path) -> ModelConfig:
    """The saved config, its field types and ranges checked before any tensor is allocated."""
    raw = info.get("config") if isinstance(info, dict) else None
    if not isinstance(raw, dict):
        raise MtplabError(f"{jpath} has no 'config' object; it is not an mtplab checkpoint (retrain or restore it)")
    fields = ModelConfig.__dataclass_fields__
    unknown = sorted(set(raw) - set(fields) - {"k"})
    if unknown:
        raise MtplabError(f"{jpath}: unknown config keys {unknown}; is this an mtplab checkpoint config? Restore it or retrain")
    for key, v in raw.items():
        want = fields[key].type if key in fields else None
        bad = (want == "int" and (isinstance(v, bool) or not isinstance(v, int) or v < 1)
               or want == "float" and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1)
               or want == "str" and not isinstance(v, str))
        if bad:
            raise MtplabError(f"{jpath}: config field {key}={v!r} is not a valid {want}; restore the file or retrain")
    if raw.get("block_size", 1) > MAX_BLOCK:
        raise MtplabError(f"{jpath}: block_size {raw['block_size']} is over {MAX_BLOCK}; restore the file or retrain")
    if raw.get("n_depths", raw.get("k", 1)) > MAX_DEPTHS:
        raise MtplabError(f"{jpath}: n_depths {raw.get('n_depths', raw.get('k'))} is over {MAX_DEPTHS}; restore the "
                          "file or retrain")
    try:
        return ModelConfig.from_dict(raw)
    except MtplabError as e:
        raise MtplabError(f"{jpath}: {e}; restore the file or retrain") from None


def config_of(name_or_path) -> ModelConfig:
    """The config saved beside a checkpoint, checked, without reading its weights."""
    path = resolve(name_or_path)
    return _config(_info_at(path), path.with_suffix(".json"))


def _depths_in(cfg: ModelConfig, shapes: dict) -> int | None:
    """Prediction depths K that the weights hold for the config's head family (None: no head weights)."""
    if cfg.heads == "none":
        return 1
    prefix = FAMILY[cfg.heads].weights
    if not prefix:  # the depths stacked in one tensor (Stern's mtp.down_w: (K-1, ...))
        w = shapes.get("mtp.down_w")
        return w[0] + 1 if w else None
    idx = {n[len(prefix):].split(".")[0] for n in shapes if n.startswith(prefix)}
    return len(idx) + 1 if idx else None


def _check_header(cfg: ModelConfig, shapes: dict, path: Path) -> None:
    """The sizes that drive allocation (vocabulary, width, layers) must be those of the weights file."""
    wte = shapes.get("wte.weight")
    layers = {int(n.split(".")[1]) for n in shapes if n.startswith("blocks.") and n.split(".")[1].isdigit()}
    if wte != (cfg.vocab_size, cfg.n_embd) or len(layers) != cfg.n_layer:
        raise MtplabError(f"config does not match the weights in {path.name}: the config says vocab_size "
                          f"{cfg.vocab_size}, n_embd {cfg.n_embd}, n_layer {cfg.n_layer}; the weights have "
                          f"wte {wte} and {len(layers)} layers. Restore the config saved with them or retrain.")
    have = _depths_in(cfg, shapes)
    if have is not None and have != cfg.n_depths:
        raise MtplabError(f"config does not match the weights in {path.name}: the config says {cfg.heads} heads with "
                          f"n_depths {cfg.n_depths}; the weights hold {have} depths. Restore the config saved with "
                          "them or retrain.")


def _check_recorded(cfg: ModelConfig | None, meta: dict, info: dict, path: Path) -> None:
    """What the weights file recorded of its config (n_head, block_size, ...) and what the JSON recorded of the
    weights (sha256). Files written before these records ("not recorded") pass on their header alone."""
    rec = meta.get("config")
    if isinstance(rec, str) and cfg is not None:
        try:
            saved = json.loads(rec)
        except (ValueError, RecursionError):
            saved = None
        if not isinstance(saved, dict):
            raise MtplabError(f"{path} is corrupt (its recorded config is not JSON); restore it from git or retrain")
        diff = [f"{k} {saved[k]!r} -> {v!r}" for k, v in cfg.to_dict().items()
                if k in saved and saved[k] != v and k != "dropout"]
        if diff:
            raise MtplabError(f"config does not match the weights in {path.name}: they were saved with another config "
                              f"({'; '.join(diff)}). Restore the config saved with them or retrain.")
    want = info.get("weights_sha256")  # absent: not recorded (files before 2026-12); null or anything else: refused
    if "weights_sha256" in info and (not isinstance(want, str) or files.sha256(path) != want):
        if path.with_name(f"{_stem(path)}.state.json").is_file():  # a training run's save cut between its files
            raise MtplabError(f"{path.name} is not the file {path.with_suffix('.json').name} was saved with: a save of "
                              f"the run in {path.parent} was cut between its files; continue the run with the same "
                              "command plus --resume (it rewrites both), or retrain")
        raise MtplabError(f"{path.name} is not the file {path.with_suffix('.json').name} was saved with (its sha256 "
                          "differs: changed, relabelled or truncated); restore both files from the same save or retrain")


def _find_base(path: Path, base) -> Path:
    """The base checkpoint with the recorded sha256: a regular file of the recorded name, beside the heads,
    in the directory it was trained from, or in data/checkpoints (nowhere else)."""
    ok = isinstance(base, dict) and isinstance(base.get("file"), str) and isinstance(base.get("sha256"), str)
    name = base["file"] if ok else ""
    if not ok or Path(name).name != name or not name.endswith(".safetensors") or name.startswith(".") or "\0" in name:
        raise MtplabError(f"{path.with_suffix('.json')}: base must name a .safetensors file (no directories, "
                          "no '..'); retrain the heads or restore the file")
    trained = [Path(base["dir"])] if isinstance(base.get("dir"), str) and "\0" not in base["dir"] else []
    dirs = [path.parent] + trained + [CHECKPOINT_DIR]
    # the recorded directory is only a hint from a JSON file: a file there is hashed (and named in a message)
    # only when it is an mtplab checkpoint, NAME.json beside a weights file whose header parses
    seen = [d / name for d in dirs if (d / name).is_file() and (d not in trained or _is_checkpoint(d / name))]
    for cand in seen:
        if files.sha256(cand) == base["sha256"]:
            return cand
    if seen:
        raise MtplabError(f"{path.name} was trained on a different {name} (sha256 differs from "
                          f"{', '.join(str(c) for c in seen)}); retrain the heads on the current base or restore the old base")
    raise MtplabError(f"{path.name} holds only heads; its base {name} is in none of "
                      f"{', '.join(str(d) for d in dirs)}; put it beside the heads")


def _is_checkpoint(path: Path) -> bool:
    try:
        _header(path)
        return isinstance(_info_at(path).get("config"), dict)
    except MtplabError:
        return False


def _device(device) -> torch.device:
    if isinstance(device, torch.device):
        return pick(str(device)) if device.type in ("cuda", "mps") else device
    if not isinstance(device, str):
        raise MtplabError(f"device must be a name such as 'cpu', 'cuda' or 'auto' (got {device!r})")
    return pick(device)


def load(name_or_path, *, device="cpu", dtype=torch.float32, config: ModelConfig | None = None) -> GPT:
    """Load a checkpoint into a GPT (eval mode). `config`, if given, must match the weights."""
    dev = _device(device)
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise MtplabError(f"dtype must be torch.float32, torch.float16 or torch.bfloat16 (got {dtype!r})")
    if config is not None and not isinstance(config, ModelConfig):
        raise MtplabError(f"config must be a ModelConfig (got {type(config).__name__}); omit it to use the one saved "
                          "beside the weights")
    path = resolve(name_or_path)
    info = _info_at(path)
    cfg = config or _config(info, path.with_suffix(".json"))
    bpath = _find_base(path, info["base"]) if "base" in info else None
    own, meta = _header(path, with_meta=True)
    shapes = {**(_header(bpath) if bpath else {}), **own}
    _check_header(cfg, shapes, path)
    _check_tensors(cfg, shapes, path)  # from the header: no byte is hashed or read beyond what the config needs
    _check_recorded(cfg if config is None else None, meta, info, path)
    state = {}
    if bpath is not None:
        state.update(_read_tensors(bpath))
    state.update(_read_tensors(path))
    model = GPT(cfg)
    model.load_state_dict({n: t.float() for n, t in state.items()}, strict=False)
    model.lm_head.weight = model.wte.weight
    return model.to(device=dev, dtype=dtype).eval()


def _check_tensors(cfg: ModelConfig, shapes: dict, path: Path) -> None:
    """Every tensor the config builds, and nothing else, with its shape: checked on the header's shapes."""
    with torch.device("meta"):
        expected = {n: t.shape for n, t in GPT(cfg).state_dict().items() if n != "lm_head.weight"}
    missing = sorted(set(expected) - set(shapes))
    extra = sorted(set(shapes) - set(expected))
    wrong = sorted(n for n in set(expected) & set(shapes) if tuple(expected[n]) != tuple(shapes[n]))
    if missing or extra or wrong:
        parts = [f"{what} {names[:4]}{'...' if len(names) > 4 else ''}"
                 for what, names in (("missing", missing), ("unexpected", extra)) if names]
        if wrong:
            parts.append("wrong shape " + ", ".join(f"{n} {tuple(shapes[n])} vs {tuple(expected[n])}" for n in wrong[:3]))
        raise MtplabError(f"config does not match the weights in {path.name}: " + "; ".join(parts) +
                          ". Load it with the config saved beside it (omit config=) or retrain.")
