"""Bring your own model (mtplab.hf): tiny GPT-2 and Llama models built here, saved and loaded back by path.

Nothing downloads: the tokenizer is a small byte-level BPE trained on 8 KB of the shipped code corpus, the
models are randomly initialised 2-layer configs (initializer_range 0.2, so that their logits have clear argmaxes).
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from mtplab.cli import main as cli_main  # noqa: E402
from mtplab.decoding.drafters import METHODS  # noqa: E402
from mtplab.errors import MtplabError  # noqa: E402
from mtplab.decoding.generate import decode_with  # noqa: E402
from mtplab.hf.heads_file import load_heads, read_heads_info, save_heads  # noqa: E402
from mtplab.hf.target import load_hf, load_target  # noqa: E402
from mtplab.distill.live import train_heads  # noqa: E402
from mtplab.training.steps import train_step  # noqa: E402
from mtplab.training.losses import self_distill_cross_entropies  # noqa: E402
from tests.hf.reference import reference_generate  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
V = 320
PROMPT = "def main(x):\n    return"


def _tokenizer(vocab_size=V):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    text = (ROOT / "data" / "corpora" / "code_train.txt").read_text(encoding="utf-8")[:8000]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<eos>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def _gpt2(seed=0, n_layer=2):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=256, n_embd=64, n_layer=n_layer, n_head=4,
                                      initializer_range=0.2, bos_token_id=0, eos_token_id=0))


def _llama_config():
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                       initializer_range=0.2, bos_token_id=0, eos_token_id=0)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """gpt2, llama, gpt2-other (same config, other seed), draft (1-layer GPT-2), and the bad ones."""
    from transformers import LlamaForCausalLM, LlamaModel
    root = tmp_path_factory.mktemp("hf")
    tok = _tokenizer()
    torch.manual_seed(1)
    models = {"gpt2": _gpt2(0), "gpt2-other": _gpt2(5), "draft": _gpt2(2, n_layer=1),
              "llama": LlamaForCausalLM(_llama_config()), "llama-base": LlamaModel(_llama_config())}
    for name, m in models.items():
        m.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    _gpt2(0).save_pretrained(root / "big-tokenizer")
    _tokenizer(400).save_pretrained(root / "big-tokenizer")
    corpus = root / "corpus.txt"  # a few KB: tokenising the whole shipped corpus would dominate the test time
    corpus.write_text((ROOT / "data" / "corpora" / "code_train.txt").read_text(encoding="utf-8")[8000:14000])
    return root


@pytest.fixture(scope="module")
def targets(dirs):
    return {n: load_hf(dirs / n) for n in ("gpt2", "llama")}


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_greedy_equals_hf_generate_for_every_method(targets, dirs, arch):
    t = targets[arch]
    ids = t.encode(PROMPT)
    ref = reference_generate(t, ids, max_new_tokens=40)
    assert len(ref) == 40
    draft = load_hf(dirs / "draft")
    accepted = {}
    for fam in ("stern", "meta", "deepseek", None):
        if fam is not None:
            t.attach(fam, 4 if fam != "deepseek" else 3)  # untrained heads: exactness holds whatever they draft
        for name, m in METHODS.items():
            if m.family != fam:
                continue
            for k in ([None] if fam is not None else [1, 3, 5]) if name != "ar" else [None]:
                tr = decode_with(name, t, ids, max_new_tokens=40, k=k, draft_model=draft)
                assert tr.tokens == ref, (arch, name, k)
                accepted[name] = accepted.get(name, 0) + tr.num_accepted_tokens
    t.mtp = None
    t.config = t.config.with_heads("none", 1)
    assert accepted["oracle"] > 0  # drafts were accepted and rejected ones cropped, not only rejections


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_cache_crop_matches_recompute(targets, arch):
    t = targets[arch]
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(V, (1, 30), generator=g)
    with torch.no_grad():
        full = t(seq)
        cache = t.new_cache()
        t(seq[:, :20], cache)
        t(torch.randint(V, (1, 6), generator=g), cache)  # six drafts, all rejected
        assert cache.length == 26
        cache.crop(20)
        assert cache.length == 20
        tail = t(seq[:, 20:], cache)
    assert cache.length == 30
    torch.testing.assert_close(tail.logits, full.logits[:, 20:], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(tail.hidden, full.hidden[:, 20:], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(tail.pre_last, full.pre_last[:, 20:], atol=1e-5, rtol=1e-4)
    # hidden is the last layer's output before the final norm: unembed(hidden) gives the model's logits
    torch.testing.assert_close(t.unembed(full.hidden), full.logits, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch, kernel", [("gpt2", "exact"), ("llama", "exact"), ("llama", "stock")])
def test_the_context_window_is_one_line_on_either_forward(dirs, arch, kernel):
    """transformers' forward (GPT-2, or kernel='stock') and the lab's (Llama) refuse a call past the window in the
    same words as the classroom model, before the cache moves."""
    t = load_hf(dirs / arch, kernel=kernel)
    cache = t.new_cache()
    with torch.no_grad():
        t(torch.zeros(1, 250, dtype=torch.long), cache)
        for n, c, span in ((300, None, "0..299"), (7, cache, "250..256")):
            with pytest.raises(MtplabError, match=f"^positions {span} exceed the context window of 256; shorten the "
                                                  "prompt or ask for fewer new tokens$"):
                t(torch.zeros(1, n, dtype=torch.long), c)
    assert cache.length == 250


def _distill_loss(t, x):
    with torch.no_grad():
        logits = t.depth_logits(x[:, :-1])
        return sum(c.item() for c in self_distill_cross_entropies(logits, logits[:, :, 0])[1:])


@pytest.mark.parametrize("fam,depths", [("stern", 3), ("meta", 3), ("deepseek", 2)])
def test_heads_train_save_and_reload(dirs, fam, depths, tmp_path):
    t = load_hf(dirs / "gpt2")
    t.attach(fam, depths)
    x = torch.randint(V, (4, 33), generator=torch.Generator().manual_seed(1))
    before = _distill_loss(t, x)
    opt = torch.optim.AdamW(t.mtp.parameters(), lr=3e-3)
    for _ in range(15):  # the same batch: the self-distillation loss on it must go down
        train_step(t, x, freeze_trunk=True, lam=0.3, labels="self")
        opt.step()
        opt.zero_grad()
    assert not any(p.grad is not None for p in t.hf.parameters())  # the trunk stays frozen
    assert _distill_loss(t, x) < before
    hist = train_heads(t, heads=fam, n_depths=depths, corpus=str(dirs / "corpus.txt"), steps=3, batch_size=2,
                       seq_len=32, eval_windows=2)
    assert hist[-1]["step"] == 3 and len(hist[-1]["val_agree_depth"]) == depths
    path = save_heads(t, tmp_path / "heads", meta={"steps": 3})
    info = read_heads_info(path)
    assert info["heads"] == fam and info["base"]["name"] == "gpt2" and len(info["base"]["config_sha256"]) == 64
    assert all(n.startswith("mtp.") for n in info["tensors"])  # heads only: no trunk weights
    again = load_target(dirs / "gpt2", path)
    torch.testing.assert_close(again.depth_logits(x[:, :-1]), t.depth_logits(x[:, :-1]))


def test_bad_inputs(dirs, tmp_path):
    with pytest.raises(MtplabError, match="not a Hugging Face model directory"):
        load_hf(tmp_path)  # an empty folder
    with pytest.raises(MtplabError, match="not a Hugging Face model directory"):
        load_hf(dirs / "corpus.txt")
    with pytest.raises(MtplabError, match="LlamaModel, which has no causal LM head"):
        load_hf(dirs / "llama-base")
    with pytest.raises(MtplabError, match="tokenizer .* has 400 tokens but the model's output layer has 320"):
        load_hf(dirs / "big-tokenizer")
    t = load_hf(dirs / "gpt2").attach("stern", 3)
    path = save_heads(t, tmp_path / "stern")
    with pytest.raises(MtplabError, match="trained on another base model .*gpt2, a gpt2 with another config"):
        load_target(dirs / "llama", path)
    with pytest.raises(MtplabError, match="same config, other weights"):
        load_target(dirs / "gpt2-other", path)
    with pytest.raises(MtplabError, match="not found"):
        load_heads(load_hf(dirs / "gpt2"), tmp_path / "nothing")
    from mtplab.hf.run import run_hf_generate
    with pytest.raises(MtplabError, match="needs stern heads .* --heads-checkpoint"):
        run_hf_generate(hf=str(dirs / "gpt2"), method="blockwise", prompt="x")
    with pytest.raises(MtplabError, match="method meta needs meta heads, but stern.safetensors holds stern heads"):
        run_hf_generate(hf=str(dirs / "gpt2"), heads_checkpoint=path, method="meta", prompt="x")


@pytest.mark.parametrize("kw", [dict(steps=0), dict(lam=-1.0), dict(batch_size=0), dict(lr=float("nan")), dict(seed=-1),
                                dict(warmup=-1), dict(eval_windows=0), dict(save_every=0), dict(max_seconds=0.0),
                                dict(save_seconds=-1.0), dict(name="../x"), dict(resume=True, overwrite=True),
                                dict(n_depths=100)])
def test_train_hf_and_fit_check_the_loop_in_the_same_words(kw):
    """The options of the lab's one loop and run folder have one check (`training.config.check_loop`) for both trainers."""
    from mtplab.distill.live import check_train_options
    from mtplab.training.config import TrainConfig, check
    with pytest.raises(MtplabError) as lab:
        check(TrainConfig(heads="stern", **kw))
    with pytest.raises(MtplabError) as hf:
        check_train_options(heads="stern", **kw)
    assert str(hf.value) == str(lab.value)


def _cli(capsys, *args):
    rc = cli_main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_train_and_generate(dirs, tmp_path, capsys):
    rc, out, err = _cli(capsys, "train", "--hf", dirs / "llama", "--heads", "deepseek", "--modules", "1",
                        "--steps", "2", "--batch-size", "2", "--seq-len", "32", "--corpus", dirs / "corpus.txt",
                        "--out", tmp_path, "--json")
    assert rc == 0, err
    ck = json.loads(out)["checkpoint"]
    assert Path(ck).name == "deepseek-d1.safetensors"
    t = load_hf(dirs / "llama")
    ref = reference_generate(t, t.encode(PROMPT), max_new_tokens=16)
    for method in ("deepseek", "ngram", "ar"):
        heads = ["--heads-checkpoint", ck] if method == "deepseek" else []  # ngram and ar use none (refused)
        rc, out, err = _cli(capsys, "generate", "--hf", dirs / "llama", *heads, "--method",
                            method, "--prompt", PROMPT, "--max-new-tokens", "16", "--json")
        assert rc == 0, err
        res = json.loads(out)
        assert res["tokens"] == ref and res["text"] == t.decode(ref)  # the model's own ids and tokenizer
    rc, out, err = _cli(capsys, "generate", "--hf", dirs / "gpt2", "--heads-checkpoint", ck, "--method",
                        "deepseek", "--prompt", PROMPT, "--json")
    assert rc == 2 and "another base model" in err and err.count("\n") == 1
    rc, out, err = _cli(capsys, "generate", "--hf", tmp_path / "nowhere", "--prompt", PROMPT)
    assert rc == 2 and "not a Hugging Face model directory" in err


def test_cli_flags_that_do_not_go_together(dirs, tmp_path, capsys):
    rc, _, err = _cli(capsys, "generate", "--heads-checkpoint", tmp_path / "h", "--prompt", "x")
    assert rc == 2 and "go with --hf PATH" in err
    rc, _, err = _cli(capsys, "generate", "--hf", dirs / "gpt2", "--checkpoint", "ntp", "--prompt", "x")
    assert rc == 2 and "drop --checkpoint" in err
    rc, _, err = _cli(capsys, "train", "--hf", dirs / "gpt2", "--from", "ntp", "--heads", "stern", "--steps", "1",
                      "--out", tmp_path)
    assert rc == 2 and "drop --from" in err
    rc, _, err = _cli(capsys, "train", "--hf", dirs / "gpt2", "--steps", "1", "--out", tmp_path)
    assert rc == 2 and "choose --heads stern, meta or deepseek" in err


def test_token_labels(targets):
    t = targets["gpt2"]
    ids = t.encode("def f(x):\n    return x")
    assert "".join(t.token_repr(i) for i in ids) == "def␣f(x):\\n␣␣␣␣return␣x"


def test_sampling_runs_and_is_seeded(targets, dirs):
    t, draft = targets["llama"], load_hf(dirs / "draft")
    ids = t.encode(PROMPT)
    runs = [decode_with("draft-model", t, ids, max_new_tokens=20, k=3, temperature=1.0, seed=s, draft_model=draft)
            for s in (0, 0, 1)]
    assert runs[0].tokens == runs[1].tokens and all(0 <= i < V for i in runs[2].tokens)
    assert len(runs[2].tokens) == 20 and runs[0].num_draft_tokens > 0


def test_without_transformers_the_error_names_the_extra(dirs, monkeypatch):
    import mtplab.hf.target
    monkeypatch.setattr(mtplab.hf.target, "transformers", None)
    with pytest.raises(MtplabError, match=r'pip install -e "\.\[hf\]"'):
        load_hf(dirs / "gpt2")


def test_core_does_not_import_transformers():
    code = ("import sys, mtplab, mtplab.cli, mtplab.decoding.generate, mtplab.training.fit, mtplab.decoding.drafters, "
            "mtplab.decoding.loop; "
            "assert 'transformers' not in sys.modules, 'core imported transformers'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr


def test_the_acceptance_lab_takes_a_hugging_face_folder_and_its_heads(dirs, tmp_path):
    """The notebook-05 lab decodes your own model: checkpoint=<HF folder>, heads=<heads file>. Its output is the
    model's own greedy output, and the chips are labelled with the model's own tokens."""
    from mtplab.teaching.acceptance_lab.session import ModelCache, decoded
    from mtplab.teaching.acceptance_lab.state import LabState, configure, run_all

    t = load_hf(dirs / "gpt2")
    t.attach("stern", 3)
    heads = save_heads(t, tmp_path / "stern")
    ref = reference_generate(load_hf(dirs / "gpt2"), load_hf(dirs / "gpt2").encode(PROMPT), max_new_tokens=12)
    models = ModelCache()
    for method, extra in (("blockwise-overlap", {"heads": str(heads)}), ("ngram", {})):
        st = run_all(decoded(configure(LabState(), method=method, k=3, prompt=PROMPT, max_new_tokens=12,
                                       device="cpu", checkpoint=str(dirs / "gpt2"), **extra), models))
        assert st.error == "" and st.trace.tokens == ref, (method, st.error)
        model = models.get(str(dirs / "gpt2"), torch.device("cpu"), extra.get("heads", ""))
        labels = [v.label for r in st.records for v in r.tokens]
        ids = [v.token for r in st.records for v in r.tokens]
        assert labels and labels == [model.token_repr(i) for i in ids]
    bad = run_all(decoded(configure(LabState(), method="blockwise-overlap", checkpoint="stern-k4",
                                    heads=str(heads), device="cpu"), models))
    assert "heads= goes with a Hugging Face model folder" in bad.error
    from mtplab.teaching.acceptance_lab.view import AcceptanceLab  # the view takes the same settings

    lab = AcceptanceLab(method="blockwise-overlap", k=3, prompt=PROMPT, max_new_tokens=12, device="cpu",
                        checkpoint=str(dirs / "gpt2"), heads=str(heads), models=models)
    lab.step(2)
    assert lab.state.error == "" and lab.state.shown == 2 and "step 2/" in lab.status.value
