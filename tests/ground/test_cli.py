"""The generate command line: output fields and one-line errors (exit 2, no traceback)."""
import json
import os
import subprocess
import sys

import pytest

from mtplab.model import checkpoint as ckpt
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
    (["--prompt", "x", "--method", "meta", "--checkpoint", "meta-k3", "--k", "5"], "use k <= 3"),
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


# ---- issue 15: one line, never a traceback ----------------------------------------------------------
def run(*args, env=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "mtplab", *args], capture_output=True, env=env, timeout=300)


def one_line(r, msg):
    err = r.stderr.decode()
    assert r.returncode == 2, (r.stdout, err)
    assert msg in err and "Traceback" not in err and err.count("\n") == 1, err


def test_invalid_utf8_prompt(ckdir):
    r = run("generate", "--prompt", b"def f(\xff\xfe):", env={"MTPLAB_CHECKPOINTS": str(ckdir)})
    one_line(r, "--prompt is not valid UTF-8 (character 6)")


def test_prompt_file_is_read_only_as_far_as_a_context_window(ckdir):
    r = run("generate", "--prompt-file", "/dev/zero", env={"MTPLAB_CHECKPOINTS": str(ckdir)})
    one_line(r, "prompt file /dev/zero is longer than 65536 bytes")


@pytest.mark.parametrize("args,msg", [
    (["--k", "3"], "--k is tokens per step of a speculative method; --method ar makes one token a forward"),
    (["--confidence-stop", "0.3"], "--confidence-stop ends the drafts of a speculative method's step; --method ar "
                                   "drafts nothing"),
    (["--method", "meta", "--confidence-stop", "1.5"], "--confidence-stop is a probability in (0, 1] (got 1.5)"),
    (["--method", "ngram", "--confidence-stop", "0.3"], "--confidence-stop reads the heads' own confidence; --method "
                                                        "ngram drafts without heads and reports none"),
    (["--method", "ngram", "--k", "1000000"], "k=1000000 tokens per step cannot fit the context window of 128; "
                                              "use k <= 126"),
    (["--method", "ngram", "--k", "1", "--max-new-tokens", "125"],
     "prompt (3 tokens) plus 125 new tokens plus k=1 tokens of one step exceeds the context window of 128; "
     "shorten the prompt to at most 2 tokens"),
    (["--max-new-tokens", "128"], "128 new tokens leave no room for a prompt in the context window of 128; "
                                  "ask for at most 127 new tokens"),
])
def test_messages_say_what_was_asked(ckdir, args, msg):
    one_line(run("generate", "--prompt", "abc", *args, env={"MTPLAB_CHECKPOINTS": str(ckdir)}), msg)


def test_json_writes_null_not_nan(monkeypatch, capsys):
    from mtplab import cli

    monkeypatch.setattr(cli, "run_generate", lambda **kw: {"text": "x", "acceptance": [float("nan"), 1.0],
                                                                 "rate": float("inf")})
    assert cli.main(["generate", "--prompt", "x", "--json"]) == 0

    def strict(c):
        raise ValueError(f"not strict JSON: {c}")
    d = json.loads(capsys.readouterr().out, parse_constant=strict)
    assert d == {"text": "x", "acceptance": [None, 1.0], "rate": None}


@pytest.mark.parametrize("args,env,msg", [
    (["--batch-size", "0"], {}, "--batch-size must be an integer >= 1 (got 0)"),
    (["--lr", "nan"], {}, "--lr must be a finite number > 0 (got nan)"),
    (["--dropout", "2"], {}, "--dropout must be a finite number in [0, 1) (got 2.0)"),
    (["--name", "../../x"], {}, "--name '../../x' must be a plain file stem"),
    ([], {"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc' is not an integer"),
])
def test_train_numbers_out_of_range(tmp_path, args, env, msg):
    one_line(run("train", "--preset", "tiny", "--steps", "2", "--out", str(tmp_path), "--no-progress", *args,
                 env=env), msg)
    assert not list(tmp_path.iterdir())


def test_seed_that_is_not_an_integer_is_a_usage_error(tmp_path):
    r = run("train", "--preset", "tiny", "--steps", "2", "--out", str(tmp_path), "--seed", "1e30")
    assert r.returncode == 2 and b"invalid int value: '1e30'" in r.stderr and b"Traceback" not in r.stderr


def test_train_out_checks(tmp_path):
    common = ["train", "--preset", "tiny", "--steps", "2", "--batch-size", "2", "--no-progress"]
    f = tmp_path / "f"
    f.write_text("x")
    one_line(run(*common, "--out", str(f)), "is a file, not a directory; choose a directory")
    one_line(run(*common, "--out", str(f / "x")), "cannot write to --out")
    one_line(run(*common, "--out", "/proc/x"), "cannot write to --out /proc/x")
    assert run(*common, "--out", str(tmp_path / "r")).returncode == 0
    one_line(run(*common, "--out", str(tmp_path / "r")), "already holds a run 'ntp'")
    assert run(*common, "--out", str(tmp_path / "r"), "--overwrite").returncode == 0
    one_line(run(*common, "--out", str(tmp_path / "r"), "--resume", "--heads", "stern", "--depths", "2",
                 "--name", "ntp"), "with other settings (heads 'none' -> 'stern'")


def test_sigint_during_training_says_how_to_resume(tmp_path):
    import signal
    import time

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-m", "mtplab", "train", "--preset", "tiny", "--steps", "100000",
                          "--batch-size", "2", "--eval-every", "1", "--out", str(tmp_path), "--no-progress"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    deadline = time.time() + 120
    while not (tmp_path / "ntp.state.json").exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    err = err.decode()
    assert p.returncode == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert "interrupted at step" in err and "the last complete save is step" in err and "--resume" in err, err


def test_a_draft_models_smaller_window_is_named_as_the_drafts(ckdir, tmp_path):
    ckpt.save(random_model(seed=6, n_embd=16, block_size=32), tmp_path / "short")
    r = run("generate", "--method", "draft-model", "--checkpoint", "ntp", "--draft-checkpoint", str(tmp_path / "short"),
            "--prompt", "abc", "--max-new-tokens", "40", env={"MTPLAB_CHECKPOINTS": str(ckdir)})
    one_line(r, "the draft model's context window (32) is smaller than the target's (128): the prompt (3 tokens) "
                "plus 40 new tokens plus k=4 do not fit it")


def test_generate_help_names_every_method():
    """The --method help was a hand-written list that left out deepseek-reuse, the real model's fastest method."""
    from mtplab.cli import build_parser
    from mtplab.decoding.drafters import METHODS
    sub = next(a for a in build_parser()._actions if a.choices and "generate" in a.choices).choices["generate"]
    text = next(a.help for a in sub._actions if "--method" in a.option_strings)
    assert set(METHODS) <= set(text.replace("|", " ").split())
