"""Files the lab reads and writes, on the ground floor: bounded readers (a file it did not write in this process is
read up to a limit, never followed into a device or a pipe), sha256 of a file, and atomic writes (a failed write
leaves the old file intact). For the files other commands left behind: `regular` checks from `os.stat`, before
anything is opened, that a path is a regular file no larger than its kind can be; `json_file` and `checked_header`
read a JSON file or a safetensors header after it; `bad_file`, `finite`, `ids_ok` and `ids_why` word and check what
was read. Imports only mtplab.errors.
"""
from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import stat
import tempfile
from pathlib import Path

from mtplab import platform_compat as compat
from mtplab.errors import MtplabError

MAX_JSON = 16 << 20  # bytes of a JSON file we are willing to read (a checkpoint's NAME.json, a manifest, a record)


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


def os_reason(e: BaseException) -> str:
    """Why a read or write failed, in words; a full disk says so (ENOSPC, EDQUOT, or safetensors' 'os error 28')."""
    text = str(e)
    if getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "os error 28" in text or "No space left" in text:
        return "the disk is full"
    return getattr(e, "strerror", None) or (text.splitlines()[0][:160] if text else type(e).__name__)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_bounded(path, *, limit: int, what: str, fix: str) -> bytes:
    """At most `limit` bytes of a regular file, or a one-line error. Opened without blocking (a FIFO with no writer
    would wait forever), checked to be a regular file after opening (a link to /dev/zero is refused, not read until
    memory runs out), then read up to limit + 1 bytes, so that a file that grows while it is read is refused too."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | compat.O_NONBLOCK | compat.O_CLOEXEC | compat.O_BINARY)
    except OSError as e:
        raise MtplabError(f"cannot read {path} ({e.strerror or e}); {fix}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise MtplabError(f"{path} is not a regular file (a device, a pipe or a directory), not {what}; {fix}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(limit + 1)
    except OSError as e:
        raise MtplabError(f"cannot read {path} ({e.strerror or e}); {fix}") from None
    finally:
        os.close(fd)
    if len(raw) > limit:
        raise MtplabError(f"{path} is larger than {limit} bytes, not {what}; {fix}")
    return raw


def read_json(path: Path, *, limit: int, what: str, fix: str, invalid_fix: str | None = None):
    """The lab's one reader of a JSON file it did not write in this process (a checkpoint's NAME.json, a run's
    manifest, a model folder's config.json, a benchmark record): bounded in size before it is read, and every
    failure is one line that names the file and the fix. Returns whatever the JSON holds."""
    try:
        return json.loads(read_bounded(path, limit=limit, what=what, fix=fix).decode("utf-8"))
    except MtplabError:  # read_bounded's own line (a device, a pipe, too large): not "invalid JSON"
        raise
    except (ValueError, UnicodeDecodeError) as e:
        raise MtplabError(f"{path} is not valid JSON ({str(e)[:120]}); {invalid_fix or fix}") from None
    except RecursionError:
        raise MtplabError(f"{path} is not {what} (JSON nested too deeply); {fix}") from None
    except OSError as e:
        raise MtplabError(f"cannot read {path} ({e.strerror or e}); {fix}") from None


# bytes per element of every dtype safetensors writes
SAFETENSORS_WIDTH = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4,
                     "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}
MAX_HEADER = 100 << 20  # bytes of a safetensors header we are willing to read


def safetensors_header(path) -> tuple[dict, dict, dict]:
    """(shapes, dtypes, metadata) of a safetensors file from its header alone, without loading (or trusting) the
    tensors: the header's length is bounded before it is read, every tensor fills exactly its shape's bytes, and the
    tensors exactly cover the file (a truncated or padded file is refused, never handed to safetensors). Read here,
    not through safe_open, which maps the whole file: a header naming a 40 GB tensor in a sparse file is refused from
    its few bytes of JSON. Raises ValueError (or OSError, RecursionError, TypeError, KeyError) for the caller to word."""
    fd = os.open(path, os.O_RDONLY | compat.O_NONBLOCK | compat.O_CLOEXEC | compat.O_BINARY)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        n = int.from_bytes(f.read(8), "little")
        if not 0 < n <= min(MAX_HEADER, size - 8):
            raise ValueError(f"header length {n} in a file of {size} bytes")
        head = json.loads(f.read(n))
    if not isinstance(head, dict):
        raise ValueError("the header is not a JSON object")
    meta = head.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError("its metadata is not an object of strings")
    shapes, dtypes, spans = {}, {}, []
    for k, v in head.items():
        shape, dtype = tuple(v["shape"]), str(v["dtype"])
        if not all(type(s) is int and s >= 0 for s in shape) or dtype not in SAFETENSORS_WIDTH:
            raise ValueError(f"tensor {k}: shape {list(shape)[:4]} dtype {dtype[:8]}")
        begin, end = (int(o) for o in v["data_offsets"])
        if end - begin != SAFETENSORS_WIDTH[dtype] * math.prod(shape):
            raise ValueError(f"tensor {k} does not fill its bytes")
        shapes[k], dtypes[k] = shape, dtype
        spans.append((begin, end))
    spans.sort()
    if [b for b, _ in spans] != [0] + [e for _, e in spans][:-1] or (spans[-1][1] if spans else 0) != size - 8 - n:
        raise ValueError("the tensors do not cover the file (truncated, or bytes beyond what the header declares)")
    return shapes, dtypes, meta


# ------------------------------------------------------------------------------------------- checked before opened
def regular(path, *, limit: int, what: str, fix: str) -> int:
    """The size of `path`, a regular file of at most `limit` bytes, from `os.stat` before anything opens it; a
    missing file, a directory, a FIFO, a device or a file larger than its kind can be is one line."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise MtplabError(f"{p} is missing (or a link to nothing), not {what}; {fix}") from None
    except (OSError, ValueError) as e:
        raise MtplabError(f"cannot read {p} ({getattr(e, 'strerror', None) or e}); {fix}") from None
    if not stat.S_ISREG(st.st_mode):
        raise MtplabError(f"{p} is not a regular file (a device, a pipe or a directory), not {what}; {fix}")
    if st.st_size > limit:
        raise MtplabError(f"{p} holds {st.st_size} bytes, more than {what} can ({limit}); {fix}")
    return st.st_size


def json_file(path, *, limit: int, what: str, fix: str):
    """A JSON file checked by `regular`, then read bounded (`read_json`)."""
    regular(path, limit=limit, what=what, fix=fix)
    return read_json(Path(path), limit=limit, what=what, fix=fix)


def bad_file(path, what: str, why: str, fix: str) -> MtplabError:
    """The one line for a file that is not what it should be: its path, what it should be, why not, the fix."""
    return MtplabError(f"{path} is not {what} ({why}); {fix}")


def finite(x) -> bool:
    """A JSON number (not a bool) that is finite."""
    return (type(x) is int or type(x) is float) and math.isfinite(x)


def ids_ok(ids, V: int) -> bool:
    """A list of token ids, each an int in 0..V-1."""
    return isinstance(ids, list) and all(type(i) is int and 0 <= i < V for i in ids)


def ids_why(ids, V: int, key: str) -> str:
    """Why `ids` (a file's `key`) is not a list of token ids in 0..V-1."""
    if not isinstance(ids, list):
        return f"{key} is a {type(ids).__name__}, not a list of token ids"
    bad = next(i for i in ids if not (type(i) is int and 0 <= i < V))
    return f"{key} holds {json.dumps(bad)[:40]}, not a token id in 0..{V - 1}"


def checked_header(path, *, limit: int, what: str, fix: str) -> tuple[dict, dict, dict]:
    """(shapes, dtypes, metadata) of a safetensors file, after `regular`, from `safetensors_header`
    (bounded header; the tensors must exactly cover the file)."""
    regular(path, limit=limit, what=what, fix=fix)
    try:
        return safetensors_header(path)
    except RecursionError:
        raise bad_file(path, what, "its header is nested too deeply", fix) from None
    except OSError as e:
        raise MtplabError(f"cannot read {path} ({e.strerror or e}); {fix}") from None
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise bad_file(path, what, f"corrupt or truncated: {str(e)[:160]}", fix) from None
