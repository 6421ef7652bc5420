"""The README's architecture section, drawn from the folders' own docstrings (so the two cannot drift).

    python -m tools.module_table          # print the section
    python -m tools.module_table --write  # put it into README.md between the markers

tests/ground/test_layout.py checks that README.md holds what this prints.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from tools import readme_section

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- modules: drawn by tools/module_table.py from the folders' docstrings -->", "<!-- /modules -->"
# the command line on top, the folders from the top floor down, then the ground floor's modules (pyproject.toml's layers)
FOLDERS = ["teaching", "bench", "distill", "hf", "viz", "measuring", "training", "decoding", "model"]
GROUND = ["data", "device", "files", "tokenizer", "paths", "errors", "platform_compat"]


def _doc(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _lead(path: Path) -> str:
    """A module's docstring, its first sentence."""
    first = _cell(_doc(path).split("\n\n")[0])
    lead = re.split(r"(?<=[\w)`])\. (?=[A-Z])", first)[0]
    return lead[:-1] if lead.endswith(".") and not lead.endswith("...") else lead


def section() -> str:
    rows = ["| folder | what lives there | its modules | may import |", "|---|---|---|---|",
            f"| `mtplab/cli.py` | {_lead(ROOT / 'mtplab' / 'cli.py')} | | every layer below |"]
    for name in FOLDERS:
        doc = _doc(ROOT / "mtplab" / name / "__init__.py")
        paras = [p for p in doc.split("\n\n") if p.strip()]
        lead = _cell(paras[0])
        bullets = [line.strip()[2:] for p in paras for line in p.splitlines() if line.strip().startswith("* ")]
        mods = "; ".join(_cell(b.split(":", 1)[0]) for b in bullets)
        rule = next((_cell(p) for p in paras if p.strip().startswith(("May import", "Imported only"))), "")
        rows.append(f"| `mtplab/{name}/` | {lead} | {mods} | {rule} |")
    ground = "; ".join(f"`{m}`: {_lead(ROOT / 'mtplab' / f'{m}.py')}" for m in GROUND)
    rows.append(f"| ground floor | {ground} | | nothing above |")
    return "\n".join([START, *rows, END])


def main(argv=None) -> int:
    return readme_section.main(argv, START, END, section)


if __name__ == "__main__":
    sys.exit(main())
