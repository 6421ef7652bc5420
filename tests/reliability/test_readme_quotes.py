"""The README's bad-input table quotes the messages of the reliability rounds word for word: each quote here is
produced by its case, so a message that changes without the README (or the other way round) fails."""
import json
import os
import re
import signal
import struct
from pathlib import Path

import torch

from mtplab import cli
from mtplab.model import checkpoint as ckpt
from mtplab.training import fit as fit_module
from mtplab.training.fit import fit
from tests.conftest import random_model
from tests.reliability.helpers import ROOT, TINY, edit_config, norm, raises


def readme_cases(tmp: Path, monkeypatch, capsys, hfdirs=None) -> list[str]:
    """Each new row's message, produced by its case; tmp paths shortened to what the README shows (runs/x, m, ...)."""
    from mtplab import data
    from mtplab.distill.live import check_train_options
    from mtplab.training.config import TrainConfig
    out, quotes = tmp / "runs" / "x", []
    out.mkdir(parents=True)
    (out / ".ntp.lock").symlink_to(tmp / "victim")
    quotes.append(norm(raises(fit, steps=2, out=out, **TINY), tmp))
    (out / ".ntp.lock").unlink()
    real, n = fit_module.train_step, {"steps": 0}

    def step(*a, **k):
        n["steps"] += 1
        if n["steps"] == 7:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*a, **k)
    monkeypatch.setattr(fit_module, "train_step", step)
    quotes.append(norm(raises(fit, steps=20, out=out, save_every=100, **TINY), tmp))
    monkeypatch.setattr(fit_module, "train_step", real)
    quotes.append(raises(TrainConfig(heads="stern", n_depths=10 ** 6).depths))
    quotes.append(raises(TrainConfig(heads="deepseek", n_modules=10 ** 5).depths))
    quotes.append(raises(fit, steps=2, out=out, name="a" * 300, **TINY))
    m = json.loads((out / "ntp.state.json").read_text())
    (out / "ntp.state.json").write_text(json.dumps({**m, "step": "3"}))
    quotes.append(norm(raises(fit, steps=20, out=out, resume=True, save_every=100, **TINY), tmp))
    corpora = tmp / "data" / "corpora"
    corpora.mkdir(parents=True)
    (corpora / "code_val.txt").write_bytes(b"x" * 500)
    monkeypatch.setattr(data, "DATA_DIR", tmp / "data")
    for text in (b"", b"x" * 100):
        (corpora / "code_train.txt").write_bytes(text)
        quotes.append(norm(raises(fit, steps=2, **TINY), tmp))
    monkeypatch.undo()
    monkeypatch.setenv("WORLD_SIZE", "2")
    for v in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(v, raising=False)
    quotes.append(raises(fit, steps=2, **TINY))
    monkeypatch.delenv("WORLD_SIZE")
    quotes.append(raises(check_train_options, heads="stern", seq_len=0))
    cli.main(["generate", "--prompt", "x", "--seed", str(2 ** 64)])
    quotes.append(capsys.readouterr().err.strip().removeprefix("error: "))
    os.mkfifo(tmp / "p")
    cli.main(["generate", "--prompt-file", str(tmp / "p")])
    quotes.append(norm(capsys.readouterr().err.strip().removeprefix("error: "), tmp))
    (tmp / "m").mkdir()
    (tmp / "m" / "config.json").write_text(json.dumps({"model_type": "x", "auto_map": {"AutoConfig": "a.B"}}))
    quotes.append(norm(raises(ckpt.resolve, tmp / "m"), tmp))
    ck = tmp / "ck"
    model = random_model("stern", 4, n_embd=32, n_head=2)
    ckpt.save(model, ck / "stern-k4")
    quotes.append(raises(ckpt.load, edit_config(ck / "stern-k4.safetensors", ck / "a" / "stern-k4", n_depths=40)))
    quotes.append(norm(raises(ckpt.load, edit_config(ck / "stern-k4.safetensors", ck / "b" / "stern-k4",
                                                        n_depths=10 ** 6)), ck / "b"))
    ckpt.save(random_model(), ck / "m")
    quotes.append(raises(ckpt.load, edit_config(ck / "m.safetensors", ck / "c" / "m", n_head=4)))
    quotes.append(norm(raises(ckpt.load, edit_config(ck / "m.safetensors", ck / "d" / "m", n_head=32)), ck / "d"))
    raw = (ck / "m.safetensors").read_bytes()
    (ck / "m.safetensors").write_bytes(raw[:-4] + bytes(4))
    quotes.append(raises(ckpt.load, ck / "m"))
    nh = struct.unpack("<Q", raw[:8])[0]
    (ck / "m.safetensors").write_bytes(raw[:8] + raw[8:8 + nh].replace(b'"F32"', b'"I32"') + raw[8 + nh:])
    quotes.append(norm(raises(ckpt.load, ck / "m"), ck))
    monkeypatch.setattr(ckpt, "CHECKPOINT_DIR", Path("/nonexistent"))
    monkeypatch.setenv("MTPLAB_CHECKPOINTS", "/nonexistent")
    quotes.append(raises(ckpt.resolve, "ntp"))
    monkeypatch.undo()
    quotes.append(raises(ckpt.load, None))
    quotes.append(raises(ckpt.save, model, ck / "i8", dtype=torch.int8))
    cli.main(["bench", "decode", "--quick", "--out", "/proc/x"])
    quotes.append(capsys.readouterr().err.strip().removeprefix("error: "))
    cli.main(["generate", "--hf", str(tmp / "nothing"), "--method", "ar", "--draft-vocab", "reduced", "--prompt", "x"])
    quotes.append(capsys.readouterr().err.strip().removeprefix("error: "))  # refused before the model loads
    if hfdirs is not None:
        from mtplab.hf.target import load_hf, load_target
        quotes.append(norm(raises(load_hf, tmp / "m"), tmp))
        for i, folder in enumerate(("size-mismatch", "pickle-weights", "no-tokenizer")):
            (tmp / f"h{i}").mkdir()
            (tmp / f"h{i}" / "m").symlink_to(hfdirs / folder)
            quotes.append(norm(raises(load_hf, tmp / f"h{i}" / "m"), tmp / f"h{i}"))
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
    quotes.append(norm(raises(load_target, hfdirs / "gpt2", tmp_path / "hh" / "h.safetensors"), tmp_path / "hh"))
    quotes.append(norm(raises(load_target, hfdirs / "gpt2", tmp_path / "hh" / "h"), tmp_path / "hh"))
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Bad input"):readme.index("\n## ", readme.index("## Bad input") + 5)]
    missing = _quotes_missing(quotes, table)
    assert not missing, "README.md's bad-input table lacks these messages:\n" + "\n".join(missing)
    assert re.search(r"`one training step needs about [\d.]+ [KMGT]B of memory \(--batch-size \d+, \d+ depths?, [\d,]+ "
                     r"parameters\), more than the [\d.]+ [KMGT]B here; lower --batch-size \(at most about \d+ fits\)`", table)
