#!/usr/bin/env bash
# The project's GPU check: one call that fits one short GPU window (default budget 480 s, set
# GPU_CHECK_BUDGET_S) and can't pass by accident. Stages, in order of value, each given a timeout
# sized from what is left of the budget (a stage that would not get enough is skipped, and said so):
#   env       nvidia-smi (persistence mode tried), `amp_bench env --json`, a bf16 matmul's TFLOP/s;
#   pytest    `pytest -m gpu tests/test_gpu.py` (TF32 vs IEEE on matmul and a 64-channel conv, autocast
#             dtypes, CUDA events, GradScaler skips, torch vs NVML memory, energy and clocks, the smoke
#             suite, DDP on NCCL);
#   suite     suites/gpu_check.yaml (ResNet-50 NCHW and channels_last, GPT-2 small; fp32, tf32,
#             amp_fp16, amp_bf16; GPT-2 compiled under amp_bf16 and fp8; fused AdamW);
#   overhead  benchmarks/overhead.py: the suite's ResNet-50 channels_last amp_bf16 case by the
#             harness and by a plain hand-written AMP loop, 2 rounds;
#   fidelity  suites/fidelity.yaml for 2 epochs, seed 0 (skipped, and said so, without scikit-learn);
#   headroom  suites/gpu_headroom.yaml (fp32 vs amp_bf16 under a 2 GiB allocator cap, ~5 probes each).
# After every stage the results are copied flat into $OUT (default gpu-check-out/): summary.md
# (complete at any stop), suite.csv, overhead.csv, fidelity.csv, headroom.csv, stages.csv, env.json
# and this log, gpu_check.log: 8 files at most, none in a folder. It exits 0 only when every stage
# ran and passed: on compute capability >= 8 every suite case ok, every fidelity and headroom row ok.
# Without a GPU (default budget 110 s there) it runs a tiny CPU smoke of the same path, says what it
# skipped, and nothing it prints validates CUDA. PYTHON overrides the interpreter (default python3).
# Wheels in .whl/ (torchao for fp8, which the GPU image lacks; DEVELOPERS.md) are installed into the
# work folder first and put on PYTHONPATH.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-check-out}
mkdir -p "$out"
py=${PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/amp_bench_gpu_check.XXXXXX")
start=$SECONDS
exec 3>&1 4>&2
exec > >(tee "$out/gpu_check.log") 2>&1  # no pipe into tee: `status` must survive to the exit below
tee_pid=$!
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 COLUMNS=${COLUMNS:-160} PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export py work

echo "## amp_bench GPU check ($(date -u +%Y-%m-%dT%H:%MZ), $(git rev-parse --short HEAD 2>/dev/null || echo no-git))"
if compgen -G ".whl/*.whl" > /dev/null; then
  if "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$work/site" .whl/*.whl; then
    export PYTHONPATH="$PYTHONPATH:$work/site"
    echo "installed from .whl/: $(cd .whl && ls *.whl | tr '\n' ' ')"
  else
    echo "wheels in .whl/ did not install: modes that need them will say unsupported"
  fi
fi
gpu=$(timeout 60 "$py" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null | tail -1)
if [ "$gpu" = 1 ]; then
  budget=${GPU_CHECK_BUDGET_S:-480}
elif [ "$gpu" = 0 ]; then
  budget=${GPU_CHECK_BUDGET_S:-110}
  echo "NO CUDA GPU: pytest's GPU tests skip, the suite runs its tiny cpu block, overhead one tiny CPU round;"
  echo "fidelity and headroom are skipped. Nothing here validates CUDA."
else
  budget=${GPU_CHECK_BUDGET_S:-110}
  echo "FAILED: $py cannot import torch"
fi
end_at=$((start + budget - 10))  # the last summary, printing it and the exit fit in the final 10 s
echo "budget: ${budget} s; work folder: $work; results: $out"

# cap: a stage's most (scaled up with a larger budget); floor: the least worth starting it with
declare -A cap=([env]=45 [pytest]=150 [suite]=270 [overhead]=70 [fidelity]=60 [headroom]=100)
declare -A floor=([env]=15 [pytest]=20 [suite]=30 [overhead]=20 [fidelity]=30 [headroom]=30)
if [ "$gpu" != 1 ]; then cap[pytest]=40; cap[suite]=60; cap[overhead]=40; fi
scale=$(( budget > 480 ? budget : 480 ))
stages=(env pytest suite overhead fidelity headroom)
sklearn=0
[ "$gpu" = 1 ] && "$py" -c 'import sklearn' 2>/dev/null && sklearn=1
planned=(env pytest suite overhead)  # the stages that will run: each reserves its floor from those before it
[ "$gpu" = 1 ] && { [ "$sklearn" = 1 ] && planned+=(fidelity); planned+=(headroom); }
post=6  # what each stage leaves for the summary written after it

record() {  # STAGE STATUS SECONDS TIMEOUT NOTE
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "${5:-}" >> "$work/stages.tsv"
}

summarize() {  # [--final]: summary.md and the flat CSVs in $out, bounded by what is left
  local left=$((start + budget - 4 - SECONDS))
  [ "$left" -lt 3 ] && left=3
  [ "$left" -gt 30 ] && left=30
  timeout -k 1 "$left" "$py" -m amp_bench.gpu_check summary "$work" "$out" "$@"
}

run_stage() {  # STAGE COMMAND...: run it with a timeout sized from what is left, record how it ended
  local name=$1; shift
  local later=0 seen=0 s
  for s in "${planned[@]}"; do
    if [ "$seen" = 1 ]; then later=$((later + floor[$s])); fi
    [ "$s" = "$name" ] && seen=1
  done
  local left=$((end_at - SECONDS))
  local limit=$((cap[$name] * scale / 480))
  [ $((left - later - post)) -lt "$limit" ] && limit=$((left - later - post))
  if [ "$limit" -lt "${floor[$name]}" ]; then
    limit=$(( floor[$name] < left - post ? floor[$name] : left - post ))
  fi
  echo; echo "### $name"
  if [ "$limit" -lt 5 ]; then
    echo "SKIPPED $name: ${left} s of the budget left"
    record "$name" budget 0 0 "${left} s of the budget left"
    summarize; return
  fi
  echo "(timeout ${limit} s; ${left} s of the budget left)"
  local t0=$SECONDS rc
  timeout -k 3 "$limit" "$@"; rc=$?
  local took=$((SECONDS - t0))
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "TIMED OUT: $name after ${took} s (its limit was ${limit} s)"
    record "$name" timeout "$took" "$limit" "stopped at its ${limit} s limit"
  elif [ "$rc" = 0 ] || { [ "$name" = overhead ] && [ "$rc" = 1 ]; }; then
    record "$name" ok "$took" "$limit" "$([ "$rc" = 1 ] && echo "harness above the overhead target")"
  else
    echo "FAILED: $name (exit code $rc)"
    record "$name" failed "$took" "$limit" "exit code $rc"
  fi
  summarize
}

skip() {  # STAGE WHY
  echo; echo "### $1"; echo "SKIPPED $1: $2"
  record "$1" skipped 0 0 "$2"
}

stage_env() {
  if [ "$gpu" = 1 ]; then
    nvidia-smi -pm 1 >/dev/null 2>&1 && echo "persistence mode: on" \
      || echo "persistence mode: not changed (nvidia-smi -pm 1 failed: not root, or not allowed here)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit,persistence_mode \
      --format=csv 2>&1 || echo "nvidia-smi failed"
  fi
  "$py" -m amp_bench env --json > "$work/env.json" || return 1
  cp "$work/env.json" "$out/env.json"
  if [ "$gpu" = 1 ]; then "$py" -m amp_bench.gpu_check matmul "$work/matmul.json" || return 1; fi
}
export -f stage_env
export gpu out

for name in "${stages[@]}"; do
  case $name in
    env) run_stage env bash -c stage_env ;;
    pytest) run_stage pytest "$py" -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py ;;
    suite) run_stage suite "$py" -m amp_bench run suites/gpu_check.yaml --results-dir "$work/suite" --no-report ;;
    overhead)
      if [ "$gpu" = 1 ]; then
        run_stage overhead "$py" benchmarks/overhead.py --device cuda --model resnet50 --image-size 224 --batch 64 \
          --channels-last --optimizer adamw --impl fused --precision amp_bf16 --rounds 2 --warmup 10 --steps 30 \
          --csv "$work/overhead.csv"
      else  # the same path in one tiny round
        run_stage overhead "$py" benchmarks/overhead.py --model resnet18 --image-size 32 --batch 2 --optimizer adamw \
          --impl fused --precision amp_bf16 --rounds 1 --warmup 1 --steps 3 --csv "$work/overhead.csv"
      fi ;;
    fidelity)
      if [ "$gpu" != 1 ]; then
        skip fidelity "needs a CUDA GPU (its CPU path runs in the test suite)"
      elif [ "$sklearn" != 1 ]; then
        skip fidelity "scikit-learn is not installed (it ships the digits data): pip install scikit-learn"
      else
        run_stage fidelity "$py" -m amp_bench fidelity suites/fidelity.yaml --epochs 2 --seed 0 \
          --results-dir "$work/fidelity" --no-report
      fi ;;
    headroom)
      if [ "$gpu" != 1 ]; then
        skip headroom "needs a CUDA GPU (its CPU path runs in the test suite)"
      else
        run_stage headroom "$py" -m amp_bench headroom suites/gpu_headroom.yaml --results-dir "$work/headroom" \
          --no-report
      fi ;;
  esac
done

echo
if summarize --final > "$work/verdict.txt" 2>&1; then status=0; else status=1; fi
cat "$out/summary.md" 2>/dev/null || echo "FAILED: no summary was written"
cat "$work/verdict.txt"
grep -q '^gpu check: ' "$work/verdict.txt" || { echo "gpu check: FAILED (the summary could not be computed)"; status=1; }
echo "took $((SECONDS - start)) s of a ${budget} s budget; raw run directories (with every case's log): $work"
exec 1>&3 2>&4 3>&- 4>&-  # close tee's input, then wait for it so the last lines are in the log
for _ in $(seq 50); do kill -0 "$tee_pid" 2>/dev/null || break; sleep 0.1; done
exit $status
