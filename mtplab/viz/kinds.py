"""The token kinds (the prefill's token, predict, accepted, rejected, discarded, bonus from the target or a
correction) and their one colour map (Okabe-Ito, colour-blind safe), shared by the figures, the tables and the
widget; and `step_record`, one step of a trace as the lab shows it.
"""
from __future__ import annotations

from dataclasses import dataclass
from mtplab.tokenizer import token_repr
from mtplab.decoding.trace import Step

KINDS = ("prefill", "predict", "accepted", "rejected", "discarded", "bonus-target", "bonus-correction")
COLORS = {  # Okabe-Ito: reddish purple, sky blue, blue, vermillion, grey, bluish green, orange
    "prefill": "#CC79A7",
    "predict": "#56B4E9",
    "accepted": "#0072B2",
    "rejected": "#D55E00",
    "discarded": "#BBBBBB",
    "bonus-target": "#009E73",
    "bonus-correction": "#E69F00",
}


def luminance(color: str) -> float:
    """WCAG 2 relative luminance of a #rrggbb colour."""
    def lin(c):
        c /= 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)


def contrast(fg: str, bg: str) -> float:
    """WCAG 2 contrast ratio of two #rrggbb colours (1 to 21; text needs at least 4.5)."""
    a, b = sorted((luminance(fg), luminance(bg)), reverse=True)
    return (a + 0.05) / (b + 0.05)


# black or white, whichever reads better on the chip's colour (every pair is at least 4.5:1, tested)
TEXT_COLORS = {k: max(("#000000", "#ffffff"), key=lambda fg: contrast(fg, COLORS[k])) for k in KINDS}
LEGEND = {
    "prefill": "prefill: the target's first token, from the prompt's forward",
    "predict": "predict token (plain schedule)",
    "accepted": "draft accepted",
    "rejected": "draft rejected",
    "discarded": "draft discarded (after a rejection)",
    "bonus-target": "bonus from the target (all drafts accepted)",
    "bonus-correction": "bonus correction (replaces the rejected draft)",
}
STRUCK = ("rejected", "discarded")


@dataclass(frozen=True)
class TokenView:
    token: int
    label: str                       # printable byte label (tokenizer.token_repr)
    kind: str                        # one of KINDS
    draw: tuple[float, float, float] | None = None  # sampled drafts: (p(d), q(d), u); kept when u < p/q


@dataclass(frozen=True)
class StepRecord:
    """One decoding step as the lab shows it."""
    index: int                       # position in trace.steps (step 0 is the prefill)
    drafted: tuple[int, ...]
    accepted: int                    # a prefix of `drafted`
    rejected: int                    # len(drafted) - accepted: the rejected draft plus the discarded ones
    bonus: int | None
    bonus_source: str                # 'target', 'correction' or 'none'
    predict_token: int | None
    emitted: tuple[int, ...]
    forwards: int
    tokens: tuple[TokenView, ...]    # predict token, drafts, bonus, in that order
    wall_s: float = 0.0              # the step's wall time, and of it: the target's forwards, the drafter
    target_s: float = 0.0
    draft_s: float = 0.0

    @property
    def kinds(self) -> list[str]:
        return [t.kind for t in self.tokens]


def step_record(index: int, step: Step, label=token_repr) -> StepRecord:
    """Label every token of a `Step`: predict / accepted / rejected / discarded / bonus. `label` prints one
    token id (the byte tokenizer's `token_repr`, or a Hugging Face model's own)."""
    views = []
    if step.predict_token is not None:
        views.append(TokenView(step.predict_token, label(step.predict_token), "predict"))
    draws = list(step.draws)
    for i, d in enumerate(step.drafted):
        kind = "accepted" if i < step.accepted else ("rejected" if i == step.accepted else "discarded")
        views.append(TokenView(d, label(d), kind, draws[i] if i < len(draws) else None))
    if step.bonus is not None:
        kind = "bonus-correction" if step.bonus_source == "correction" else "bonus-target"
        if index == 0 and not step.drafted and step.predict_token is None:
            kind = "prefill"  # step 0: the prompt in one forward gives the first token; no draft was checked
        views.append(TokenView(step.bonus, label(step.bonus), kind))
    return StepRecord(index, tuple(step.drafted), step.accepted, len(step.drafted) - step.accepted, step.bonus,
                      step.bonus_source, step.predict_token, tuple(step.emitted), step.forwards, tuple(views),
                      step.wall_s, step.target_s, step.draft_s)
