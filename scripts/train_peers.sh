#!/usr/bin/env bash
# Issue 23's models, one thread, one after another (each line continues with --resume if killed):
#   the lab's own Hugging Face Llama (hf-target, <= 29 min) and its draft model (hf-draft), both on code;
#   DeepSeek D = 1 heads on the HF model (train --hf); a prose trunk of the 4-layer classroom shape and its heads.
# Run alone: benchmarks must not run while this holds a core.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/hf}
R=${RESUME:-}
export OMP_NUM_THREADS=1
$PY -m mtplab train-hf-model --preset hf-target --corpus code --steps 1800 --max-seconds 1740 --eval-every 100 \
    --save-every 100 --out "$OUT" --name mtplab-llama $R
$PY -m mtplab train-hf-model --preset hf-draft --corpus code --steps 900 --max-seconds 480 --eval-every 100 \
    --save-every 100 --out "$OUT" --name mtplab-llama-draft $R
# DeepSeek D = 1 heads on the HF model's frozen trunk, self-distilled
$PY -m mtplab train --hf "$OUT/mtplab-llama" --heads deepseek --modules 1 --steps 300 --batch-size 16 --seq-len 128 \
    --lr 2e-3 --max-seconds 600 --out "$OUT" --name mtplab-llama-deepseek-d1 --no-progress $R
# a benchmark may hold the cores here: it creates $OUT/PAUSE, and the queue waits until the file is gone
while [ -e "$OUT/PAUSE" ]; do sleep 5; done
# code against prose: two trunks of the 4-layer classroom shape, the same recipe, only the corpus differs;
# then the same D = 1 heads on each (self-distilled, frozen trunk)
for c in code prose; do
    $PY -m mtplab train --preset classroom-l4 --corpus $c --steps 500 --lr 3e-3 --eval-every 100 --seed 0 \
        --save-dtype bf16 --max-seconds 900 --out "$OUT/domain" --name domain-$c --no-progress $R
done
for c in code prose; do
    $PY -m mtplab train --corpus $c --from "$OUT/domain/domain-$c.safetensors" --freeze-trunk --heads deepseek \
        --modules 1 --labels self --steps 150 --lr 2e-3 --eval-every 50 --save-dtype bf16 --max-seconds 400 \
        --out "$OUT/domain" --name domain-$c-d1 --no-progress $R
done
