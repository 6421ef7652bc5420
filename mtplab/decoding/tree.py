"""Token trees: several candidates per depth, verified in ONE target forward (greedy).

N tree nodes, L committed positions in the target cache, V vocabulary, w_d candidates at depth d.

A chain drafts one token per depth and loses the rest of the step at the first wrong one. A tree keeps
the top-w_d candidates of every depth d: each node at depth d-1 gets the w_d candidates of depth d as
its children (the Stern and Meta heads read only the hidden state at the last committed position, so
depth d's candidates do not depend on which depth d-1 token precedes them). Widths (1, 1, 1) are the
chain; (2, 2, 1) has 2 + 4 + 4 = 10 nodes. This is the tree attention of Medusa (Cai et al. 2024,
sec. 2.1.2) and the token tree verification of SpecInfer (Miao et al. 2024): the root (the last
committed token) and all N nodes go through the target in one forward, node i at position
L + depth(i), and a mask lets node i see the committed prefix, the root, its ancestors and itself,
so its row is what a chain forward along its branch computes (equal up to float rounding).
The accepted path is the longest branch the target agrees
with; its keys and values are compacted to positions L..L+a, and everything else (pruned branches)
is cut off, so the cache holds exactly the committed tokens.

Greedy only: with temperature > 0 a tree needs a multi-draft acceptance rule (SpecInfer's), which this
lab does not teach; `tree_speculative` refuses it with an error.
"""
from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator
from dataclasses import dataclass
import torch
from mtplab.decoding.checks import check_drafts, check_finite, check_options, check_prompt, fitted
from mtplab.decoding.loop import Clock, Decode, end_turn, prefill
from mtplab.errors import MtplabError
from mtplab.decoding.trace import Step, Trace


@dataclass
class Tree:
    """Draft nodes in breadth-first order; the root (the last committed token) is not a node."""
    tokens: list[int]
    parent: list[int]   # parent node of each node, -1 for the root
    depth: list[int]    # 1-based: a depth-d node stands for the token d places after the root

    def __len__(self):
        return len(self.tokens)

    def children(self, node: int) -> list[int]:
        """Nodes whose parent is `node` (-1: the root)."""
        return [i for i, p in enumerate(self.parent) if p == node]

    def ancestry(self) -> torch.Tensor:
        """(N+1, N+1) bool over [root] + nodes: entry (i, j) says j is i, or an ancestor of i."""
        n = len(self.tokens) + 1
        m = torch.eye(n, dtype=torch.bool)
        m[:, 0] = True  # the root precedes every node
        for i, p in enumerate(self.parent):
            if p >= 0:
                m[i + 1] |= m[p + 1]
        return m


def build_tree(candidates: list[list[int]], widths: tuple[int, ...] | list[int]) -> Tree:
    """candidates[d-1]: depth d's candidates, best first. Every node at depth d-1 gets the first w_d of
    them as children (w = widths)."""
    tokens, parent, depth = [], [], []
    frontier = [-1]
    for d, (cands, w) in enumerate(zip(candidates, widths), start=1):
        nxt = []
        for p in frontier:
            for tok in cands[:w]:
                tokens.append(int(tok))
                parent.append(p)
                depth.append(d)
                nxt.append(len(tokens) - 1)
        frontier = nxt
    return Tree(tokens, parent, depth)


def check_widths(widths) -> tuple[int, ...]:
    w = tuple(widths)
    if not w or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in w):
        raise MtplabError(f"widths must be a non-empty sequence of integers >= 1 (got {widths!r}); "
                          "widths (1, 1, 1) is the chain of 3 drafts")
    return w


def head_candidates(drafter, n: int, widest: int) -> list[list[int]]:
    """Top-`widest` tokens of depths 2..n+1, asked of the drafter itself (`candidates(n, width)`: Stern and Meta
    heads offer it, since their depths read one hidden state and one head pass gives every depth; a DeepSeek module
    offers its one depth, n = 1)."""
    if not callable(getattr(drafter, "candidates", None)):
        raise MtplabError(f"token trees are built from stern or meta heads (or a DeepSeek module, one depth deep), "
                          f"not {drafter.name!r}: their depths read one hidden state, so one head pass gives every "
                          "depth's candidates")
    return drafter.candidates(n, widest)


def verify_tree(model, cache, root: int, tree: Tree):
    """One forward over [root] + nodes: node i at position L + depth(i), seeing the prefix and its ancestors."""
    L = cache.length
    dev = model.wte.weight.device
    ids = torch.tensor([[root] + tree.tokens], dtype=torch.long, device=dev)  # (1, N+1)
    positions = L + torch.tensor([[0] + tree.depth], device=dev)  # (1, N+1) tree position ids
    mask = torch.cat([torch.ones(len(tree) + 1, L, dtype=torch.bool), tree.ancestry()], dim=1)  # (N+1, L+N+1)
    return model(ids, cache, positions=positions, mask=mask.to(dev)[None, None])


def longest_path(tree: Tree, top: list[int]) -> tuple[list[int], int, str]:
    """Greedy: walk from the root while the target's token (top[row], row 0 the root) is a child's token.
    Returns the rows of the path (root first), the bonus token and its source."""
    path = [0]
    while True:
        want = top[path[-1]]
        kids = tree.children(path[-1] - 1)
        hit = next((c for c in kids if tree.tokens[c] == want), None)
        if hit is None:
            return path, want, ("correction" if kids else "target")
        path.append(hit + 1)


def compact(cache, L: int, path: list[int]) -> None:
    """Move the path's keys and values (rows of the tree forward) to positions L..L+a; drop the rest."""
    src = torch.tensor(path, device=cache.k.device) + L
    cache.k[:, :, :, L:L + len(path)] = cache.k[:, :, :, src]  # (layers, B, H, a+1, D), a copy: no aliasing
    cache.v[:, :, :, L:L + len(path)] = cache.v[:, :, :, src]
    cache.crop(L + len(path))


@dataclass
class TreeStep:
    """One tree step, for pictures: the tree, the rows of the accepted path, and the usual Step."""
    tree: Tree
    path: list[int]
    step: Step

    @property
    def side_branch(self) -> bool:
        """Did the accepted path leave the top-1 chain (some node on it is not its parent's first child)?"""
        return any(self.tree.children(self.tree.parent[r - 1])[0] != r - 1 for r in self.path[1:])


def iter_tree_steps(model, drafter, prompt_ids, *, max_new_tokens: int, widths, temperature: float = 0.0,
                    cache=None, stop: int | None = None) -> Iterator[TreeStep]:
    """Greedy tree speculation: yields the prefill, then one `TreeStep` per step (one target forward each).
    `cache` (optional): the target's KV cache, to look at between steps. temperature > 0 is refused.
    `stop` (a chat model's end-of-turn token): the decode ends at the step that commits it (`loop.end_turn`)."""
    check_options(max_new_tokens=max_new_tokens, temperature=temperature, top_k=None)
    if temperature != 0:
        raise MtplabError("token trees are greedy-only here (a sampled tree needs a multi-draft acceptance rule); "
                          "use temperature=0")
    widths = check_widths(widths)
    check_drafts(len(widths) + 1, drafter, tree=True)
    room = max_new_tokens + sum(nodes_per_depth(widths)) + 1
    prompt = check_prompt(model, prompt_ids, room)
    if cache is None:
        cache = model.new_cache(max_len=fitted(model, len(prompt) + room))
    run = Decode(model, drafter, cache, list(prompt), len(prompt),
                 max_new_tokens, len(widths) + 1, "tree", stop=stop)
    yield TreeStep(Tree([], [], []), [0], prefill(run))  # the loop's own prefill: the prompt in one forward
    while run.remaining > 0:
        yield _tree_step(run, widths[:run.remaining - 1])


def nodes_per_depth(widths) -> list[int]:
    """Nodes per depth: w_1, w_1 w_2, ..."""
    return list(itertools.accumulate(widths, operator.mul))


def _tree_step(run: Decode, widths) -> TreeStep:
    """propose (head candidates -> tree) -> verify (one forward) -> accept (longest path) -> commit (compact)."""
    model, drafter, cache, tokens = run.model, run.drafter, run.cache, run.tokens
    clock = Clock(run.device)
    with clock("draft"):
        tree = build_tree(head_candidates(drafter, len(widths), max(widths)), widths) if widths else Tree([], [], [])
    L = cache.length  # == len(tokens) - 1
    with clock("target"):
        out = verify_tree(model, cache, tokens[-1], tree)
        top = check_finite(out.logits[0]).argmax(-1).tolist()
    # greedy: follow the branch whose every token the target would also have chosen
    path, bonus, source = longest_path(tree, top)
    new = [tree.tokens[r - 1] for r in path[1:]] + [bonus]
    tokens.extend(new)
    compact(cache, L, path)  # cache: tokens[:-1] exactly; pruned branches are gone
    rows = torch.tensor(path, device=out.hidden.device)
    kept = out.cut((slice(None), rows))
    with clock("draft"):
        drafter.feedback(kept, len(path), tokens)
    step = clock.step(drafted=list(tree.tokens), accepted=len(path) - 1, emitted=new, bonus=bonus,
                      bonus_source=source, forwards=1, draft_forwards=int(bool(widths)))
    run.ended = end_turn(step, run.stop)  # the answer's last token: the step is cut after it, the decode ends
    return TreeStep(tree, path, step)


@torch.inference_mode()
def tree_speculative(model, drafter, prompt_ids, *, max_new_tokens: int, widths, temperature: float = 0.0,
                     method: str | None = None, stop: int | None = None) -> Trace:
    """Greedy tree speculation of `model` with a Stern or Meta drafter; output equals greedy `autoregressive`.

    A tree Step's `drafted` lists every node (breadth-first) and `accepted` the length of the accepted
    path, so per-position acceptance statistics of a chain do not apply to it. temperature > 0: refused.
    """
    steps = iter_tree_steps(model, drafter, prompt_ids, max_new_tokens=max_new_tokens, widths=widths,
                            temperature=temperature, stop=stop)
    first = next(steps)
    trace = Trace(method=method or f"{drafter.name}-tree", prompt=[int(t) for t in prompt_ids],
                  k=len(check_widths(widths)) + 1, schedule="tree", steps=[first.step])
    trace.steps.extend(s.step for s in steps)
    return trace
