"""Nothing lost, never a traceback (issue 15): runs, resume, save sets and checkpoints under bad input and faults."""
import errno
import json
import os

import pytest
import torch
from safetensors.torch import load_file

from mtplab.errors import MtplabError
from mtplab import files
from mtplab.model import checkpoint as ckpt
from mtplab.training import runs
from mtplab.training import steps
from mtplab.training.config import TrainConfig
from mtplab.training.fit import fit

TINY = dict(preset="tiny", batch_size=2, progress=False, device="cpu", eval_windows=2)


def live_weights(out, name="ntp"):
    t = load_file(str(out / f"{name}.state.safetensors"))
    return {n: v for n, v in t.items() if n.startswith("__w__.")}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


# ---- fit keeps its keywords; TrainConfig is the same thing -------------------------------------------
def test_fit_takes_a_config_or_keywords(tmp_path):
    fit(TrainConfig(steps=2, out=tmp_path / "a", seed=2, **TINY))
    fit(steps=2, out=tmp_path / "b", seed=2, **TINY)
    fit(TrainConfig(steps=2, **TINY), out=tmp_path / "c", seed=2)  # keywords replace the config's fields
    assert same(live_weights(tmp_path / "a"), live_weights(tmp_path / "b"))
    assert same(live_weights(tmp_path / "a"), live_weights(tmp_path / "c"))
    with pytest.raises(TypeError):
        fit(steps=2, bogus=1)


# ---- 1. --out that holds a run, the lock, the shipped checkpoints ------------------------------------
def test_out_holding_a_run_is_refused_unless_resume_or_overwrite(tmp_path):
    fit(steps=2, out=tmp_path, **TINY)
    before = live_weights(tmp_path)
    with pytest.raises(MtplabError, match="already holds a run 'ntp'.*--resume.*--overwrite"):
        fit(steps=2, out=tmp_path, seed=7, **TINY)
    assert same(live_weights(tmp_path), before)
    fit(steps=2, out=tmp_path, seed=7, overwrite=True, **TINY)
    assert not same(live_weights(tmp_path), before)
    with pytest.raises(MtplabError, match="give one of them"):
        fit(steps=2, out=tmp_path, resume=True, overwrite=True, **TINY)


def test_a_second_run_on_the_same_out_is_locked_out(tmp_path):
    with runs.lock(tmp_path, "ntp"):
        with pytest.raises(MtplabError, match=f"locked by pid {os.getpid()}"):
            fit(steps=2, out=tmp_path, **TINY)
    fit(steps=2, out=tmp_path, **TINY)  # released with the run


def test_shipped_checkpoints_are_never_written_by_accident(monkeypatch):
    listing = sorted((p.name, p.stat().st_mtime_ns) for p in ckpt.SHIPPED_DIR.iterdir())
    monkeypatch.delenv("MTPLAB_WRITE_SHIPPED", raising=False)
    for kw in ({}, {"overwrite": True}):
        with pytest.raises(MtplabError, match="which the lab ships"):
            fit(steps=2, out=ckpt.SHIPPED_DIR, **kw, **TINY)
    assert sorted((p.name, p.stat().st_mtime_ns) for p in ckpt.SHIPPED_DIR.iterdir()) == listing


# ---- 2. heads on a trunk of your own: the base is found by sha256 ------------------------------------
def test_heads_on_your_own_trunk_load_from_another_directory(tmp_path, monkeypatch):
    fit(steps=2, out=tmp_path / "trunk", seed=4, **TINY)
    fit(steps=2, out=tmp_path / "heads", heads="stern", n_depths=2, freeze_trunk=True,
        from_checkpoint=tmp_path / "trunk" / "ntp", **TINY)
    decoy = tmp_path / "shipped"  # a data/checkpoints holding another ntp, as the shipped one is
    fit(steps=2, out=decoy, seed=5, **TINY)
    monkeypatch.setattr(ckpt, "CHECKPOINT_DIR", decoy)
    m = ckpt.load(tmp_path / "heads" / "stern-k2")
    base = ckpt.load(tmp_path / "trunk" / "ntp")
    assert torch.equal(m.wte.weight, base.wte.weight)


@pytest.mark.parametrize("file", ["../ntp.safetensors", "/dev/zero", "sub/ntp.safetensors", "ntp.json"])
def test_base_file_is_confined_to_a_plain_checkpoint_name(tmp_path, file):
    fit(steps=2, out=tmp_path, **TINY)
    fit(steps=2, out=tmp_path, heads="stern", n_depths=2, freeze_trunk=True, from_checkpoint=tmp_path / "ntp", **TINY)
    j = tmp_path / "stern-k2.json"
    info = json.loads(j.read_text())
    info["base"]["file"] = file
    j.write_text(json.dumps(info))
    with pytest.raises(MtplabError, match="base must name a .safetensors file"):
        ckpt.load(j)


def test_base_dir_pointing_at_a_device_is_not_read(tmp_path):
    fit(steps=2, out=tmp_path, **TINY)
    fit(steps=2, out=tmp_path / "h", heads="stern", n_depths=2, freeze_trunk=True, from_checkpoint=tmp_path / "ntp",
        **TINY)
    j = tmp_path / "h" / "stern-k2.json"
    info = json.loads(j.read_text())
    info["base"].update(file="zero.safetensors", dir="/dev")
    j.write_text(json.dumps(info))
    with pytest.raises(MtplabError, match="its base zero.safetensors is in none of"):
        ckpt.load(j)


# ---- 3. the save set is atomic: a kill at every point, then --resume, gives the same weights -------
class Killed(BaseException):
    """A kill: not an Exception, so nothing on the way catches it."""


def _kill_at(monkeypatch, point):
    """Kill the second save (step 4) at `point`: ('write', i, 'before'|'after') of its i-th file, or 'promote'."""
    calls = {"n": 0}
    real_write, real_promote = files.atomic_write, runs._promote

    def write(path, w):
        calls["n"] += 1
        if point[0] == "write" and calls["n"] == 4 + point[1] + 1:  # 4 writes a save: weights, config, state, manifest
            if point[2] == "before":
                raise Killed
            real_write(path, w)
            raise Killed
        real_write(path, w)

    def promote(src, dst):
        if point == ("promote",) and calls["n"] > 4:
            raise Killed
        real_promote(src, dst)
    monkeypatch.setattr(files, "atomic_write", write)
    monkeypatch.setattr(runs, "_promote", promote)


POINTS = [("write", i, when) for i in range(4) for when in ("before", "after")] + [("promote",)]


@pytest.mark.parametrize("point", POINTS, ids=lambda p: "-".join(map(str, p)))
def test_a_save_killed_at_any_point_resumes_bit_for_bit(tmp_path, monkeypatch, point):
    kw = dict(steps=6, seed=1, save_every=2, eval_every=2, dropout=0.1, **TINY)
    fit(out=tmp_path / "whole", **kw)
    _kill_at(monkeypatch, point)
    with pytest.raises(Killed):
        fit(out=tmp_path / "cut", **kw)
    monkeypatch.undo()
    hist = fit(out=tmp_path / "cut", resume=True, **kw)
    assert hist[-1]["step"] == 6
    assert same(live_weights(tmp_path / "cut"), live_weights(tmp_path / "whole"))
    assert not (tmp_path / "cut" / "ntp.state.next.safetensors").exists()


def test_disk_full_while_saving_is_one_line_and_the_last_save_survives(tmp_path, monkeypatch):
    kw = dict(steps=4, seed=1, save_every=2, eval_every=2, **TINY)
    real = files.atomic_write
    calls = {"n": 0}

    def full(path, w):
        calls["n"] += 1
        if calls["n"] > 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, w)
    monkeypatch.setattr(files, "atomic_write", full)
    with pytest.raises(MtplabError, match=r"could not save step 4 to .* \(the disk is full\); the last complete save"):
        fit(out=tmp_path / "cut", **kw)
    monkeypatch.undo()
    fit(out=tmp_path / "whole", **kw)
    fit(out=tmp_path / "cut", resume=True, **kw)
    assert same(live_weights(tmp_path / "cut"), live_weights(tmp_path / "whole"))


# ---- 4. --resume checks the settings and its files ----------------------------------------------------
@pytest.fixture
def cut(tmp_path):
    fit(steps=4, out=tmp_path, stop_after=2, save_every=2, **TINY)
    return tmp_path


@pytest.mark.parametrize("change,shown", [
    (dict(heads="stern", n_depths=2, name="ntp"), "heads 'none' -> 'stern'"),
    (dict(seed=3), "seed 0 -> 3"),
    (dict(preset="draft"), "preset 'tiny' -> 'draft'"),
    (dict(lr=1e-3), "lr 0.003 -> 0.001"),
])
def test_resume_with_other_settings_is_refused(cut, change, shown):
    args = dict(TINY, steps=4, out=cut, resume=True) | change
    with pytest.raises(MtplabError, match="--resume of .* with other settings .*" + shown.replace("(", r"\(")
                       + r".*only --steps, --max-seconds"):
        fit(**args)


def test_resume_may_change_steps(cut):
    assert fit(steps=5, out=cut, resume=True, **TINY)[-1]["step"] == 5


@pytest.mark.parametrize("damage,msg", [
    ("truncate-state", "ntp.state.safetensors in .* is missing, truncated or not the one ntp.state.json names"),
    ("delete-state", "is missing, truncated"),
    ("garbage-manifest", "ntp.state.json is not a resumable training state"),
    ("list-manifest", "not a resumable training state"),
    ("delete-manifest", "nothing to resume in"),
])
def test_damaged_resume_files_give_one_line(cut, damage, msg):
    state, manifest = cut / "ntp.state.safetensors", cut / "ntp.state.json"
    if damage == "truncate-state":
        state.write_bytes(state.read_bytes()[:500])
    elif damage == "delete-state":
        state.unlink()
    elif damage == "garbage-manifest":
        manifest.write_text("{not json")
    elif damage == "list-manifest":
        manifest.write_text("[1, 2]")
    else:
        manifest.unlink()
    with pytest.raises(MtplabError, match=msg):
        fit(steps=4, out=cut, resume=True, **TINY)


# ---- --out unusable, found before training ------------------------------------------------------------
@pytest.fixture
def no_training(monkeypatch):
    import mtplab.training.fit as train

    def never(*a, **k):
        raise AssertionError("training started")
    monkeypatch.setattr(train, "load_corpus", never)
    monkeypatch.setattr(train, "_build_model", never)


def test_unusable_out_is_refused_before_training(tmp_path, no_training):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(MtplabError, match="is a file, not a directory"):
        fit(steps=2, out=f, **TINY)
    with pytest.raises(MtplabError, match="cannot write to --out .*choose a writable directory"):
        fit(steps=2, out=f / "sub", **TINY)
    with pytest.raises(MtplabError, match="cannot write to --out /proc/x"):
        fit(steps=2, out="/proc/x", **TINY)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_out_is_refused_before_training(tmp_path, no_training):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    with pytest.raises(MtplabError, match="cannot write to --out"):
        fit(steps=2, out=ro, **TINY)


# ---- out-of-range numbers ------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,msg", [
    (dict(batch_size=0), r"--batch-size must be an integer >= 1 \(got 0\)"),
    (dict(lr=float("nan")), r"--lr must be a finite number > 0 \(got nan\)"),
    (dict(lr=-1.0), "--lr must be a finite number > 0"),
    (dict(dropout=2.0), r"--dropout must be a finite number in \[0, 1\) \(got 2.0\)"),
    (dict(seed=10 ** 30), r"--seed must be an integer in \[0, 9223372036854775808\)"),
    (dict(seed=1e30), "--seed must be an integer"),
    (dict(lam=float("nan")), "lambda must be >= 0"),
    (dict(max_seconds=float("inf")), "--max-seconds must be a finite number > 0"),
    (dict(eval_every=0), "--eval-every must be an integer >= 1"),
    (dict(warmup=-1), "--warmup must be an integer >= 0"),
    (dict(name="../../x"), "--name '../../x' must be a plain file stem"),
    (dict(name=".hidden"), "must be a plain file stem"),
    (dict(save_dtype="fp8"), "unknown save dtype"),
])
def test_out_of_range_training_numbers(tmp_path, no_training, kw, msg):
    with pytest.raises(MtplabError, match=msg):
        fit(**(dict(TINY, steps=2, out=tmp_path) | kw))
    assert not list(tmp_path.iterdir())


def test_world_size_not_a_number(tmp_path, monkeypatch, no_training):
    monkeypatch.setenv("WORLD_SIZE", "abc")
    with pytest.raises(MtplabError, match="WORLD_SIZE='abc' is not an integer; unset it"):
        fit(steps=2, out=tmp_path, **TINY)


def test_dotted_name_trains_and_loads_by_name(tmp_path, monkeypatch):
    fit(steps=2, out=tmp_path, name="my.run", **TINY)
    assert ckpt.load(tmp_path / "my.run").config.n_layer == 2
    monkeypatch.setattr(ckpt, "CHECKPOINT_DIR", tmp_path)
    assert ckpt.load("my.run").config.n_layer == 2
    ckpt.save(ckpt.load("my.run"), tmp_path / "copy.v2")
    assert (tmp_path / "copy.v2.safetensors").is_file() and (tmp_path / "copy.v2.json").is_file()
    assert ckpt.load("copy.v2").config.n_layer == 2


# ---- SIGINT during training ----------------------------------------------------------------------------
def test_interrupt_says_where_the_last_save_is(tmp_path, monkeypatch):
    import mtplab.training.fit as train
    real = steps.train_step
    n = {"steps": 0}

    def step(*a, **k):
        n["steps"] += 1
        if n["steps"] == 4:
            raise KeyboardInterrupt
        return real(*a, **k)
    monkeypatch.setattr(train, "train_step", step)
    with pytest.raises(MtplabError, match=r"interrupted at step 3; the last complete save is step 2 in .*--resume"):
        fit(steps=6, out=tmp_path, save_every=2, **TINY)
    monkeypatch.undo()
    assert fit(steps=6, out=tmp_path, save_every=2, resume=True, **TINY)[-1]["step"] == 6


# ---- checkpoint configs: wrong types and values, crafted sizes -----------------------------------------
@pytest.fixture
def saved(tmp_path):
    from mtplab.model.config import preset
    from mtplab.model.gpt import GPT
    torch.manual_seed(0)
    return ckpt.save(GPT(preset("tiny")), tmp_path / "m")


@pytest.mark.parametrize("edit,msg", [
    (lambda i: i["config"].update(n_embd="256"), r"config field n_embd='256' is not a valid int"),
    (lambda i: i["config"].update(n_head=0), "config field n_head=0 is not a valid int"),
    (lambda i: i["config"].update(vocab_size=-5), "config field vocab_size=-5 is not a valid int"),
    (lambda i: i["config"].update(dropout="x"), "config field dropout='x' is not a valid float"),
    (lambda i: i.update(config=None), "has no 'config' object"),
    (lambda i: i["config"].update(n_layer=10 ** 7), "the config says vocab_size 256, n_embd 64, n_layer 10000000"),
    (lambda i: i["config"].update(block_size=10 ** 9), "block_size 1000000000 is over 65536"),
])
def test_bad_checkpoint_configs_give_one_line(saved, edit, msg):
    j = saved.with_suffix(".json")
    info = json.loads(j.read_text())
    edit(info)
    j.write_text(json.dumps(info))
    with pytest.raises(MtplabError, match=msg):
        ckpt.load(saved)


def test_config_that_is_not_an_object(saved):
    saved.with_suffix(".json").write_text("[]")
    with pytest.raises(MtplabError, match="has no 'config' object"):
        ckpt.load(saved)


def test_atomic_write_fsyncs_before_the_rename(tmp_path, monkeypatch):
    order = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (order.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (order.append("replace"), real_replace(a, b))[1])
    files.atomic_write_text(tmp_path / "x.json", "{}")
    assert order[:2] == ["fsync", "replace"] and (tmp_path / "x.json").read_text() == "{}"
