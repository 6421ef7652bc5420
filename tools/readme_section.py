"""One README section between two markers, printed or written in place: the drawn tables' shared command line."""
from __future__ import annotations

import argparse
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def main(argv, start: str, end: str, section) -> int:
    """`--write` puts section() into README.md between `start` and `end`; without it, prints the section."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args(argv)
    text = section()
    if not a.write:
        print(text)
        return 0
    s = README.read_text()
    if start not in s or end not in s:
        raise SystemExit(f"README.md has no {start} ... {end} markers")
    i, j = s.index(start), s.index(end) + len(end)
    README.write_text(s[:i] + text + s[j:])
    return 0
