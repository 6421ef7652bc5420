"""The generate command line: output fields and one-line errors (exit 2, no traceback)."""
import json
import os
import subprocess
import sys

import pytest

from mtplab import checkpoint as ckpt
from tests.conftest import random_model


@pytest.fixture(scope="module")
def ckdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("ck")
    ckpt.save(random_model(block_size=128), d / "ntp")
    ckpt.save(random_model("meta", 3, seed=3, block_size=128), d / "meta-k3")
    ckpt.save(random_model(seed=4, n_embd=16, block_size=128), d / "draft")
    return d


def gen(ckdir, *args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MTPLAB_CHECKPOINTS": str(ckdir)}
    return subprocess.run([sys.executable, "-m", "mtplab", "generate", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_generate_json(ckdir):
    r = gen(ckdir, "--checkpoint", "ntp", "--prompt", "def f(x):", "--max-new-tokens", "12", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert {"text", "tokens", "forwards", "tokens_per_forward", "accepted_per_position"} <= set(d)
    assert len(d["tokens"]) == 12 and d["forwards"] == 12
    r = gen(ckdir, "--method", "meta", "--checkpoint", "meta-k3", "--prompt", "ab", "--max-new-tokens", "20", "--json")
    d = json.loads(r.stdout)
    assert len(d["tokens"]) == 20 and len(d["accepted_per_position"]) == 2
    r = gen(ckdir, "--method", "draft-model", "--checkpoint", "ntp", "--prompt", "ab", "--max-new-tokens", "8")
    assert r.returncode == 0 and "tokens/forward" in r.stdout


@pytest.mark.parametrize("args,msg", [
    (["--prompt", ""], "prompt is empty"),
    (["--prompt", "x" * 200, "--max-new-tokens", "10"], "exceeds the context window"),
    (["--prompt", "x", "--k", "0", "--method", "ngram"], "k must be"),
    (["--prompt", "x", "--temperature", "-1"], "temperature must be >= 0"),
    (["--prompt", "x", "--max-new-tokens", "0"], "max_new_tokens"),
    (["--prompt", "x", "--method", "meta", "--checkpoint", "meta-k3", "--k", "5"], "at most 3"),
    (["--prompt", "x", "--method", "blockwise", "--checkpoint", "meta-k3"], "needs a checkpoint with stern heads"),
    (["--prompt", "x", "--method", "teleport"], "unknown method"),
    (["--prompt", "x", "--checkpoint", "nope"], "not found"),
])
def test_generate_errors(ckdir, args, msg):
    r = gen(ckdir, *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert msg in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_non_utf8_prompt_file(ckdir, tmp_path):
    f = tmp_path / "p.txt"
    f.write_bytes(b"def f(\xff\xfe):")
    r = gen(ckdir, "--prompt-file", str(f))
    assert r.returncode == 2 and "not valid UTF-8" in r.stderr
    f.write_bytes("déf".encode())
    r = gen(ckdir, "--prompt-file", str(f), "--max-new-tokens", "3")
    assert r.returncode == 0, r.stderr


def test_corrupt_checkpoint_via_cli(ckdir, tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes((ckdir / "ntp.safetensors").read_bytes()[:1000])
    (tmp_path / "bad.json").write_text((ckdir / "ntp.json").read_text())
    r = gen(ckdir, "--prompt", "x", "--checkpoint", str(bad))
    assert r.returncode == 2 and "corrupt or truncated" in r.stderr
