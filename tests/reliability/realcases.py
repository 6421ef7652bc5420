"""What the real model's reliability tables share: special files (a FIFO, a link to /dev/zero, a sparse giant), a
snapshot of a folder to prove nothing outside the intended one changed, and the one-line, bounded-time check."""
import os
import time
from pathlib import Path

import pytest

from mtplab.errors import MtplabError

LINKS = pytest.mark.skipif(os.name == "nt", reason="symbolic links need a privilege on Windows")


def fifo(p: Path) -> None:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes on this platform")
    p.unlink(missing_ok=True)
    os.mkfifo(p)


def devzero(p: Path) -> None:
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero on this platform")
    p.unlink(missing_ok=True)
    p.symlink_to("/dev/zero")


def sparse(p: Path, size: int) -> None:
    """A file of `size` bytes that holds none (a hole): refused from its size, never read."""
    if os.name == "nt":
        pytest.skip("a file of that size may take its size on disk here (no sparse files by default)")
    p.unlink(missing_ok=True)
    with open(p, "wb") as f:
        f.truncate(size)


def snapshot(root: Path, *, skip: Path | None = None) -> dict:
    """Every path under root (but `skip`) with its kind, size and modification time."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        d = Path(dirpath)
        if skip is not None and (d == skip or skip in d.parents):
            continue
        for n in dirs + files:
            p = d / n
            st = os.lstat(p)
            out[str(p)] = (st.st_mode, st.st_size if not os.path.isdir(p) else 0, st.st_mtime_ns)
    return out


def one_line_error(fn, *fragments, seconds: float = 10.0) -> str:
    """fn() raises the lab's one-line error holding every fragment, within `seconds` (the CLI prints it as one line
    with status 2, no traceback)."""
    t0 = time.perf_counter()
    with pytest.raises(MtplabError) as e:
        fn()
    took = time.perf_counter() - t0
    msg = str(e.value)
    assert "\n" not in msg and "Traceback" not in msg, msg
    for f in fragments:
        assert f in msg, (f, msg)
    assert took < seconds, f"{took:.1f} s: {msg}"
    return msg


def shipped_copy(tmp_path: Path, monkeypatch) -> Path:
    """data/hf/smollm2 copied under tmp_path; the copy stands where the lab looks for (and ships) the real model's files."""
    from mtplab import paths
    hf = tmp_path / "hf"
    (hf / "smollm2").mkdir(parents=True)
    for p in (paths.HF_DIR / "smollm2").iterdir():
        (hf / "smollm2" / p.name).write_bytes(p.read_bytes())
    monkeypatch.setattr(paths, "HF_DIR", hf)  # where RealModel.heads_dir looks
    monkeypatch.setattr(paths, "SHIPPED", (paths.CHECKPOINT_DIR, hf))
    return hf / "smollm2"


def chat_tokenizer():
    """The tiny BPE tokenizer of tests/hf/test_hf with ChatML's two control tokens and a ChatML chat template."""
    from tests.hf.test_hf import _tokenizer
    tok = _tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return tok
