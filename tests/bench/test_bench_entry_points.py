"""Every classroom benchmark runs end to end on a tiny setting (random models stand in for the checkpoints; nothing
timed here is read by anyone): `bench k` (its loop once unpacked `Pair` by position and broke when the pair grew
fields) and `bench regime`. `bench batch` and `bench tree` run in tests/decoding/test_batched.py, `bench decode` in
tests/measuring/test_speedup.py. Each record names its machine and its kernel."""
import argparse
import json

import torch

from mtplab import bench
from mtplab.decoding.drafters import METHODS, pair
from tests.conftest import random_model


def _fake_load(meth, checkpoint=None, *, device="auto", dtype="fp32"):
    fam = METHODS[meth].family
    model = (random_model(fam, 2 if fam == "deepseek" else 4, seed=1, block_size=160) if fam  # D = 1; k = 4
             else random_model(block_size=160))  # the cost curve sits on 128 cached tokens
    return model, checkpoint or f"random-{fam}", torch.device("cpu")


def _tiny_prompts(n, length=48):
    return [[1 + i, 2, 3, 4][: 2 + i % 3] for i in range(n)]


def test_bench_k_runs_on_a_tiny_grid_and_names_the_machine(tmp_path, monkeypatch):
    from mtplab.bench import engines

    sweep = [pair("blockwise-overlap"), pair("deepseek D=1 reused"), pair("ngram")]  # --quick: first two, last
    monkeypatch.setattr(engines, "SWEEP", sweep)
    monkeypatch.setattr(engines, "load_for", _fake_load)
    monkeypatch.setattr(engines, "held_out_ids", _tiny_prompts)
    a = argparse.Namespace(what="k", quick=True, json=True, device="cpu", dtype="fp32", out=str(tmp_path),
                           preset="tiny")
    bench.main(a)
    data = json.loads((tmp_path / "k-quick.json").read_text())
    assert (tmp_path / "k-quick.md").exists()
    # blockwise-overlap k = 2..4 (the stand-in has k = 4 heads), the D = 1 module reused k = 2..4, n-gram k = 2..4,
    # each with its two adaptive rows at its largest k
    assert [(r["label"], r["k"], r["adapt"]) for r in data["rows"]] == [
        (p.label, k, ad) for p in sweep for k, ad in
        [(2, "fixed"), (3, "fixed"), (4, "fixed"), (4, "schedule"), (4, "confidence")]]
    for r in data["rows"]:
        assert r["identical"] == r["prompts"] == 2  # greedy output equals AR's on every prompt
        assert r["speedup_min"] <= r["speedup"] <= r["speedup_max"]
        assert 1 <= r["tokens_per_step"] <= r["k"] and r["speedup_predicted"] > 0
    assert set(data["best"]) == {p.label for p in sweep}
    assert data["machine"]["threads"] == torch.get_num_threads() and data["kernel"] in ("exact", "stock")


def test_bench_regime_runs_on_a_tiny_setting(tmp_path, monkeypatch):
    from mtplab.bench import regime

    monkeypatch.setattr(regime, "QUICK_SHAPES", [(1, 32), (2, 32)])
    monkeypatch.setattr(regime.ckpt, "load", lambda name, device="cpu": random_model(
        "meta" if name.startswith("meta") else "stern", 4, seed=2) if name.startswith(("meta", "stern"))
        else random_model())
    monkeypatch.setattr(regime, "HEADS", {"blockwise-overlap": ("blockwise-overlap", "stern-k4-l4"),
                                          "meta": ("meta", "meta-k4-l4")})
    monkeypatch.setattr(regime, "held_out_ids", _tiny_prompts)
    a = argparse.Namespace(what="regime", quick=True, json=True, device="cpu", dtype="fp32", out=str(tmp_path),
                           preset="tiny")
    bench.main(a)
    data = json.loads((tmp_path / "regime-quick.json").read_text())
    assert [(r["n_layer"], r["n_embd"]) for r in data["by_size"]] == [(1, 32), (2, 32)]
    assert {(r["label"], r["n_layer"]) for r in data["by_depth"]} == {
        (label, n) for label in ("blockwise-overlap", "meta") for n in (4, 8)}
    assert all(r["identical"] == r["prompts"] for r in data["by_depth"])
    assert (tmp_path / "regime-quick.png").exists() and "last-level cache" in (tmp_path / "regime-quick.md").read_text()
    assert data["machine"]["cpu"] and data["kernel"] in ("exact", "stock")


def test_bench_train_runs_its_probe_in_a_fresh_process(monkeypatch):
    """`bench train` times each configuration in a process of its own, through a program given to `python -c`: that
    program's import once named a module that does not export the probe and failed in every process. The first
    configuration runs for real here (the tiny preset, two steps); the rest are not needed to show the program runs."""
    import subprocess

    import pytest

    from mtplab.bench import costs

    class Enough(Exception):
        pass

    real_run, seen = subprocess.run, []

    def first_only(cmd, **kw):
        if seen:
            raise Enough  # stop after the first configuration
        seen.append(cmd)
        return real_run(cmd, **kw)
    monkeypatch.setattr(costs.subprocess, "run", first_only)
    with pytest.raises(Enough):
        costs.run_train(argparse.Namespace(quick=True, preset="tiny", device="cpu", out=None))
    assert seen and "_train_probe" in seen[0][2]
