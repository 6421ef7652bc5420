#!/usr/bin/env bash
# The recipe behind the shipped checkpoints, on a 2-core CPU (see data/README.md for what each run reached).
# The next-token trunk first, then the head families on the frozen trunk, two at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/cpu}
export OMP_NUM_THREADS=1
common="--corpus code --batch-size 16 --save-dtype fp16 --seed 0 --out $OUT"
$PY -m mtplab train $common --preset classroom --steps 1000 --lr 3e-3 --eval-every 100 --name ntp --max-seconds 3300 &
$PY -m mtplab train $common --preset draft --steps 1500 --lr 3e-3 --eval-every 150 --name draft --max-seconds 2400 &
wait
heads="$common --from $OUT/ntp --freeze-trunk --lr 2e-3 --eval-every 50"
$PY -m mtplab train $heads --heads stern --k 4 --steps 400 --max-seconds 1500 &
$PY -m mtplab train $heads --heads meta --k 4 --steps 300 --max-seconds 1800 &
wait
$PY -m mtplab train $heads --heads deepseek --k 1 --steps 400 --max-seconds 1500 &
$PY -m mtplab train $heads --heads deepseek --k 3 --steps 300 --max-seconds 1800 &
wait
for n in ntp draft stern-k4 meta-k4 deepseek-d1 deepseek-d3; do cp "$OUT/$n.safetensors" "$OUT/$n.json" data/checkpoints/; done
