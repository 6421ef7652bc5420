"""`train --hf`: heads on a Hugging Face trunk go through the lab's run folder (its checks, lock, save set, signals
and --resume), their numbers are checked before the model loads, and the corpus is bounded before it is tokenized."""
import os
import signal

import pytest
import torch
from safetensors.torch import load_file

from mtplab.errors import MtplabError
from mtplab.model import checkpoint as ckpt
from mtplab.training import runs
from mtplab.training.fit import fit
from tests.reliability.helpers import TINY, main, refused

HF_TRAIN = ["--heads", "stern", "--depths", "2", "--steps", "2", "--batch-size", "2", "--seq-len", "32", "--no-progress"]


# ---- the run folder: check_out, the shipped folders, --overwrite, names, the lock (hft01-hft04, hft15, hft20) ---------
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
    assert not (tmp_path / "stern-k2.json").exists()  # the lab run's config does not stay beside the new heads
    with runs.lock(tmp_path / "dot", "my-run"):
        refused(capsys, f"locked by pid {os.getpid()}", *hf, "--out", tmp_path / "dot", "--name", "my-run", "--overwrite")


def test_hf_train_names_cannot_leave_out(hfdirs, tmp_path, capsys):
    """hft01."""
    refused(capsys, "--name '../../ESCAPED' must be a plain file stem", "train", "--hf", hfdirs / "gpt2", *HF_TRAIN,
            "--out", tmp_path / "a" / "b", "--name", "../../ESCAPED")
    assert not list(tmp_path.rglob("ESCAPED*"))


def test_hf_train_out_a_file_is_refused_before_training(hfdirs, tmp_path, capsys):
    """hft15."""
    (tmp_path / "f").write_text("x")
    refused(capsys, f"--out {tmp_path / 'f'} is a file, not a directory", "train", "--hf", hfdirs / "gpt2", *HF_TRAIN,
            "--out", tmp_path / "f")


# ---- numbers and inputs, checked before the model loads (hft07-hft18, hf-train-no-tokenizer, n-hft-corpus-sparse1g) --
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


def test_hf_train_without_a_tokenizer_names_the_tokenizer(hfdirs, tmp_path, capsys):
    """hf-train-no-tokenizer: it said 'the corpus has 0 tokens'."""
    refused(capsys, "has no usable tokenizer", "train", "--hf", hfdirs / "no-tokenizer", *HF_TRAIN, "--out", tmp_path)


def test_a_huge_corpus_is_one_line_before_tokenizing(tmp_path):
    from mtplab.distill import live as run
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.truncate(run.MAX_CORPUS + 1)  # sparse: nothing is written
    with pytest.raises(MtplabError, match="give at most 64 MiB of text"):
        run.corpus_ids(None, str(big))


# ---- the save set: SIGINT, time, --resume to the uninterrupted heads (hft19) ------------------------------------------
def test_hf_train_sigint_saves_and_resume_reaches_the_uninterrupted_heads(hfdirs, tmp_path, monkeypatch):
    """hft19: a Ctrl-C after 9 s used to lose everything; --resume did not exist."""
    from mtplab.distill import live as hfrun
    kw = dict(hf=str(hfdirs / "gpt2"), heads="stern", n_depths=2, corpus=str(hfdirs / "corpus.txt"), steps=6,
              batch_size=2, seq_len=32, save_every=100)
    hfrun.run_hf_train(out=str(tmp_path / "ref"), **kw)
    real, n = hfrun.train_step, {"steps": 0}

    def step(*a, **k):
        n["steps"] += 1
        if n["steps"] == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*a, **k)
    monkeypatch.setattr(hfrun, "train_step", step)
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
    from mtplab.distill import live as hfrun
    monkeypatch.setattr(runs, "SAVE_SECONDS", 0.0)
    real, n = hfrun.train_step, {"steps": 0}

    def step(*a, **k):
        n["steps"] += 1
        if n["steps"] == 3:
            raise KeyboardInterrupt
        return real(*a, **k)
    monkeypatch.setattr(hfrun, "train_step", step)
    with pytest.raises(MtplabError, match=r"interrupted at step 2; the last complete save is step 2 in "):
        hfrun.run_hf_train(hf=str(hfdirs / "gpt2"), heads="stern", n_depths=2, corpus=str(hfdirs / "corpus.txt"),
                           steps=10 ** 9, batch_size=2, seq_len=32, out=str(tmp_path))
