"""`generate` (and the loaders behind it): which checkpoint a name means, the prompt file, options a method does not
use, sizes bounded under a memory cap, and Hugging Face folders: never their own code, every odd folder or heads file
one line."""
import os
import subprocess
import sys
import time

import pytest
import torch

from mtplab.errors import MtplabError
from mtplab.model import checkpoint as ckpt
from mtplab.model.layers import MASK_CACHE, _MASKS, causal_mask
from mtplab.training.fit import fit
from tests.conftest import random_model
from tests.reliability.helpers import ENV, TINY, child, edit_config, one_line, refused


# ---- which file a name means; options and inputs of the command (env-cwd-hijack, g10, g31, g43) ---------------------
def test_a_local_ntp_never_shadows_the_shipped_one(tmp_path, monkeypatch):
    ckpt.save(random_model(seed=9), tmp_path / "ntp")
    monkeypatch.chdir(tmp_path)
    assert ckpt.resolve("ntp") == ckpt.CHECKPOINT_DIR / "ntp.safetensors"
    assert ckpt.resolve("./ntp") == tmp_path / "ntp.safetensors"  # as a path, it is the local file
    assert ckpt.load("./ntp").config.n_embd == 32


def test_a_fifo_prompt_file_is_refused_not_waited_on(tmp_path, capsys):
    os.mkfifo(tmp_path / "fifo")
    refused(capsys, "is a pipe (FIFO) that nobody writes to; give a regular file", "generate", "--prompt-file",
            tmp_path / "fifo")
    r = subprocess.run([sys.executable, "-m", "mtplab", "generate", "--prompt-file", "/dev/stdin", "--max-new-tokens", "2"],
                       input="def main(", capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 0, r.stderr  # a pipe that is written to still works


def test_options_a_method_does_not_use_are_refused(capsys):
    """g31, g43: --alpha and --draft-checkpoint were silently ignored."""
    refused(capsys, "--alpha is the oracle drafter's acceptance rate; --method ngram does not use it",
            "generate", "--prompt", "x", "--method", "ngram", "--alpha", "-7")
    refused(capsys, "--method ngram does not use one: drop it or choose --method draft-model",
            "generate", "--prompt", "x", "--method", "ngram", "--draft-checkpoint", "/nonexistent/x")


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


# ---- bounded under a memory cap (ck-huge-stern-1e6-ulimit, ck-block65536-longprompt) --------------------------------
def test_a_million_depths_in_a_checkpoint_is_one_line_under_a_memory_cap(heads_dir, tmp_path):
    m = edit_config(heads_dir / "stern.safetensors", tmp_path / "stern-k4", n_depths=10 ** 6)
    r = child("generate", "--prompt", "x", "--max-new-tokens", "4", "--method", "blockwise", "--checkpoint", m,
              mem_gb=3)
    one_line(r, "n_depths 1000000 is over 64")


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


# ---- --hf: a model folder never runs its own code, and every odd folder is one line (hf-*) ---------------------------
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


# ---- --heads-checkpoint: heads metadata of the wrong shape (hfh-*) --------------------------------------------------
@pytest.mark.parametrize("variant, fragment", [
    ("bad-json", "has heads metadata mtplab does not understand (not JSON)"),
    ("info-list", "is not an mtplab heads checkpoint for a Hugging Face model"),
    ("no-base", "(its base record is missing or malformed)"),
    ("base-str", "(its base record is missing or malformed)"),
    ("depths-str", "heads 'stern' with n_depths '3'"),
    ("depths-huge", "heads 'stern' with n_depths 10000000"),
    ("depths-5", "does not match its own head config (stern, 5 depths"),
    ("int-tensors", "holds I32 tensors"),  # hfh-int-tensors: loaded silently, every draft rejected
    ("nan-tensors", "holds NaN or infinite weights"),  # hfh-nan-tensors
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


# ---- the Python API: decode_with is handed loaded models, a seed torch can take, a reference of token ids ------------
@pytest.mark.parametrize("bad, match", [
    (dict(seed=2 ** 64), r"seed must be an integer in \[-2\*\*63, 2\*\*64\)"),
    (dict(seed=1.5), "seed must be an integer"),
    (dict(seed=None), "seed must be an integer"),
    (dict(model="stern-k4"), "model must be a loaded model, not str 'stern-k4'; load it first"),
    (dict(method="draft-model", draft_model="draft"), "draft_model must be a loaded model"),
    (dict(method="oracle", reference="abc"), "reference must be a list of token ids"),
])
def test_decode_with_refuses_what_it_cannot_run_in_one_line(bad, match):
    from mtplab.decoding.generate import decode_with

    call = dict(method="blockwise", model=random_model("stern", 4, seed=1), prompt_ids=[1, 2], max_new_tokens=4)
    call.update(bad)
    with pytest.raises(MtplabError, match=match):
        decode_with(call.pop("method"), call.pop("model"), call.pop("prompt_ids"), **call)
    edge = dict(call, seed=2 ** 64 - 1) if "seed" in bad else None  # the largest seed torch takes still decodes
    if edge is not None:
        assert len(decode_with("blockwise", random_model("stern", 4, seed=1), [1, 2], **edge).tokens) == 4
