"""Each depth may see only the tokens it is allowed to see.

Depth d at position i predicts x[i+d]. Stern and Meta heads read only x[0..i]. DeepSeek's module
k = d-1 also reads x[i+1..i+k] through teacher forcing (its causal chain), but never x[i+d] itself:
feeding the embedding of the very token being predicted is the leak this test guards against.
"""
import pytest
import torch

from tests.conftest import random_model

T = 16


@pytest.mark.parametrize("heads", ["stern", "meta", "deepseek"])
def test_no_depth_sees_its_label(heads):
    m = random_model(heads, 4, seed=7)
    torch.manual_seed(0)
    x = torch.randint(0, 256, (1, T))
    with torch.no_grad():
        base = m.depth_logits(x)
        for d in range(1, 5):
            i = 5
            last_seen = i + (d - 1 if heads == "deepseek" else 0)
            # the label x[i+d] and everything after it: no effect on depth d at position i
            y = x.clone()
            y[0, i + d:] = (y[0, i + d:] + 1) % 256
            assert torch.equal(m.depth_logits(y)[0, i, d - 1], base[0, i, d - 1]), (heads, d)
            # the last token it is allowed to read: an effect
            z = x.clone()
            z[0, last_seen] = (z[0, last_seen] + 1) % 256
            assert not torch.allclose(m.depth_logits(z)[0, i, d - 1], base[0, i, d - 1]), (heads, d)
