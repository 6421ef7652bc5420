#!/usr/bin/env bash
# Issue 23's benchmarks, one thread, alone on the machine (nothing else may hold a core while they time):
# mtplab's loop beside transformers' generate on the lab's own HF model, then code against prose.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export OMP_NUM_THREADS=1
what=${1:-all}
if [ "$what" = all ] || [ "$what" = peers ]; then
    $PY -m mtplab bench peers --hf data/hf/mtplab-llama --draft-hf data/hf/mtplab-llama-draft \
        --heads-checkpoint data/hf/mtplab-llama-deepseek-d1.safetensors --device cpu --out docs/bench
fi
if [ "$what" = all ] || [ "$what" = domain ]; then
    $PY -m mtplab bench domain --device cpu --out docs/bench
fi
