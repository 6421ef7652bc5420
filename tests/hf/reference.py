"""transformers' own greedy decode, the reference every lab method on a Hugging Face model must reproduce (moved here
from mtplab.hf.run: only the tests use it)."""
import torch

from mtplab.decoding.checks import check_options, check_prompt


@torch.inference_mode()
def reference_generate(target, prompt_ids, *, max_new_tokens: int, stop: int | None = None) -> list[int]:
    """The model's own `generate`, greedy, exactly max_new_tokens new tokens (no stop at EOS, as the lab's
    decoders do not stop either; with `stop`, both end with that token): what every lab method must reproduce
    token for token."""
    from transformers import GenerationConfig

    check_options(max_new_tokens=max_new_tokens, temperature=0.0, top_k=None)
    prompt = check_prompt(target, prompt_ids, max_new_tokens)
    ids = torch.tensor([prompt], device=target.wte.weight.device)
    gc = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=0, eos_token_id=stop,
                          pad_token_id=0, num_beams=1)
    out = target.hf.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gc)
    return out[0, len(prompt):].tolist()
