"""tools.notebook_times: a measuring run leaves the record alone unless it also rewrites the first cells (--write),
since tests/notebooks/test_notebooks.py holds the two to each other."""
import json

import tools.notebook_times as nt


def _fake(monkeypatch, tmp_path):
    record = tmp_path / "notebooks.json"
    record.write_text(json.dumps({"notebooks": {"01_x.ipynb": {"seconds": 40.0, "slowest_cell_s": 5.0}}}))
    written = []
    monkeypatch.setattr(nt, "RECORD", record)
    monkeypatch.setattr(nt, "ROOT", tmp_path)
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "01_x.ipynb").write_text("{}")
    monkeypatch.setattr(nt, "measure", lambda path: {"seconds": 20.0, "slowest_cell_s": 3.0})
    monkeypatch.setattr(nt, "write_lines", lambda rec: written.append("lines"))
    monkeypatch.setattr(nt, "write_teaching", lambda rec: written.append("teaching"))
    return record, written


def test_a_measuring_run_leaves_the_record_as_it_was(monkeypatch, tmp_path, capsys):
    record, written = _fake(monkeypatch, tmp_path)
    before = record.read_text()
    assert nt.main([]) == 0
    assert record.read_text() == before and written == []
    out = capsys.readouterr().out
    assert "01_x.ipynb: 20 s" in out and "left as it was" in out


def test_write_changes_the_record_and_the_cells_together(monkeypatch, tmp_path):
    record, written = _fake(monkeypatch, tmp_path)
    assert nt.main(["--write"]) == 0
    assert json.loads(record.read_text())["notebooks"]["01_x.ipynb"]["seconds"] == 20.0
    assert written == ["lines", "teaching"]
