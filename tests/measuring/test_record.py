"""The one reader of benchmark records: flat rows found by their fields (method, checkpoint, k, draft_vocab, dtype,
threads), one machine line, and one line naming the command when a record is missing or broken."""
import json
from pathlib import Path

import pytest

from mtplab.decoding.drafters import METHODS, PAIRS, default_for_family, pair, pairs
from mtplab.errors import MtplabError
from mtplab.measuring.record import FIELDS, Record, command, machine_text, row_tables


def test_shipped_decode_rows_are_found_by_method_and_checkpoint():
    rec = Record.load("decode")
    d3 = rec.row(method="deepseek", checkpoint="deepseek-d3")
    assert d3["label"] == "deepseek D=3" and d3["k"] == 4
    assert rec.row(method="deepseek", checkpoint="deepseek-d1")["k"] == 2
    assert rec.row(method="meta", checkpoint="no-such-checkpoint") is None
    assert {r["label"] for r in rec.rows} == {p.label for p in pairs() if p.method != "deepseek-reuse"}
    assert rec.machine_text().startswith("measured on ") and "cores" in rec.machine_text()


def test_old_records_were_rewritten_with_their_pairs_fields():
    """scripts/flat_records.py gave the rows of records written before `method`/`checkpoint` their pair's fields once;
    the reader parses no label (`_compat_fields` is gone)."""
    import mtplab.measuring.record as record
    assert not hasattr(record, "_compat_fields") and not hasattr(record, "OLD_LABELS")
    k = Record.load("k")
    # k.json was re-measured (exact kernel) after the pairs were relabelled: its rows carry today's label
    assert k.row(method="blockwise-overlap", checkpoint="stern-k4", k=2, adapt="fixed")["label"] == "blockwise-overlap"
    assert k.row(method="deepseek-reuse", k=2)["checkpoint"] == "deepseek-d1"
    depth = Record.load("regime").table("by_depth")
    assert {r["checkpoint"] for r in depth} == {"stern-k4-l4", "meta-k4-l4", "deepseek-d1-l4", "deepseek-d3-l4"}
    # domain rows ran on the domain pair: their method names are not read as shipped pairs
    assert all(r["checkpoint"] is None for r in Record.load("domain").rows)


SHIPPED = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "docs" / "bench").glob("*.json"))


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_row_is_flat_and_found_by_its_fields_alone(name):
    """Issue 38: every record is flat rows with method, checkpoint, k, draft_vocab, dtype and threads as fields, and
    `Record.row` finds each by those fields (with its label, or the fields that tell rows of one record apart)."""
    rec = Record.load(name)
    tables = row_tables(rec.data)
    if name == "real":
        assert "rows" in tables and all("rows" not in run for run in rec["threads"].values())
    for key in tables:
        rows = rec.table(key)
        for r in rows:
            missing = [f for f in FIELDS if f not in r]
            assert not missing, f"{name}.{key}: a row lacks {missing}"
            match = {f: r[f] for f in FIELDS}
            if sum(all(o.get(f) == v for f, v in match.items()) for o in rows) > 1:  # the fields do not tell it apart
                match.update({f: r[f] for f in ("label", "adapt", "batch_size", "kind", "tree", "alpha", "width",
                                                 "n_layer", "n_embd", "trained_on", "text", "config") if f in r})
            assert rec.row(key, **match) is r or rec.row(key, **match) == r, (name, key, match)
    if name == "real":
        best = rec.row(method="deepseek-reuse", k=4, draft_vocab="reduced", dtype="fp32", threads=1)
        assert best is not None and best["checkpoint"] == "deepseek-d1" and best["model"] == "smollm2"


def test_new_rows_keep_their_own_fields(tmp_path):
    p = tmp_path / "decode.json"
    p.write_text(json.dumps({"rows": [{"label": "meta", "method": "meta", "checkpoint": "meta-k9", "k": 3}]}))
    assert Record.load(p).row(method="meta")["checkpoint"] == "meta-k9"
    from mtplab.measuring.record import flat
    stamped = flat({"dtype": "bf16", "threads": 2, "rows": [{"method": "meta", "k": 3}, {"method": "ar", "dtype": "x"}]})
    assert stamped["rows"][0] == {"method": "meta", "k": 3, "checkpoint": None, "draft_vocab": "full", "dtype": "bf16",
                                  "threads": 2}
    assert stamped["rows"][1]["dtype"] == "x"  # what a row says is kept


def test_missing_and_broken_records_name_the_command(tmp_path):
    with pytest.raises(MtplabError, match="python -m mtplab bench decode --quick --dtype bf16` writes it"):
        Record.load(tmp_path / "decode-quick-bf16.json")
    bad = tmp_path / "tree.json"
    bad.write_text("{not json")
    with pytest.raises(MtplabError, match="not valid JSON.*bench tree"):
        Record.load(bad)
    bad.write_text(json.dumps({"rows": None}))
    with pytest.raises(MtplabError, match="no 'rows' list.*bench tree"):
        Record.load(bad).table()
    bad.write_text("[1, 2]")
    with pytest.raises(MtplabError, match="no JSON object"):
        Record.load(bad)
    assert command("cost-curve-classroom-fp32") == "python -m mtplab bench cost-curve --preset classroom"
    assert command("loops") is None


def test_one_machine_line_for_every_kind_of_record():
    m = {"cpu": "X", "threads": 1, "cores": 2, "llc": "1 MiB", "torch": "2", "device": "cpu"}
    assert machine_text(m) == "measured on X, 1 of 2 cores, last-level cache 1 MiB, torch 2, device cpu"
    assert machine_text(None, device="cpu", threads=1) == "measured on cpu, 1 thread (machine not recorded)"
    assert machine_text("a laptop") == "measured on a laptop"


def test_the_catalogue_names_each_familys_default_and_every_pair_ships():
    assert [default_for_family(f).name for f in ("stern", "meta", "deepseek")] == ["blockwise-overlap", "meta",
                                                                                    "deepseek"]
    with pytest.raises(MtplabError, match="no method decodes head family"):
        default_for_family("eagle")
    assert all(p.method in METHODS for p in pairs()) and len({p.label for p in PAIRS}) == len(PAIRS)
    assert pair("deepseek D=3").checkpoint == "deepseek-d3"
    with pytest.raises(MtplabError, match="no shipped pair"):
        pair("nope")


def test_every_benchmark_table_is_a_filter_of_the_catalogue():
    from mtplab.bench.batch import BATCH_METHODS
    from mtplab.bench.decode import ROWS
    from mtplab.bench.engines import SWEEP
    from mtplab.bench.regime import HEADS
    from mtplab.teaching.meta import FAMILIES
    assert set(ROWS) <= set(PAIRS) and set(SWEEP) <= set(PAIRS)
    assert BATCH_METHODS == ("blockwise-overlap", "meta", "deepseek")
    assert {label: m for label, (m, _) in HEADS.items()} == {p.label: p.method for p in PAIRS if p.label in HEADS}
    assert all(name == pair(label).checkpoint + "-l4" for label, (_, name) in HEADS.items())
    assert {f: p.checkpoint for f, p in FAMILIES.items()} == {"stern": "stern-k4", "meta": "meta-k4",
                                                              "deepseek": "deepseek-d3"}


def test_the_real_models_rows_are_pairs_rows_labelled_from_their_fields():
    """Issue 38, item 3: the study's rows (hf.study.ROWS) became PAIRS rows with model, draft vocabulary and dtype as
    fields; each label is made from the fields, and every row of the shipped bench real record is found by them."""
    from mtplab.decoding.drafters import real_label
    from mtplab.hf.real import REAL_MODELS
    name = next(iter(REAL_MODELS))
    real = pairs(name)
    assert real and all(p.label == real_label(p.method, p.k, p.draft_vocab, p.dtype, p.kernel, p.widths, p.stop)
                        for p in real)
    assert real_label("deepseek-reuse", 4, "reduced", stop=0.3) == "DeepSeek D=1 reused, k=4, reduced vocab, confidence stop 0.3"
    assert real_label("deepseek-reuse", 4, "reduced", "bf16") == "DeepSeek D=1 reused, k=4, reduced vocab, bf16"
    assert real[0].label == "AR" and not set(pairs()) & set(real)
    rec = Record.load("real")
    for r in rec.rows:
        p = next(p for p in real if p.label == r["label"])
        assert (p.method, p.checkpoint, p.k, p.draft_vocab, p.dtype, p.model) == (
            r["method"], r["checkpoint"], r["k"], r["draft_vocab"], r["dtype"], r["model"]), r["label"]
        assert rec.row(method=p.method, k=p.k, draft_vocab=p.draft_vocab, dtype=p.dtype, kernel=p.kernel,
                       widths=list(p.widths) if p.widths else None, threshold=p.stop, threads=r["threads"]) is r  # JSON


def test_records_name_their_kernel_and_old_ones_read_as_stock(tmp_path):
    """A record written now says which kernel its linears ran; one written before the exact kernel existed says
    nothing and reads as 'stock' (notebook 01 names the kernels when a record and a live run differ)."""
    from mtplab.bench import report
    from mtplab.model import kernels
    report._write(tmp_path, "k", {"rows": [{"label": "a"}]}, "| a |", device="cpu")
    assert Record.load(tmp_path / "k.json").kernel() == ("exact" if kernels.active() else "stock")
    with kernels.use_stock():
        report._write(tmp_path, "k", {"rows": [{"label": "a"}]}, "| a |", device="cpu")
    assert json.loads((tmp_path / "k.json").read_text())["kernel"] == "stock"
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"rows": [{"label": "a"}]}))
    assert Record.load(old).kernel() == "stock"
    old.write_text(json.dumps({"rows": [{"label": "a", "kernel": "exact"}, {"label": "b", "kernel": "exact"}]}))
    assert Record.load(old).kernel() == "exact"  # every row names the same one
    assert Record.load("real").kernel() == ("exact" if "stock kernels" in Record.load("real").path.with_suffix(
        ".md").read_text() else "stock")  # bench real raced the stock kernels beside its default, the exact one
