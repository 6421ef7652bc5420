#!/usr/bin/env bash
# The shipped benchmark records under docs/bench/, measured alone on the machine at hand (nothing else may hold the
# cores: two torch processes on 2 cores slow each other down 30-200x). Each record names its machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-docs/bench}
OMP_NUM_THREADS=1 $PY -m mtplab bench regime --out "$OUT"
OMP_NUM_THREADS=1 $PY -m mtplab bench decode --prompts "${PROMPTS:-8}" --out "$OUT"
OMP_NUM_THREADS=2 $PY -m mtplab bench decode --prompts "${PROMPTS:-8}" --out "$OUT"
OMP_NUM_THREADS=1 $PY -m mtplab bench k --out "$OUT"
