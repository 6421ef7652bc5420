"""What the prose says about the lab itself must match the lab: module names that exist, prompt counts that match
the records they cite, notebook counts that match the notebooks folder. No model is run; every check reads text.

Scanned: the markdown cells of every notebook, README.md, data/README.md and docs/*.md. (The drawn-table tests of
tests/notebooks/test_report.py and tests/notebooks/test_notebooks.py hold tables and run-time lines to their records; this file holds
the sentences.)
"""
from __future__ import annotations

import importlib
import json
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
DOCS = [ROOT / "README.md", ROOT / "data" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SUBPACKAGES = sorted(p.name for p in (ROOT / "mtplab").iterdir() if (p / "__init__.py").exists())
WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                                    "fourteen fifteen sixteen seventeen eighteen nineteen twenty".split())}
NUMBER = r"(\d+|" + "|".join(WORDS) + r")"


def _int(word: str) -> int:
    return int(word) if word.isdigit() else WORDS[word.lower()]


def _markdown(nb: Path) -> str:
    cells = json.loads(nb.read_text())["cells"]
    return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


@cache
def texts() -> dict[str, str]:
    out = {nb.name: _markdown(nb) for nb in NOTEBOOKS}
    out.update({str(p.relative_to(ROOT)): p.read_text() for p in DOCS if p.exists()})
    return out


def _sentences(text: str) -> list[str]:
    """Paragraphs, then sentences (a full stop, question or exclamation mark before a space and a capital, a backtick
    or a digit); a markdown table row or a list item is a sentence of its own."""
    out = []
    for para in re.split(r"\n\s*\n|\n(?=\s*(?:[-*|]|\d+\.)\s)", text):
        out += re.split(r"(?<=[.!?])\s+(?=[A-Z`0-9])", " ".join(para.split()))
    return out


# ---------------------------------------------------------------------------------- module names
@cache
def _resolves(dotted: str) -> bool:
    """mtplab.a.b.c names a module, or an attribute (a chain of them) of the longest importable prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                try:  # a submodule not yet imported by its package
                    obj = importlib.import_module(f"{obj.__name__}.{name}")
                    continue
                except (ModuleNotFoundError, AttributeError):
                    return False
            obj = getattr(obj, name)
        return True
    return False


def _module_names(text: str) -> set[str]:
    """Every `mtplab.x.y` written out in full, and every short `subpackage.module[.name]` in backticks whose first two
    parts name a real module file (`decoding.accept`, `measuring.speedup.bench_row`). A short form whose second part
    is not a module file (`model.mtp`, an attribute of a model object) is not a claim about the tree."""
    names = {m.rstrip(".") for m in re.findall(r"\bmtplab(?:\.[A-Za-z_][A-Za-z0-9_]*)+", text)}
    for code in re.findall(r"`([^`\n]+)`", text):
        m = re.fullmatch(r"([a-z_]+)\.([a-z_][a-z0-9_]*)((?:\.[A-Za-z_][A-Za-z0-9_]*)*)(\(.*\))?", code.strip())
        if m and m.group(1) in SUBPACKAGES and (ROOT / "mtplab" / m.group(1) / f"{m.group(2)}.py").exists():
            names.add(f"mtplab.{m.group(1)}.{m.group(2)}{m.group(3)}")
    return names


def _paths(text: str) -> set[str]:
    return set(re.findall(r"\bmtplab/[A-Za-z0-9_/]+\.py\b", text))


@pytest.mark.parametrize("name", sorted(texts()))
def test_every_module_named_in_the_prose_exists(name):
    text = texts()[name]
    missing = sorted(n for n in _module_names(text) if not _resolves(n))
    missing += sorted(p for p in _paths(text) if not (ROOT / p).exists())
    assert not missing, f"{name} names modules or files that do not exist: {missing}"


# a short `module.name` (`speedup.live_speedup`, `timing.interleaved_race`) names a function of that module file;
# stems that prose also uses for objects (`trace.steps` is a Trace's field, `run.tokens` a decode's) are not claims
MODULE_STEMS: dict[str, list[str]] = {}
for _f in sorted((ROOT / "mtplab").rglob("*.py")):
    if _f.stem != "__init__":
        MODULE_STEMS.setdefault(_f.stem, []).append(".".join(_f.relative_to(ROOT).with_suffix("").parts))
OBJECT_STEMS = {"trace", "run", "record", "state", "config", "step", "view", "session", "heads", "target", "data",
                "meta"}  # a checkpoint's meta dict (`meta.history`)


def _short_names(text: str) -> list[tuple[str, list[str]]]:
    """Every backticked `stem.name` whose stem is a module file of the package (not a subpackage) and not one of
    OBJECT_STEMS: (what was written, the dotted names it may mean)."""
    out = []
    for code in re.findall(r"`([^`\n]+)`", text):
        m = re.fullmatch(r"([a-z_][a-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)(\(.*\))?", code.strip())
        if m and m.group(1) in MODULE_STEMS and m.group(1) not in OBJECT_STEMS and m.group(1) not in SUBPACKAGES:
            out.append((code.strip(), [f"{mod}.{m.group(2)}" for mod in MODULE_STEMS[m.group(1)]]))
    return out


def _docstrings() -> dict[str, str]:
    """Every module's, class's and function's docstring in the package, by file."""
    import ast
    out = {}
    for f in sorted((ROOT / "mtplab").rglob("*.py")):
        tree = ast.parse(f.read_text())
        docs = [ast.get_docstring(n) or "" for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
        out[str(f.relative_to(ROOT))] = "\n\n".join(d for d in docs if d)
    return out


def _notebook_code(nb: Path) -> str:
    cells = json.loads(nb.read_text())["cells"]
    return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


@pytest.mark.parametrize("name", sorted(texts()))
def test_every_function_named_in_the_prose_exists(name):
    """Review finding (design-3): prose and docstrings named `speedup.live_speedup`, `speedup.batch_sweep` and other
    functions after they were gone. A short `module.function` must name something that module has."""
    text = texts()[name]
    missing = sorted(code for code, means in _short_names(text) if not any(_resolves(m) for m in means))
    assert not missing, f"{name} names functions that do not exist: {missing}"


def test_no_docstring_names_a_module_or_function_that_does_not_exist():
    bad = {}
    for path, text in _docstrings().items():
        missing = sorted(n for n in _module_names(text) if not _resolves(n))
        missing += sorted(code for code, means in _short_names(text) if not any(_resolves(m) for m in means))
        missing += sorted(p for p in _paths(text) if not (ROOT / p).exists())
        if missing:
            bad[path] = missing
    assert not bad, f"docstrings name what does not exist: {bad}"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_import_and_call_names_something_that_exists(nb):
    """A notebook's code names `mtplab.x.y` in its imports; each must resolve (a renamed function fails here, before
    a papermill run)."""
    code = _notebook_code(nb)
    names = set()
    for mod, what in re.findall(r"^\s*from (mtplab(?:\.\w+)*) import \(?([^)\n]+)", code, re.M):
        names |= {f"{mod}.{w.split(' as ')[0].strip()}" for w in what.split(",") if w.strip()}
    names |= {n.rstrip(".") for n in re.findall(r"\bmtplab(?:\.[A-Za-z_][A-Za-z0-9_]*)+", code)}
    missing = sorted(n for n in names if not _resolves(n))
    assert not missing, f"{nb.name} imports what does not exist: {missing}"


def test_the_module_check_catches_a_stale_name():
    assert _resolves("mtplab.decoding.accept.accept") and _resolves("mtplab.measuring.speedup")
    assert not _resolves("mtplab.batched") and not _resolves("mtplab.trees") and not _resolves("mtplab.decoding.nothing")
    assert "mtplab.decoding.accept" in _module_names("the rule (`decoding.accept`) and `model.mtp`")
    assert not any("mtp" in n for n in _module_names("`model.mtp`"))
    stale = _short_names("the race (`speedup.live_speedup`), the rows (`timing.measure_batch`), `trace.steps`")
    assert [c for c, means in stale if not any(_resolves(m) for m in means)] == ["speedup.live_speedup"]


# ---------------------------------------------------------------------------------- prompt counts against records
RECORD_ALIASES = {"decode benchmark": "decode.json", "shipped benchmark": "decode.json", "bench real": "real.json",
                  "loops.json": "loops.json"}


def _prompt_counts(record: object) -> set[int]:
    """Every prompt count a record holds: `prompts` (a number, or a list whose length counts) at any depth."""
    out: set[int] = set()
    if isinstance(record, dict):
        for k, v in record.items():
            if k in ("prompts", "n_prompts") and isinstance(v, int) and not isinstance(v, bool):
                out.add(v)
            elif k == "prompts" and isinstance(v, list):
                out.add(len(v))
            else:
                out |= _prompt_counts(v)
    elif isinstance(record, list):
        for v in record:
            out |= _prompt_counts(v)
    return out


@cache
def _record_counts(stem: str) -> frozenset[int]:
    path = ROOT / "docs" / "bench" / f"{stem}.json"
    if not path.exists():
        return frozenset()
    return frozenset(_prompt_counts(json.loads(path.read_text())))


def _cited_records(sentence: str) -> set[str]:
    stems = set(re.findall(r"docs/bench/([A-Za-z0-9_.-]+?)\.(?:json|md)\b", sentence))
    low = sentence.lower()
    stems |= {v[:-5] for k, v in RECORD_ALIASES.items() if k in low}
    return stems


PROMPTS = re.compile(NUMBER + r"(?:[ -]held-out)?(?:[ -](?:code|chat|prose))?(?:[ -]prompts\b|-prompt\b)", re.I)


def prompt_count_errors(text: str) -> list[str]:
    """Sentences that cite records and state a prompt count none of those records holds."""
    errors = []
    for s in _sentences(text):
        stems = _cited_records(s)
        allowed = set().union(*(_record_counts(st) for st in stems)) if stems else set()
        if not allowed:
            continue  # no record cited, or none that records its prompts: not determinable here
        for m in PROMPTS.finditer(s):
            before = s[max(0, m.start() - 12):m.start()].lower()
            if re.search(r"\b(first|last|per|every|each)\s*$", before):
                continue  # "the first 3 prompts" is a part of the record's set, not its size
            if _int(m.group(1)) not in allowed:
                errors.append(f"{m.group(0)!r} where {', '.join(sorted(stems))} records {sorted(allowed)}: {s[:160]}")
    return errors


@pytest.mark.parametrize("name", sorted(texts()))
def test_prompt_counts_match_the_records_they_cite(name):
    errors = prompt_count_errors(texts()[name])
    assert not errors, f"{name}:\n" + "\n".join(errors)


def test_the_prompt_check_catches_the_old_twenty():
    assert _record_counts("decode") == {8}
    assert prompt_count_errors("It says whether the shipped 20-prompt decode benchmark shows the same rise.")
    assert prompt_count_errors("Quote the benchmark (`docs/bench/decode.md`): it runs 20 prompts of 128 tokens.")
    assert not prompt_count_errors("`docs/bench/decode.md`: 8 held-out prompts, m = 128.")
    assert prompt_count_errors("The decode benchmark loops on 3 of 20 prompts.")
    assert not prompt_count_errors("Greedy continuations of the 20 held-out prompts loop (`docs/bench/loops.json`).")
    assert not prompt_count_errors("Three prompts of different lengths, decoded together.")  # no record cited
    assert not prompt_count_errors("`docs/bench/real.md`: all six prompt categories.")  # not a count of prompts


# ---------------------------------------------------------------------------------- notebook counts
def _core() -> list[int]:
    """The core notebooks: every notebook whose first cell does not call it "Going further"."""
    first = lambda nb: "".join(json.loads(nb.read_text())["cells"][0]["source"])
    return [int(nb.name[:2]) for nb in NOTEBOOKS if "Going further" not in first(nb)]


def notebook_count_errors(text: str, total: int, core: list[int]) -> list[str]:
    errors = []
    flat = " ".join(text.split())
    for m in re.finditer(r"(?:^|[.;:(]\s+|\b(?:all|the|these|of)\s+)" + NUMBER + r"\s+notebooks\b", flat, re.I):
        if _int(m.group(1)) != total:
            errors.append(f"{m.group(0).strip()!r}: there are {total} notebooks")
    for m in re.finditer(r"\b(?:run|ran|execute|executes)\s+all\s+" + NUMBER + r"\b", flat, re.I):
        if _int(m.group(1)) != total:
            errors.append(f"{m.group(0)!r}: there are {total} notebooks")
    for m in re.finditer(r"\b(\d+) of (\d+) notebooks\b", flat):
        if int(m.group(2)) != total:
            errors.append(f"{m.group(0)!r}: there are {total} notebooks")
    for m in re.finditer(r"core notebooks (\d\d)-(\d\d)", flat, re.I):
        if core and (int(m.group(1)), int(m.group(2))) != (core[0], core[-1]):
            errors.append(f"{m.group(0)!r}: the core notebooks are {core[0]:02d}-{core[-1]:02d}")
    return errors


@pytest.mark.parametrize("name", sorted(texts()))
def test_notebook_counts_match_the_folder(name):
    errors = notebook_count_errors(texts()[name], len(NOTEBOOKS), _core())
    assert not errors, f"{name}: " + "; ".join(errors)


@pytest.mark.parametrize("nb", [nb for nb in NOTEBOOKS if int(nb.name[:2]) in _core()], ids=lambda p: p.name[:2])
def test_each_core_notebook_states_its_place(nb):
    core = _core()
    m = re.search(r"Core notebook, (\d+) of (\d+)", _markdown(nb))
    if not m:
        pytest.skip(f"{nb.name} does not state its place")
    assert (int(m.group(1)), int(m.group(2))) == (core.index(int(nb.name[:2])) + 1, len(core)), m.group(0)


def test_the_glossary_lists_every_notebook():
    section = (ROOT / "docs" / "glossary.md").read_text().split("## The notebooks", 1)[1]
    missing = [nb.name[:2] for nb in NOTEBOOKS if not re.search(rf"\b{nb.name[:2]}\b", section)]
    assert not missing, f"docs/glossary.md's notebook list misses {missing}"


def test_the_notebook_check_catches_a_wrong_count():
    assert notebook_count_errors("Run all eight once on the teaching machine.", 10, [1, 2])
    assert notebook_count_errors("The ten notebooks are listed.", 11, [1, 2])
    assert notebook_count_errors("After the core notebooks 01-05.", 10, [1, 2, 3, 4, 5, 6])
    assert not notebook_count_errors("Ten notebooks, 01-06 the core; the six core notebooks.", 10, [1, 2, 3, 4, 5, 6])


# ---------------------------------------------------------------------------------- verdict words from the numbers
def test_verdict_words_say_rises_only_when_the_intervals_separate():
    from mtplab.teaching.blockwise import compare_rates, rise_words
    from mtplab.teaching.deepseek import d1_against_d3

    assert compare_rates((50, 100), (90, 100), "rises", "falls") == "rises"
    assert compare_rates((90, 100), (50, 100), "rises", "falls") == "falls"
    assert compare_rates((5, 10), (7, 10), "rises", "falls").startswith("ends higher, but within overlapping")
    assert "rises" not in rise_words([(5, 10), (3, 5), (7, 10)])  # 0.5 -> 0.7 on 10 steps: cannot tell
    assert rise_words([(60, 120), (40, 60), (38, 40)]).startswith("from position 1 to 3 conditional acceptance rises")
    live = lambda lo, med, hi: {"speedup_min": lo, "speedup": med, "speedup_max": hi, "busy": None}
    row = lambda med, reps: {"speedup_wall": med, "speedup_wall_reps": reps}
    overlap = d1_against_d3((164, 105), (live(1.2, 1.3, 1.7), live(1.1, 1.29, 1.5)),
                            (row(1.47, [1.42, 1.48]), row(1.63, [1.57, 1.76])))
    assert "cannot say" in overlap and "in the benchmark D = 3 gained more time" in overlap
    apart = d1_against_d3((164, 105), (live(1.2, 1.3, 1.4), live(0.5, 0.6, 0.7)), (None, None))
    assert "live, gained less time" in apart
    busy = d1_against_d3((164, 105), (live(1.2, 1.3, 1.4), live(0.5, 0.6, 0.7) | {"busy": "x"}), (None, None))
    assert "too busy" in busy and "gained less" not in busy


def test_loop_split_drops_the_steps_inside_a_loop():
    from mtplab.decoding.trace import Step, Trace
    from mtplab.measuring.quality import loop_onset
    from mtplab.teaching.blockwise import loop_line, loop_split

    assert loop_onset([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]) is None
    assert loop_onset([9, 8, 7, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2]) == 5  # from the second "1, 2" on, each token repeats

    def step(emitted, accepted):
        return Step(drafted=[0, 0, 0], accepted=accepted, emitted=emitted, bonus=None, bonus_source="none", forwards=1)

    looping = Trace(method="x", prompt=[], steps=[step([9, 8, 7], 0), step([1, 2, 1, 2], 3), step([1, 2, 1, 2], 3),
                                                  step([1, 2, 1, 2], 3)], k=4)
    plain = Trace(method="x", prompt=[], steps=[step(list(range(10, 22)), 1)], k=4)
    sp = loop_split([looping, plain])
    assert (sp["continuations"], sp["looping"]) == (2, 1)
    assert sp["in_loop"] == 2 and sp["free"].num_drafts == 3  # the looping text's last two steps start inside it
    assert loop_line([looping, plain]).startswith("1 of 2 greedy continuations fall into a loop")
