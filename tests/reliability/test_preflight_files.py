"""`preflight` (review 2026-12-02-reliability-3, p-*): --out is checked before anything is measured (never a device,
a pipe, a link, a folder or a shipped file, all of which the atomic write would have replaced), and the shipped
benchmark records it reads are checked before measuring too. In this process: each refusal comes before the timing."""
import json
import os

import pytest

from mtplab import paths
from mtplab.bench import preflight
from tests.reliability.realcases import fifo, one_line_error, snapshot

ROOT = paths.ROOT


def _devnull(tmp):
    if not os.path.exists("/dev/null"):
        pytest.skip("no /dev/null here")
    return "/dev/null"


def _fifo(tmp):
    fifo(tmp / "pipe.json")
    return tmp / "pipe.json"


def _link(tmp):
    if os.name == "nt":
        pytest.skip("symbolic links need a privilege on Windows")
    (tmp / "real.json").write_text("{}")
    (tmp / "link.json").symlink_to(tmp / "real.json")
    return tmp / "link.json"


def _dir(tmp):
    (tmp / "d.json").mkdir()
    return tmp / "d.json"


OUTS = {  # review case: (the --out, what the line says)
    "p-out-devnull-ns": (_devnull, "is a device or a pipe"),
    "p-out-devnode": (_devnull, "not a regular file"),
    "p-out-fifo": (_fifo, "is a device or a pipe"),
    "p-out-stdout-link": (_link, "is a link"),
    "p-out-dir": (_dir, "is a folder"),
    "p-out-shipped-ntp": (lambda t: paths.CHECKPOINT_DIR / "ntp.json", "which the lab ships"),
    "p-out-shipped-record": (lambda t: paths.HF_DIR / "smollm2" / "record.json", "which the lab ships"),
    "p-out-nonutf8": (lambda t: t / os.fsdecode(b"pf\xff.json"), "is not valid UTF-8"),
}


@pytest.mark.parametrize("case", list(OUTS))
def test_an_out_that_would_be_replaced_is_refused_before_measuring(case, tmp_path, monkeypatch):
    monkeypatch.delenv("MTPLAB_WRITE_SHIPPED", raising=False)
    out, fragment = OUTS[case]
    out = out(tmp_path)
    watched = [tmp_path, paths.CHECKPOINT_DIR, paths.HF_DIR / "smollm2"]
    before = [snapshot(d) for d in watched]
    st = os.lstat(out) if os.path.lexists(out) else None
    one_line_error(lambda: preflight.run_preflight(out=str(out), quick=True, log=None), fragment, "--out",
                   seconds=5)  # the measurement alone takes longer
    assert [snapshot(d) for d in watched] == before
    if st is not None:
        assert os.lstat(out).st_mode == st.st_mode


RECORDS = {  # review case: (the record, its edit, what the line says)
    "p-real-record-tampered": ("real.json", lambda d: d.pop("threads"), "KeyError: 'threads'"),
    "p-real-rows-str": ("real.json", lambda d: d.__setitem__("rows", "x"), "restore it from git"),
    "p-decode-record-no-method": ("decode.json", lambda d: [r.pop("method") for r in d["rows"]], "restore it from git"),
    "p-decode-k-str": ("decode.json", lambda d: [r.__setitem__("k", "four") for r in d["rows"]], "a row preflight"),
}


@pytest.mark.parametrize("case", list(RECORDS))
def test_a_tampered_shipped_record_is_one_line_before_measuring(case, tmp_path, monkeypatch):
    name, edit, fragment = RECORDS[case]
    bench = tmp_path / "bench"
    bench.mkdir()
    for n in ("real.json", "decode.json"):
        (bench / n).write_bytes((paths.BENCH_DIR / n).read_bytes())
    d = json.loads((bench / name).read_text())
    edit(d)
    (bench / name).write_text(json.dumps(d))
    monkeypatch.setattr(paths, "BENCH_DIR", bench)
    monkeypatch.setattr(paths, "DECODE_JSON", bench / "decode.json")
    msg = one_line_error(lambda: preflight.run_preflight(out=str(tmp_path / "pf.json"), quick=True, log=None),
                         name, fragment, seconds=5)
    assert "git checkout" in msg and not (tmp_path / "pf.json").exists()


def test_the_shipped_records_read():
    """The control: the records as shipped give rows to predict from."""
    assert preflight._classroom_rows() and preflight._real_rows()
    preflight.check_out(ROOT / "build" / "preflight.json")


def test_preflight_out_dev_null_is_one_line_from_the_cli(capsys):
    """p-out-devnull-ns: as root, preflight --out /dev/null turned /dev/null into a JSON file."""
    from tests.reliability.helpers import refused
    if not os.path.exists("/dev/null"):
        pytest.skip("no /dev/null here")
    st = os.stat("/dev/null")
    refused(capsys, "--out /dev/null is a device or a pipe", "preflight", "--quick", "--out", "/dev/null")
    assert os.stat("/dev/null").st_rdev == st.st_rdev
