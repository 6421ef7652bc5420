"""Notebook 05 under bad settings: the lab's one-line message, and every later cell still runs (papermill, SMOKE)."""
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "nbtest"

NB05 = ROOT / "notebooks" / "05_acceptance_lab.ipynb"


@pytest.mark.slow
@pytest.mark.parametrize("params, words", [
    (dict(METHOD="bogus"), "unknown method 'bogus'"),
    (dict(PROMPT=""), "the prompt is empty"),
    (dict(METHOD="meta", K=2.5), "k must be an integer >= 1 (got 2.5)"),
    (dict(CHECKPOINT="/no/such/dir/mine.safetensors"), "not found"),
    (dict(REAL_METHOD="deepseek-reuse", REAL_K=0), "skipping the real model: REAL_K = 0"),  # n05-real-k0 (issue 41)
], ids=["method", "prompt", "k", "checkpoint", "real-k"])
def test_nb05_bad_settings_give_the_labs_message_and_run_to_the_end(params, words):
    """Issue 15: a bad setting shows the lab's one-line message, and every later cell still runs."""
    import papermill as pm

    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / f"05-bad-{next(iter(params))}.ipynb"
    pm.execute_notebook(str(NB05), str(out), parameters={"SMOKE": True, **params}, kernel_name="python3",
                        cwd=str(NB05.parent), progress_bar=False, execution_timeout=600)
    ran = nbformat.read(out, as_version=4)
    outputs = [o for c in ran.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert words in printed
    assert "What we learnt" in "".join(str(o.get("data", {}).get("text/markdown", "")) for o in outputs)
