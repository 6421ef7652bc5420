"""python -m mtplab preflight: the install checked, this machine timed, the shipped rows' speedups predicted on its
cost curve, a JSON record written atomically, and a plain verdict when the machine was busy."""
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mtplab.bench import preflight
from mtplab.errors import MtplabError

ROOT = Path(__file__).resolve().parents[2]


def test_the_record_holds_the_inputs_but_no_prediction():
    """The laptop assignment's answer is neither stored nor printed (issue 39); the grader recomputes it from the
    inputs, and the forecast follows the machine's cost curve."""
    from mtplab.teaching.classroom import forecast
    rows = preflight._to_predict([
        {"row": "blockwise-overlap", "method": "blockwise-overlap", "k": 4, "tps": 2.0, "draft_t1": 0.1},
        {"row": "blockwise", "method": "blockwise", "k": 4, "tps": 2.0, "draft_t1": 0.1, "measured": 1.4}])
    assert not any("predict" in key or key in ("plain", "verify_q") for r in rows for key in r)
    flat, steep = {"1": 1.0, "2": 1.0, "4": 1.0, "8": 1.0}, {"1": 1.0, "2": 2.0, "4": 4.0, "8": 8.0}
    assert forecast(rows[0], flat) == pytest.approx(2.0 / 1.1)
    assert forecast(rows[1], flat) == pytest.approx(2.0 / 2.1)  # plain pays the predict forward too
    assert forecast(rows[0], steep) < 1 < forecast(rows[0], flat)  # the machine decides
    text = preflight.report({"machine": {"cpu": "x", "threads": 1}, "install": {}, "predictions": {"classroom": rows},
                             "classroom": {"t1_ms": 1.0, "ratio": flat}})
    assert "to predict: classroom, blockwise, k=4: 2.00 tokens per step" in text
    assert f"{2.0 / 1.1:.2f}" not in text and f"{2.0 / 2.1:.2f}" not in text and "predicted here" not in text


def test_install_checks_name_the_fix(monkeypatch):
    real_find = preflight.importlib.util.find_spec
    monkeypatch.setattr(preflight.importlib.util, "find_spec",
                        lambda name, *a: None if name == "papermill" else real_find(name, *a))
    out = preflight.install_checks()
    assert out["notebooks"].startswith("missing papermill") and 'pip install -e ".[notebooks]"' in out["notebooks"]


@pytest.mark.slow
def test_preflight_writes_its_record(tmp_path):
    out = tmp_path / "pf.json"
    r = subprocess.run([sys.executable, "-m", "mtplab", "preflight", "--quick", "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    rec = json.loads(out.read_text())
    assert rec["classroom"]["t1_ms"] > 0 and "4" in rec["classroom"]["ratio"]
    assert {"cpu", "threads", "llc"} <= set(rec["machine"])
    assert "busy" in rec and "record:" in r.stdout
    assert ("too busy" in r.stdout) == bool(rec["busy"])


def test_an_unwritable_record_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "_curve", lambda *a, **k: {"t1_ms": 1.0, "ratio": {"1": 1.0, "4": 1.2}})
    monkeypatch.setattr(preflight, "install_checks", lambda: {"smollm2": "missing", "hf": "ok"})
    monkeypatch.setattr(preflight.checkpoint, "load",
                        lambda *a, **k: SimpleNamespace(config=SimpleNamespace(n_layer=12, n_embd=256)))
    (tmp_path / "f").write_text("")
    with pytest.raises(MtplabError, match="give --out a writable file"):
        preflight.run_preflight(out=str(tmp_path / "f" / "x.json"), quick=True, log=None)
