#!/usr/bin/env bash
# The recipe behind the shipped 12-layer family (issue 18), on a 2-core CPU with bf16 autocast. data/README.md
# says what each run reached, how long it took, and why this shape (the regime map, docs/bench/regime.md).
#
#   1. the trunk: the 4-layer ntp (now ntp-l4) grown to 12 layers with `deepen` (identity blocks: the same
#      function, the same loss at step 0), then trained on: planned as 1600 steps, it was stopped at step 950
#      (other jobs had slowed it from 2.5 to 6 s a step) and resumed with --steps 1300, which lets the cosine
#      finish in time; at step 1081 (val bpb 1.443 at step 1000, below the 1.45 target) it was resumed once more
#      with --steps 1160 for the same reason (the line below is the last resumed run's); saved in bf16 (decoding runs in fp32
#      from the bf16 weights, so greedy speculative output stays identical to greedy AR of the shipped model)
#   2. the four head families on the frozen new trunk, self-distilled, each started from the 4-layer family's
#      heads (--heads-from), all at once, one thread each
# A killed run continues with the same line plus --resume (the trunk's --from must be ntp-l4 then too).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/regime}
export OMP_NUM_THREADS=1
if [ "${1:-}" != "--heads-only" ]; then
    $PY -m mtplab train --from ntp-l4 --deepen 12 --out "$OUT" --name ntp12 --steps 1160 --lr 1e-3 --warmup 40 \
        --batch-size 16 --eval-every 100 --save-every 10 --autocast bf16 --save-dtype bf16 --no-progress
fi
mkdir -p "$OUT/ship"
cp "$OUT/ntp12.safetensors" "$OUT/ship/ntp.safetensors"   # the heads name their base file and its sha256
cp "$OUT/ntp12.json" "$OUT/ship/ntp.json"
heads="--from $OUT/ship/ntp --freeze-trunk --labels self --batch-size 16 --lr 1e-3 --warmup 20 --eval-every 50
       --save-every 10 --autocast bf16 --save-dtype bf16 --max-seconds ${HEAD_SECONDS:-1200} --out $OUT/ship --no-progress"
$PY -m mtplab train $heads --heads stern --depths 4 --steps 160 --heads-from stern-k4-l4 > "$OUT/stern-k4.log" 2>&1 &
$PY -m mtplab train $heads --heads meta --depths 4 --steps 100 --heads-from meta-k4-l4 > "$OUT/meta-k4.log" 2>&1 &
$PY -m mtplab train $heads --heads deepseek --modules 1 --steps 160 --heads-from deepseek-d1-l4 > "$OUT/deepseek-d1.log" 2>&1 &
$PY -m mtplab train $heads --heads deepseek --modules 3 --steps 80 --heads-from deepseek-d3-l4 > "$OUT/deepseek-d3.log" 2>&1 &
wait
