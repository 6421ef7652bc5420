import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from mtplab.errors import MtplabError
from mtplab import files
from mtplab.model import checkpoint as ckpt
from mtplab.model.config import preset
from mtplab.model.gpt import GPT
from mtplab.training.fit import fit
from mtplab.training.steps import lr_at

TINY = dict(preset="tiny", batch_size=2, progress=False, device="cpu")


def weights(path):
    return load_file(str(path))


def test_history_and_checkpoint(tmp_path):
    hist = fit(steps=6, out=tmp_path, eval_every=3, eval_windows=4, **TINY)
    assert [h["step"] for h in hist] == [3, 6]
    assert all(h["val_bpb"] > 0 and len(h["val_acc_depth"]) == 1 for h in hist)
    m = ckpt.load(tmp_path / "ntp")
    assert isinstance(m, GPT) and not m.training
    info = json.loads((tmp_path / "ntp.json").read_text())
    assert info["config"]["n_embd"] == preset("tiny").n_embd and info["meta"]["tokens"] == 6 * 2 * 128


def test_deterministic_for_a_seed(tmp_path):
    fit(steps=4, out=tmp_path / "a", seed=3, eval_windows=2, **TINY)
    fit(steps=4, out=tmp_path / "b", seed=3, eval_windows=2, **TINY)
    fit(steps=4, out=tmp_path / "c", seed=4, eval_windows=2, **TINY)
    a, b, c = (weights(tmp_path / d / "ntp.safetensors") for d in "abc")
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not all(torch.equal(a[n], c[n]) for n in a)


@pytest.mark.parametrize("heads,k", [("none", 1), ("meta", 3), ("deepseek", 2)])
def test_killed_and_resumed_equals_uninterrupted(tmp_path, heads, k):
    kw = dict(steps=8, seed=1, heads=heads, n_depths=k + (heads == "deepseek"), eval_every=4, eval_windows=2, dropout=0.1, **TINY)
    fit(out=tmp_path / "whole", **kw)
    fit(out=tmp_path / "cut", stop_after=5, **kw)   # the run is killed after step 5
    hist = fit(out=tmp_path / "cut", resume=True, **kw)
    assert hist[-1]["step"] == 8
    name = {"none": "ntp", "meta": "meta-k3", "deepseek": "deepseek-d2"}[heads]
    a = weights(tmp_path / "whole" / f"{name}.state.safetensors")
    b = weights(tmp_path / "cut" / f"{name}.state.safetensors")
    ws = [n for n in a if n.startswith("__w__.")]
    assert ws and all(torch.equal(a[n], b[n]) for n in ws)


def test_frozen_trunk_trains_only_heads_and_saves_only_heads(tmp_path):
    fit(steps=3, out=tmp_path, eval_windows=2, **TINY)
    fit(steps=3, out=tmp_path, heads="stern", n_depths=3, freeze_trunk=True, from_checkpoint=tmp_path / "ntp",
        eval_windows=2, batch_size=2, progress=False, device="cpu")
    heads_only = weights(tmp_path / "stern-k3.safetensors")
    assert heads_only and all(n.startswith("mtp.") for n in heads_only)
    base, full = ckpt.load(tmp_path / "ntp"), ckpt.load(tmp_path / "stern-k3")
    for n, t in base.state_dict().items():
        assert torch.equal(t, full.state_dict()[n]), n  # the trunk did not move
    info = json.loads((tmp_path / "stern-k3.json").read_text())
    assert info["base"]["sha256"] == files.sha256(tmp_path / "ntp.safetensors")


def test_base_changed_under_heads_is_caught(tmp_path):
    fit(steps=2, out=tmp_path, eval_windows=2, **TINY)
    fit(steps=2, out=tmp_path, heads="deepseek", n_modules=1, freeze_trunk=True, from_checkpoint=tmp_path / "ntp",
        eval_windows=2, batch_size=2, progress=False, device="cpu")
    fit(steps=3, out=tmp_path, seed=9, eval_windows=2, overwrite=True, **TINY)  # retrain the base in place
    with pytest.raises(MtplabError, match="different ntp.safetensors"):
        ckpt.load(tmp_path / "deepseek-d1")


def test_lr_schedule_warms_up_and_decays():
    lrs = [lr_at(s, 100, 1.0, 10) for s in range(100)]
    assert lrs[0] < lrs[9] == 1.0 and lrs[-1] < 0.15 and min(lrs[10:]) >= 0.1


@pytest.mark.parametrize("kw,msg", [
    (dict(preset="huge"), "unknown preset"),
    (dict(corpus="poems"), "unknown corpus"),
    (dict(steps=0), "steps must be a positive"),
    (dict(heads="meta", n_depths=0), "needs --depths >= 2"),
    (dict(heads="deepseek", n_modules=0), "--modules must be >= 1"),
    (dict(heads="stern", n_modules=2), "--modules .D. is for --heads deepseek"),
    (dict(heads="deepseek", n_modules=2, n_depths=2), "D=2 modules means K=3 depths"),
    (dict(heads="medusa", n_depths=2), "unknown head family"),
    (dict(heads="deepseek", n_modules=1, lam=-0.5), "lambda must be >= 0"),
    (dict(heads="stern", n_depths=3, freeze_trunk=True), "needs --from"),
])
def test_bad_training_input(tmp_path, kw, msg):
    args = dict(TINY, steps=2, out=tmp_path) | kw
    with pytest.raises(MtplabError, match=msg):
        fit(**args)


def test_heads_from_a_headed_checkpoint_is_refused(tmp_path):
    fit(steps=2, out=tmp_path, heads="stern", n_depths=2, eval_windows=2, **TINY)
    with pytest.raises(MtplabError, match="already has stern heads"):
        fit(steps=2, out=tmp_path, heads="meta", n_depths=2, freeze_trunk=True, from_checkpoint=tmp_path / "stern-k2",
            batch_size=2, progress=False, device="cpu")


# ---- checkpoints: corrupt, truncated, mismatched, missing, failed writes ---------------------------
@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    m = GPT(preset("tiny"))
    return m, ckpt.save(m, tmp_path / "m")


def test_roundtrip(saved):
    m, path = saved
    x = torch.randint(0, 256, (1, 9))
    assert torch.allclose(ckpt.load(path)(x).logits, m.eval()(x).logits, atol=1e-6)


def test_truncated_checkpoint(saved):
    _, path = saved
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(MtplabError, match="corrupt or truncated"):
        ckpt.load(path)


def test_garbage_checkpoint(saved):
    _, path = saved
    path.write_bytes(b"\x00\x01not a safetensors file")
    with pytest.raises(MtplabError, match="corrupt or truncated"):
        ckpt.load(path)


def test_config_weights_mismatch(saved):
    _, path = saved
    from dataclasses import replace
    with pytest.raises(MtplabError, match="does not match the weights"):
        ckpt.load(path, config=replace(preset("tiny"), n_embd=96, n_head=2))
    with pytest.raises(MtplabError, match="does not match the weights"):
        ckpt.load(path, config=preset("tiny").with_heads("meta", 3))


def test_missing_checkpoint_names_the_shipped_ones(tmp_path):
    with pytest.raises(MtplabError, match="not found"):
        ckpt.load(tmp_path / "nope")
    with pytest.raises(MtplabError, match="not found"):
        ckpt.load("no-such-checkpoint")


def test_failed_write_leaves_old_checkpoint_intact(saved, monkeypatch):
    m, path = saved
    before = path.read_bytes()

    def dies_half_way(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"partial")
        raise OSError("disk full")
    monkeypatch.setattr(ckpt, "save_file", dies_half_way)
    with torch.no_grad():
        m.wte.weight.add_(1.0)
    with pytest.raises(MtplabError, match="cannot write the checkpoint .*disk full"):
        ckpt.save(m, path)
    assert path.read_bytes() == before
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


# ---- command line ---------------------------------------------------------------------------------
def cli(*args, input_file=None):
    return subprocess.run([sys.executable, "-m", "mtplab", *args], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})


def test_cli_train_and_errors(tmp_path):
    r = cli("train", "--preset", "tiny", "--steps", "2", "--batch-size", "2", "--out", str(tmp_path), "--no-progress")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "ntp.safetensors").exists()
    for args, msg in [(["--steps", "0"], "steps must be"), (["--steps", "2", "--preset", "huge"], "unknown preset"),
                      (["--steps", "2", "--heads", "stern", "--freeze-trunk"], "needs --from")]:
        r = cli("train", "--out", str(tmp_path), "--no-progress", *args)
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_self_labels_score_each_depth_against_the_targets_own_row():
    """Depth d at position i is scored against the target's logits at row i+d-1 (it predicts token i+d)."""
    from mtplab.training.losses import self_distill_cross_entropies

    torch.manual_seed(0)
    B, T, K, V = 2, 12, 3, 11
    target = torch.randn(B, T, V) * 3
    perfect = torch.zeros(B, T, K, V)
    for d in range(1, K + 1):  # a perfect depth d copies the target row i+d-1 (large scale: a sharp copy)
        perfect[:, :T - d + 1, d - 1] = target[:, d - 1:] * 50
    off_by_one = torch.zeros(B, T, K, V)
    for d in range(1, K + 1):
        off_by_one[:, :T - d + 1, d - 1] = torch.roll(target, 1, dims=1)[:, d - 1:] * 50
    hard_perfect = self_distill_cross_entropies(perfect, target, hard=True)
    hard_shifted = self_distill_cross_entropies(off_by_one, target, hard=True)
    assert all(float(x) < 1e-3 for x in hard_perfect)
    assert all(float(x) > 1.0 for x in hard_shifted[1:])
    # soft labels: the cross-entropy is smallest (the target's entropy) when depth d equals row i+d-1 exactly
    exact = torch.zeros(B, T, K, V)
    for d in range(1, K + 1):
        exact[:, :T - d + 1, d - 1] = target[:, d - 1:]
    soft = self_distill_cross_entropies(exact, target)
    ent = [float(-(torch.softmax(target[:, d - 1:], -1) * torch.log_softmax(target[:, d - 1:], -1)).sum(-1).mean())
           for d in range(1, K + 1)]
    assert [round(float(s), 5) for s in soft] == [round(e, 5) for e in ent]
    with pytest.raises(MtplabError, match="target logits must be"):
        self_distill_cross_entropies(exact, target[:, 1:])


@pytest.mark.parametrize("heads,k", [("stern", 3), ("meta", 3), ("deepseek", 3)])
@pytest.mark.parametrize("labels", ["self", "self-argmax"])
def test_self_labelled_train_step_is_the_distillation_loss(heads, k, labels):
    """Each family's training step with self labels computes mean over depths d >= 2 of the cross-entropy
    between depth d at position i and the frozen target's row i+d-1 (its soft distribution or argmax)."""
    from mtplab.model.toy import random_model
    from mtplab.training.steps import train_step

    model = random_model(vocab_size=32, seed=5, noise=1.0, heads=heads, n_depths=k, n_layer=2, n_head=2, n_embd=32,
                         block_size=64)
    x = torch.randint(0, 32, (3, 21), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model.depth_logits(x[:, :-1])  # (B, T, K, V)
    T = logits.shape[1]
    want = []
    for d in range(2, k + 1):
        student, teacher = logits[:, :T - d + 1, d - 1], logits[:, d - 1:, 0]
        label = teacher.argmax(-1) if labels == "self-argmax" else torch.softmax(teacher, -1)
        want.append(torch.nn.functional.cross_entropy(student.reshape(-1, 32), label.reshape(-1, *label.shape[2:])))
    for n, p in model.named_parameters():
        p.requires_grad_(n.startswith("mtp."))
    got = train_step(model, x, freeze_trunk=True, lam=0.3, labels=labels)
    assert got == pytest.approx(float(torch.stack(want).mean()), rel=1e-5)


def test_self_labelled_run_records_its_labels_and_agreement(tmp_path):
    fit(steps=3, out=tmp_path, eval_windows=2, **TINY)
    hist = fit(steps=2, out=tmp_path / "self", heads="stern", n_depths=3, freeze_trunk=True, labels="self",
               from_checkpoint=tmp_path / "ntp", eval_windows=2, batch_size=2, progress=False, device="cpu")
    assert len(hist[-1]["val_agree_depth"]) == 3 and hist[-1]["val_agree_depth"][0] == 1.0
    assert json.loads((tmp_path / "self" / "stern-k3.json").read_text())["meta"]["labels"] == "self"


def test_self_labels_need_a_frozen_target(tmp_path):
    with pytest.raises(MtplabError, match="needs --freeze-trunk"):
        fit(steps=2, out=tmp_path, heads="stern", n_depths=2, labels="self", **TINY)
    with pytest.raises(MtplabError, match="unknown labels"):
        fit(steps=2, out=tmp_path, labels="teacher", **TINY)
    with pytest.raises(MtplabError, match="unknown autocast"):
        fit(steps=2, out=tmp_path, autocast="fp8", **TINY)


def test_optimizer_state_round_trips_through_safetensors_with_amsgrad(tmp_path):
    """The resume state is the optimizer's own state_dict() without pickle: amsgrad's extra buffer survives, and
    the next step after a restore equals the next step of the optimizer that never stopped."""
    from safetensors.torch import load_file, save_file

    from mtplab.training import runs

    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4, 3))
    opt = torch.optim.AdamW([w], lr=0.1, amsgrad=True)
    for _ in range(3):
        (w ** 2).sum().backward()
        opt.step()
        opt.zero_grad()
    tensors, scalars = runs._opt_tensors(opt)
    assert any(k.endswith("max_exp_avg_sq") for k in tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, tmp_path / "opt.safetensors")
    w2 = torch.nn.Parameter(w.detach().clone())
    opt2 = torch.optim.AdamW([w2], lr=0.1, amsgrad=True)
    runs._load_opt(opt2, load_file(tmp_path / "opt.safetensors"), json.loads(json.dumps(scalars)))
    for o, p in ((opt, w), (opt2, w2)):
        (p ** 2).sum().backward()
        o.step()
    assert torch.equal(w, w2)
    assert torch.equal(opt.state[w]["max_exp_avg_sq"], opt2.state[w2]["max_exp_avg_sq"])
