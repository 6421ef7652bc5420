"""Every notebook runs top to bottom with SMOKE=True (notebook 05 under bad settings: test_notebook_05_settings.py).
The real model's sections (a notebook's `REAL` parameter) are left out here: `pytest --nbval-lax notebooks/` (in
`make test`) runs them at the defaults a class runs, and each loads SmolLM2 (half a gigabyte) once more.

The smoke runs are marked `smoke` and `make test` leaves them out: it runs every notebook at its defaults under nbval,
the same cells with larger sizes, which holds only while SMOKE does nothing but give declared parameters smaller
values. `test_smoke_only_shrinks_parameters` checks that it does; notebook 05, which also branches on SMOKE, is run
with SMOKE=True by its bad-settings tests in `make test`. Run the smoke runs with `pytest -m smoke tests/notebooks`.

The runs use papermill (parameters injected after the cell tagged `parameters`) and write the executed copies to
build/nbtest/ (git-ignored). `pytest --nbval-lax notebooks/` separately runs the defaults and compares the cells
marked `# NBVAL_CHECK_OUTPUT` with their committed outputs.
"""
import ast
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
OUT = ROOT / "build" / "nbtest"


def _ids(path):
    return path.stem


def _declared(nb) -> str:
    """The source of the notebook's cell tagged `parameters` ('' without one)."""
    return next((c.source for c in nb.cells if "parameters" in c.metadata.get("tags", [])), "")


@pytest.mark.slow
@pytest.mark.smoke
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_runs_in_smoke_mode(path):
    import papermill as pm

    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / path.name
    # raises PapermillExecutionError, naming the cell, if any cell fails
    declared = _declared(nbformat.read(path, as_version=4))
    params = {"SMOKE": True, **({"REAL": False} if "\nREAL = " in "\n" + declared else {})}
    pm.execute_notebook(str(path), str(out), parameters=params, kernel_name="python3",
                        cwd=str(path.parent), progress_bar=False, execution_timeout=600)
    ran = nbformat.read(out, as_version=4)
    errors = [o for c in ran.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors


SMOKE_BRANCHES = {"05_acceptance_lab": ROOT / "tests" / "notebooks" / "test_notebook_05_settings.py"}


def smoke_reads(nb) -> list[str]:
    """Where a notebook reads SMOKE for anything but giving parameters of its `parameters` cell other values:
    each `if SMOKE:` block may only assign those names; any other read of SMOKE is listed (cell, line)."""
    cells = [c for c in nb.cells if c.cell_type == "code"]
    params = {t.id for node in ast.parse(_declared(nb)).body if isinstance(node, ast.Assign)
              for target in node.targets for t in ast.walk(target) if isinstance(t, ast.Name)}
    found = []
    for i, c in enumerate(cells):
        if "parameters" in c.metadata.get("tags", []) or "SMOKE" not in c.source:
            continue
        tree = ast.parse("\n".join(line for line in c.source.splitlines() if not line.lstrip().startswith(("%", "!"))))
        allowed = set()
        for node in tree.body:
            if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "SMOKE" \
                    and not node.orelse and all(isinstance(s, ast.Assign) for s in node.body) \
                    and {t.id for s in node.body for target in s.targets for t in ast.walk(target)
                         if isinstance(t, ast.Name)} <= params:
                allowed.add(id(node.test))
        found += [f"cell {i}, line {n.lineno}" for n in ast.walk(tree)
                  if isinstance(n, ast.Name) and n.id == "SMOKE" and id(n) not in allowed]
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_smoke_only_shrinks_parameters(path):
    """What lets `make test` leave the smoke runs out (see the module's docstring)."""
    reads = smoke_reads(nbformat.read(path, as_version=4))
    if path.stem in SMOKE_BRANCHES:  # its SMOKE branches run in make test through another test
        assert reads, f"{path.stem} no longer branches on SMOKE: drop it from SMOKE_BRANCHES"
        assert '"SMOKE": True' in SMOKE_BRANCHES[path.stem].read_text()
    else:
        assert not reads, f"{path.name} reads SMOKE at {reads}: give it only parameter values, or run it in make test"


def test_the_smoke_check_catches_a_branch():
    from nbformat.v4 import new_code_cell, new_notebook
    params = new_code_cell("SMOKE = False\nN = 3", metadata={"tags": ["parameters"]})
    shrink = new_code_cell("import os\nif SMOKE:\n    N = 1\nprint(N)")
    assert smoke_reads(new_notebook(cells=[params, shrink])) == []
    for body in ("if SMOKE:\n    M = 1", "x = 2 if SMOKE else 3", "if SMOKE:\n    N = 1\nelse:\n    N = 4",
                 "if SMOKE:\n    print(N)"):
        assert smoke_reads(new_notebook(cells=[params, new_code_cell(body)])), body
