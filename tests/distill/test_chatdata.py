"""The real model's training data (scripts/make_chat_data.py, read through mtplab.distill.chatdata): selection, the
batched decoder, resumable shards.

A tiny 2-layer Llama with a byte-level BPE tokenizer and a ChatML template stands in for SmolLM2."""
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from scripts import make_chat_data as cd  # noqa: E402  (with chatdata's readers, imported there)

ROOT = Path(__file__).resolve().parents[2]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tiny():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    text = (ROOT / "data" / "corpora" / "prose_train.txt").read_text(encoding="utf-8")[:8000]
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator([text], trainers.BpeTrainer(vocab_size=300, special_tokens=["<|im_start|>", "<|im_end|>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=t, eos_token="<|im_end|>", pad_token="<|im_start|>")
    tok.chat_template = CHATML
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                      initializer_range=0.2)).eval()
    return hf, tok


def test_greedy_rows_equal_generate_row_by_row(tiny):
    """Left padding and rows leaving the batch change nothing: each row is transformers' own greedy decode."""
    hf, tok = tiny
    end = tok.convert_tokens_to_ids("<|im_end|>")
    prompts = [cd.template_ids(tok, p) for p in ("Why is the sky blue?", "Hi", "Write a poem about the sea at night.")]
    assert len({len(p) for p in prompts}) == 3  # the batch is padded
    rows = cd.decode_rows(hf, prompts, max_new=24, stop=end)
    for p, row in zip(prompts, rows):
        ids = torch.tensor([p])  # the prompt holds the pad id (<|im_start|>): the mask says it is no padding
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                          eos_token_id=end, pad_token_id=tok.pad_token_id)[0, len(p):].tolist()
        if end in ref:
            ref = ref[:ref.index(end) + 1]
        assert row == ref


def test_sampled_rows_are_seeded(tiny):
    hf, tok = tiny
    head = cd.user_turn_head(tok)
    a = cd.decode_rows(hf, [head] * 4, max_new=12, stop=-1, temperature=1.0, seed=3)
    b = cd.decode_rows(hf, [head] * 4, max_new=12, stop=-1, temperature=1.0, seed=3)
    c = cd.decode_rows(hf, [head] * 4, max_new=12, stop=-1, temperature=1.0, seed=4)
    assert a == b and a != c and all(len(r) == 12 for r in a)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_rows_on_cuda_are_the_rows_on_the_cpu(tiny):
    """distill's held-out answers on a GPU: the inputs go to the model's device, the bookkeeping and the seeded
    sampling stay on the CPU (this model's logits lie far apart, so no near tie flips a greedy row)."""
    import copy
    hf, tok = tiny
    gpu = copy.deepcopy(hf).cuda()
    head = cd.user_turn_head(tok)
    prompts = [cd.template_ids(tok, p) for p in ("Why is the sky blue?", "Hi")]
    assert cd.decode_rows(gpu, prompts, max_new=16, stop=-1) == cd.decode_rows(hf, prompts, max_new=16, stop=-1)
    assert all(len(r) == 12 for r in cd.decode_rows(gpu, [head] * 3, max_new=12, stop=-1, temperature=1.0, seed=3))


def test_selection_drops_duplicates_heldout_and_caps_templates():
    own = [{"category": "chat", "prompt": f"Tell me about the history of {w} and why people like it.",
            "finished": True} for w in ("tea", "coffee", "chess", "bread", "rain", "owls", "glass")]
    cands = own + [
        {"category": "chat", "prompt": "tell me about the history of TEA and why people like it!", "finished": True},
        {"category": "chat", "prompt": "Tell me about the history of tea and why people really like it.",
         "finished": True},
        {"category": "qa", "prompt": "Why is the sky blue during the day?", "finished": True},
        {"category": "qa", "prompt": "A question cut off in the mid", "finished": False},
        {"category": "qa", "prompt": "Hi", "finished": True},
    ]
    templates = [{"category": "math", "prompt": f"What is {a} plus {a + 1}? Explain."} for a in range(50)]
    kept, why = cd.select_prompts(cands, ["Why is the sky blue?"], templates=templates, max_template_share=0.15)
    texts = [k["prompt"] for k in kept]
    assert why["exact"] == 1 and why["near"] == 1 and why["heldout"] == 1
    assert why["unfinished"] == 1 and why["length"] == 1
    assert why["own"] == 7 and sum(k.get("source") == "template" for k in kept) == why["templates"] == 1
    assert why["templates"] / len(kept) <= 0.15
    assert len(set(map(cd.normalise, texts))) == len(texts)


def test_answers_resume_and_split_over_workers(tiny, tmp_path, monkeypatch):
    hf, tok = tiny
    monkeypatch.setattr(cd, "BATCH", 2)
    monkeypatch.setattr(cd, "ANSWER_TOKENS", 6)
    prompts = [{"category": "qa", "prompt": f"Question number {i} about {w}?"}
               for i, w in enumerate(("tea", "owls", "rain", "glass", "bread"))]
    work = cd.DataWork(tmp_path)
    logs: list[str] = []
    cd.stage_answers(hf, tok, work, prompts, worker=(1, 2), log=logs.append)
    assert sorted(p.name for p in (tmp_path / "answers").iterdir()) == ["00001.json"]
    cd.stage_answers(hf, tok, work, prompts, worker=(0, 2), log=logs.append)
    cd.stage_answers(hf, tok, work, prompts, worker=(0, 2), log=logs.append)  # nothing left: no new batch
    assert len(logs) == 3
    rows = work.rows("answers")
    assert sorted(r["prompt"] for r in rows) == sorted(p["prompt"] for p in prompts)
    costs = work.costs("answers")
    assert costs["shards"] == 3 and costs["tokens"] == sum(len(r["answer_ids"]) for r in rows) > 0
    assert costs["cpu_s"] > 0
    shard = json.loads((tmp_path / "answers" / "00000.json").read_text())
    assert shard["threads"] >= 1 and all(1 <= len(r["answer_ids"]) <= 6 for r in shard["rows"])


@pytest.mark.parametrize("n", [1, 2, 5, 8, 184])
def test_answer_batches_are_taken_spread_over_the_lengths(n):
    order = cd.spread(n)
    assert sorted(order) == list(range(n))  # every batch once
    if n >= 8:  # any first quarter of the order reaches into every quarter of the range
        assert {b * 4 // n for b in order[:max(4, n // 4)]} == {0, 1, 2, 3}


def test_a_broken_shard_is_one_line(tmp_path):
    work = cd.DataWork(tmp_path)
    (tmp_path / "answers" / "00000.json").write_text("[1, 2")
    with pytest.raises(Exception) as e:
        work.rows("answers")
    assert "00000.json" in str(e.value) and "--resume" in str(e.value) and "\n" not in str(e.value)
