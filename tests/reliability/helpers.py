"""What the reliability tables share: the tiny training run, a child process under a memory cap, the one-line checks."""
import errno
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from mtplab import cli
from mtplab.errors import MtplabError

ROOT = Path(__file__).resolve().parent.parent.parent
TINY = dict(preset="tiny", batch_size=2, progress=False, device="cpu", eval_windows=2)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
NOT_UTF8 = os.fsdecode(b"run\xff")  # a folder name with a byte that is not UTF-8 (a lone surrogate in Python)


def child(*args, mem_gb=None, input=None, cwd=None, env=None, timeout=180):
    """python -m mtplab ARGS in a child process, its address space capped at mem_gb (resource.setrlimit)."""
    def cap():
        if mem_gb is not None:
            lim = int(mem_gb * 2 ** 30)
            resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    return subprocess.run([sys.executable, "-m", "mtplab", *map(str, args)], capture_output=True, text=True,
                          input=input, cwd=cwd, env={**ENV, **(env or {})}, preexec_fn=cap, timeout=timeout)


def one_line(r, *fragments):
    err = r.stderr.strip()
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], err[-2000:])
    assert "Traceback" not in err and err.count("\n") == 0, err
    for f in fragments:
        assert f in err, (f, err)
    return err


def main(capsys, *args):
    """cli.main in this process: (status, the one stderr line)."""
    rc = cli.main([str(a) for a in args])
    err = capsys.readouterr().err.strip()
    return rc, err


def refused(capsys, fragment, *args):
    rc, err = main(capsys, *args)
    assert rc == 2 and err.count("\n") == 0 and fragment in err, (rc, err)
    return err


def raises(fn, *a, **k) -> str:
    with pytest.raises(MtplabError) as e:
        fn(*a, **k)
    return str(e.value)


def norm(msg: str, *dirs: Path) -> str:
    for d in dirs:
        msg = msg.replace(f"{d}/", "")
    return msg


def edit_config(src: Path, dst: Path, **fields):
    """A copy of checkpoint SRC at DST whose NAME.json config has FIELDS changed."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    info = json.loads(src.with_suffix(".json").read_text())
    info["config"].update(fields)
    (dst.with_suffix(".safetensors")).write_bytes(src.with_suffix(".safetensors").read_bytes())
    dst.with_suffix(".json").write_text(json.dumps(info))
    return dst


def disk_full(*a, **k):
    """A writer on a full disk."""
    raise OSError(errno.ENOSPC, "No space left on device")


def full_under(folder: Path, real):
    """`real` (a writer taking a path first), failing with ENOSPC for any path under `folder`: a full disk there."""
    def write(path, *a, **k):
        if Path(path).resolve().is_relative_to(Path(folder).resolve()):
            disk_full()
        return real(path, *a, **k)
    return write
