"""The rest of review 2026-12-02-reliability-3 (issue 41): options `generate --hf` would ignore (g-dv-reduced-*,
g-heads-with-ar), the widget's draft model on a Hugging Face model (w-draft-model), notebook 05's real-model settings
(n05-real-*), the class's preflight records read back (c-*), and the real model named once (issue 38). Each bad case
is one line, no traceback, in bounded time, and changes no file. In this process."""
import ast
import json
from pathlib import Path

import pytest

from mtplab.errors import MtplabError
from mtplab.paths import DATA_DIR, REAL_NAMES
from tests.reliability.helpers import refused
from tests.reliability.realcases import one_line_error, snapshot

ROOT = Path(__file__).resolve().parents[2]
REAL = REAL_NAMES[0]

# ---- generate --hf: an option the method would ignore is refused before anything loads --------------------------------
GENERATE = {  # review case: (the options after generate --hf REAL --prompt hi, what the line says)
    "g-dv-reduced-ar": (["--method", "ar", "--draft-vocab", "reduced"], "--method ar drafts without heads"),
    "g-dv-reduced-ngram": (["--method", "ngram", "--draft-vocab", "reduced"], "--method ngram drafts without heads"),
    "g-dv-reduced-draft-model": (["--method", "draft-model", "--draft-vocab", "reduced", "--draft-hf", "d"],
                                 "--draft-vocab reduced go with the heads"),
    "g-heads-with-ar": (["--method", "ar", "--heads-checkpoint", "nonexistent.safetensors"],
                        "--heads-checkpoint and --draft-vocab reduced go with the heads of a head method"),
    "g-heads-with-ngram": (["--method", "ngram", "--heads-checkpoint", "h.safetensors"], "deepseek-reuse)"),
    "g-draft-hf-with-ar": (["--method", "ar", "--draft-hf", "d"], "--method ar does not use one"),
    "g-draft-hf-with-heads": (["--method", "deepseek", "--draft-hf", "d"], "choose --method draft-model"),
}


@pytest.mark.parametrize("case", list(GENERATE))
def test_generate_hf_refuses_an_option_its_method_ignores(case, capsys, tmp_path, monkeypatch):
    """The run went on and its JSON named heads or a draft vocabulary it never used."""
    monkeypatch.chdir(tmp_path)
    opts, fragment = GENERATE[case]
    before = snapshot(tmp_path)
    err = one_line_error(lambda: _raise_refused(capsys, fragment, "generate", "--hf", REAL, "--prompt", "hi",
                                                "--json", *opts), fragment, seconds=5)
    assert "drop" in err
    assert snapshot(tmp_path) == before


def _raise_refused(capsys, fragment, *args):
    """refused() (status 2, one stderr line) raised as the lab's error, so one_line_error can time it."""
    raise MtplabError(refused(capsys, fragment, *args))


# ---- the widget: no draft model for a Hugging Face model ---------------------------------------------------------------
@pytest.mark.parametrize("checkpoint", [REAL, "hf-folder"])
def test_the_widget_says_it_has_no_draft_model_for_a_hugging_face_model(checkpoint, hfdirs, tmp_path, monkeypatch):
    """w-draft-model: method='draft-model' on smollm2 loaded both models and named their vocabularies' mismatch."""
    from mtplab.teaching.acceptance_lab import session
    from mtplab.teaching.acceptance_lab.state import LabState
    name = str(hfdirs / "gpt2") if checkpoint == "hf-folder" else checkpoint
    models = session.ModelCache()
    monkeypatch.chdir(tmp_path)
    out = session.decode(LabState(method="draft-model", k=3, checkpoint=name, max_new_tokens=4), models)
    assert out.trace is None and "\n" not in out.error, out.error
    assert f"no draft model for {name}" in out.error and "--draft-hf" in out.error
    assert not models.models  # refused before loading anything
    assert not list(tmp_path.iterdir())


# ---- notebook 05's real-model settings: one line, then the section is skipped -----------------------------------------
@pytest.fixture(scope="module")
def real():
    from mtplab.teaching import real
    if real.missing():
        pytest.skip(real.missing())
    return real


ROW = ("deepseek-reuse", 4, "reduced")
SETTINGS = {  # review case: ((REAL_METHOD, REAL_K, REAL_RECORD_ROW), what the line says; None: fine)
    "n05-real-k0": (("deepseek-reuse", 0, ROW), "REAL_K = 0 is not a number of tokens per step"),
    "n05-real-k-float": (("deepseek", 2.5, ROW), "set it to an integer >= 1"),
    "n05-real-k-too-large": (("deepseek", 3, ROW), "(at most 2); lower it"),
    "n05-real-method-meta": (("meta", 4, ROW), "REAL_METHOD = 'meta' has no heads the lab ships"),
    "n05-real-method-bogus": (("fast", 4, ROW), "one of blockwise-overlap, deepseek, deepseek-reuse"),
    "n05-real-row-bogus": (("best", 4, ["x", 1, "y"]), "REAL_RECORD_ROW: name a real-model row"),
    "n05-defaults": (("best", 4, ROW), None),
    "n05-reuse-k4": (("deepseek-reuse", 4, "best"), None),
}


@pytest.mark.parametrize("case", list(SETTINGS))
def test_notebook_05s_real_settings_are_one_line(case, real):
    """REAL_K 0, REAL_METHOD meta (told to use the lab's meta-k4) and a wrong REAL_RECORD_ROW stopped the notebook."""
    args, fragment = SETTINGS[case]
    if fragment is None:
        assert real.settings_problem(*args) is None
        return
    msg = real.settings_problem(*args)
    assert msg is not None and "\n" not in msg and fragment in msg, msg
    assert "in the parameters cell" in msg or msg.startswith("REAL_RECORD_ROW: "), msg
    assert "meta-k4" not in msg


def test_notebook_05_asks_for_the_settings_before_the_real_model_section():
    """The cell that starts the section prints the line and skips (real-05d reads the same `why`)."""
    nb = json.loads((ROOT / "notebooks" / "05_acceptance_lab.ipynb").read_text())
    cells = {c.get("id"): "".join(c["source"]) for c in nb["cells"]}
    start = cells["real-05b"]
    assert "real.settings_problem(REAL_METHOD, REAL_K, REAL_RECORD_ROW" in start
    assert start.index("settings_problem") < start.index("if why:") < start.index("real.chat_answer")
    assert "rec = None if why else" in cells["real-05d"]


# ---- the class's preflight records ------------------------------------------------------------------------------------
def _machine(**m):
    return lambda r: r["machine"].update(m)


def _row(**fields):
    return lambda r: r["predictions"]["classroom"][0].update(fields)


def _drop(key):
    return lambda r: r["predictions"]["classroom"][0].pop(key)


RECORDS = {  # review case: (how the crafted record differs from a good one, what the line says; None: read)
    "c-no-predicted": (_drop("tokens_per_step"), "tokens_per_step None"),
    "c-speedup-str": (_row(tokens_per_step="fast"), "tokens_per_step 'fast'"),
    "c-speedup-zero": (_row(tokens_per_step=0), "a number above 0"),
    "c-speedup-null": (_row(tokens_per_step=None), "tokens_per_step None"),
    "c-speedup-nan": (_row(tokens_per_step=float("nan")), "tokens_per_step nan"),
    "c-speedup-neg": (_row(tokens_per_step=-3), "tokens_per_step -3"),
    "c-speedup-huge": (_row(tokens_per_step=1e300), "at most 1000"),
    "c-speedup-bool": (_row(tokens_per_step=True), "tokens_per_step True"),
    "c-rows-not-dicts": (lambda r: r.update(predictions={"classroom": ["blockwise-overlap"]}), "want a dict"),
    "c-rows-not-list": (lambda r: r.update(predictions={"classroom": 5}), "not a list of rows"),
    "c-predictions-str": (lambda r: r.update(predictions="all"), "predictions is a str"),
    "c-model-not-dict": (lambda r: r.update(classroom=7), "classroom is not a dict"),
    "c-row-name-int": (_row(row=3), "a row of predictions.classroom"),
    "c-there-str": (_row(measured_there="1.2x"), "measured_there '1.2x'"),
    "c-there-null": (_row(measured_there=None), None),  # no lab row raced there: fine
    "c-threads-str": (_machine(threads="two"), "threads 'two'"),
    "c-threads-zero": (_machine(threads=0), "counts from 1"),
    "c-cores-huge": (_machine(cores=10 ** 400), "counts from 1"),
    "c-cpu-list": (_machine(cpu=["x"]), "machine cpu ['x']"),
    "c-predictions-list": (lambda r: r.update(predictions=[]), None),  # no rows: no point (review: ok)
    "c-llc-str": (_machine(llc_bytes="8 MiB"), None),                 # no cache point (review: ok)
    "c-k-str": (_row(k="four"), "k 'four'"),                          # issue 39: the grader recomputes from these
    "c-draft-neg": (_row(draft_t1=-1), "draft_t1 -1"),
    "c-no-curve": (lambda r: r["classroom"].pop("ratio"), "classroom.ratio None"),
    "c-good": (lambda r: None, None),
}


def _good() -> dict:
    return {"machine": {"cpu": "Student CPU", "cores": 4, "threads": 2, "llc_bytes": 8 << 20},
            "classroom": {"model": "ntp, 12 x 256", "ratio": {"1": 1.0, "4": 1.3}}, "busy": None, "others_cores": 0.1,
            "predictions": {"classroom": [{"row": "blockwise", "method": "blockwise", "k": 4, "tokens_per_step": 2.6,
                                           "measured_there": 1.27}]}}


@pytest.mark.parametrize("case", list(RECORDS))
def test_a_bad_class_record_is_one_line_naming_it(case, tmp_path):
    """Notebook 01's CLASS_RECORDS cell: read_class -> points -> spread -> figure."""
    from mtplab.teaching import classroom
    folder = tmp_path / "class"
    folder.mkdir()
    (folder / "a.json").write_text(json.dumps(_good()))
    crafted = _good()
    change, fragment = RECORDS[case]
    change(crafted)
    (folder / "b.json").write_text(json.dumps(crafted))
    before = snapshot(tmp_path)

    def notebook_cell():
        pts = classroom.points(classroom.read_class(folder))
        classroom.spread(pts, "blockwise")
        classroom.figure(pts, "blockwise")
        return pts

    if fragment is None:
        assert {p["source"] for p in notebook_cell()} >= {"a.json"}
    else:
        msg = one_line_error(notebook_cell, str(folder / "b.json"), fragment, "preflight --out", seconds=5)
        assert "a.json" not in msg
    assert snapshot(tmp_path) == before


def test_the_shipped_class_records_read():
    from mtplab.teaching import classroom
    assert len(classroom.read_class()) == len(list((DATA_DIR / "classroom").glob("*.json")))


# ---- the real model named once (issue 38) -----------------------------------------------------------------------------
def test_the_real_model_is_named_only_in_its_table():
    """'smollm2' as a string in the package: once, the name in paths.REAL_MODELS (the ground floor's one table of real
    models, keyed by that name); no other string of code holds it, help strings and messages included (they are
    formatted from the table). Docstrings and comments are documentation and may name it."""
    found, inside = [], []
    for p in sorted((ROOT / "mtplab").rglob("*.py")):
        tree = ast.parse(p.read_text(encoding="utf-8"))
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for n in ast.walk(tree):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
                where = f"{p.relative_to(ROOT).as_posix()}:{n.lineno}"
                if n.value == REAL:
                    found.append(where)
                elif REAL in n.value:
                    inside.append(where)
    assert len(found) == 1 and found[0].startswith("mtplab/paths.py:"), found
    assert all(w.startswith("mtplab/paths.py:") for w in inside), inside  # its package and module names
