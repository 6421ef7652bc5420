"""The files the lab reads: checkpoint configs and weights files (sizes against the header, recorded hashes, odd
dtypes, crafted headers, the base of heads-only files), any JSON or config read through the one bounded reader, and
crafted Hugging Face configs, each one line before anything is allocated or hashed."""
import json
import os
import struct
import sys
import time

import pytest
import torch

from mtplab.errors import MtplabError
from mtplab.measuring.record import Record
from mtplab import files
from mtplab.model import checkpoint as ckpt
from mtplab.files import read_json
from mtplab.training import runs
from tests.conftest import random_model
from tests.reliability.helpers import edit_config, raises


# ---- the one bounded reader: devices, FIFOs, oversized and deeply nested files (n-*-devzero, n-*-fifo) ---------------
def _plant(path, kind):
    if kind == "devzero":
        os.symlink("/dev/zero", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "huge":
        path.write_text(json.dumps({"x": "a" * (20 << 20)}))
    elif kind == "nested":
        path.write_text("[" * 100000 + "]" * 100000)


READERS = {
    "read_json": lambda p: read_json(p, limit=1 << 20, what="a test file", fix="restore it"),
    "decode bench": lambda p: Record.load(p).table(),
    "run manifest": lambda p: runs.read_manifest(p.parent, p.name.removesuffix(".state.json")),
}


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs and /dev/zero")
@pytest.mark.parametrize("kind", ["devzero", "fifo", "huge", "nested"])
@pytest.mark.parametrize("reader", list(READERS))
def test_special_and_oversized_files_are_one_line(tmp_path, reader, kind):
    name = "run.state.json" if reader == "run manifest" else "x.json"
    path = tmp_path / name
    if reader == "run manifest" and not runs.paths(tmp_path, "run")["manifest"].name == name:
        pytest.skip("the manifest has another name")
    _plant(path, kind)
    t0 = time.monotonic()
    with pytest.raises(MtplabError) as e:
        READERS[reader](path)
    assert time.monotonic() - t0 < 10 and "\n" not in str(e.value)
    if kind in ("devzero", "fifo"):
        assert "not a regular file" in str(e.value)
    if kind != "nested":  # read_bounded's own line, not wrapped as "not valid JSON" (n-hf-config-big)
        assert "not valid JSON" not in str(e.value)


# ---- checkpoint configs against the weights' header (ck-huge-*, ck-cfg-*, ck-hdr-nested) ----------------------------
@pytest.mark.parametrize("fam", ["stern", "meta", "deepseek"])
def test_n_depths_in_the_json_is_checked_against_the_header_before_building(heads_dir, tmp_path, fam):
    m = edit_config(heads_dir / f"{fam}.safetensors", tmp_path / fam, n_depths=40)
    with pytest.raises(MtplabError, match=f"the config says {fam} heads with n_depths 40; the weights hold 3 depths"):
        ckpt.load(m)
    huge = edit_config(heads_dir / f"{fam}.safetensors", tmp_path / "huge" / fam, n_depths=10 ** 6)
    with pytest.raises(MtplabError, match="n_depths 1000000 is over 64; restore the file or retrain"):
        ckpt.load(huge)


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
        ckpt.load(edit_config(heads_dir / "ntp.safetensors", tmp_path / "odd" / "m", n_head=32))
    with pytest.raises(MtplabError, match=r"they were saved with another config \(n_head 2 -> 4\)"):
        ckpt.load(edit_config(heads_dir / "ntp.safetensors", tmp_path / "four" / "m", n_head=4))
    with pytest.raises(MtplabError, match=r"saved with another config \(block_size 96 -> 65536\)"):
        ckpt.load(edit_config(heads_dir / "ntp.safetensors", tmp_path / "block" / "m", block_size=65536))


def _with_extra_tensor(src, dst, gb):
    """A copy of checkpoint SRC whose header also names a GB-sized tensor, in a sparse file (nothing is written)."""
    dst.mkdir(parents=True)
    raw = src.with_suffix(".safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header, body = json.loads(raw[8:8 + n]), raw[8 + n:]
    header["zzz"] = {"dtype": "F32", "shape": [(gb << 30) // 4], "data_offsets": [len(body), len(body) + (gb << 30)]}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path = dst / src.with_suffix(".safetensors").name
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + body)
        f.truncate(8 + len(h) + len(body) + (gb << 30))
    info = json.loads(src.with_suffix(".json").read_text())
    info["weights_sha256"] = "0" * 64  # recorded: the file would be hashed, all of it
    path.with_suffix(".json").write_text(json.dumps(info))
    return path


@pytest.mark.parametrize("gb", [3, 40])
def test_a_huge_extra_tensor_is_refused_from_the_header_before_hashing_or_mapping(heads_dir, tmp_path, monkeypatch, gb):
    """n-ck-extra-3g-sha (17 s of hashing), n-ck-extra-40g (MemoryError from safe_open's mmap under ulimit -v)."""
    path = _with_extra_tensor(heads_dir / "ntp.json", tmp_path / "x", gb)
    hashed = []
    monkeypatch.setattr(files, "sha256", lambda p: hashed.append(p) or "0" * 64)
    t = time.monotonic()
    with pytest.raises(MtplabError, match=r"config does not match the weights in ntp.safetensors: unexpected \['zzz'\]"):
        ckpt.load(path)
    assert not hashed and time.monotonic() - t < 10


def test_bytes_beyond_what_the_header_declares_are_corrupt(heads_dir, tmp_path):
    (tmp_path / "m.safetensors").write_bytes((heads_dir / "ntp.safetensors").read_bytes() + bytes(4096))
    (tmp_path / "m.json").write_text((heads_dir / "ntp.json").read_text())
    with pytest.raises(MtplabError, match=r"m.safetensors is corrupt or truncated \(the tensors do not cover the file"):
        ckpt.load(tmp_path / "m")


# ---- what the JSON records of the weights: sha256, dtypes (ck-dtype-*, ck-sha-*) -------------------------------------
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


def test_a_null_weights_sha256_is_refused_not_taken_for_not_recorded(tmp_path):
    """n-ck-sha-flip-null: "weights_sha256": null let relabelled weights decode garbage."""
    ckpt.save(random_model(), tmp_path / "m")
    info = json.loads((tmp_path / "m.json").read_text())
    (tmp_path / "m.json").write_text(json.dumps({**info, "weights_sha256": None}))
    with pytest.raises(MtplabError, match=r"m.safetensors is not the file m.json was saved with"):
        ckpt.load(tmp_path / "m")


def test_a_hugging_face_heads_file_given_as_a_lab_checkpoint_says_what_it_is(hfheads):
    """n-hfrom-hfheads: it said 'good.json is missing: a checkpoint is NAME.safetensors plus NAME.json'."""
    with pytest.raises(MtplabError, match=r"holds heads for a Hugging Face model \(train --hf wrote it\), not a lab "
                                          r"checkpoint; use it with generate --hf MODEL --heads-checkpoint"):
        ckpt.load(hfheads / "good.safetensors")


# ---- the base of a heads-only checkpoint: a plain name, found by sha256 (ck-base-*) ----------------------------------
def test_a_nul_in_the_base_name_is_refused_not_printed(heads_dir, tmp_path):
    """ck-base-nul."""
    m = tmp_path / "stern"
    (tmp_path / "stern.safetensors").write_bytes((heads_dir / "stern.safetensors").read_bytes())
    ckpt.save(random_model("stern", 3, seed=1), m, base=heads_dir / "ntp")
    info = json.loads(m.with_suffix(".json").read_text())
    info["base"]["file"] = "ntp\x00.safetensors"
    m.with_suffix(".json").write_text(json.dumps(info))
    err = raises(ckpt.load, m)
    assert "base must name a .safetensors file" in err and "\x00" not in err


def test_the_recorded_base_dir_hashes_and_names_only_lab_checkpoints(heads_dir, tmp_path, monkeypatch):
    """ck-base-wrongsha-other: base.dir in the JSON made load() hash NAME.safetensors in any directory and print its
    path. The recorded directory stays (heads trained on a trunk elsewhere load), but a file there that is not an
    mtplab checkpoint is neither hashed nor named."""
    ckpt.save(random_model("stern", 3, seed=1), tmp_path / "h" / "stern", base=heads_dir / "ntp")
    other = tmp_path / "secret"
    other.mkdir()
    (other / "ntp.safetensors").write_bytes(b"not a checkpoint, just a file named like one")
    info = json.loads((tmp_path / "h" / "stern.json").read_text())
    info["base"]["dir"] = str(other)
    (tmp_path / "h" / "stern.json").write_text(json.dumps(info))
    real, hashed = files.sha256, []
    monkeypatch.setattr(files, "sha256", lambda p: hashed.append(p) or real(p))
    monkeypatch.setattr(ckpt, "CHECKPOINT_DIR", tmp_path / "none")
    err = raises(ckpt.load, tmp_path / "h" / "stern")
    assert other / "ntp.safetensors" not in hashed and str(other / "ntp.safetensors") not in err
    assert "holds only heads; its base ntp.safetensors is in none of" in err
    info["base"]["dir"] = str(heads_dir)  # a lab checkpoint there: found, as before
    (tmp_path / "h" / "stern.json").write_text(json.dumps(info))
    assert ckpt.load(tmp_path / "h" / "stern").config.heads == "stern"


# ---- crafted Hugging Face config.json files (n-hf-*) ----------------------------------------------------------------
@pytest.mark.parametrize("key,value", [("num_hidden_layers", 100000), ("num_hidden_layers", 2000),
                                       ("num_hidden_layers", 0), ("num_hidden_layers", -1),
                                       ("num_attention_heads", 0), ("vocab_size", -1), ("hidden_act", "bogus"),
                                       ("hidden_size", 63), ("max_position_embeddings", -5),
                                       ("model_type", ["llama"]), ("pad_token_id", 10 ** 9)])
def test_crafted_model_configs_are_one_line_before_any_allocation(tiny_llama, tmp_path, key, value):
    import shutil
    from mtplab.hf.target import load_hf
    d = tmp_path / "m"
    shutil.copytree(tiny_llama, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg[key] = value
    (d / "config.json").write_text(json.dumps(cfg))
    t0 = time.monotonic()
    with pytest.raises(MtplabError) as e:
        load_hf(d)
    assert time.monotonic() - t0 < 20 and "\n" not in str(e.value)
    if key in ("max_position_embeddings", "model_type", "pad_token_id"):  # the field of config.json, not the lab's
        assert f"config.json: {key} = " in str(e.value)
