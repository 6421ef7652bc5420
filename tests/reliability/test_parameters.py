"""What a notebook or a widget is given: papermill parameters and the measuring functions the lessons call with a
student's numbers, validated where they enter."""
import time

import nbformat
import pytest

from mtplab.errors import MtplabError
from mtplab.measuring.acceptance import alpha_from_length
from tests.reliability.helpers import ROOT


def test_alpha_from_length_is_bounded_in_time():
    t = time.time()
    assert alpha_from_length(2, 10 ** 7) == pytest.approx(0.5, abs=1e-9)
    assert time.time() - t < 0.5
    with pytest.raises(MtplabError, match=r"n_drafts must be an integer >= 1 \(got True\)"):
        alpha_from_length(2, True)
    with pytest.raises(MtplabError, match="length must be a number"):
        alpha_from_length("2", 3)


@pytest.mark.parametrize("given, rows", [
    ("mtplab AR", ["mtplab AR"]),  # papermill -p LIVE_ROWS 'mtplab AR': one row, not nine characters
    (["mtplab AR", "HF prompt lookup, 3 drafts"], ["mtplab AR", "HF prompt lookup, 3 drafts"]),
])
def test_notebook_10_takes_one_live_row_given_as_text(given, rows):
    """n-pm-nb10-liverows-bogus: -p LIVE_ROWS arrives as a str and was iterated by character ("no peer row named '['")."""
    nb = nbformat.read(ROOT / "notebooks" / "10_beside_hugging_face.ipynb", as_version=4)
    cell = next(c.source for c in nb.cells if "only=rows" in c.source)
    line = next(ln for ln in cell.splitlines() if ln.startswith("rows = "))
    scope = {"LIVE_ROWS": given}
    exec(line, scope)
    assert scope["rows"] == rows


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name[:2])
def test_papermill_sees_every_parameter_of_every_notebook(path):
    """`-p NAME VALUE` works only for a name papermill can parse (a '=' inside a string hid notebook 10's LIVE_ROWS)."""
    import ast

    from papermill.translators import PythonTranslator

    cell = next(c for c in nbformat.read(path, as_version=4).cells if "parameters" in c.metadata.get("tags", []))
    assigned = [t.id for node in ast.parse(cell.source).body if isinstance(node, (ast.Assign, ast.AnnAssign))
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)]
    assert [p.name for p in PythonTranslator.inspect(cell)] == assigned
