#!/usr/bin/env bash
# The project's GPU check: one short script for a lent GPU machine (about 6-8 minutes on an H200).
# Writes everything it prints, plus the results, under ${OUT:-gpu-check-out}/; commit what it printed
# under docs/gpu-validation/. Needs torch, torchvision, transformers, pandas, pyyaml, rich, pytest,
# hypothesis on the machine (plotly is not used here).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-check-out}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 COLUMNS=160
{
  echo "== nvidia-smi"; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  echo "== amp_bench env"; python -m amp_bench env --device cuda
  echo "== pytest -m gpu"; timeout 240 python -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py
  echo "== resnet50, batch 128, every mode and layout, 1 repeat"
  timeout 300 python -m amp_bench run suites/resnet50.yaml --device cuda --batch-size 128 --repeats 1 \
      --warmup-steps 15 --steps 30 --results-dir "$out/results"
} 2>&1 | tee "$out/gpu_check.log"
( cd "$out" && tar czf results.tgz results 2>/dev/null && rm -rf results )
