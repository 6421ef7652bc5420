"""Regression tests of the 2026-12-01 reliability probe (issue 24): each failure of its severe, high and medium lists,
reproduced; every one now ends in one line that names the fix (exit status 2, or MtplabError), loses nothing and stays
bounded. Where an input used to allocate without bound, the test runs it in a child process under RLIMIT_AS.

Case ids (hft02, ck-huge-*, t26-*, ...) are the probe's, in ../shared/reviews/2026-12-01-reliability.md.
"""
import errno
import json
import os
import re
import resource
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mtplab import cli
from mtplab.errors import MtplabError
from mtplab.measuring.acceptance import alpha_from_length
from mtplab.model import checkpoint as ckpt
from mtplab.model.layers import MASK_CACHE, _MASKS, causal_mask
from mtplab.training import runs
from mtplab.training import fit as fit_module
from mtplab.training.fit import fit
from tests.conftest import random_model

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(preset="tiny", batch_size=2, progress=False, device="cpu", eval_windows=2)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


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


# ---- severe 5: symlinks in --out (t08, t34) --------------------------------------------------------------------
def test_a_symlinked_lock_file_is_refused_and_its_target_untouched(tmp_path):
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    out = tmp_path / "run"
    out.mkdir()
    (out / ".ntp.lock").symlink_to(victim)
    with pytest.raises(MtplabError, match=r"\.ntp\.lock is a symlink; a run never writes through one: remove it"):
        fit(steps=2, out=out, **TINY)
    assert victim.read_text() == "keep me"


def test_the_write_probe_never_follows_a_planted_symlink(tmp_path):
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    out = tmp_path / "run"
    out.mkdir()
    (out / f".ntp.probe.{os.getpid()}").symlink_to(victim)  # the old probe's predictable name
    fit(steps=2, out=out, **TINY)
    assert victim.read_text() == "keep me"


# ---- severe 6: long runs save on a time cadence; SIGINT and SIGTERM save the step (t17, kill-term1) -------------
def test_a_run_saves_by_time_even_when_steps_say_never(tmp_path, monkeypatch):
    real, n = fit_module.train_step, {"steps": 0}

    def step(*a, **k):
        n["steps"] += 1
        if n["steps"] == 4:
            raise KeyboardInterrupt  # a hard interrupt inside step 4 (a second Ctrl-C)
        return real(*a, **k)
    monkeypatch.setattr(fit_module, "train_step", step)
    with pytest.raises(MtplabError, match=r"interrupted at step 3; the last complete save is step 3 in .*--resume"):
        fit(steps=10 ** 12, out=tmp_path, save_seconds=1e-9, **TINY)  # steps/10 = 10**11 would never save
    assert json.loads((tmp_path / "ntp.state.json").read_text())["step"] == 3


def test_sigint_finishes_the_step_saves_it_and_resumes_bit_for_bit(tmp_path, monkeypatch):
    fit(steps=6, out=tmp_path / "ref", save_every=100, **TINY)
    real, n = fit_module.train_step, {"steps": 0}

    def step(*a, **k):
        n["steps"] += 1
        if n["steps"] == 4:
            os.kill(os.getpid(), signal.SIGINT)  # arrives inside step 4: the step finishes, then it is saved
        return real(*a, **k)
    monkeypatch.setattr(fit_module, "train_step", step)
    with pytest.raises(MtplabError, match=r"interrupted at step 4 \(SIGINT\); the last complete save is step 4"):
        fit(steps=6, out=tmp_path / "cut", save_every=100, **TINY)
    monkeypatch.undo()
    fit(steps=6, out=tmp_path / "cut", save_every=100, resume=True, **TINY)
    a, b = (load_file(str(tmp_path / d / "ntp.safetensors")) for d in ("ref", "cut"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the old handler is back


def test_sigterm_prints_one_line_and_leaves_a_resumable_save(tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "mtplab", "train", "--preset", "tiny", "--steps", "100000",
                          "--batch-size", "2", "--save-every", "2", "--out", str(tmp_path), "--no-progress"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    deadline = time.time() + 120
    while not (tmp_path / "ntp.state.json").exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2 and "Traceback" not in err and err.count("\n") == 1, err
    step = int(re.search(r"interrupted at step (\d+) \(SIGTERM\); the last complete save is step \1 in", err).group(1))
    assert json.loads((tmp_path / "ntp.state.json").read_text())["step"] == step


# ---- severe 4 / low 18: orphaned temp files of a killed save (kill1-k1-6, kill1-kk-1) ---------------------------
def test_orphaned_temp_files_are_removed_by_resume_and_overwrite(tmp_path):
    fit(steps=2, out=tmp_path, **TINY)
    orphans = [tmp_path / ".ntp.safetensors.lzgz2pvz.tmp", tmp_path / ".ntp.state.next.safetensors.e4gv_zr4.tmp"]
    other = tmp_path / ".ntp.v2.safetensors.abcdefgh.tmp"  # another run's (ntp.v2): not ours to remove
    for f in orphans + [other]:
        f.write_bytes(b"half a save")
    fit(steps=4, out=tmp_path, resume=True, **TINY)
    assert not any(f.exists() for f in orphans) and other.exists()
    orphans[0].write_bytes(b"half a save")
    fit(steps=2, out=tmp_path, overwrite=True, **TINY)
    assert not orphans[0].exists()


# ---- high 7: sizes that drive allocation are checked first (ck-huge-*, t21-t23) --------------------------------
@pytest.fixture(scope="module")
def heads_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("heads")
    for fam in ("stern", "meta", "deepseek"):
        ckpt.save(random_model(fam, 3, seed=1), d / fam)
    ckpt.save(random_model(), d / "ntp")
    return d


def _edit_config(src: Path, dst: Path, **fields):
    dst.parent.mkdir(parents=True, exist_ok=True)
    info = json.loads(src.with_suffix(".json").read_text())
    info["config"].update(fields)
    (dst.with_suffix(".safetensors")).write_bytes(src.with_suffix(".safetensors").read_bytes())
    dst.with_suffix(".json").write_text(json.dumps(info))
    return dst


@pytest.mark.parametrize("fam", ["stern", "meta", "deepseek"])
def test_n_depths_in_the_json_is_checked_against_the_header_before_building(heads_dir, tmp_path, fam):
    m = _edit_config(heads_dir / f"{fam}.safetensors", tmp_path / fam, n_depths=40)
    with pytest.raises(MtplabError, match=f"the config says {fam} heads with n_depths 40; the weights hold 3 depths"):
        ckpt.load(m)
    huge = _edit_config(heads_dir / f"{fam}.safetensors", tmp_path / "huge" / fam, n_depths=10 ** 6)
    with pytest.raises(MtplabError, match="n_depths 1000000 is over 64; restore the file or retrain"):
        ckpt.load(huge)


def test_a_million_depths_in_a_checkpoint_is_one_line_under_a_memory_cap(heads_dir, tmp_path):
    m = _edit_config(heads_dir / "stern.safetensors", tmp_path / "stern-k4", n_depths=10 ** 6)
    r = child("generate", "--prompt", "x", "--max-new-tokens", "4", "--method", "blockwise", "--checkpoint", m,
              mem_gb=3)
    one_line(r, "n_depths 1000000 is over 64")


@pytest.mark.parametrize("args, fragment", [
    (["--heads", "stern", "--depths", "1000000"], "--depths 1000000 is more than 64 prediction depths; use at most --depths 64"),
    (["--heads", "deepseek", "--modules", "100000"], "--modules 100000 is more than 63 sequential modules"),
    (["--batch-size", "1000000"], "lower --batch-size (at most about"),
])
def test_depths_modules_and_batch_size_are_bounded_before_allocating(tmp_path, args, fragment):
    r = child("train", "--preset", "tiny", "--steps", "3", "--no-progress", "--out", tmp_path / "r", *args, mem_gb=3,
              timeout=60)
    one_line(r, fragment)
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


# ---- high 8: a bare name is the shipped checkpoint, never a file in the cwd (env-cwd-hijack) ---------------------
def test_a_local_ntp_never_shadows_the_shipped_one(tmp_path, monkeypatch):
    ckpt.save(random_model(seed=9), tmp_path / "ntp")
    monkeypatch.chdir(tmp_path)
    assert ckpt.resolve("ntp") == ckpt.CHECKPOINT_DIR / "ntp.safetensors"
    assert ckpt.resolve("./ntp") == tmp_path / "ntp.safetensors"  # as a path, it is the local file
    assert ckpt.load("./ntp").config.n_embd == 32


# ---- high 9: the causal mask is built for the window used (ck-block65536-longprompt) ----------------------------
def test_the_causal_mask_of_a_long_window_is_its_own_size_not_a_cached_square():
    _MASKS.clear()
    m = causal_mask(30000, 4, "cpu")
    assert m.shape == (4, 30004) and m[0, 30000] and not m[0, 30001] and m[3, 30003]
    assert all(t.shape[0] <= MASK_CACHE for t in _MASKS.values())
    small = causal_mask(10, 3, "cpu")
    assert torch.equal(small, torch.ones(3, 13, dtype=torch.bool).tril(10))


def test_a_long_prompt_on_a_long_window_stays_bounded(tmp_path):
    model = random_model(n_embd=16, n_head=2, block_size=8192)
    ckpt.save(model, tmp_path / "m")
    (tmp_path / "long.txt").write_text("def f(x):\n    return x\n" * 300)  # 7.5 KB of prompt: a 2(p+T) table was 230 MB
    r = child("generate", "--checkpoint", tmp_path / "m", "--method", "ngram", "--prompt-file", tmp_path / "long.txt",
              "--max-new-tokens", "8", mem_gb=2.2)
    assert r.returncode == 0, r.stderr[-2000:]


# ---- medium 10: corpora that are empty or shorter than one window (t26-data-*) ----------------------------------
@pytest.mark.parametrize("train, val, fragment", [
    (b"", b"x" * 500, "is empty; restore it"),
    (b"x" * 100, b"x" * 500, "has 100 tokens, fewer than the 130 one training window of this model needs"),
    (b"x" * 129, b"x" * 500, "has 129 tokens, fewer than the 130"),
    (b"x" * 500, b"", "is empty; restore it"),
    (b"x" * 500, b"x" * 10, "has 10 tokens, fewer than the 129"),
])
def test_short_or_empty_corpora_are_one_line(tmp_path, monkeypatch, train, val, fragment):
    from mtplab import data
    (tmp_path / "corpora").mkdir()
    (tmp_path / "corpora" / "code_train.txt").write_bytes(train)
    (tmp_path / "corpora" / "code_val.txt").write_bytes(val)
    monkeypatch.setattr(data, "DATA_DIR", tmp_path)
    with pytest.raises(MtplabError, match=re.escape(fragment)):
        fit(steps=3, out=tmp_path / "r", **TINY)


def test_a_corpus_of_exactly_two_windows_trains(tmp_path, monkeypatch):
    from mtplab import data
    (tmp_path / "corpora").mkdir()
    (tmp_path / "corpora" / "code_train.txt").write_bytes(b"ab" * 65)
    (tmp_path / "corpora" / "code_val.txt").write_bytes(b"ab" * 65)
    monkeypatch.setattr(data, "DATA_DIR", tmp_path)
    assert fit(steps=2, **TINY)[-1]["step"] == 2


# ---- medium 14: the other tracebacks of the CLI ------------------------------------------------------------------
def test_generate_checks_its_seed(capsys):
    refused(capsys, "--seed must be an integer in [-2**63, 2**64) (got 18446744073709551616)",
            "generate", "--prompt", "x", "--max-new-tokens", "4", "--temperature", "1", "--seed", 2 ** 64)


def test_a_full_disk_before_the_first_save_is_one_line(tmp_path, monkeypatch):
    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(runs.tempfile, "mkstemp", full)
    with pytest.raises(MtplabError, match=r"cannot write to --out .* \(the disk is full\); choose a writable directory"):
        fit(steps=2, out=tmp_path, **TINY)
    monkeypatch.undo()
    real = os.open

    def no_lock(path, *a, **k):
        if str(path).endswith(".lock"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, *a, **k)
    monkeypatch.setattr(runs.os, "open", no_lock)
    with pytest.raises(MtplabError, match=r"cannot create the lock file .*\.ntp\.lock \(the disk is full\)"):
        fit(steps=2, out=tmp_path, **TINY)


def test_world_size_without_rank_is_one_line(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for v in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(v, raising=False)
    with pytest.raises(MtplabError, match=r"WORLD_SIZE=2 but RANK, MASTER_ADDR, MASTER_PORT are not set; launch with "
                                          r"torchrun --nproc_per_node 2"):
        fit(steps=2, **TINY)


def test_nested_json_and_headers_are_one_line(heads_dir, tmp_path):
    nest = tmp_path / "nest"
    nest.mkdir()
    (nest / "m.safetensors").write_bytes((heads_dir / "ntp.safetensors").read_bytes())
    (nest / "m.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(MtplabError, match="m.json (is not a checkpoint config|has no 'config' object)"):
        ckpt.load(nest / "m")
    hdr = tmp_path / "hdr"
    hdr.mkdir()
    body = ("[" * 5000 + "]" * 5000).encode()
    (hdr / "m.safetensors").write_bytes(struct.pack("<Q", len(body)) + body)
    (hdr / "m.json").write_text((heads_dir / "ntp.json").read_text())
    with pytest.raises(MtplabError, match="m.safetensors is corrupt"):
        ckpt.load(hdr / "m")


def test_an_odd_head_size_and_an_edited_n_head_are_refused(heads_dir, tmp_path):
    with pytest.raises(MtplabError, match="n_embd / n_head = 1 is odd; rotary positions turn channel pairs"):
        ckpt.load(_edit_config(heads_dir / "ntp.safetensors", tmp_path / "odd" / "m", n_head=32))
    with pytest.raises(MtplabError, match=r"they were saved with another config \(n_head 2 -> 4\)"):
        ckpt.load(_edit_config(heads_dir / "ntp.safetensors", tmp_path / "four" / "m", n_head=4))
    with pytest.raises(MtplabError, match=r"saved with another config \(block_size 96 -> 65536\)"):
        ckpt.load(_edit_config(heads_dir / "ntp.safetensors", tmp_path / "block" / "m", block_size=65536))


def test_bench_checks_out_and_device_before_running(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    t = time.time()
    refused(capsys, "cannot write to --out /proc/x", "bench", "cost-curve", "--preset", "tiny", "--quick", "--out", "/proc/x")
    refused(capsys, f"--out {tmp_path / 'f'} is a file, not a directory", "bench", "decode", "--quick", "--out", tmp_path / "f")
    refused(capsys, "unknown device 'bogus'", "bench", "train", "--quick", "--device", "bogus", "--out", tmp_path / "b")
    assert time.time() - t < 10  # refused before any benchmark ran


@pytest.mark.parametrize("field, value, fragment", [
    ("step", "3", "step '3' is not an integer >= 0"),
    ("step", 2.5, "step 2.5 is not an integer >= 0"),
    ("step", -5, "step -5 is not an integer >= 0"),
    ("step", 10 ** 18, "step 1000000000000000000 is not an integer >= 0"),
    ("history", {}, "history is not a list of records"),
    ("scalars", [], "scalars and settings must be objects"),
    ("settings", [], "scalars and settings must be objects"),
])
def test_a_state_json_with_fields_of_the_wrong_type_is_one_line(tmp_path, field, value, fragment):
    fit(steps=4, out=tmp_path, save_every=2, **TINY)
    m = json.loads((tmp_path / "ntp.state.json").read_text())
    m[field] = value
    (tmp_path / "ntp.state.json").write_text(json.dumps(m))
    with pytest.raises(MtplabError, match=re.escape(fragment) + r".*start again with --overwrite"):
        fit(steps=8, out=tmp_path, save_every=2, resume=True, **TINY)


def test_a_state_json_whose_scalars_do_not_fit_is_one_line(tmp_path):
    fit(steps=4, out=tmp_path, save_every=2, **TINY)
    m = json.loads((tmp_path / "ntp.state.json").read_text())
    m["scalars"] = {}
    (tmp_path / "ntp.state.json").write_text(json.dumps(m))
    with pytest.raises(MtplabError, match="the saved training state in .* does not fit this run .*--overwrite"):
        fit(steps=8, out=tmp_path, save_every=2, resume=True, **TINY)


# ---- low, fixed on the way ------------------------------------------------------------------------------------------
def test_weights_sha256_refuses_changed_or_relabelled_weights(tmp_path):
    path = ckpt.save(random_model(), tmp_path / "m", dtype=torch.float16)
    assert len(json.loads((tmp_path / "m.json").read_text())["weights_sha256"]) == 64
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    for v in header.values():
        if isinstance(v, dict) and v.get("dtype") == "F16":
            v["dtype"] = "BF16"  # the same bytes read as another float format (ck-dtype-bf16)
    body = json.dumps(header).encode()
    body += b" " * (-len(body) % 8)
    path.write_bytes(struct.pack("<Q", len(body)) + body + raw[8 + n:])
    with pytest.raises(MtplabError, match=r"m.safetensors is not the file m.json was saved with \(its sha256 differs"):
        ckpt.load(tmp_path / "m")


def test_integer_weights_are_refused_even_where_no_sha256_was_recorded(heads_dir, tmp_path):
    raw = (heads_dir / "ntp.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = raw[8:8 + n].replace(b'"F32"', b'"I32"')
    (tmp_path / "m.safetensors").write_bytes(raw[:8] + header + raw[8 + n:])
    info = json.loads((heads_dir / "ntp.json").read_text())
    info.pop("weights_sha256")  # as in the shipped checkpoints: not recorded
    (tmp_path / "m.json").write_text(json.dumps(info))
    with pytest.raises(MtplabError, match="holds I32 tensors .*weights are F32, F16 or BF16"):
        ckpt.load(tmp_path / "m")


def test_shipped_checkpoints_without_the_field_still_load():
    assert "weights_sha256" not in json.loads((ckpt.SHIPPED_DIR / "ntp-l4.json").read_text())  # not recorded
    assert ckpt.load("ntp-l4").config.heads == "none"
    assert "weights_sha256" in json.loads((ckpt.SHIPPED_DIR / "ntp.json").read_text())  # the new family records it


def test_checkpoint_api_type_errors_are_one_line(tmp_path):
    for bad in (None, 3, ""):
        with pytest.raises(MtplabError, match="a checkpoint is a name such as 'ntp' or a path"):
            ckpt.load(bad)
    with pytest.raises(MtplabError, match="config must be a ModelConfig"):
        ckpt.load("ntp", config={"n_embd": 3})
    with pytest.raises(MtplabError, match="unknown device 'bogus'"):
        ckpt.load("ntp", device="bogus")
    with pytest.raises(MtplabError, match="dtype must be torch.float32"):
        ckpt.load("ntp", dtype=torch.int8)
    with pytest.raises(MtplabError, match="save dtype must be torch.float32"):
        ckpt.save(random_model(), tmp_path / "i8", dtype=torch.int8)
    (tmp_path / "file").write_text("x")
    with pytest.raises(MtplabError, match="is a file, not a directory"):
        ckpt.save(random_model(), tmp_path / "file" / "m")
    with pytest.raises(MtplabError, match="cannot write the checkpoint /proc/x"):
        ckpt.save(random_model(), "/proc/x")


def test_messages_that_blamed_the_wrong_thing(tmp_path, capsys, monkeypatch):
    with pytest.raises(MtplabError, match="--name is 300 characters long; .* use at most 200 characters"):
        fit(steps=2, out=tmp_path, name="a" * 300, **TINY)
    hf = tmp_path / "hfdir"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    refused(capsys, f"{hf} is a Hugging Face model folder, not an mtplab checkpoint; pass it as --hf {hf}",
            "generate", "--prompt", "x", "--checkpoint", hf)
    monkeypatch.setattr(ckpt, "CHECKPOINT_DIR", tmp_path / "nothing")
    monkeypatch.setenv("MTPLAB_CHECKPOINTS", str(tmp_path / "nothing"))
    with pytest.raises(MtplabError, match=r"there are no shipped checkpoints in .*nothing \(MTPLAB_CHECKPOINTS\); "
                                          r"point MTPLAB_DATA at mtplab's data folder"):
        ckpt.resolve("ntp")


def test_a_fifo_prompt_file_is_refused_not_waited_on(tmp_path, capsys):
    os.mkfifo(tmp_path / "fifo")
    refused(capsys, "is a pipe (FIFO) that nobody writes to; give a regular file", "generate", "--prompt-file",
            tmp_path / "fifo")
    r = subprocess.run([sys.executable, "-m", "mtplab", "generate", "--prompt-file", "/dev/stdin", "--max-new-tokens", "2"],
                       input="def main(", capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 0, r.stderr  # a pipe that is written to still works


def test_alpha_from_length_is_bounded_in_time():
    t = time.time()
    assert alpha_from_length(2, 10 ** 7) == pytest.approx(0.5, abs=1e-9)
    assert time.time() - t < 0.5
    with pytest.raises(MtplabError, match=r"n_drafts must be an integer >= 1 \(got True\)"):
        alpha_from_length(2, True)
    with pytest.raises(MtplabError, match="length must be a number"):
        alpha_from_length("2", 3)


def test_divergence_from_a_huge_lambda_names_lambda(tmp_path):
    with pytest.raises(MtplabError, match=r"training diverged at step 0 \(loss .*\); lower --lr or --lambda"):
        fit(steps=3, heads="deepseek", lam=1e308, **TINY)


# ==== the --hf paths (severe 1-3, high 7, medium 11-13) ==============================================================
@pytest.fixture(scope="module")
def hfdirs(tmp_path_factory):
    """A tiny GPT-2 with its tokenizer (tests/test_hf.py builds it), and the probe's crafted folders."""
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from tests.test_hf import _gpt2, _tokenizer
    root = tmp_path_factory.mktemp("hfrel")
    tok = _tokenizer()
    m = _gpt2(0)
    m.save_pretrained(root / "gpt2")
    tok.save_pretrained(root / "gpt2")
    (root / "corpus.txt").write_text((ROOT / "data" / "corpora" / "code_train.txt").read_text(encoding="utf-8")[8000:12000])
    for name, edit in (("size-mismatch", {"n_embd": 128}), ("npos-4", {"n_positions": 4})):
        d = root / name
        m.save_pretrained(d)
        tok.save_pretrained(d)
        cfg = json.loads((d / "config.json").read_text())
        cfg.update(edit)
        (d / "config.json").write_text(json.dumps(cfg))
    m.save_pretrained(root / "no-tokenizer")
    d = root / "remote-code"  # an unknown model_type whose auto_map names the folder's own module
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "evilmodel", "auto_map": {
        "AutoConfig": "evil_config.EvilConfig", "AutoModelForCausalLM": "evil_config.EvilModel"}}))
    (d / "evil_config.py").write_text(f"open({str(root / 'PWNED')!r}, 'w').write('ran')\n")
    d = root / "pickle-weights"
    d.mkdir()
    (d / "config.json").write_text((root / "gpt2" / "config.json").read_text())
    tok.save_pretrained(d)
    torch.save({"transformer.wte.weight": torch.zeros(2), "x": _Evil()}, d / "pytorch_model.bin")
    d = root / "config-is-dir"
    (d / "config.json").mkdir(parents=True)
    return root


class _Evil:
    """A global that torch's weights_only unpickler refuses."""


@pytest.fixture(scope="module")
def hfheads(hfdirs, tmp_path_factory):
    """A valid stern heads file on gpt2, and copies whose metadata is each of the probe's bad variants."""
    from mtplab.hf.target import load_hf, save_heads
    root = tmp_path_factory.mktemp("hfheads")
    t = load_hf(hfdirs / "gpt2").attach("stern", 3)
    good = save_heads(t, root / "good")
    from safetensors import safe_open
    with safe_open(str(good), "pt") as f:
        info, tensors = json.loads(f.metadata()["mtplab"]), {k: f.get_tensor(k) for k in f.keys()}
    variants = {"bad-json": "{bad", "info-list": "[1, 2]",
                "no-base": json.dumps({k: v for k, v in info.items() if k != "base"}),
                "base-str": json.dumps({**info, "base": "gpt2"}), "depths-str": json.dumps({**info, "n_depths": "3"}),
                "depths-huge": json.dumps({**info, "n_depths": 10 ** 7}), "depths-5": json.dumps({**info, "n_depths": 5})}
    for name, meta in variants.items():
        save_file(tensors, str(root / f"{name}.safetensors"), metadata={"mtplab": meta})
    return root


HF_TRAIN = ["--heads", "stern", "--depths", "2", "--steps", "2", "--batch-size", "2", "--seq-len", "32", "--no-progress"]


def test_hf_train_goes_through_the_run_directory(hfdirs, tmp_path, capsys, monkeypatch):
    """hft02, hft04, hft20: check_out, the shipped folder, --overwrite, a dotted --name kept whole."""
    hf = ["train", "--hf", hfdirs / "gpt2", "--corpus", hfdirs / "corpus.txt", *HF_TRAIN]
    fit(steps=2, out=tmp_path, heads="stern", n_depths=2, **TINY)  # a lab run named stern-k2
    before = (tmp_path / "stern-k2.safetensors").read_bytes()
    refused(capsys, f"--out {tmp_path} already holds a run 'stern-k2' (stern-k2.safetensors, stern-k2.state.json); "
            "pass --resume", *hf, "--out", tmp_path)
    assert (tmp_path / "stern-k2.safetensors").read_bytes() == before
    refused(capsys, "which the lab ships; train into another --out", *hf, "--out", ckpt.SHIPPED_DIR)
    rc, _ = main(capsys, *hf, "--out", tmp_path / "dot", "--name", "my-run")
    rc2, _ = main(capsys, *hf, "--out", tmp_path / "dot", "--name", "my-run.v2")
    assert rc == rc2 == 0
    assert {p.name for p in (tmp_path / "dot").glob("*.safetensors")} >= {"my-run.safetensors", "my-run.v2.safetensors"}
    assert main(capsys, *hf, "--out", tmp_path, "--overwrite")[0] == 0
    assert (tmp_path / "stern-k2.safetensors").read_bytes() != before
    with runs.lock(tmp_path / "dot", "my-run"):
        refused(capsys, f"locked by pid {os.getpid()}", *hf, "--out", tmp_path / "dot", "--name", "my-run", "--overwrite")


def test_hf_train_names_cannot_leave_out(hfdirs, tmp_path, capsys):
    """hft01."""
    refused(capsys, "--name '../../ESCAPED' must be a plain file stem", "train", "--hf", hfdirs / "gpt2", *HF_TRAIN,
            "--out", tmp_path / "a" / "b", "--name", "../../ESCAPED")
    assert not list(tmp_path.rglob("ESCAPED*"))


@pytest.mark.parametrize("args, fragment", [
    (["--batch-size", "0"], "--batch-size must be an integer >= 1 (got 0)"),
    (["--lr", "nan"], "--lr must be a finite number > 0 (got nan)"),
    (["--lr", "-1"], "--lr must be a finite number > 0 (got -1.0)"),
    (["--seq-len", "0"], "--seq-len must be an integer >= 1 (got 0)"),
    (["--seq-len", "-5"], "--seq-len must be an integer >= 1 (got -5)"),
    (["--warmup", "-5"], "--warmup must be an integer >= 0 (got -5)"),
    (["--lambda", "-5"], "lambda must be >= 0 (got -5.0)"),
    (["--resume"], "nothing to resume in"),
    (["--depths", "1000000"], "--depths 1000000 is more than 64 prediction depths"),
])
def test_hf_train_checks_its_numbers_before_loading(hfdirs, tmp_path, capsys, args, fragment):
    """hft07-hft12, hft17, hft18."""
    base = [a for a in HF_TRAIN]
    for flag in args[::2]:  # the case's flag replaces the default one
        if flag in base:
            i = base.index(flag)
            del base[i:i + 2]
    refused(capsys, fragment, "train", "--hf", hfdirs / "gpt2", "--corpus", hfdirs / "corpus.txt", *base, *args,
            "--out", tmp_path / "r")
    assert not list((tmp_path / "r").glob("*.safetensors")) if (tmp_path / "r").exists() else True


def test_hf_train_out_a_file_is_refused_before_training(hfdirs, tmp_path, capsys):
    """hft15."""
    (tmp_path / "f").write_text("x")
    refused(capsys, f"--out {tmp_path / 'f'} is a file, not a directory", "train", "--hf", hfdirs / "gpt2", *HF_TRAIN,
            "--out", tmp_path / "f")


def test_hf_train_sigint_saves_and_resume_reaches_the_uninterrupted_heads(hfdirs, tmp_path, monkeypatch):
    """hft19: a Ctrl-C after 9 s used to lose everything; --resume did not exist."""
    from mtplab.hf import run as hfrun
    kw = dict(hf=str(hfdirs / "gpt2"), heads="stern", n_depths=2, corpus=str(hfdirs / "corpus.txt"), steps=6,
              batch_size=2, seq_len=32, save_every=100)
    hfrun.run_hf_train(out=str(tmp_path / "ref"), **kw)
    real, n = hfrun.hf_train_step, {"steps": 0}

    def step(*a, **k):
        n["steps"] += 1
        if n["steps"] == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*a, **k)
    monkeypatch.setattr(hfrun, "hf_train_step", step)
    with pytest.raises(MtplabError, match=r"interrupted at step 3 \(SIGINT\); the last complete save is step 3 in "):
        hfrun.run_hf_train(out=str(tmp_path / "cut"), **kw)
    monkeypatch.undo()
    with pytest.raises(MtplabError, match="already holds a run 'stern-k2'"):
        hfrun.run_hf_train(out=str(tmp_path / "cut"), **kw)
    (tmp_path / "cut" / ".stern-k2.safetensors.x1y2z3ab.tmp").write_bytes(b"orphan")
    res = hfrun.run_hf_train(out=str(tmp_path / "cut"), resume=True, **kw)
    assert res["history"][-1]["step"] == 6 and not list((tmp_path / "cut").glob("*.tmp"))
    a, b = (load_file(str(tmp_path / d / "stern-k2.safetensors")) for d in ("ref", "cut"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(MtplabError, match=r"--resume of .* with other settings \(lr 0.001 -> 0.002\)"):
        hfrun.run_hf_train(out=str(tmp_path / "cut"), resume=True, **{**kw, "steps": 8}, lr=2e-3)


def test_hf_train_saves_by_time(hfdirs, tmp_path, monkeypatch):
    from mtplab.hf import run as hfrun
    monkeypatch.setattr(runs, "SAVE_SECONDS", 0.0)
    real, n = hfrun.hf_train_step, {"steps": 0}

    def step(*a, **k):
        n["steps"] += 1
        if n["steps"] == 3:
            raise KeyboardInterrupt
        return real(*a, **k)
    monkeypatch.setattr(hfrun, "hf_train_step", step)
    with pytest.raises(MtplabError, match=r"interrupted at step 2; the last complete save is step 2 in "):
        hfrun.run_hf_train(hf=str(hfdirs / "gpt2"), heads="stern", n_depths=2, corpus=str(hfdirs / "corpus.txt"),
                           steps=10 ** 9, batch_size=2, seq_len=32, out=str(tmp_path))


def test_a_model_folder_never_runs_its_own_code(hfdirs):
    """hf-remote-code, hf-remote-code-yes, hf-remote-code-wait: 'y' on stdin used to run the folder's module."""
    t = time.time()
    r = child("generate", "--prompt", "x", "--max-new-tokens", "4", "--hf", hfdirs / "remote-code", input="y\n")
    one_line(r, "config.json names custom code (auto_map): loading it would run Python from the model folder, "
                "which mtplab never does")
    assert not (hfdirs / "PWNED").exists() and "[y/N]" not in r.stdout and time.time() - t < 60


def test_every_transformers_load_passes_trust_remote_code_false(hfdirs, monkeypatch):
    import transformers
    from mtplab.hf import target as hft
    seen = []
    for cls in ("AutoConfig", "AutoModelForCausalLM", "AutoTokenizer"):
        real = getattr(transformers, cls).from_pretrained

        def spy(*a, _real=real, _cls=cls, **k):
            seen.append((_cls, k.get("trust_remote_code")))
            return _real(*a, **k)
        monkeypatch.setattr(getattr(hft, cls), "from_pretrained", spy)
    hft.load_hf(hfdirs / "gpt2")
    assert {c for c, _ in seen} == {"AutoConfig", "AutoModelForCausalLM", "AutoTokenizer"}
    assert all(v is False for _, v in seen), seen


@pytest.mark.parametrize("folder, fragment", [
    ("size-mismatch", "do not match its config.json (the sizes differ); restore the config.json saved with these weights"),
    ("npos-4", "do not match its config.json (the sizes differ)"),
    ("pickle-weights", "holds pickled weights (pytorch_model.bin) that torch refuses to load safely"),
    ("no-tokenizer", "has no usable tokenizer"),
    ("config-is-dir", "config.json is a directory, not a file"),
])
def test_hf_folders_mtplab_does_not_expect_are_one_line(hfdirs, capsys, folder, fragment):
    """hf-size-mismatch, hf-npos-4, hf-pickle-weights, hf-no-tokenizer, hf-config-is-dir."""
    refused(capsys, fragment, "generate", "--prompt", "x", "--max-new-tokens", "4", "--hf", hfdirs / folder)


def test_transformers_load_report_never_reaches_the_terminal(hfdirs):
    """hf-size-mismatch printed transformers' 20-line load report before the error."""
    one_line(child("generate", "--prompt", "x", "--max-new-tokens", "4", "--hf", hfdirs / "size-mismatch"),
             "do not match its config.json")


def test_hf_train_without_a_tokenizer_names_the_tokenizer(hfdirs, tmp_path, capsys):
    """hf-train-no-tokenizer: it said 'the corpus has 0 tokens'."""
    refused(capsys, "has no usable tokenizer", "train", "--hf", hfdirs / "no-tokenizer", *HF_TRAIN, "--out", tmp_path)


@pytest.mark.parametrize("variant, fragment", [
    ("bad-json", "has heads metadata mtplab does not understand (not JSON)"),
    ("info-list", "is not an mtplab heads checkpoint for a Hugging Face model"),
    ("no-base", "(its base record is missing or malformed)"),
    ("base-str", "(its base record is missing or malformed)"),
    ("depths-str", "heads 'stern' with n_depths '3'"),
    ("depths-huge", "heads 'stern' with n_depths 10000000"),
    ("depths-5", "does not match its own head config (stern, 5 depths"),
])
def test_heads_metadata_of_the_wrong_shape_is_one_line(hfdirs, hfheads, capsys, variant, fragment):
    """hfh-bad-json, hfh-no-base, hfh-base-str, hfh-depths-str, hfh-info-list, hfh-depths-huge."""
    refused(capsys, fragment, "generate", "--prompt", "x", "--max-new-tokens", "4", "--hf", hfdirs / "gpt2",
            "--method", "blockwise", "--heads-checkpoint", hfheads / f"{variant}.safetensors")


def test_heads_with_ten_million_depths_stay_bounded(hfdirs, hfheads):
    r = child("generate", "--prompt", "x", "--max-new-tokens", "4", "--hf", hfdirs / "gpt2", "--method", "blockwise",
              "--heads-checkpoint", hfheads / "depths-huge.safetensors", mem_gb=4)
    one_line(r, "n_depths 10000000")


def test_a_directory_as_heads_checkpoint_says_so(hfdirs, hfheads, capsys):
    refused(capsys, "is a directory; give the heads file that train --hf wrote", "generate", "--prompt", "x",
            "--hf", hfdirs / "gpt2", "--method", "blockwise", "--heads-checkpoint", hfheads)


# ==== the README's bad-input table: the rows this issue added, quoted word for word ==================================
def _norm(msg: str, *dirs: Path) -> str:
    for d in dirs:
        msg = msg.replace(f"{d}/", "")
    return msg


def _raises(fn, *a, **k) -> str:
    with pytest.raises(MtplabError) as e:
        fn(*a, **k)
    return str(e.value)


def readme_cases(tmp: Path, monkeypatch, capsys, hfdirs=None) -> list[str]:
    """Each new row's message, produced by its case; tmp paths shortened to what the README shows (runs/x, m, ...)."""
    from mtplab import data
    from mtplab.hf.run import check_train_options
    from mtplab.training.config import TrainConfig
    out, quotes = tmp / "runs" / "x", []
    out.mkdir(parents=True)
    (out / ".ntp.lock").symlink_to(tmp / "victim")
    quotes.append(_norm(_raises(fit, steps=2, out=out, **TINY), tmp))
    (out / ".ntp.lock").unlink()
    real, n = fit_module.train_step, {"steps": 0}

    def step(*a, **k):
        n["steps"] += 1
        if n["steps"] == 7:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*a, **k)
    monkeypatch.setattr(fit_module, "train_step", step)
    quotes.append(_norm(_raises(fit, steps=20, out=out, save_every=100, **TINY), tmp))
    monkeypatch.setattr(fit_module, "train_step", real)
    quotes.append(_raises(TrainConfig(heads="stern", n_depths=10 ** 6).depths))
    quotes.append(_raises(TrainConfig(heads="deepseek", n_modules=10 ** 5).depths))
    quotes.append(_raises(fit, steps=2, out=out, name="a" * 300, **TINY))
    m = json.loads((out / "ntp.state.json").read_text())
    (out / "ntp.state.json").write_text(json.dumps({**m, "step": "3"}))
    quotes.append(_norm(_raises(fit, steps=20, out=out, resume=True, save_every=100, **TINY), tmp))
    corpora = tmp / "data" / "corpora"
    corpora.mkdir(parents=True)
    (corpora / "code_val.txt").write_bytes(b"x" * 500)
    monkeypatch.setattr(data, "DATA_DIR", tmp / "data")
    for text in (b"", b"x" * 100):
        (corpora / "code_train.txt").write_bytes(text)
        quotes.append(_norm(_raises(fit, steps=2, **TINY), tmp))
    monkeypatch.undo()
    monkeypatch.setenv("WORLD_SIZE", "2")
    for v in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(v, raising=False)
    quotes.append(_raises(fit, steps=2, **TINY))
    monkeypatch.delenv("WORLD_SIZE")
    quotes.append(_raises(check_train_options, heads="stern", seq_len=0))
    cli.main(["generate", "--prompt", "x", "--seed", str(2 ** 64)])
    quotes.append(capsys.readouterr().err.strip().removeprefix("error: "))
    os.mkfifo(tmp / "p")
    cli.main(["generate", "--prompt-file", str(tmp / "p")])
    quotes.append(_norm(capsys.readouterr().err.strip().removeprefix("error: "), tmp))
    (tmp / "m").mkdir()
    (tmp / "m" / "config.json").write_text(json.dumps({"model_type": "x", "auto_map": {"AutoConfig": "a.B"}}))
    quotes.append(_norm(_raises(ckpt.resolve, tmp / "m"), tmp))
    ck = tmp / "ck"
    model = random_model("stern", 4, n_embd=32, n_head=2)
    ckpt.save(model, ck / "stern-k4")
    quotes.append(_raises(ckpt.load, _edit_config(ck / "stern-k4.safetensors", ck / "a" / "stern-k4", n_depths=40)))
    quotes.append(_norm(_raises(ckpt.load, _edit_config(ck / "stern-k4.safetensors", ck / "b" / "stern-k4",
                                                        n_depths=10 ** 6)), ck / "b"))
    ckpt.save(random_model(), ck / "m")
    quotes.append(_raises(ckpt.load, _edit_config(ck / "m.safetensors", ck / "c" / "m", n_head=4)))
    quotes.append(_norm(_raises(ckpt.load, _edit_config(ck / "m.safetensors", ck / "d" / "m", n_head=32)), ck / "d"))
    raw = (ck / "m.safetensors").read_bytes()
    (ck / "m.safetensors").write_bytes(raw[:-4] + bytes(4))
    quotes.append(_raises(ckpt.load, ck / "m"))
    nh = struct.unpack("<Q", raw[:8])[0]
    (ck / "m.safetensors").write_bytes(raw[:8] + raw[8:8 + nh].replace(b'"F32"', b'"I32"') + raw[8 + nh:])
    quotes.append(_norm(_raises(ckpt.load, ck / "m"), ck))
    monkeypatch.setattr(ckpt, "CHECKPOINT_DIR", Path("/nonexistent"))
    monkeypatch.setenv("MTPLAB_CHECKPOINTS", "/nonexistent")
    quotes.append(_raises(ckpt.resolve, "ntp"))
    monkeypatch.undo()
    quotes.append(_raises(ckpt.load, None))
    quotes.append(_raises(ckpt.save, model, ck / "i8", dtype=torch.int8))
    cli.main(["bench", "decode", "--quick", "--out", "/proc/x"])
    quotes.append(capsys.readouterr().err.strip().removeprefix("error: "))
    if hfdirs is not None:
        from mtplab.hf.target import load_hf, load_target
        quotes.append(_norm(_raises(load_hf, tmp / "m"), tmp))
        for i, folder in enumerate(("size-mismatch", "pickle-weights", "no-tokenizer")):
            (tmp / f"h{i}").mkdir()
            (tmp / f"h{i}" / "m").symlink_to(hfdirs / folder)
            quotes.append(_norm(_raises(load_hf, tmp / f"h{i}" / "m"), tmp / f"h{i}"))
        return quotes + [load_target]  # the heads cases need hfheads: added by the test
    return quotes


def _quotes_missing(quotes, readme: str) -> list[str]:
    return [q for q in quotes if isinstance(q, str) and f"`{q}`" not in readme]


def test_the_readme_bad_input_table_quotes_the_new_messages(tmp_path, monkeypatch, capsys, hfdirs, hfheads):
    quotes = readme_cases(tmp_path, monkeypatch, capsys, hfdirs)
    load_target = quotes.pop()
    (tmp_path / "hh").mkdir()
    (tmp_path / "hh" / "h.safetensors").symlink_to(hfheads / "no-base.safetensors")
    (tmp_path / "hh" / "h").mkdir()
    quotes.append(_norm(_raises(load_target, hfdirs / "gpt2", tmp_path / "hh" / "h.safetensors"), tmp_path / "hh"))
    quotes.append(_norm(_raises(load_target, hfdirs / "gpt2", tmp_path / "hh" / "h"), tmp_path / "hh"))
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Bad input"):readme.index("\n## ", readme.index("## Bad input") + 5)]
    missing = _quotes_missing(quotes, table)
    assert not missing, "README.md's bad-input table lacks these messages:\n" + "\n".join(missing)
    assert re.search(r"`one training step needs about [\d.]+ [KMGT]B of memory \(--batch-size \d+, \d+ depths?, [\d,]+ "
                     r"parameters\), more than the [\d.]+ [KMGT]B here; lower --batch-size \(at most about \d+ fits\)`", table)


def test_options_a_method_does_not_use_are_refused(capsys):
    """g31, g43: --alpha and --draft-checkpoint were silently ignored."""
    refused(capsys, "--alpha is the oracle drafter's acceptance rate; --method ngram does not use it",
            "generate", "--prompt", "x", "--method", "ngram", "--alpha", "-7")
    refused(capsys, "--method ngram does not use one: drop it or choose --method draft-model",
            "generate", "--prompt", "x", "--method", "ngram", "--draft-checkpoint", "/nonexistent/x")


def test_a_nul_in_the_base_name_is_refused_not_printed(heads_dir, tmp_path):
    """ck-base-nul."""
    m = tmp_path / "stern"
    (tmp_path / "stern.safetensors").write_bytes((heads_dir / "stern.safetensors").read_bytes())
    ckpt.save(random_model("stern", 3, seed=1), m, base=heads_dir / "ntp")
    info = json.loads(m.with_suffix(".json").read_text())
    info["base"]["file"] = "ntp\x00.safetensors"
    m.with_suffix(".json").write_text(json.dumps(info))
    err = _raises(ckpt.load, m)
    assert "base must name a .safetensors file" in err and "\x00" not in err


def test_a_rank_that_never_comes_is_named_after_the_timeout(tmp_path):
    """t19: WORLD_SIZE=2 RANK=0 waited 30 minutes (torch's default) without a word."""
    r = child("train", "--preset", "tiny", "--steps", "3", "--no-progress", "--out", tmp_path,
              env={"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29581",
                   "MTPLAB_DIST_TIMEOUT": "2"}, timeout=120)
    one_line(r, "could not start 2 processes at 127.0.0.1:29581", "launch every rank with torchrun")


def test_resume_on_another_corpus_of_the_same_name_is_refused(tmp_path, monkeypatch):
    """t33: --resume accepted another corpus file of the same name."""
    from mtplab import data
    (tmp_path / "d" / "corpora").mkdir(parents=True)
    for split in ("train", "val"):
        (tmp_path / "d" / "corpora" / f"code_{split}.txt").write_bytes(b"def main(x):\n    return x\n" * 40)
    monkeypatch.setattr(data, "DATA_DIR", tmp_path / "d")
    fit(steps=2, out=tmp_path / "r", **TINY)
    (tmp_path / "d" / "corpora" / "code_train.txt").write_bytes(b"other bytes entirely, same name\n" * 40)
    with pytest.raises(MtplabError, match=r"--resume of .* with other settings \(corpus_sha256 '[0-9a-f]{64}' -> "):
        fit(steps=4, out=tmp_path / "r", resume=True, **TINY)


def test_a_run_saved_before_the_corpus_hash_still_resumes(tmp_path):
    fit(steps=2, out=tmp_path, **TINY)
    m = json.loads((tmp_path / "ntp.state.json").read_text())
    del m["settings"]["corpus_sha256"]  # as a run saved before 2026-12
    (tmp_path / "ntp.state.json").write_text(json.dumps(m))
    assert fit(steps=4, out=tmp_path, resume=True, **TINY)[-1]["step"] == 4
