"""What the command line checks once for every command, and what every trainer does the same way: a seed in range,
paths the weights library can open, and a full disk (one line naming the fix, the last save intact)."""
import os

import pytest

from mtplab import cli
from mtplab.errors import MtplabError
from mtplab import files
from mtplab.training import runs
from mtplab.training.fit import fit
from tests.reliability.helpers import NOT_UTF8, TINY, disk_full, full_under, main, refused

TRAIN = ["train", "--preset", "tiny", "--steps", "2", "--batch-size", "2", "--no-progress"]
OWN = ["train-hf-model", "--preset", "hf-draft", "--steps", "2", "--batch-size", "2", "--seq-len", "32", "--no-progress"]


def _hf(hfdirs):
    return ["train", "--hf", hfdirs / "gpt2", "--corpus", hfdirs / "corpus.txt", "--heads", "stern", "--depths", "2",
            "--steps", "2", "--batch-size", "2", "--seq-len", "32", "--no-progress"]


def _command(entry, hfdirs):
    if entry == "train --hf":
        return _hf(hfdirs)
    if entry == "train-hf-model":
        pytest.importorskip("transformers")
        return OWN
    return TRAIN


# ---- --seed: one check in cli.main, the range of each command (n-own-seed-2e64, g34-seed-2e64) -----------------------
@pytest.mark.parametrize("entry, seed, fragment", [
    ("generate", 2 ** 64, "--seed must be an integer in [-2**63, 2**64) (got 18446744073709551616)"),
    ("generate", -(2 ** 63) - 1, "--seed must be an integer in [-2**63, 2**64)"),
    ("train", 2 ** 64, "--seed must be an integer in [0, 2**63) (got 18446744073709551616)"),
    ("train", -1, "--seed must be an integer in [0, 2**63) (got -1)"),
    ("train --hf", 2 ** 63, "--seed must be an integer in [0, 2**63)"),
    ("train-hf-model", 2 ** 64, "--seed must be an integer in [0, 2**63) (got 18446744073709551616)"),
])
def test_every_command_checks_its_seed_before_it_starts(hfdirs, tmp_path, capsys, entry, seed, fragment):
    args = ["generate", "--prompt", "x", "--max-new-tokens", "4"] if entry == "generate" else \
        [*_command(entry, hfdirs), "--out", tmp_path / "r"]
    refused(capsys, fragment, *args, "--seed", seed)
    assert not (tmp_path / "r").exists()


def test_train_hf_model_checks_its_seed_in_the_api_too(tmp_path):
    pytest.importorskip("transformers")
    from scripts.train_hf_model import train_own
    with pytest.raises(MtplabError, match=r"--seed must be an integer in \[0, 9223372036854775808\) "
                                          r"\(got 18446744073709551616\)"):
        train_own(preset="hf-draft", steps=2, seed=2 ** 64, out=str(tmp_path / "o"))
    assert not (tmp_path / "o").exists()


# ---- paths that are not UTF-8: refused before anything is written (n-*-nonutf8) --------------------------------------
@pytest.mark.parametrize("entry, flag", [("train", "--out"), ("train --hf", "--out"), ("train-hf-model", "--out"),
                                         ("generate", "--checkpoint"), ("generate", "--hf"), ("bench", "--out")])
def test_a_path_that_is_not_utf8_is_one_line_at_parsing(hfdirs, tmp_path, capsys, entry, flag):
    bad = os.path.join(str(tmp_path), NOT_UTF8)
    if entry == "generate":
        args = ["generate", "--prompt", "x", flag, bad]
    elif entry == "bench":
        args = ["bench", "decode", "--quick", "--out", bad]
    else:
        args = [*_command(entry, hfdirs), "--out", bad]
    err = refused(capsys, f"{flag} ", *args)
    assert "is not valid UTF-8 (byte ff)" in err and "choose a name of UTF-8 characters" in err
    assert not os.listdir(tmp_path)  # nothing was written: not trained first and refused at the first save


def test_the_api_refuses_such_an_out_before_training(tmp_path):
    with pytest.raises(MtplabError, match=r"--out .* is not valid UTF-8"):
        fit(steps=2, out=os.path.join(str(tmp_path), NOT_UTF8), **TINY)
    assert not os.listdir(tmp_path)


# ---- a full disk: every trainer ends in one line, its last save intact (t05, n-diskfull-*) ---------------------------
FULL = {  # where the disk fills -> the line's words (a write probe of one block finds a full disk before training)
    "probe file": "cannot write to --out",
    "probe block": "cannot write to --out",  # a 0-byte probe fits on a full disk
    "lock file": "cannot create the lock file",
    "lock": "cannot write the lock file",  # it used to flush again at close: a second ENOSPC, two tracebacks
    "save": "the last complete save is still there: free space or fix --out, then continue with --resume",
    "in the run": "stopped: the disk is full",
}


def _fill(monkeypatch, where, out):
    if where == "probe file":
        monkeypatch.setattr(runs.tempfile, "mkstemp", disk_full)
    elif where == "probe block":
        monkeypatch.setattr(runs.os, "write", disk_full)
    elif where == "lock file":
        real = os.open
        monkeypatch.setattr(runs.os, "open", lambda path, *a, **k: disk_full() if str(path).endswith(".lock")
                            else real(path, *a, **k))
    elif where == "lock":
        monkeypatch.setattr(runs.os, "pwrite", disk_full)
    elif where == "save":
        monkeypatch.setattr(files, "atomic_write", full_under(out, files.atomic_write))
    else:  # an OSError from anywhere inside the run (the lock is where it ends)
        monkeypatch.setattr(runs.Stop, "__enter__", disk_full)


@pytest.mark.parametrize("where", list(FULL))
@pytest.mark.parametrize("entry", ["train", "train --hf", "train-hf-model"])
def test_a_full_disk_is_one_line_for_every_trainer(hfdirs, tmp_path, monkeypatch, capsys, entry, where):
    args = [*_command(entry, hfdirs), "--out", tmp_path / "r"]
    _fill(monkeypatch, where, tmp_path / "r")
    rc, err = main(capsys, *args)
    assert rc == 2 and err.count("\n") == 0 and "Traceback" not in err, err
    assert "the disk is full" in err and FULL[where] in err, err
    if where.startswith("probe"):
        assert "choose a writable directory" in err
    if where == "lock file":
        assert ".lock (the disk is full)" in err


def test_a_full_disk_at_a_later_save_leaves_the_last_one_byte_for_byte(tmp_path, monkeypatch):
    out = tmp_path / "r"
    fit(steps=2, out=out, save_every=2, **TINY)
    before = {p.name: p.read_bytes() for p in out.iterdir() if not p.name.startswith(".")}
    monkeypatch.setattr(files, "atomic_write", full_under(out, files.atomic_write))
    with pytest.raises(MtplabError, match=r"could not save step 4 to .* \(the disk is full\)"):
        fit(steps=4, out=out, save_every=2, resume=True, **TINY)
    assert {p.name: p.read_bytes() for p in out.iterdir() if not p.name.startswith(".")} == before
    monkeypatch.undo()
    assert fit(steps=4, out=out, save_every=2, resume=True, **TINY)[-1]["step"] == 4


def test_an_oserror_no_command_named_is_still_one_line(tmp_path, monkeypatch, capsys):
    def lost(a):
        raise OSError(28, "No space left on device", str(tmp_path / "x.json"))
    monkeypatch.setattr(cli.bench, "main", lost)
    rc, err = main(capsys, "bench", "decode", "--quick", "--out", tmp_path)
    assert rc == 2 and err == f"error: the disk is full ({tmp_path / 'x.json'}); free space or fix the path, then run " \
                              "the command again (a training run continues with --resume)"


# ---- --resume checks the text: another corpus under the same name is refused by every trainer (t33, n-hft-resume-*) --
@pytest.mark.parametrize("entry", ["train", "train --hf", "train-hf-model"])
def test_resume_on_another_text_is_refused_by_every_trainer(hfdirs, tmp_path, monkeypatch, entry):
    from mtplab import data
    corpora = tmp_path / "d" / "corpora"
    corpora.mkdir(parents=True)
    for split in ("train", "val"):
        (corpora / f"code_{split}.txt").write_bytes(b"def main(x):\n    return x\n" * 80)
    monkeypatch.setattr(data, "DATA_DIR", tmp_path / "d")
    text = corpora / "code_train.txt"
    out = tmp_path / "r"
    if entry == "train":
        run = lambda steps, **k: fit(steps=steps, out=out, **TINY, **k)  # noqa: E731
    elif entry == "train --hf":
        from mtplab.distill.live import run_hf_train
        run = lambda steps, **k: run_hf_train(hf=str(hfdirs / "gpt2"), heads="stern", n_depths=2, corpus=str(text),  # noqa: E731
                                              steps=steps, batch_size=2, seq_len=32, out=str(out), **k)
    else:
        pytest.importorskip("transformers")
        from scripts.train_hf_model import train_own
        run = lambda steps, **k: train_own(preset="hf-draft", steps=steps, batch_size=2, seq_len=32, out=str(out),  # noqa: E731
                                           log=None, **k)
    run(2)
    text.write_bytes(b"other bytes entirely, same name\n" * 80)
    with pytest.raises(MtplabError, match=r"--resume of .* with other settings \(corpus_sha256 '[0-9a-f]{64}' -> "):
        run(4, resume=True)
