"""Every notebook runs top to bottom with SMOKE=True (notebook 05 under bad settings: test_notebook_05_settings.py).
The real model's sections (a notebook's `REAL` parameter) are left out here: `pytest --nbval-lax notebooks/` (in
`make test`) runs them at the defaults a class runs, and each loads SmolLM2 (half a gigabyte) once more.

The runs use papermill (parameters injected after the cell tagged `parameters`) and write the executed copies to
build/nbtest/ (git-ignored). `pytest --nbval-lax notebooks/` separately runs the defaults and compares the cells
marked `# NBVAL_CHECK_OUTPUT` with their committed outputs.
"""
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
OUT = ROOT / "build" / "nbtest"


def _ids(path):
    return path.stem


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_runs_in_smoke_mode(path):
    import papermill as pm

    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / path.name
    # raises PapermillExecutionError, naming the cell, if any cell fails
    nb = nbformat.read(path, as_version=4)
    declared = next((c.source for c in nb.cells if "parameters" in c.metadata.get("tags", [])), "")
    params = {"SMOKE": True, **({"REAL": False} if "\nREAL = " in "\n" + declared else {})}
    pm.execute_notebook(str(path), str(out), parameters=params, kernel_name="python3",
                        cwd=str(path.parent), progress_bar=False, execution_timeout=600)
    ran = nbformat.read(out, as_version=4)
    errors = [o for c in ran.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
