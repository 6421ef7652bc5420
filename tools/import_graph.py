"""The package's import graph, measured from the code: floors (the longest chain of imports below a module),
cycles, and imports inside functions. An import inside a function is an edge like any other: a cycle that only
closes at call time is still a cycle. `make lint` runs it and fails on a cycle or on a function-level import
of the project that no heavy optional dependency explains (import-linter's `layers` contract in pyproject.toml
checks the direction of every import).

    python -m tools.import_graph           # the numbers
    python -m tools.import_graph --check   # exit 1 on a cycle or an unexplained local import
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (importer, imported): kept inside a function because the imported module pulls in a heavy optional dependency
LAZY = {"mtplab.viz": "matplotlib", "mtplab.hf.run": "transformers", "mtplab.hf.target": "transformers",
        "mtplab.hf.study": "transformers", "mtplab.distill.pipeline": "transformers", "mtplab.distill.live": "transformers"}


def modules(pkg: Path = ROOT / "mtplab") -> dict[str, Path]:
    out = {}
    for p in sorted(pkg.rglob("*.py")):
        name = ".".join(p.relative_to(pkg.parent).with_suffix("").parts).removesuffix(".__init__")
        out[name] = p
    return out


def _resolve(name: str, mods: dict) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def graph(mods: dict[str, Path]):
    """edges[a] = modules a imports, at module level or inside a function; local = [(a, b, line)] imports of b
    inside a function of a; third = {package: count} of third-party imports inside functions."""
    edges: dict[str, set] = {m: set() for m in mods}
    local, third = [], {}
    for m, p in mods.items():
        tree = ast.parse(p.read_text())
        in_fn = set()
        for f in ast.walk(tree):
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                in_fn |= {id(s) for s in ast.walk(f) if isinstance(s, (ast.Import, ast.ImportFrom))}
        for s in ast.walk(tree):
            if not isinstance(s, (ast.Import, ast.ImportFrom)):
                continue
            targets = []
            if isinstance(s, ast.ImportFrom) and s.module and s.module.startswith("mtplab"):
                targets = [_resolve(s.module + "." + a.name, mods) for a in s.names]
            elif isinstance(s, ast.Import):
                targets = [_resolve(a.name, mods) for a in s.names if a.name.startswith("mtplab")]
            if id(s) in in_fn:
                if targets:
                    local += [(m, t, s.lineno) for t in targets if t]
                else:
                    top = (s.module if isinstance(s, ast.ImportFrom) else s.names[0].name) or ""
                    third[top.split(".")[0]] = third.get(top.split(".")[0], 0) + 1
            edges[m] |= {t for t in targets if t and t != m}
    return edges, local, third


def cycles(edges) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            visit(v)
    return out


def floors(edges) -> dict[str, int]:
    """Floor 1 imports nothing of the project; a module stands one floor above the highest it imports."""
    memo: dict[str, int] = {}

    def f(v, seen=()):
        if v in memo:
            return memo[v]
        if v in seen:
            return 1
        memo[v] = 1 + max((f(w, seen + (v,)) for w in edges[v] if not w.endswith("__main__")), default=0)
        return memo[v]

    return {v: f(v) for v in edges}


def unexplained(local) -> list[tuple[str, str, int]]:
    return [(a, b, line) for a, b, line in local if not any(b == x or b.startswith(x + ".") for x in LAZY)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    mods = modules()
    edges, local, third = graph(mods)
    cyc, fl = cycles(edges), floors(edges)
    bad = unexplained(local)
    print(f"{len(mods)} modules, {sum(map(len, edges.values()))} imported modules (function-level included), "
          f"{max(fl.values())} floors, "
          f"{len(cyc)} cycles, {len(local)} function-level imports of the project "
          f"({len(local) - len(bad)} for a heavy optional dependency), function-level third-party imports: "
          + ", ".join(f"{k} {v}" for k, v in sorted(third.items())))
    for c in cyc:
        print("cycle:", " <-> ".join(c))
    for m, t, line in bad:
        print(f"{mods[m].relative_to(ROOT)}:{line}: imports {t} inside a function; import it at the top, or name "
              "the heavy optional dependency that needs the delay in tools/import_graph.py LAZY")
    return 1 if a.check and (cyc or bad) else 0


if __name__ == "__main__":
    sys.exit(main())
