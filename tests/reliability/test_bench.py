"""`bench`: --out and --device checked before a benchmark runs, --prompts bounded, and what was measured kept when
--out cannot take it (a full disk): in the temp dir, else printed, and the one line says where."""
import json
import time
from pathlib import Path

import pytest

from mtplab.bench import report
from mtplab.errors import MtplabError
from mtplab import files
from tests.reliability.helpers import disk_full, full_under, main, refused


# ---- checked before the benchmark runs (b03, b04, b06, b09, n-diskfull-bench-at-start) --------------------------------
def test_bench_checks_out_and_device_before_running(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    t = time.time()
    refused(capsys, "cannot write to --out /proc/x", "bench", "cost-curve", "--preset", "tiny", "--quick", "--out", "/proc/x")
    refused(capsys, f"--out {tmp_path / 'f'} is a file, not a directory", "bench", "decode", "--quick", "--out", tmp_path / "f")
    refused(capsys, "unknown device 'bogus'", "bench", "train", "--quick", "--device", "bogus", "--out", tmp_path / "b")
    assert time.time() - t < 10  # refused before any benchmark ran


def test_a_full_out_is_found_by_the_probe_before_the_benchmark(tmp_path, monkeypatch, capsys):
    """A 0-byte probe file fits on a full disk; one block does not."""
    import os
    monkeypatch.setattr(os, "write", disk_full)
    refused(capsys, f"cannot write to --out {tmp_path} (the disk is full); choose a writable directory for the results",
            "bench", "decode", "--quick", "--out", tmp_path)


@pytest.mark.parametrize("bench,prompts", [("peers", 10**8), ("peers", 0), ("domain", -1), ("domain", 10**8)])
def test_bench_prompt_counts_are_bounded(bench, prompts):
    import argparse
    from mtplab.bench import domain, peers
    a = argparse.Namespace(prompts=prompts, quick=False, device="cpu", dtype="fp32", hf="x", out="build/x")
    with pytest.raises(MtplabError, match=r"--prompts must be in 1\.\.20"):
        (peers.run_peers if bench == "peers" else domain.run_domain)(a)


# ---- what was measured is kept (n-diskfull-bench-at-start: the record write failed after the benchmark ran) -----------
RECORD = {"rows": [{"method": "ar", "speedup": 1.0}]}


def test_results_that_out_cannot_take_are_kept_in_the_temp_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "atomic_write", full_under(tmp_path / "out", files.atomic_write))
    with pytest.raises(MtplabError) as e:
        report._write(tmp_path / "out", "decode", RECORD, "| method |", device="cpu")
    msg = str(e.value)
    assert msg.startswith(f"could not write decode.json to {tmp_path / 'out'} (the disk is full); the results measured "
                          "are kept in ") and "\n" not in msg
    kept = Path(msg.split("are kept in ")[1].split(":")[0])
    kept_rows = json.loads(kept.read_text())["rows"]  # written flat: the measured fields, plus the row's field set
    assert kept.name == "decode.json" and [{k: r[k] for k in RECORD["rows"][0]} for r in kept_rows] == RECORD["rows"]
    assert (kept.parent / "decode.md").read_text().startswith("| method |")


def test_results_are_printed_when_the_temp_dir_is_full_too(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(files, "atomic_write", disk_full)
    monkeypatch.setattr(report.tempfile, "tempdir", str(tmp_path))
    with pytest.raises(MtplabError, match=r"the results measured are kept in the JSON printed above"):
        report._write(tmp_path / "out", "decode", RECORD, "| method |", device="cpu")
    printed = json.loads(capsys.readouterr().out)
    assert [{k: r[k] for k in RECORD["rows"][0]} for r in printed["rows"]] == RECORD["rows"] and "machine" in printed


def test_the_cli_reports_kept_results_in_one_line(tmp_path, monkeypatch, capsys):
    from mtplab import bench

    def measured(a):
        report._write(Path(a.out), "decode", RECORD, "| method |")
        return RECORD
    monkeypatch.setitem(bench.RUNS, "decode", measured)
    monkeypatch.setattr(files, "atomic_write", full_under(tmp_path / "out", files.atomic_write))
    t = time.time()
    rc, err = main(capsys, "bench", "decode", "--quick", "--device", "cpu", "--out", tmp_path / "out")
    assert rc == 2 and err.count("\n") == 0 and "the results measured are kept in " in err, err
    assert time.time() - t < 60
