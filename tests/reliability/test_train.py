"""`train` and `fit`: the folder a run writes, its save set (time, signals, a kill at any point), sizes before
anything is allocated, the corpus, --resume, and torchrun's launch. Each table is one mechanism; a row is a probe's
input (t08, t17, t26-*, t27-*, ...) and the one line it ends in."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from mtplab.errors import MtplabError
from mtplab import files
from mtplab.model import checkpoint as ckpt
from mtplab.training import fit as fit_module
from mtplab.training.fit import fit
from tests.reliability.helpers import ENV, TINY, child, one_line


# ---- symlinks planted in --out: refused or stepped around, never written through (t08, t34) ------------------------
@pytest.mark.parametrize("planted, fragment", [
    (".ntp.lock", r"\.ntp\.lock is a symlink; a run never writes through one: remove it"),
    (".ntp.probe.PID", None),  # the old write probe's predictable name (PID: this process's): the probe is random now
], ids=["lock", "old-probe-name"])
def test_a_symlink_planted_in_out_is_never_written_through(tmp_path, planted, fragment):
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    out = tmp_path / "run"
    out.mkdir()
    (out / planted.replace("PID", str(os.getpid()))).symlink_to(victim)
    if fragment is None:
        fit(steps=2, out=out, **TINY)
    else:
        with pytest.raises(MtplabError, match=fragment):
            fit(steps=2, out=out, **TINY)
    assert victim.read_text() == "keep me"


# ---- the save set: saved by time, at SIGINT and SIGTERM; orphans of a killed save removed (t17, kill-term1, kill1-*) --
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
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN in a job started in the background
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
    assert signal.getsignal(signal.SIGINT) is before  # the old handler is back


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


def test_a_save_cut_between_its_files_names_resume(tmp_path, monkeypatch):
    """fault-lab: killed after NAME.safetensors and before NAME.json of the second save; generate said 'restore both
    files from the same save or retrain', although --resume repairs both."""
    class Killed(BaseException):
        pass
    real, n = files.atomic_write, {"writes": 0}

    def write(path, w):
        n["writes"] += 1
        if str(path).endswith("ntp.json") and n["writes"] > 4:
            raise Killed
        real(path, w)
    monkeypatch.setattr(files, "atomic_write", write)
    with pytest.raises(Killed):
        fit(steps=4, out=tmp_path, save_every=2, **TINY)
    monkeypatch.undo()
    with pytest.raises(MtplabError, match=r"a save of the run in .* was cut between its files; continue the run with the "
                                          r"same command plus --resume \(it rewrites both\)"):
        ckpt.load(tmp_path / "ntp")
    fit(steps=4, out=tmp_path, save_every=2, resume=True, **TINY)
    assert ckpt.load(tmp_path / "ntp").config.n_embd > 0


# ---- sizes before allocation (t21-t23) -------------------------------------------------------------------------------
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


# ---- the corpus: empty or shorter than one window (t26-data-*) -------------------------------------------------------
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


# ---- --resume: the manifest's fields, the state's parts (t27-*); runs saved before the corpus hash ------------------
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


def test_a_run_saved_before_the_corpus_hash_still_resumes(tmp_path):
    fit(steps=2, out=tmp_path, **TINY)
    m = json.loads((tmp_path / "ntp.state.json").read_text())
    del m["settings"]["corpus_sha256"]  # as a run saved before 2026-12
    (tmp_path / "ntp.state.json").write_text(json.dumps(m))
    assert fit(steps=4, out=tmp_path, resume=True, **TINY)[-1]["step"] == 4


# ---- torchrun's launch, a diverging run (t18, t19) ------------------------------------------------------------------
def test_world_size_without_rank_is_one_line(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for v in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(v, raising=False)
    with pytest.raises(MtplabError, match=r"WORLD_SIZE=2 but RANK, MASTER_ADDR, MASTER_PORT are not set; launch with "
                                          r"torchrun --nproc_per_node 2"):
        fit(steps=2, **TINY)


def test_a_rank_that_never_comes_is_named_after_the_timeout(tmp_path):
    """t19: WORLD_SIZE=2 RANK=0 waited 30 minutes (torch's default) without a word."""
    r = child("train", "--preset", "tiny", "--steps", "3", "--no-progress", "--out", tmp_path,
              env={"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29581",
                   "MTPLAB_DIST_TIMEOUT": "2"}, timeout=120)
    one_line(r, "could not start 2 processes at 127.0.0.1:29581", "launch every rank with torchrun")


def test_divergence_from_a_huge_lambda_names_lambda(tmp_path):
    with pytest.raises(MtplabError, match=r"training diverged at step 0 \(loss .*\); lower --lr or --lambda"):
        fit(steps=3, heads="deepseek", lam=1e308, **TINY)
