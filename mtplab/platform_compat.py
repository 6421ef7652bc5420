"""What differs between Linux, macOS and Windows, in one place: a run's lock, reads and writes at an offset, opening
without following a symlink, memory limits, peak memory, and the machine's CPU time (the busy-machine guard).

Every other module imports these instead of a POSIX-only module (`fcntl`, `resource`) or a POSIX-only function
(`os.pread`, `os.sysconf`), so that `import mtplab...` works on every system. Where a system has no equivalent,
the helper says so in its docstring and does the documented no-op; none of them pretends to have measured.

    Linux, macOS   fcntl.flock, os.pread/pwrite, O_NOFOLLOW, resource.getrlimit/getrusage
    Windows        msvcrt.locking on one byte far past the lock file's text, lseek + read/write, a symlink check
                   before the open, no address-space limit, psutil's peak working set
    everywhere     psutil.cpu_times (the machine's CPU time) and psutil.virtual_memory (its RAM)

This module imports nothing from mtplab (it is on the ground floor, beside mtplab.errors).
"""
from __future__ import annotations

import errno
import os
import sys

try:  # POSIX: Linux and macOS
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]
try:
    import msvcrt
except ImportError:  # Linux and macOS
    msvcrt = None  # type: ignore[assignment]
try:
    import resource
except ImportError:  # Windows
    resource = None  # type: ignore[assignment]
try:  # a core dependency; an install made before it was one runs without it, and says "not measured"
    import psutil
except ImportError:
    psutil = None  # type: ignore[assignment]

# 0 where the flag does not exist (Windows): callers OR them in unconditionally
O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_BINARY = getattr(os, "O_BINARY", 0)
# Windows locks are mandatory: a locked byte cannot be read by anyone else. The lock sits far past the few bytes
# of text a lock file holds ("pid 1234"), so a second process can still read who holds it.
WINDOWS_LOCK_OFFSET = 1 << 30


def lock_exclusive(fd: int) -> bool:
    """Take an exclusive lock on the open file `fd` without waiting; raise OSError when another process holds it.
    The operating system drops it when the file is closed or the process dies. POSIX: `fcntl.flock`.
    Windows: `msvcrt.locking` on one byte at WINDOWS_LOCK_OFFSET (the file position is put back). Returns True.
    A system with neither (none the lab knows of) gets a documented no-op and False: two runs in one folder are
    then not kept apart."""
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    if msvcrt is not None:
        pos = os.lseek(fd, 0, os.SEEK_CUR)
        try:
            os.lseek(fd, WINDOWS_LOCK_OFFSET, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        finally:
            os.lseek(fd, pos, os.SEEK_SET)
        return True
    return False


def read_at(fd: int, n: int, offset: int) -> bytes:
    """Up to n bytes from `offset` (os.pread where it exists; else a seek and a read, which moves the position)."""
    if hasattr(os, "pread"):
        return os.pread(fd, n, offset)
    os.lseek(fd, offset, os.SEEK_SET)
    return os.read(fd, n)


def write_at(fd: int, data: bytes, offset: int) -> int:
    """Write `data` at `offset` (os.pwrite where it exists; else a seek and a write)."""
    if hasattr(os, "pwrite"):
        return os.pwrite(fd, data, offset)
    os.lseek(fd, offset, os.SEEK_SET)
    return os.write(fd, data)


def open_no_follow(path, flags: int, mode: int = 0o644) -> int:
    """os.open that refuses a symlink at `path` with OSError(ELOOP). POSIX: O_NOFOLLOW, atomic. Windows has no such
    flag: the path is checked just before the open (creating a symlink there needs an administrator or developer
    mode, so the window between the check and the open is the documented limit)."""
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    if not nofollow and os.path.islink(path):
        raise OSError(errno.ELOOP, "is a symlink", str(path))
    return os.open(path, flags | nofollow | O_CLOEXEC | O_BINARY, mode)


def set_blocking(fd: int) -> None:
    """Make reads of `fd` block again after an open with O_NONBLOCK (a FIFO without a writer). Windows has neither
    FIFOs nor O_NONBLOCK on files: a no-op there."""
    if O_NONBLOCK:
        os.set_blocking(fd, True)


def memory_bytes() -> int | None:
    """Bytes a process may use: the machine's RAM, or the address-space limit (RLIMIT_AS) where one is set and lower.
    RAM from psutil, else sysconf (POSIX); None where neither is there. Windows has no RLIMIT_AS: the RAM alone."""
    total = None
    if psutil is not None:
        total = int(psutil.virtual_memory().total)
    elif hasattr(os, "sysconf"):
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            total = None
    if resource is not None and total is not None:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft not in (resource.RLIM_INFINITY, -1) and soft > 0:
            return min(total, soft)
    return total


def peak_rss_bytes() -> int | None:
    """This process's peak resident memory so far, in bytes. POSIX: getrusage's ru_maxrss (KiB on Linux, bytes on
    macOS). Windows: psutil's peak working set. None where neither can be read."""
    if resource is not None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)
    if psutil is not None:
        info = psutil.Process().memory_info()
        peak = getattr(info, "peak_wset", None)
        return int(peak) if peak is not None else int(info.rss)
    return None


def cpu_seconds() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine, all cores together, since boot: read through psutil the same
    way on Linux, macOS and Windows. Idle and I/O wait count as not busy; Linux's guest times are already inside
    user and nice, so they are not added twice. None where it cannot be read (psutil missing or refused): the
    caller then says "not measured", never "idle"."""
    if psutil is None:
        return None
    try:
        t = psutil.cpu_times()
    except (OSError, RuntimeError, NotImplementedError):
        return None
    parts = {k: float(v) for k, v in t._asdict().items() if k not in ("guest", "guest_nice")}
    total = sum(parts.values())
    return total - parts.get("idle", 0.0) - parts.get("iowait", 0.0), total
