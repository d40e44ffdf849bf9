#!/usr/bin/env bash
# The project's GPU check, for a machine with one CUDA GPU (about 6-8 minutes on an H200):
#   1. the environment record (`amp_bench env`);
#   2. the GPU-marked tests (`pytest -m gpu`): autocast dtypes on CUDA, fp32 really without TF32
#      (matmul and cuDNN error against float64), CUDA-event timing, GradScaler skips, a 1 GiB
#      allocation seen by torch and NVML within 10%, energy and clocks non-empty, the smoke suite;
#   3. suites/gpu_check.yaml (ResNet-50 and GPT-2 small, all four precision modes, and ResNet-50 under
#      torchrun + DDP with world size 1 on NCCL) and its markdown summary (environment, step time,
#      speedup, memory saving, NVML peak, energy, MFU, statuses);
#   4. GPU only: the fidelity study for 3 epochs (ResNet-18 on the digits; needs scikit-learn) and a
#      headroom search under a 2 GiB allocator cap (suites/gpu_headroom.yaml).
# On a machine without a GPU it runs what it can (the CPU block of the suite) and says what it skipped.
# It exits non-zero when any step fails or any case ends in error or timeout.
# Everything it prints also goes to ${OUT:-gpu-check-out}/gpu_check.log; commit that under
# docs/gpu-validation/. Needs: torch, torchvision, transformers, pandas, pyyaml, rich, pytest,
# nvidia-ml-py. plotly is optional (no HTML report without it; the markdown needs none).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-check-out}
mkdir -p "$out"
exec > >(tee "$out/gpu_check.log") 2>&1  # no pipe: `status` must survive to the exit below
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 COLUMNS=${COLUMNS:-160}
py=${PYTHON:-python}
status=0
fail() { echo "FAILED: $1"; status=1; }

has_gpu=$("$py" -c 'import torch; print(int(torch.cuda.is_available()))') || fail "torch does not import"
echo "## amp_bench GPU check ($(date -u +%Y-%m-%dT%H:%MZ))"
if [ "${has_gpu:-0}" = 1 ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv 2>/dev/null || true
else
  echo "NO CUDA GPU: the GPU tests skip and the suite runs its cpu block; nothing here validates CUDA."
fi
echo; echo "### Environment"; "$py" -m amp_bench env || fail "amp_bench env"
echo; echo "### pytest -m gpu"
timeout 300 "$py" -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py || fail "pytest -m gpu"
echo; echo "### suites/gpu_check.yaml"
timeout 540 "$py" -m amp_bench run suites/gpu_check.yaml --results-dir "$out/results" --no-report || fail "amp_bench run"
echo
if "$py" -m amp_bench report "$out/results" --format md -o "$out/summary.html" >/dev/null; then
  cat "$out/summary.md"
else
  fail "amp_bench report"
fi
bad=$("$py" -c "import amp_bench, sys; t = amp_bench.load_results(sys.argv[1]); \
print(int(t.status.isin(['error', 'timeout']).sum()))" "$out/results" 2>/dev/null) || bad=unknown
[ "$bad" = 0 ] || fail "$bad case(s) ended in error or timeout (see the logs in results.tgz)"
ddp=$("$py" -c "import amp_bench, sys; t = amp_bench.load_results(sys.argv[1]); \
t = t[(t.world_size == 1) & (t.dist_backend.isin(['nccl', 'gloo'])) & (t.status == 'ok')]; print(len(t))" \
  "$out/results" 2>/dev/null) || ddp=0
[ "${ddp:-0}" -gt 0 ] || fail "no DDP case (resnet50-ddp, world size 1) finished ok"
echo; echo "### fidelity and headroom on the GPU"
if [ "${has_gpu:-0}" != 1 ]; then
  echo "SKIPPED: needs a CUDA GPU (the CPU paths of fidelity and headroom run in the test suite)"
else
  if "$py" -c 'import sklearn' 2>/dev/null; then
    timeout 240 "$py" -m amp_bench fidelity suites/fidelity.yaml --epochs 3 --seed 0 \
      --results-dir "$out/results" --no-report || fail "amp_bench fidelity"
  else
    echo "SKIPPED fidelity: scikit-learn (which ships the data) is not installed; pip install scikit-learn"
  fi
  timeout 240 "$py" -m amp_bench headroom suites/gpu_headroom.yaml --results-dir "$out/results" --no-report \
    || fail "amp_bench headroom"
fi
( cd "$out" && tar czf results.tgz results 2>/dev/null && rm -rf results )
echo "gpu check: $([ $status = 0 ] && echo passed || echo FAILED)"
exit $status
