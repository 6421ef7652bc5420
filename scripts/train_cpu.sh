#!/usr/bin/env bash
# The recipe behind the shipped checkpoints, on a 2-core CPU with native bf16 (data/README.md says what each
# run reached and how long it took). Each run stops, validates and saves at --max-seconds (its JSON records
# stopped_early); a killed run continues with the same line plus --resume.
#
#   1. the next-token trunk: the first 757 steps (fp32, 2025) were continued from data/checkpoints/ntp
#      with bf16 autocast for 1350 more steps (interrupted once and resumed; see data/README.md)
#   2. the head families on the frozen trunk, self-distilled (--labels self), all at once, one thread each,
#      and one Stern run on corpus labels for the corpus-versus-self comparison
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/cpu}
export OMP_NUM_THREADS=1
common="--corpus code --batch-size 16 --save-dtype fp16 --seed 0 --no-progress"
if [ "${1:-}" != "--heads-only" ]; then
    $PY -m mtplab train $common --from ntp --steps 1350 --lr 1.5e-3 --warmup 50 --eval-every 150 \
        --out "$OUT/trunk" --name ntp --seed 1 --max-seconds 4600
    cp "$OUT/trunk/ntp.safetensors" data/checkpoints/ntp.safetensors   # the heads name their base by sha256
fi
heads="$common --from ntp --freeze-trunk --lr 2e-3 --eval-every 50 --max-seconds ${HEAD_SECONDS:-1500} --out $OUT/heads"
$PY -m mtplab train $heads --heads stern --depths 4 --labels self --steps 600 &
$PY -m mtplab train $heads --heads stern --depths 4 --labels corpus --steps 600 --name stern-k4-corpus &
$PY -m mtplab train $heads --heads meta --depths 4 --labels self --steps 330 &
$PY -m mtplab train $heads --heads deepseek --modules 1 --labels self --steps 600 &
$PY -m mtplab train $heads --heads deepseek --modules 3 --labels self --steps 300 &
wait
