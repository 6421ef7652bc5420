"""A training run's directory: checked before training, locked for the run's lifetime, saved as one set.

A save writes, in order:
  1. NAME.safetensors, NAME.json          the checkpoint (each file atomic: temp file, fsync, rename)
  2. NAME.state.next.safetensors          the resume state: full-precision weights, optimizer, generators
  3. NAME.state.json                      the manifest: step, history, settings, sha256 of the state file
  4. rename NAME.state.next.safetensors -> NAME.state.safetensors
The manifest is the commit point: resume loads whichever state file has the sha256 it names, so a run
killed at any point resumes from the last complete save and reaches the uninterrupted run's weights.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from mtplab.model import checkpoint as ckpt
from mtplab.errors import MtplabError

# settings that may differ between a run and its --resume; every other saved setting must match
MAY_CHANGE = ("steps", "max_seconds", "eval_every", "eval_windows", "save_every", "progress", "device",
              "save_dtype", "stop_after", "overwrite", "resume", "out")


def paths(out: Path, name: str) -> dict[str, Path]:
    return {"weights": out / f"{name}.safetensors", "config": out / f"{name}.json",
            "state": out / f"{name}.state.safetensors", "next": out / f"{name}.state.next.safetensors",
            "manifest": out / f"{name}.state.json", "lock": out / f".{name}.lock"}


def check_out(out: Path, name: str, *, resume: bool, overwrite: bool) -> None:
    """Refuse an unusable --out, the shipped checkpoints, or a run already there, before training starts."""
    if out.resolve() == ckpt.SHIPPED_DIR.resolve() and os.environ.get("MTPLAB_WRITE_SHIPPED") != "1":
        raise MtplabError(f"--out {out} is the shipped checkpoint directory; train into another --out and copy "
                          "the files (or set MTPLAB_WRITE_SHIPPED=1 to write there on purpose)")
    if out.exists() and not out.is_dir():
        raise MtplabError(f"--out {out} is a file, not a directory; choose a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".{name}.probe.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise MtplabError(f"cannot write to --out {out} ({e.strerror or e}); choose a writable directory") from None
    p = paths(out, name)
    held = [p[k].name for k in ("weights", "manifest") if p[k].exists()]
    if held and not (resume or overwrite):
        raise MtplabError(f"--out {out} already holds a run {name!r} ({', '.join(held)}); pass --resume to "
                          "continue it, --overwrite to replace it, or choose another --out or --name")


@contextmanager
def lock(out: Path, name: str):
    """Hold OUT/.NAME.lock for the run's lifetime (released by the OS if the process dies)."""
    path = paths(out, name)["lock"]
    f = open(path, "a+")
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            who = f.read().strip() or "another process"
            raise MtplabError(f"run {name!r} in {out} is locked by {who}; wait for it to finish or choose "
                              "another --out or --name") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}")
        f.flush()
        yield
    finally:
        f.close()


def _opt_tensors(opt) -> tuple[dict, dict]:
    """The optimizer's own `state_dict()`, flattened without pickle: its tensors as `__opt__.{param}.{key}` for
    safetensors, everything else (scalars, the param groups' settings) as JSON. Any torch optimizer round-trips,
    AdamW with amsgrad's max_exp_avg_sq included."""
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"__opt__.{idx}.{k}"] = v
            else:
                scalars[f"{idx}.{k}"] = v
    return tensors, {"state": scalars, "param_groups": sd["param_groups"]}


def _load_opt(opt, tensors: dict, scalars: dict) -> None:
    if "param_groups" not in scalars:  # a save set written before the state_dict format: AdamW's three keys
        for gi, group in enumerate(opt.param_groups):
            for pi, p in enumerate(group["params"]):
                key = f"{gi}.{pi}"
                if f"{key}.exp_avg" in tensors:
                    opt.state[p] = {"step": torch.tensor(scalars[f"{key}.step"]),
                                    "exp_avg": tensors[f"{key}.exp_avg"].to(p.device),
                                    "exp_avg_sq": tensors[f"{key}.exp_avg_sq"].to(p.device)}
        return
    state: dict = {}
    for name, t in tensors.items():
        if name.startswith("__opt__."):
            idx, k = name[len("__opt__."):].split(".", 1)
            state.setdefault(int(idx), {})[k] = t
    for name, v in scalars["state"].items():
        idx, k = name.split(".", 1)
        state.setdefault(int(idx), {})[k] = v
    opt.load_state_dict({"state": state, "param_groups": scalars["param_groups"]})


def save(out: Path, name: str, *, model, opt, gen, step: int, history: list, settings: dict, meta: dict,
         base, dtype) -> None:
    """One save set (see the module docstring). A failed write raises MtplabError; the last set survives."""
    p = paths(out, name)
    tensors, scalars = _opt_tensors(opt)
    tensors = {n: t.detach().cpu().contiguous() for n, t in tensors.items()}
    tensors["__batch_rng__"] = gen.get_state()
    tensors["__torch_rng__"] = torch.get_rng_state()
    for n, t in model.state_dict().items():  # the live fp32 weights, so that a resumed run continues bit for bit
        if n != "lm_head.weight":
            tensors[f"__w__.{n}"] = t.detach().cpu().contiguous()
    try:
        ckpt.save(model, p["weights"], meta=meta, base=base, dtype=dtype)
        ckpt.atomic_write(p["next"], lambda tmp: save_file(tensors, tmp))
        manifest = {"step": step, "state_sha256": ckpt.sha256(p["next"]), "scalars": scalars,
                    "settings": settings, "history": history}
        ckpt.atomic_write_text(p["manifest"], json.dumps(manifest) + "\n")
        _promote(p["next"], p["state"])
    except (OSError, SafetensorError) as e:
        full = isinstance(e, OSError) and e.errno == errno.ENOSPC
        why = "the disk is full" if full else (getattr(e, "strerror", None) or str(e))
        raise MtplabError(f"could not save step {step} to {out} ({why}); the last complete save is still there: "
                          "free space or fix --out, then continue with --resume") from None


def _promote(src: Path, dst: Path) -> None:
    """The last point of a save: the committed state file takes its usual name."""
    os.replace(src, dst)


def read_manifest(out: Path, name: str) -> dict:
    p = paths(out, name)
    if not p["manifest"].exists():
        raise MtplabError(f"nothing to resume in {out}: {p['manifest'].name} is missing; run without --resume "
                          "first (or with --overwrite)")
    try:
        m = json.loads(p["manifest"].read_text(encoding="utf-8"))
        if not isinstance(m, dict):
            raise ValueError("not an object")
        m["step"], m["history"], m["scalars"], m["settings"]  # noqa: B018 (all four are needed)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise MtplabError(f"{p['manifest']} is not a resumable training state ({e}); start again with "
                          "--overwrite") from None
    return m


def check_settings(saved: dict, now: dict, out: Path) -> None:
    """Refuse a --resume whose settings differ from the saved run's (MAY_CHANGE may differ)."""
    diff = [f"{k} {saved.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(saved) | set(now))
            if k not in MAY_CHANGE and saved.get(k) != now.get(k)]
    if diff:
        raise MtplabError(f"--resume of {out} with other settings ({'; '.join(diff)}); resume with the saved "
                          "settings (only --steps, --max-seconds, --eval-every, --save-dtype, --device may change) "
                          "or start again with --overwrite")


def load_state(out: Path, name: str, manifest: dict) -> dict:
    """The resume tensors of the last complete save: the state file whose sha256 the manifest names."""
    p = paths(out, name)
    want = manifest.get("state_sha256")
    for path in (p["state"], p["next"]):
        if path.is_file() and ckpt.sha256(path) == want:
            try:
                return load_file(str(path))
            except (SafetensorError, OSError) as e:
                raise MtplabError(f"{path} is corrupt ({e}); start again with --overwrite") from None
    raise MtplabError(f"{p['state'].name} in {out} is missing, truncated or not the one "
                      f"{p['manifest'].name} names; start again with --overwrite")


def restore(tensors: dict, manifest: dict, *, model, opt, gen) -> None:
    model.load_state_dict({n[len("__w__."):]: t for n, t in tensors.items() if n.startswith("__w__.")},
                          strict=False)
    model.lm_head.weight = model.wte.weight
    _load_opt(opt, {n: t for n, t in tensors.items() if n.startswith("__opt__.") or not n.startswith("__")},
              manifest["scalars"])
    gen.set_state(tensors["__batch_rng__"])
    torch.set_rng_state(tensors["__torch_rng__"])
