"""The package shows its architecture: role folders whose docstrings say what lives there and what they may
import, an import graph without cycles, and a non-editable install that ships every folder."""
import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import mtplab

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ["model", "training", "decoding", "measuring", "viz", "teaching", "bench", "hf"]


def test_every_folder_says_what_lives_there_and_what_it_may_import():
    for name in FOLDERS:
        mod = importlib.import_module(f"mtplab.{name}")
        doc = mod.__doc__ or ""
        assert len(doc) > 80, f"mtplab/{name}/__init__.py needs a docstring"
        assert "import" in doc, f"mtplab/{name}/__init__.py must say what it may import"


def test_only_the_faces_re_export():
    """Re-exports live only in mtplab/__init__.py and mtplab/viz/__init__.py (and bench's dispatch table)."""
    for p in (ROOT / "mtplab").rglob("__init__.py"):
        rel = p.relative_to(ROOT).as_posix()
        if rel in ("mtplab/__init__.py", "mtplab/viz/__init__.py", "mtplab/bench/__init__.py"):
            continue
        code = [line for line in p.read_text().splitlines() if line.startswith(("from ", "import "))]
        assert code == [], f"{rel} should be a docstring only, not {code}"


def test_every_module_imports():
    names = [m.name for m in pkgutil.walk_packages(mtplab.__path__, "mtplab.")]
    assert len(names) > 50
    for n in names:
        importlib.import_module(n)


def test_import_graph_has_no_cycle_and_no_unexplained_local_import():
    sys.path.insert(0, str(ROOT))
    from tools import import_graph

    mods = import_graph.modules()
    edges, local, _ = import_graph.graph(mods)
    assert import_graph.cycles(edges) == []
    assert import_graph.unexplained(local) == []
    # the check can fail: a made-up cycle is found
    assert import_graph.cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


def test_an_import_inside_a_function_closes_a_cycle(tmp_path):
    """hf/real imported hf/target inside a function while target imported real at the top: a cycle the check
    did not see while it counted module-level imports only."""
    sys.path.insert(0, str(ROOT))
    from tools import import_graph

    pkg = tmp_path / "mtplab"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from mtplab.b import g\n")
    (pkg / "b.py").write_text("def g():\n    from mtplab.a import f\n    return f\n")
    edges, local, _ = import_graph.graph(import_graph.modules(pkg))
    assert local == [("mtplab.b", "mtplab.a", 2)]
    assert import_graph.cycles(edges) == [["mtplab.a", "mtplab.b"]]


@pytest.mark.slow
def test_a_non_editable_install_ships_every_folder_and_runs(tmp_path):
    """pip install . (not -e) into a fresh target; from there, outside the checkout: every module imports, a
    benchmark runs and a notebook helper answers."""
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                        "-q", "--target", str(target), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (target / "mtplab" / "teaching" / "acceptance_lab" / "state.py").is_file()
    env = {**os.environ, "PYTHONPATH": str(target), "MTPLAB_DATA": str(ROOT / "data"), "OMP_NUM_THREADS": "1"}
    code = ("import importlib, pkgutil, mtplab\n"
            "assert mtplab.__file__.startswith(%r), mtplab.__file__\n"
            "names = [m.name for m in pkgutil.walk_packages(mtplab.__path__, 'mtplab.')]\n"
            "[importlib.import_module(n) for n in names]\n"
            "from mtplab.teaching.meta import shift_table\n"
            "print(len(names), shift_table(T=4, K=2).count(chr(10)) > 0)\n") % str(target)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[1] == "True" and int(r.stdout.split()[0]) > 50
    r = subprocess.run([sys.executable, "-m", "mtplab", "bench", "cost-curve", "--quick", "--preset", "tiny", "--out",
                        str(tmp_path / "b")], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "b" / "cost-curve-tiny-fp32.json").is_file()


def test_the_readme_draws_the_architecture_from_the_folders_docstrings():
    sys.path.insert(0, str(ROOT))
    from tools import module_table

    text = module_table.section()
    assert text in (ROOT / "README.md").read_text(), "README.md's package table is stale: python -m tools.module_table --write"
    for name in FOLDERS:
        assert f"`mtplab/{name}/`" in text


def test_the_readme_measured_tables_are_drawn_from_their_records():
    """No number in the README's measured tables can drift from docs/bench/*.json: they are printed from them."""
    sys.path.insert(0, str(ROOT))
    from tools import bench_tables

    assert bench_tables.section() in (ROOT / "README.md").read_text(), \
        "README.md's measured tables are stale: python -m tools.bench_tables --write"
