"""Every notebook is committed clean, states its measured run time, and teaching.md's plan quotes the record.

The notebooks' runs are in tests/notebooks/test_notebook_runs.py (a file of their own, so that the parallel lane's
`--dist loadfile` puts them beside the other tests instead of after them).
"""
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
OUT = ROOT / "build" / "nbtest"
CHECK = "# NBVAL_CHECK_OUTPUT"


def _ids(path):
    return path.stem


def test_the_lab_has_notebooks():
    assert NOTEBOOKS, "no notebooks found under notebooks/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_committed_without_outputs_and_with_parameters(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.cells and nb.cells[0].cell_type == "markdown", "the first cell says what the notebook teaches"
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{len(tagged)} cells are tagged 'parameters'; exactly one must be"
    assert tagged[0].cell_type == "code"
    for knob in ("SEED", "DEVICE", "SMOKE"):
        assert re.search(rf"^{knob}\s*=", tagged[0].source, re.M), f"the parameters cell has no {knob}"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if CHECK in cell.source:
            # nbval compares these with a fresh run: their outputs must be committed, and with an execution
            # count, since nbval refuses a reference cell that has outputs but was never run
            assert cell.outputs, f"cell {i} is marked {CHECK} but has no committed output to compare"
            assert cell.execution_count is not None, f"cell {i} is marked {CHECK} but has no execution count"
            assert not any(o.output_type == "error" for o in cell.outputs), f"cell {i} committed an error"
        else:
            assert not cell.outputs, f"cell {i} has outputs; commit notebooks stripped (nbstripout)"


MAX_CELL_LINES = 25


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_no_code_cell_over_25_lines(path):
    """Heavy logic lives in `mtplab` (the companions), not in cells: every code cell but the parameters cell (a list
    of settings, not logic) holds at most 25 lines, every line counted. Review finding (design-3, §5): 05's code
    cells 6, 9 and 10 and 09's cell 7 ran to 31-33 lines."""
    nb = nbformat.read(path, as_version=4)
    long = [(i, len(c.source.splitlines())) for i, c in enumerate(nb.cells) if c.cell_type == "code"
            and "parameters" not in c.metadata.get("tags", []) and len(c.source.splitlines()) > MAX_CELL_LINES]
    assert not long, f"{path.name}: (cell, lines) over {MAX_CELL_LINES} lines: {long}; move the logic into its companion"


def test_each_notebook_states_its_measured_run_time():
    """The first cell's run-time line is the one tools/notebook_times.py draws from docs/bench/notebooks.json, the
    notebook's measured run with its defaults, so the statement cannot drift from the measurement."""
    import json
    from tools.notebook_times import LINE, RECORD, statement
    record = json.loads(RECORD.read_text())["notebooks"] if RECORD.exists() else {}
    for path in NOTEBOOKS:
        first = nbformat.read(path, as_version=4).cells[0].source
        found = LINE.search(first)
        assert found, f"{path.name}: no '*Run time with the defaults: ...*' line in the first cell"
        assert path.name in record, f"{path.name} has no measured run time: python -m tools.notebook_times --write"
        assert found.group(0) == statement(record[path.name]), f"{path.name}: rerun tools.notebook_times --write"


def test_teaching_md_holds_the_measured_times():
    import json
    from tools.notebook_times import RECORD, TEACHING, table
    assert table(json.loads(RECORD.read_text())) in TEACHING.read_text()


def test_teaching_plan_fits_two_sessions_and_quotes_the_record():
    """Issue 31: each session's plan is contiguous minutes that add up to at most 90, has live and in-class time,
    and every notebook time it quotes ("NN: S s idle, slowest cell C s") is docs/bench/notebooks.json's."""
    import json
    import re
    from tools.notebook_times import END, RECORD, TEACHING
    record = {name[:2]: r for name, r in json.loads(RECORD.read_text())["notebooks"].items()}
    text = TEACHING.read_text()
    plan = text[text.index("## The plan"):]
    plan = plan[:plan.index("\n## ", 4)]
    sessions = re.split(r"^### Session \d", plan, flags=re.M)[1:]
    assert len(sessions) == 2
    for n, body in enumerate(sessions, start=1):
        spans = [(int(a), int(b), kind) for a, b, kind in re.findall(r"^\| (\d+)-(\d+) \| ([a-z ]+) \|", body, flags=re.M)]
        assert spans and spans[0][0] == 0, f"session {n}: the plan starts at minute 0"
        assert all(b > a for a, b, _ in spans) and all(s[1] == t[0] for s, t in zip(spans, spans[1:])), \
            f"session {n}: the slots must follow each other without gaps or overlaps: {spans}"
        minutes = sum(b - a for a, b, _ in spans)
        assert minutes <= 90, f"session {n} plans {minutes} minutes"
        assert {"live", "in class"} <= {k for _, _, k in spans}, f"session {n}: live and in-class time both planned"
    quoted = re.findall(r"\b(\d\d): (\d+) s idle, slowest cell (\d+) s", text[text.index(END):])
    assert len({q[0] for q in quoted}) >= 5, quoted
    for nb, secs, slow in quoted:
        assert nb in record, f"teaching.md quotes notebook {nb}, which the record lacks"
        want = (f"{record[nb]['seconds']:.0f}", f"{record[nb]['slowest_cell_s']:.0f}")
        assert (secs, slow) == want, f"teaching.md quotes {nb} at {secs} s / {slow} s; the record says {want}"
    assert "build/NN_name.html" in plan and "over 20 s" in plan  # the fallback for slow live cells is named
    if "no cell takes over 20 s" in " ".join(plan.split()):
        assert max(r["slowest_cell_s"] for r in record.values()) <= 20, "the plan says no cell takes over 20 s"
