"""The regime lesson's pieces: `deepen` keeps the function, the regime measurements report what they measure,
and every record names its machine. Timings here are not read by anyone (speed is measured in benchmarks)."""
import pytest
import torch

from mtplab.decoding.generate import decode_with, max_k
from mtplab.device import machine, machine_line
from mtplab.errors import MtplabError
from mtplab.measuring.regime import cost_by_size, speedup_by_depth, weight_bytes
from mtplab.model.gpt import deepen, deepen_plan
from mtplab.training.fit import fit
from mtplab.training.steps import evaluate
from tests.conftest import random_model

METHODS = {"none": "ar", "stern": "blockwise-overlap", "meta": "meta", "deepseek": "deepseek"}


def test_deepen_plan_spreads_new_blocks_below_the_last_layer():
    assert deepen_plan(4, 12) == [0, None, None, None, 1, None, None, None, 2, None, None, 3]
    assert deepen_plan(4, 4) == [0, 1, 2, 3]
    plan = deepen_plan(3, 10)
    assert plan[-1] == 2 and plan.count(None) == 7 and [p for p in plan if p is not None] == [0, 1, 2]
    with pytest.raises(MtplabError, match="n_layer >= 4"):
        deepen_plan(4, 2)


@pytest.mark.parametrize("family", ["none", "stern", "meta", "deepseek"])
def test_deepen_keeps_every_depths_logits_and_greedy_output_bit_identical(family):
    model = random_model(family, 1 if family == "none" else 4, seed=5, n_layer=3).eval()
    grown = deepen(model, 8).eval()
    assert grown.config.n_layer == 8 and grown.num_params() > model.num_params()
    x = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model.depth_logits(x), grown.depth_logits(x))
    method = METHODS[family]
    prompt = [1, 2, 3, 4, 5]
    for name in {"ar", method}:
        k = max_k(name, model) if name != "ar" else None
        a = decode_with(name, model, prompt, max_new_tokens=30, k=k)
        b = decode_with(name, grown, prompt, max_new_tokens=30, k=k)
        assert a.tokens == b.tokens
        if name != "ar":
            assert a.num_accepted_tokens == b.num_accepted_tokens  # acceptance does not move


def test_deepen_is_not_a_copy_of_the_old_blocks():
    """The new blocks are identity only through their zero output projections: a broken deepen that skipped
    the zeroing would change the logits (this is the control for the test above)."""
    model = random_model(seed=6, n_layer=2).eval()
    grown = deepen(model, 4)
    new = [i for i, src in enumerate(deepen_plan(2, 4)) if src is None]
    with torch.no_grad():
        grown.blocks[new[0]].mlp.proj.weight.normal_()
        x = torch.randint(0, 256, (1, 20))
        assert not torch.equal(model(x).logits, grown.eval()(x).logits)


def test_training_from_the_grown_model_starts_at_the_old_loss(tmp_path):
    from mtplab.data import load_corpus, val_windows
    from mtplab.model import checkpoint as ckpt

    fit(preset="tiny", steps=2, out=tmp_path, name="base", batch_size=2, eval_windows=2, progress=False, device="cpu")
    base = ckpt.load(tmp_path / "base")
    windows = val_windows(load_corpus("code", "val"), base.config.block_size, 4)
    before = evaluate(base, windows)["val_bpb"]
    assert evaluate(deepen(base, 5), windows)["val_bpb"] == pytest.approx(before, abs=1e-6)
    hist = fit(preset="tiny", steps=1, out=tmp_path, name="grown", from_checkpoint=tmp_path / "base", deepen=5,
               batch_size=2, eval_windows=4, progress=False, device="cpu", lr=1e-9, warmup=0)
    assert hist[-1]["val_bpb"] == pytest.approx(before, abs=1e-3)
    assert ckpt.load(tmp_path / "grown").config.n_layer == 5


def test_deepen_asks_for_a_trained_trunk():
    with pytest.raises(MtplabError, match="--deepen N grows a trained trunk"):
        fit(preset="tiny", steps=1, deepen=4, progress=False)


def test_cost_by_size_reports_weight_bytes_against_the_cache():
    rows = cost_by_size([(1, 32), (2, 64)], qs=(1, 2), context=16, repeats=1)
    assert [(r["n_layer"], r["n_embd"]) for r in rows] == [(1, 32), (2, 64)]
    for r in rows:
        assert r["weight_bytes"] > 0 and r["t1_ms"] > 0 and set(r["ratio"]) == {"1", "2"}
        assert r["fits_in_llc"] == bool(r["llc_bytes"] and r["weight_bytes"] <= r["llc_bytes"])
    assert rows[1]["weight_bytes"] > rows[0]["weight_bytes"]
    with pytest.raises(MtplabError, match="n_layer >= 1"):
        cost_by_size([(0, 32)])


def test_speedup_by_depth_keeps_the_output_and_the_acceptance():
    model = random_model("stern", 4, seed=7, n_layer=2).eval()
    rows = speedup_by_depth({"stern": ("blockwise-overlap", model)}, [[1, 2, 3], [4, 5]], (2, 4),
                            max_new_tokens=12, repeats=1)
    assert [r["n_layer"] for r in rows] == [2, 4]
    assert all(r["identical"] == r["prompts"] == 2 for r in rows)
    assert rows[0]["tokens_per_forward"] == rows[1]["tokens_per_forward"]
    assert weight_bytes(deepen(model, 4)) > weight_bytes(model)


def test_every_record_names_its_machine():
    m = machine("cpu")
    assert {"cpu", "cores", "threads", "llc", "llc_bytes", "torch", "device"} <= set(m)
    assert m["torch"] == torch.__version__ and m["threads"] == torch.get_num_threads()
    line = machine_line("cpu")
    assert m["cpu"] in line and "torch" in line and "last-level cache" in line


def test_a_timing_names_which_cpu_generation_ran_it():
    """A VM's "AMD EPYC" names Zen 3 and Zen 4 alike (threefold apart): the family, model and vector units go with it."""
    from mtplab.device import cpu_words
    zen4 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n" \
           "flags\t\t: fpu avx2 avx512f avx512_bf16\n\nprocessor\t: 1\nmodel name\t: AMD EPYC\n"
    zen3 = zen4.replace("model\t\t: 17", "model\t\t: 1").replace(" avx512f avx512_bf16", "")
    assert cpu_words(zen4) == "AMD EPYC (family 25 model 17; AVX-512, bf16)"
    assert cpu_words(zen3) == "AMD EPYC (family 25 model 1; AVX2)"
    xeon = ("cpu family\t: 6\nmodel\t\t: 143\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
            "flags\t: avx2 avx512f avx512_bf16 amx_tile\n")
    assert cpu_words(xeon).endswith("(family 6 model 143; AVX-512, bf16, AMX)")
    assert cpu_words("model name\t: Some CPU\n") == "Some CPU" and cpu_words("") is None
