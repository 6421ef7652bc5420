"""A notebook's closing summary reads each name from one binding (issue 40): notebook 07's tree race rebound `res`,
the name of section 1's ragged-row decode, so the summary's "each equal to that row decoded alone by AR" compared a
race result with a list and printed False on every run. No notebook is run; the cells are parsed."""
import ast
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUMMARIES = {"07_batches_and_trees.ipynb": "## What was learnt", "10_beside_hugging_face.ipynb": "## What this notebook"}


def _bound(tree: ast.AST) -> set[str]:
    """Names a cell binds at its top level (assignments, loop and with targets, walrus, imports), not inside a
    function, a lambda or a comprehension, which have scopes of their own."""
    out: set[str] = set()

    def visit(node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
            return
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def _parse(src: str) -> ast.AST:
    return ast.parse("\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("%", "!"))))


@pytest.mark.parametrize("name", sorted(SUMMARIES))
def test_the_summary_reads_names_bound_once(name):
    cells = json.loads((ROOT / "notebooks" / name).read_text())["cells"]
    head = next(i for i, c in enumerate(cells) if "".join(c["source"]).startswith(SUMMARIES[name]))
    summary = next(c for c in cells[head:] if c["cell_type"] == "code")
    tree = _parse("".join(summary["source"]))
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - _bound(tree)
    others = [c for c in cells if c["cell_type"] == "code" and c is not summary
              and "parameters" not in c["metadata"].get("tags", [])
              and not "".join(c["source"]).lstrip().startswith("if SMOKE")]  # settings, rebound on purpose
    binds = [_bound(_parse("".join(c["source"]))) for c in others]
    twice = sorted(n for n in read if sum(n in b for b in binds) > 1)
    assert not twice, f"{name}: its summary reads {twice}, bound in more than one cell; the last binding wins"


def test_the_check_catches_a_rebound_name():
    first, second = _bound(_parse("res = run()\nfor name, w in x:\n    pass")), _bound(_parse("res = race()"))
    assert "res" in first and "res" in second and "name" in first
    assert "p" not in _bound(_parse("y = [p for p in ps]\nf = lambda p: p"))
