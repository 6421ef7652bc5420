"""Device choice: "auto" is cuda where there is one, else the cpu; MPS only when asked for; nothing assumes CUDA.

Why not MPS by default: in class every laptop should run what the lab's records and tests were made on. The CPU
is where the timing lessons hold (on MPS a model this small is bound by kernel launches); MPS runs the lab's
equality and losslessness tests only on a Mac that has it (the `mps` marker), and no record was measured there.
An instructor who wants MPS asks for it: device="mps" (DEVICE = "mps" in a notebook's parameters cell), or
MTPLAB_MPS=1 in the environment, which lets "auto" pick it.
"""
from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from mtplab.errors import MtplabError


def mps_available() -> bool:
    """Apple's Metal backend is there (an Apple-Silicon Mac with a torch built for it)."""
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def pick(name: str = "auto") -> torch.device:
    """The device for `name`: "auto" (cuda, else cpu; mps too only under MTPLAB_MPS=1), "cpu", "cuda[:N]", "mps"."""
    name = (name or "auto").lower()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if os.environ.get("MTPLAB_MPS") == "1" and mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise MtplabError(f"device {name!r} was asked for but CUDA is not available here; use device='auto' or 'cpu'")
        return torch.device(name)
    if name == "mps":
        if not mps_available():
            raise MtplabError("device 'mps' was asked for but MPS is not available here; use device='auto' or 'cpu'")
        return torch.device("mps")
    if name == "cpu":
        return torch.device("cpu")
    raise MtplabError(f"unknown device {name!r}; use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return device.type


def sync(device) -> None:
    """Wait for queued device work, so that a clock read afterwards includes it."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def now(device="cpu") -> float:
    """The clock, read after the device has finished its queued work: the one clock of every timing."""
    sync(device)
    return time.perf_counter()


MACOS = sys.platform == "darwin"


@functools.cache
def _sysctl(name: str) -> str | None:
    """macOS's `sysctl -n NAME` (the CPU's name and caches, which macOS keeps out of /proc and /sys), asked once a
    process; None elsewhere, or where the key does not exist on this Mac. By its full path: a JupyterLab started
    from the Dock may not have /usr/sbin on its PATH."""
    if not MACOS:
        return None
    try:
        r = subprocess.run(["/usr/sbin/sysctl", "-n", name], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    out = r.stdout.strip()
    return out if r.returncode == 0 and out else None


def _llc_bytes() -> int | None:
    """The last-level cache of CPU 0, in bytes, from sysfs (Linux) or sysctl (macOS: Apple Silicon reports no L3,
    so its performance cores' L2); None where it cannot be read."""
    for key in ("hw.l3cachesize", "hw.perflevel0.l2cachesize", "hw.l2cachesize"):
        v = _sysctl(key)
        if v is not None and v.isdigit() and int(v) > 0:
            return int(v)
    best = None
    for d in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((d / "level").read_text())
            kind = (d / "type").read_text().strip()
            size = (d / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        n = int(size.rstrip("KMG")) * mult
        if best is None or level > best[0]:
            best = (level, n)
    return best[1] if best else None


def cpu_words(cpuinfo: str) -> str | None:
    """The CPU as Linux's /proc/cpuinfo names it, with its family, model and vector units: a virtual machine's
    "AMD EPYC" alone names three CPU generations whose times differ threefold (Zen 3 with AVX2, Zen 4 with AVX-512
    and bf16), so a timing names which. None where the text names no CPU."""
    first: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        first.setdefault(key.strip(), value.strip())
    name = first.get("model name")
    if not name:
        return None
    flags = set(first.get("flags", "").split())
    units = ["AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else None,
             "bf16" if "avx512_bf16" in flags else None, "AMX" if "amx_tile" in flags else None]
    units = [u for u in units if u]
    where = (f"family {first['cpu family']} model {first['model']}" if "cpu family" in first and "model" in first
             else None)
    detail = "; ".join(x for x in (where, ", ".join(units)) if x)
    return f"{name} ({detail})" if detail else name


def _cpu_model() -> str:
    brand = _sysctl("machdep.cpu.brand_string")  # macOS: "Apple M2", where platform.processor() says "arm"
    if brand:
        return brand
    try:
        found = cpu_words(Path("/proc/cpuinfo").read_text())
    except OSError:
        found = None
    return found or platform.processor() or platform.machine()


def machine(device: torch.device | str = "cpu") -> dict:
    """What a timing was measured on: CPU model, cores, the threads torch uses, the last-level cache, torch's
    version, and the accelerator where one is used. Every benchmark record and notebook timing carries it."""
    device = torch.device(device)
    llc = _llc_bytes()
    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "llc_bytes": llc, "llc": f"{llc / (1 << 20):.0f} MiB" if llc else "unknown", "torch": torch.__version__,
            "device": describe(device)}


def machine_words(m: dict, device=None) -> str:
    """The one wording of a machine dict (`machine()`'s, or a record's), for the line under a timing."""
    return (f"measured on {m.get('cpu', '?')}, {m.get('threads', '?')} of {m.get('cores', '?')} cores, last-level "
            f"cache {m.get('llc', 'unknown')}, torch {m.get('torch', '?')}, device {m.get('device', device or '?')}")


def machine_line(device: torch.device | str = "cpu") -> str:
    """One line naming this machine, for the line under a live timing."""
    return machine_words(machine(device))
