"""torchrun with 2 CPU processes (gloo on 127.0.0.1) matches one process at the same global batch."""
import os
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("heads,k", [("none", 1), ("meta", 3)])
def test_two_processes_match_one(tmp_path, heads, k):
    args = ["train", "--preset", "tiny", "--steps", "3", "--batch-size", "4", "--heads", heads, "--depths", str(k),
            "--device", "cpu", "--no-progress", "--seed", "5", "--eval-every", "3",
            "--autocast", "off"]  # fp32: exact enough to compare
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, "-m", "mtplab", *args, "--out", str(tmp_path / "one")],
                         capture_output=True, text=True, env=env, timeout=600)
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
                          "-m", "mtplab", *args, "--out", str(tmp_path / "two")],
                         capture_output=True, text=True, env=env, timeout=600)
    assert two.returncode == 0, two.stderr[-3000:]
    name = "ntp" if heads == "none" else f"{heads}-k{k}"
    a = load_file(str(tmp_path / "one" / f"{name}.state.safetensors"))
    b = load_file(str(tmp_path / "two" / f"{name}.state.safetensors"))
    ws = [n for n in a if n.startswith("__w__.")]
    assert ws
    worst = max((a[n] - b[n]).abs().max().item() for n in ws)
    assert worst < 1e-5, worst
    from mtplab.model.gpt import GPT
    from mtplab.model.config import preset
    torch.manual_seed(5)
    init = GPT(preset("tiny").with_heads(heads, k)).state_dict()
    assert max((a[n] - init[n[len("__w__."):]]).abs().max().item() for n in ws) > 1e-3  # training moved them


def test_batch_must_split_evenly(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
                        "-m", "mtplab", "train", "--preset", "tiny", "--steps", "2", "--batch-size", "3",
                        "--device", "cpu", "--no-progress", "--out", str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode != 0 and "multiple of the 2 processes" in (r.stderr + r.stdout)
