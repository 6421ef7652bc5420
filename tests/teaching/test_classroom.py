"""The class as data (mtplab.teaching.classroom, notebook 01's going-further section): the shipped points are the
numbers their commits hold, a preflight record is read as a point, and bad folders fail in one line."""
import json
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from mtplab.bench import preflight
from mtplab.errors import MtplabError
from mtplab.teaching import classroom

ROOT = Path(__file__).resolve().parents[2]


def _machine(cpu="Test CPU", threads=2, llc=32 << 20):
    return {"cpu": cpu, "cores": 4, "threads": threads, "llc_bytes": llc, "llc": "32 MiB", "torch": "x", "device": "cpu"}


def _write(folder: Path, name: str, rec: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(rec))


def test_shipped_points_name_their_source_and_machine():
    recs = classroom.read_records()
    assert len(recs) >= 3
    for r in recs:
        assert r["provenance"] and all({"commit", "file", "what"} <= set(p) for p in r["provenance"])
        assert r["measured"]["classroom"], r["source"]
    assert len({(r["machine"]["cpu"], r["machine"]["threads"]) for r in recs}) == len(recs)  # one point per setting


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs the git history")
def test_shipped_points_equal_what_their_commits_hold():
    from tools import classroom_points
    try:
        want = classroom_points.points()
    except subprocess.CalledProcessError:
        pytest.skip("a shallow clone lacks the commits the points come from")
    for name, rec in want.items():
        assert json.loads((classroom.SHIPPED / f"{name}.json").read_text()) == rec, name


def test_a_preflight_record_is_a_point(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "_curve", lambda *a, name, **k: {"model": name, "t1_ms": 1.0,
                                                                    "ratio": {"1": 1.0, "2": 1.1, "4": 1.2, "8": 1.5}})
    monkeypatch.setattr(preflight, "install_checks", lambda: {"smollm2": "missing", "hf": "ok"})
    monkeypatch.setattr(preflight.checkpoint, "load",
                        lambda *a, **k: SimpleNamespace(config=SimpleNamespace(n_layer=12, n_embd=256)))
    preflight.run_preflight(out=str(tmp_path / "alice.json"), quick=True, log=None)
    pts = classroom.points(classroom.read_records(tmp_path))
    mine = classroom.select(pts, "blockwise-overlap")
    assert [p["kind"] for p in mine] == ["predicted"] and mine[0]["source"] == "alice.json"
    assert mine[0]["variant"] == "ntp, 12 x 256" and mine[0]["speedup"] > 0


def test_spread_reads_its_words_off_the_numbers(tmp_path):
    rows = lambda s: {"classroom": [{"row": "ngram", "k": 4, "speedup": s}]}
    _write(tmp_path, "a.json", {"machine": _machine("slow", 1), "measured": rows(0.8)})
    _write(tmp_path, "b.json", {"machine": _machine("fast", 2), "measured": rows(1.3), "busy": "others used 1.2 cores"})
    pts = classroom.points(classroom.read_records(tmp_path))
    text = classroom.spread(pts, "ngram")
    assert "from 0.80x (slow" in text and "to 1.30x (fast" in text
    assert "slower than plain decoding on one machine and faster on another" in text
    assert "1 record(s) say their machine was busy" in text
    _write(tmp_path, "b.json", {"machine": _machine("fast", 2), "measured": rows(0.82)})
    text = classroom.spread(classroom.points(classroom.read_records(tmp_path)), "ngram")
    assert "faster on another" not in text and "busy" not in text and "gains" not in text


def test_a_spread_over_different_weights_says_so(tmp_path):
    for name, model in (("a.json", "ntp, 12 x 256"), ("b.json", "the old 4 x 256")):
        _write(tmp_path, name, {"machine": _machine(name), "classroom": {"model": model},
                                "measured": {"classroom": [{"row": "meta", "k": 4, "speedup": 1.0}]}})
    text = classroom.spread(classroom.points(classroom.read_records(tmp_path)), "meta")
    assert "raced different weights" in text


def test_the_figure_has_three_panels():
    pts = classroom.points(classroom.read_records())
    fig = classroom.figure(pts, "blockwise-overlap")
    assert len(fig.axes) == 3 and fig.axes[1].get_xscale() == "log"
    assert "raced (filled)" in fig._suptitle.get_text()


def test_bad_folders_and_rows_fail_in_one_line(tmp_path):
    with pytest.raises(MtplabError, match="preflight --out"):
        classroom.read_records(tmp_path / "nowhere")
    with pytest.raises(MtplabError, match="holds no"):
        classroom.read_records(tmp_path)
    _write(tmp_path, "x.json", {"rows": []})
    with pytest.raises(MtplabError, match="x.json names no machine"):
        classroom.read_records(tmp_path)
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(MtplabError, match="not valid JSON"):
        classroom.read_records(tmp_path)
    with pytest.raises(MtplabError, match="choose among: .*ngram"):
        classroom.select(classroom.points(classroom.read_records()), "no such row")


def test_the_class_stands_beside_the_labs_points(tmp_path):
    _write(tmp_path, "bob.json", {"machine": _machine("bob's laptop"), "classroom": {"ratio": {"1": 1.0, "4": 2.0}},
                                  "predictions": {"classroom": [
        {"row": "blockwise-overlap", "method": "blockwise-overlap", "k": 4, "tokens_per_step": 1.8,
         "measured_there": 1.5}]}})  # forecast: 1.8 / t(4)/t(1) = 0.9
    recs = classroom.read_class(tmp_path)
    assert [r["source"] for r in recs][-1] == "bob.json" and len(recs) == len(classroom.read_class()) + 1
    assert "from 0.90x (bob's laptop" in classroom.spread(classroom.points(recs), "blockwise-overlap")
