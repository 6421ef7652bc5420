"""The answer key of notebook 08's find-the-bug exercise (`mtplab.teaching.find_the_bug`). Instructors only: the
student copy (`make student-copy`) leaves instructor/ out (.gitattributes export-ignore). The package holds only
one salted digest of the whole right set of verdicts and the explanations sealed under it; `sealed()` makes both from
this key, and tests/teaching/test_find_the_bug.py checks that the package's copies equal them."""
from __future__ import annotations

import base64
import json

from mtplab.teaching import find_the_bug as bugs

# rule: (what the rule is, broken, why)
ANSWERS: dict[str, tuple[str, bool, str]] = {
    "rule_a": ("residual_is_p", True, "the residual is taken as p instead of norm(max(0, p - q)): tokens that q "
                                      "over-proposes come out too often"),
    "rule_b": ("reference", False, "decoding.accept: min(1, p/q), then norm(max(0, p - q))"),
    "rule_c": ("ignores_temperature", True, f"the drafts were sampled at T = {bugs.DRAFT_TEMPERATURE}, but the ratio "
                                            "uses the drafter's distribution at T = 1 (of the shape of "
                                            "z-lab/dflash#74)"),
    "rule_d": ("first_unverified", True, "the loop starts at the second draft: the first one is never verified, so "
                                         "it follows q"),
    "rule_e": ("p_in_bf16", True, f"the target p comes from bf16 logits near {bugs.LOGIT_LEVEL:g}, where bf16 steps by "
                                  "1, while q stays float32: the rule is exact for a rounded p, not for p (of the shape "
                                  "of DeepSpec#31, where the draft side was in the other dtype)"),
    "rule_f": ("ratio_free", False, "u * q(d) < p(d) is u < p(d)/q(d) without the division"),
    "rule_g": ("argmax_residual", True, "a rejected draft becomes the residual's argmax; a sample was due (of the "
                                        "shape of jaymody/speculative-sampling#3, where the draft was an argmax)"),
    "rule_h": ("top_k_on_p", True, f"top-{bugs.TOP_K} applied to the target p but not to q: the output follows "
                                   "top-k(p) (of the shape of vllm PR #10198, where top-p filtered q, not p)"),
}
BROKEN = {name: a[1] for name, a in ANSWERS.items()}


def sealed() -> tuple[str, str]:
    """(the digest of the right set of verdicts, the explanations sealed under it): what the package holds."""
    digest = bugs._digest(BROKEN)
    plain = json.dumps({name: a[2] for name, a in ANSWERS.items()}).encode()
    box = bytes(a ^ b for a, b in zip(plain, bugs._stream(BROKEN, len(plain))))
    return digest, base64.b64encode(box).decode()


if __name__ == "__main__":  # python -m instructor.find_the_bug_key: the constants to paste into the package
    d, s = sealed()
    print("_KEY =", repr(d))
    print("_SEALED =", repr(s))
