#!/usr/bin/env bash
# On a CUDA machine: the GPU tests, then the quick decoding benchmark on the GPU (under 5 minutes).
# Usage: bash scripts/gpu_check.sh [python]   (default: .venv/bin/python if present, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name())"
$PY -m pytest -q -m gpu tests/decoding/test_gpu.py
mkdir -p build/gpu
$PY -m mtplab bench decode --quick --device cuda --out build/gpu
$PY -m mtplab bench cost-curve --preset wide --device cuda --dtype bf16 --quick --out build/gpu
