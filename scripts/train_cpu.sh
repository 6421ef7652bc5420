#!/usr/bin/env bash
# The recipe behind the shipped checkpoints, on a 2-core CPU (data/README.md says what each run reached).
# The next-token trunk first; then the four head families on the frozen trunk and the draft model, at once.
# --max-seconds caps each run; a capped run stops, validates and saves (its JSON records stopped_early).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/cpu}
export OMP_NUM_THREADS=1
common="--corpus code --batch-size 16 --save-dtype fp16 --seed 0 --out $OUT"
$PY -m mtplab train $common --preset classroom --steps 1000 --lr 3e-3 --eval-every 100 --name ntp --max-seconds 3300
heads="$common --from $OUT/ntp --freeze-trunk --lr 2e-3 --eval-every 50 --max-seconds 2100"
$PY -m mtplab train $heads --heads stern --depths 4 --steps 400 &
$PY -m mtplab train $heads --heads meta --depths 4 --steps 250 &
$PY -m mtplab train $heads --heads deepseek --modules 1 --steps 350 &
$PY -m mtplab train $heads --heads deepseek --modules 3 --steps 220 &
$PY -m mtplab train $common --preset draft --steps 900 --lr 3e-3 --eval-every 100 --name draft --max-seconds 2100 &
wait
for n in ntp draft stern-k4 meta-k4 deepseek-d1 deepseek-d3; do cp "$OUT/$n.safetensors" "$OUT/$n.json" data/checkpoints/; done
