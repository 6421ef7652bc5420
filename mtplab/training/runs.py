"""A training run's directory: checked before training, locked for the run's lifetime, saved as one set.

A save writes, in order:
  1. NAME.safetensors, NAME.json          the checkpoint (each file atomic: temp file, fsync, rename)
  2. NAME.state.next.safetensors          the resume state: full-precision weights, optimizer, generators
  3. NAME.state.json                      the manifest: step, history, settings, sha256 of the state file
  4. rename NAME.state.next.safetensors -> NAME.state.safetensors
The manifest is the commit point: resume loads whichever state file has the sha256 it names, so a run
killed at any point resumes from the last complete save and reaches the uninterrupted run's weights.
The temp files a kill inside a save leaves behind are removed by the next --resume or --overwrite.

The lab's own runs (`mtplab.training.fit`) and heads on a Hugging Face trunk (`mtplab.training.heads`) share all of
it: the checks of --out, the lock, the save set, the save cadence (steps, and every SAVE_SECONDS of wall time)
and the signals (SIGINT and SIGTERM finish the step, save it and stop with one line).
"""
from __future__ import annotations

import errno
import json
import os
import signal
import stat
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from mtplab.paths import may_write_shipped, shipped_folder
from mtplab import files
from mtplab.model import checkpoint as ckpt
from mtplab.errors import MtplabError
from mtplab import platform_compat as compat

# settings that may differ between a run and its --resume; every other saved setting must match
MAY_CHANGE = ("steps", "max_seconds", "eval_every", "eval_windows", "save_every", "progress", "device",
              "save_dtype", "stop_after", "overwrite", "resume", "out", "save_seconds")
ADDED_LATER = ("corpus_sha256",)  # settings that runs saved before 2026-12 lack: not recorded, not compared
SAVE_SECONDS = 300.0  # a save at least this often (wall time), whatever --steps and --save-every say
TEMP_KINDS = ("safetensors", "json", "state.next.safetensors", "state.safetensors", "state.json")


def paths(out: Path, name: str) -> dict[str, Path]:
    return {"weights": out / f"{name}.safetensors", "config": out / f"{name}.json",
            "state": out / f"{name}.state.safetensors", "next": out / f"{name}.state.next.safetensors",
            "manifest": out / f"{name}.state.json", "lock": out / f".{name}.lock"}


def check_out(out: Path, name: str, *, resume: bool, overwrite: bool) -> None:
    """Refuse an unusable --out, the shipped checkpoints, or a run already there, before training starts."""
    shipped = shipped_folder(out)
    if shipped is not None and not may_write_shipped():
        raise MtplabError(f"--out {out} is inside {shipped}, which the lab ships; train into another --out and copy "
                          "the files (or set MTPLAB_WRITE_SHIPPED=1 to write there on purpose)")
    ckpt.check_path("--out", out)
    if out.exists() and not out.is_dir():
        raise MtplabError(f"--out {out} is a file, not a directory; choose a directory")
    try:
        probe_folder(out, f".{name}.probe.")
    except OSError as e:
        raise MtplabError(f"cannot write to --out {out} ({files.os_reason(e)}); choose a writable directory") from None
    p = paths(out, name)
    held = [p[k].name for k in ("weights", "manifest") if p[k].exists()]
    if held and not (resume or overwrite):
        raise MtplabError(f"--out {out} already holds a run {name!r} ({', '.join(held)}); pass --resume to "
                          "continue it, --overwrite to replace it, or choose another --out or --name")


def probe_folder(folder: Path, prefix: str) -> None:
    """Make `folder` and write one block into a new file there, then remove it: a folder that cannot take a run's
    (or a benchmark's) files fails before the work, not after. The file is created exclusively under a random name
    (O_EXCL: never through a symlink someone planted there), and written: a full disk takes an empty file but not
    one block. Raises OSError for the caller to word."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(dir=folder, prefix=prefix)
    try:
        os.write(fd, bytes(4096))
        os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(probe)


@contextmanager
def lock(out: Path, name: str):
    """Hold OUT/.NAME.lock for the run's lifetime (released by the OS if the process dies). The lock file is
    opened with O_NOFOLLOW and must be a regular file: a symlink planted there is refused, never written through.
    It is written unbuffered (nothing is left to flush, and fail again, when it closes).

    The lock is also where a run's OSError ends (a full disk, a folder removed under it): one line that names the
    fix. Every file of a run is written atomically, so its last complete save stays intact."""
    path = paths(out, name)["lock"]
    try:
        fd = compat.open_no_follow(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise MtplabError(f"{path} is a symlink; a run never writes through one: remove it (rm {path}) "
                              "and start again") from None
        raise MtplabError(f"cannot create the lock file {path} ({files.os_reason(e)}); choose a writable --out") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise MtplabError(f"{path} is not a regular file; remove it and start again")
        try:
            compat.lock_exclusive(fd)
        except OSError:
            who = compat.read_at(fd, 64, 0).decode("utf-8", "replace").strip() or "another process"
            raise MtplabError(f"run {name!r} in {out} is locked by {who}; wait for it to finish or choose "
                              "another --out or --name") from None
        try:
            os.ftruncate(fd, 0)
            compat.write_at(fd, f"pid {os.getpid()}".encode(), 0)
        except OSError as e:
            raise MtplabError(f"cannot write the lock file {path} ({files.os_reason(e)}); free space or choose "
                              "another --out") from None
        try:
            yield
        except OSError as e:
            where = f" ({e.filename})" if getattr(e, "filename", None) else ""
            raise MtplabError(f"the run in {out} stopped: {files.os_reason(e)}{where}; its last complete save is "
                              "intact: free space or fix --out, then continue with the same command plus "
                              "--resume") from None
    finally:
        os.close(fd)


def remove_orphans(out: Path, name: str) -> list[Path]:
    """Delete the temp files of a save that was killed part way (`.NAME.safetensors.XXXX.tmp`, ...); call it
    with the lock held, on --resume or --overwrite. Returns what was removed."""
    gone = []
    for kind in TEMP_KINDS:
        for tmp in out.glob(f".{name}.{kind}.*.tmp"):
            if tmp.name[len(name) + len(kind) + 3:-len(".tmp")].count(".") == 0 and not tmp.is_dir():
                try:
                    tmp.unlink()
                    gone.append(tmp)
                except OSError:
                    pass
    return gone


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
    if "param_groups" not in scalars:  # nothing shipped was saved before the state_dict format: refuse, never restart
        raise KeyError("param_groups")  # the optimizer's state would silently start afresh
    state: dict = {}
    for name, t in tensors.items():
        if name.startswith("__opt__."):
            idx, k = name[len("__opt__."):].split(".", 1)
            state.setdefault(int(idx), {})[k] = t
    for name, v in scalars["state"].items():
        idx, k = name.split(".", 1)
        state.setdefault(int(idx), {})[k] = v
    opt.load_state_dict({"state": state, "param_groups": scalars["param_groups"]})


def save(out: Path, name: str, *, model, opt, gen, step: int, history: list, settings: dict, meta: dict | None = None,
         base=None, dtype=None, write_weights=None, live: dict | None = None) -> None:
    """One save set (see the module docstring). A failed write raises MtplabError; the last set survives.
    `write_weights(path)` writes NAME.safetensors (default: `checkpoint.save` of the model), `live` the
    tensors a resume restores (default: the model's weights, the tied lm_head left out)."""
    p = paths(out, name)
    tensors, scalars = _opt_tensors(opt)
    tensors = {n: t.detach().cpu().contiguous() for n, t in tensors.items()}
    tensors["__batch_rng__"] = gen.get_state()
    tensors["__torch_rng__"] = torch.get_rng_state()
    if live is None:  # the live fp32 weights, so that a resumed run continues bit for bit
        live = {n: t for n, t in model.state_dict().items() if n != "lm_head.weight"}
    for n, t in live.items():
        tensors[f"__w__.{n}"] = t.detach().cpu().contiguous()
    try:
        if write_weights is not None:
            write_weights(p["weights"])
        else:
            ckpt.write_files(model, p["weights"], meta=meta, base=base, dtype=dtype)
        files.atomic_write(p["next"], lambda tmp: save_file(tensors, tmp))
        manifest = {"step": step, "state_sha256": files.sha256(p["next"]), "scalars": scalars,
                    "settings": settings, "history": history}
        files.atomic_write_text(p["manifest"], json.dumps(manifest) + "\n")
        _promote(p["next"], p["state"])
    except (OSError, SafetensorError) as e:
        raise MtplabError(f"could not save step {step} to {out} ({files.os_reason(e)}); the last complete save is "
                          "still there: free space or fix --out, then continue with --resume") from None


def _promote(src: Path, dst: Path) -> None:
    """The last point of a save: the committed state file takes its usual name."""
    os.replace(src, dst)


def read_manifest(out: Path, name: str) -> dict:
    p = paths(out, name)
    if not p["manifest"].exists():
        raise MtplabError(f"nothing to resume in {out}: {p['manifest'].name} is missing; run without --resume "
                          "first (or with --overwrite)")
    try:
        m = json.loads(files.read_bounded(p["manifest"], limit=files.MAX_JSON, what="a run's manifest",
                                         fix="restore it, or start again with --overwrite").decode("utf-8"))
        if not isinstance(m, dict):
            raise ValueError("not an object")
        step, history, scalars, settings = m["step"], m["history"], m["scalars"], m["settings"]
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2 ** 53:
            raise ValueError(f"step {step!r} is not an integer >= 0")
        if not isinstance(history, list) or not all(isinstance(r, dict) for r in history):
            raise ValueError("history is not a list of records")
        if any(not isinstance(r.get("step"), int) or r["step"] > step for r in history):
            raise ValueError(f"history runs past step {step}")
        if not isinstance(scalars, dict) or not isinstance(settings, dict):
            raise ValueError("scalars and settings must be objects")
        if not isinstance(m.get("state_sha256"), str):
            raise ValueError("state_sha256 is missing")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError, OSError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError) else e
        raise MtplabError(f"{p['manifest']} is not a resumable training state ({why}); start again with "
                          "--overwrite") from None
    return m


def check_settings(saved: dict, now: dict, out: Path) -> None:
    """Refuse a --resume whose settings differ from the saved run's (MAY_CHANGE may differ)."""
    diff = [f"{k} {saved.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(saved) | set(now))
            if k not in MAY_CHANGE and saved.get(k) != now.get(k) and not (k in ADDED_LATER and k not in saved)]
    if diff:
        raise MtplabError(f"--resume of {out} with other settings ({'; '.join(diff)}); resume with the saved "
                          "settings (only --steps, --max-seconds, --eval-every, --save-dtype, --device may change) "
                          "or start again with --overwrite")


def load_state(out: Path, name: str, manifest: dict) -> dict:
    """The resume tensors of the last complete save: the state file whose sha256 the manifest names."""
    p = paths(out, name)
    want = manifest.get("state_sha256")
    for path in (p["state"], p["next"]):
        if path.is_file() and files.sha256(path) == want:
            try:
                return load_file(str(path))
            except (SafetensorError, OSError) as e:
                raise MtplabError(f"{path} is corrupt ({e}); start again with --overwrite") from None
    raise MtplabError(f"{p['state'].name} in {out} is missing, truncated or not the one "
                      f"{p['manifest'].name} names; start again with --overwrite")


def resume(out: Path, name: str, manifest: dict | None, settings: dict, *, model, opt, gen,
           tied: bool = True) -> tuple[int, list]:
    """Where a run starts, (step, history): (0, []) for a new run; for a --resume (its `manifest`), after its
    settings are checked against the saved ones, the saved weights, optimizer and generators put back."""
    if not manifest:
        return 0, []
    check_settings(manifest["settings"], settings, out)
    restore(load_state(out, name, manifest), manifest, model=model, opt=opt, gen=gen, out=out, tied=tied)
    return manifest["step"], manifest["history"]


def restore(tensors: dict, manifest: dict, *, model, opt, gen, out: Path | None = None, tied: bool = True) -> None:
    """Put the saved weights, optimizer state and generators back. A state whose parts do not fit this run
    (a hand-edited manifest, another optimizer) is refused in one line."""
    try:
        model.load_state_dict({n[len("__w__."):]: t for n, t in tensors.items() if n.startswith("__w__.")},
                              strict=False)
        if tied:
            model.lm_head.weight = model.wte.weight
        _load_opt(opt, {n: t for n, t in tensors.items() if n.startswith("__opt__.") or not n.startswith("__")},
                  manifest["scalars"])
        gen.set_state(tensors["__batch_rng__"])
        torch.set_rng_state(tensors["__torch_rng__"])
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError, IndexError) as e:
        where = f" in {out}" if out is not None else ""
        raise MtplabError(f"the saved training state{where} does not fit this run ({type(e).__name__}: "
                          f"{str(e).splitlines()[0][:120] if str(e) else 'bad field'}); start again with --overwrite") from None


class Stop:
    """SIGINT and SIGTERM while a run trains: the first one sets `signal` (the loop finishes its step, saves it
    and stops), a second one interrupts at once. Installed only in the main thread; the old handlers come back
    on exit."""

    def __init__(self):
        self.signal: str | None = None
        self._old: dict = {}

    def _handler(self, signum, frame):
        if self.signal is not None:
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum).name

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    self._old[sig] = signal.signal(sig, self._handler)
                except (ValueError, OSError):
                    pass
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False


def stopped_message(sig: str, step: int, out: Path | None) -> str:
    """The one line a signal ends a run with, after the step it arrived in was saved."""
    if out is None:
        return f"interrupted ({sig}) at step {step}; nothing was saved (no --out)"
    return (f"interrupted at step {step} ({sig}); the last complete save is step {step} in {out}: continue it "
            "with the same command plus --resume")
