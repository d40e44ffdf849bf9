#!/usr/bin/env bash
# The project's GPU check, in two self-contained parts that each fit one device command and can't pass
# by accident. Run part 1, then part 2 (DEVELOPERS.md has the device-tool recipe); no argument runs
# both back to back (a local machine). Each stage's timeout is sized from what is left of its part's
# budget (GPU_CHECK_BUDGET_S overrides it); a stage that would not get enough is skipped, and said so.
#
# The stages, their H200 estimates (from the first H200 reading), caps and budgets live in
# amp_bench/gpu_check/plan.py (`python3 -m amp_bench.gpu_check plan --part N` prints them; a test holds each
# part's estimated stages under 60% of its budget). An extra stage is not in the estimate and reserves
# nothing: it runs on what the others left, as far as it gets, and its timeout does not fail the part.
#   --part 1 (budget 360 s, ~200 s): env (~12 s), the main job as the README types it (`amp_bench run
#     suites/resnet50.yaml`: ResNet-50 bs 256 channels_last in every mode, ~165 s); extras: `pytest -m gpu`
#     as far as it gets, the harness against a plain loop
#   --part 2 (budget 360 s, ~210 s): env (~7 s), suites/gpu_check_part2.yaml (~180 s: GPT-2 small compiled
#     amp_bf16 and fp8, GPT-2 eager amp_bf16 with explain on, whose breakdown must be ok); extras: fidelity
#     (skipped, and said so, without scikit-learn), headroom
# Before any stage: wheels from .whl/ installed; a GPU that nvidia-smi or /dev lists but torch cannot
# see FAILS the part; on compute capability >= 8.9 part 2 (fp8) refuses in one line without torchao;
# TORCH_ALLOW_TF32_CUBLAS_OVERRIDE and NVIDIA_TF32_OVERRIDE (NGC containers set them) are printed and
# unset, and the summary says so. The check changes nothing on the machine (nvidia-smi is only queried).
#
# After every stage the part's results are copied flat into $OUT (default gpu-check-out/), named
# partN_*: summary.md (whole at any stop: written outside $OUT, then renamed in; it names the stages
# not reached), gpu_check.log, stages.csv, env.json, suite.csv, part 1's overhead.csv or part 2's
# fidelity.csv and headroom.csv, and runs.tar.gz (every run's manifest, results, logs and explain traces,
# for later scoring): at most 8 files a part, none in a folder. A part exits 0 only when each of its
# estimated stages ran and passed: on compute capability >= 8 every suite case ok; every fidelity and
# headroom row ok, no fidelity verdict "worse", no AMP headroom below fp32's; on a GPU, the explain case's
# breakdown ok with GEMM time and "other" under 30%. Exit 2: refused before starting.
# Without a GPU (budget 130 s a part there) it runs a tiny CPU smoke of the same path (part 1's
# suites/gpu_check_part1.yaml, part 2's cpu: block, one tiny overhead round; pytest's GPU tests skip;
# fidelity and headroom are skipped, their CPU paths run in the test suite), says so, and nothing it
# prints validates CUDA. PYTHON overrides the
# interpreter (default python3); GPU_CHECK_DEV_DIR where the device nodes are (default /dev).
set -uo pipefail
cd "$(dirname "$0")/.."
part=
case "${1:-}" in
  --part) part=${2:-} ;;
  --part=*) part=${1#--part=} ;;
  "") ;;
  *) echo "usage: bash scripts/gpu_check.sh [--part 1|2]   (no argument: part 1, then part 2)" >&2; exit 2 ;;
esac
if [ -z "$part" ]; then  # both, back to back: a refusal of part 1 stops both
  bash "$0" --part 1; first=$?
  [ "$first" = 2 ] && exit 2
  bash "$0" --part 2; second=$?
  [ "$first" = 0 ] && [ "$second" = 0 ] && exit 0
  exit 1
fi
if [ "$part" != 1 ] && [ "$part" != 2 ]; then echo "--part takes 1 or 2, not '$part'" >&2; exit 2; fi

out=${OUT:-gpu-check-out}
mkdir -p "$out"
py=${PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/amp_bench_gpu_check${part}.XXXXXX")
start=$SECONDS
exec 3>&1 4>&2
exec > >(tee "$out/part${part}_gpu_check.log") 2>&1  # no pipe into tee: `status` must survive to the exit
tee_pid=$!
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 COLUMNS=${COLUMNS:-160} PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

finish() {  # STATUS: close tee's input, wait for it so the last lines are in the log, exit
  exec 1>&3 2>&4 3>&- 4>&-
  for _ in $(seq 50); do kill -0 "$tee_pid" 2>/dev/null || break; sleep 0.1; done
  exit "$1"
}

echo "## amp_bench GPU check, part $part of 2 ($(date -u +%Y-%m-%dT%H:%MZ), $(git rev-parse --short HEAD 2>/dev/null || echo no-git))"
if compgen -G ".whl/*.whl" > /dev/null; then
  if "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$work/site" .whl/*.whl; then
    export PYTHONPATH="$PYTHONPATH:$work/site"
    echo "installed from .whl/: $(cd .whl && ls *.whl | tr '\n' ' ')"
  else
    echo "wheels in .whl/ did not install: modes that need them will say unsupported"
  fi
fi
# The GPU's TF32 overrides (NVIDIA's NGC containers set them) would make every IEEE mode refuse to run:
# printed, unset for every stage, and said in the summary.
: > "$work/overrides.txt"
for var in TORCH_ALLOW_TF32_CUBLAS_OVERRIDE NVIDIA_TF32_OVERRIDE; do
  if [ -n "${!var+x}" ]; then
    echo "unset $var=${!var} for the check: it overrides the TF32 flags inside cuBLAS/NVIDIA's libraries, so the fp32 and AMP modes could not run as IEEE FP32" | tee -a "$work/overrides.txt"
    unset "$var"
  fi
done
export AMP_BENCH_CONDA_EXPORT=0  # the environment record skips `conda env export` (up to minutes on a conda image)
# one interpreter start: CUDA? its compute capability, and whether torchao imports (part 2 runs fp8:
# plan.FP8_PART)
read -r gpu cc torchao < <(timeout 90 "$py" -c '
import importlib.util, torch
ok = torch.cuda.is_available()
cap = "%d.%d" % torch.cuda.get_device_capability() if ok else "-"
print(int(ok), cap, int(importlib.util.find_spec("torchao") is not None))' 2>/dev/null | tail -1)
if [ "${gpu:-}" = 1 ] && [ "$torchao" != 1 ] && [ "$part" = 2 ] && \
   awk -v c="$cc" 'BEGIN { split(c, v, "."); exit !(v[1] > 8 || (v[1] == 8 && v[2] >= 9)) }'; then
  echo "REFUSED: compute capability $cc runs fp8 natively but torchao is not in .whl/: fetch the wheel with the pip download line in DEVELOPERS.md (torchao 0.18.0, 3.4 MB, manylinux_2_28, no dependencies) and carry .whl"
  finish 2
fi
# a GPU the machine lists but torch cannot see (a CPU-only wheel, a driver/library mismatch) fails the check
listed=$( (nvidia-smi -L 2>/dev/null | grep -m1 '^GPU ') || true)
[ -z "$listed" ] && compgen -G "${GPU_CHECK_DEV_DIR:-/dev}/nvidia[0-9]*" > /dev/null && \
  listed="device node $(compgen -G "${GPU_CHECK_DEV_DIR:-/dev}/nvidia[0-9]*" | head -1)"
unseen=
if [ "${gpu:-}" != 1 ] && [ -n "$listed" ]; then
  why=$(timeout 90 "$py" -W always -c 'import torch; ok = torch.cuda.is_available(); print("torch", torch.__version__, "built for CUDA", torch.version.cuda or "none (a CPU-only wheel)")' 2>&1 | tail -2 | tr '\n' ' ')
  unseen="a GPU is present ($listed) but torch.cuda.is_available() is False: ${why:-torch does not import}"
fi
if ! plan=$("$py" -m amp_bench.gpu_check plan --part "$part" --shell); then
  echo "FAILED: the check's plan could not be read ($py -m amp_bench.gpu_check plan)"; finish 1
fi
declare -A cap=() floor=() cpu_cap=() extra=()
eval "$plan"
[ "${gpu:-}" = 1 ] || suite_file=$cpu_suite_file  # without a GPU: the same path in seconds
if [ "${gpu:-}" = 1 ]; then
  budget=${GPU_CHECK_BUDGET_S:-$gpu_budget}
  echo "GPU: compute capability $cc; torchao $([ "$torchao" = 1 ] && echo importable || echo absent)"
elif [ -n "$unseen" ]; then
  budget=${GPU_CHECK_BUDGET_S:-$cpu_budget}
  echo "FAILED: $unseen"
elif [ "${gpu:-}" = 0 ]; then
  budget=${GPU_CHECK_BUDGET_S:-$cpu_budget}
  echo "NO CUDA GPU: a tiny CPU smoke of part $part's path; GPU-only stages are skipped. Nothing here validates CUDA."
else
  budget=${GPU_CHECK_BUDGET_S:-$cpu_budget}
  echo "FAILED: $py cannot import torch"
fi
end_at=$((start + budget - 10))  # the last summary, printing it and the exit fit in the final 10 s
echo "budget: ${budget} s; work folder: $work; results: $out/part${part}_*"
"$py" -m amp_bench.gpu_check plan --part "$part"

if [ "${gpu:-}" != 1 ]; then for s in "${stages[@]}"; do cap[$s]=${cpu_cap[$s]}; done; fi
sklearn=0
[ "${gpu:-}" = 1 ] && "$py" -c 'import sklearn' 2>/dev/null && sklearn=1
planned=()  # the stages that will run, in order: each reserves the floors of those after it
for s in "${stages[@]}"; do
  case $s in
    fidelity) [ "${gpu:-}" = 1 ] && [ "$sklearn" = 1 ] && planned+=("$s") ;;
    headroom) [ "${gpu:-}" = 1 ] && planned+=("$s") ;;
    *) planned+=("$s") ;;
  esac
done
post=6  # what each stage leaves for the summary written after it

record() {  # STAGE STATUS SECONDS TIMEOUT NOTE
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "${5:-}" >> "$work/stages.tsv"
}

summarize() {  # [--final]: partN_summary.md and the flat files in $out, bounded by what is left
  local left=$((start + budget - 4 - SECONDS))
  [ "$left" -lt 3 ] && left=3
  [ "$left" -gt 30 ] && left=30
  timeout -k 1 "$left" "$py" -m amp_bench.gpu_check summary "$work" "$out" --part "$part" "$@"
}

run_stage() {  # STAGE COMMAND...: run it with a timeout sized from what is left, record how it ended
  local name=$1; shift
  local later=0 seen=0 s
  for s in "${planned[@]}"; do  # an extra stage reserves nothing: it runs on what the others left
    if [ "$seen" = 1 ] && [ "${extra[$s]:-0}" = 0 ]; then later=$((later + floor[$s])); fi
    [ "$s" = "$name" ] && seen=1
  done
  local left=$((end_at - SECONDS))
  local limit=${cap[$name]}
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
  if [ "$gpu" = 1 ]; then  # a query only: the check changes nothing on the machine it measures
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit,persistence_mode \
      --format=csv 2>&1 || echo "nvidia-smi failed"
  fi
  "$py" -m amp_bench env --json > "$work/env.json" || return 1
  cp "$work/env.json" "$out/part${part}_env.json"
  if [ "$gpu" = 1 ] && [ "$part" = 1 ]; then "$py" -m amp_bench.gpu_check matmul "$work/matmul.json" || return 1; fi
}
export -f stage_env
export gpu py work out part

if [ -n "$unseen" ]; then  # nothing below would check a GPU: the part fails here, with the reason
  record pre failed 0 0 "$unseen"
  stages=()
fi
for name in "${stages[@]}"; do
  case $name in
    env) run_stage env bash -c stage_env ;;
    suite)
      if [ "$gpu" = 1 ]; then
        run_stage suite "$py" -m amp_bench run "$suite_file" --results-dir "$work/suite" --reports-dir "$work/reports"
      else  # the GPU path's steps only: a GPU run predicts nothing, and the GPU image has no plotly for the report
        run_stage suite "$py" -m amp_bench run "$suite_file" --results-dir "$work/suite" --target none --no-report
      fi ;;
    overhead)
      if [ "$gpu" = 1 ]; then
        run_stage overhead "$py" benchmarks/overhead.py --device cuda --model resnet50 --image-size 224 --batch 256 \
          --channels-last --optimizer adamw --impl fused --precision amp_bf16 --rounds 1 --warmup 5 --steps 15 \
          --csv "$work/overhead.csv"
      else  # the same path in one tiny round (channels_last too: NCHW bf16 convolutions crawl without bf16 ISA)
        run_stage overhead "$py" benchmarks/overhead.py --model resnet18 --image-size 32 --batch 2 --channels-last \
          --optimizer adamw --impl fused --precision amp_bf16 --rounds 1 --warmup 1 --steps 3 --csv "$work/overhead.csv"
      fi ;;
    pytest) run_stage pytest "$py" -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py ;;
    fidelity)
      if [ "$gpu" != 1 ]; then
        skip fidelity "needs a CUDA GPU (its CPU path runs in the test suite)"
      elif [ "$sklearn" != 1 ]; then
        skip fidelity "scikit-learn is not installed (it ships the digits data): pip install scikit-learn"
      else
        run_stage fidelity "$py" -m amp_bench fidelity suites/gpu_check_fidelity.yaml --results-dir "$work/fidelity" \
          --no-report
      fi ;;
    headroom)
      if [ "$gpu" != 1 ]; then
        skip headroom "needs a CUDA GPU (its CPU path runs in the test suite)"
      else
        run_stage headroom "$py" -m amp_bench headroom suites/gpu_check_headroom.yaml --results-dir "$work/headroom" \
          --no-report
      fi ;;
  esac
done

echo
if summarize --final > "$work/verdict.txt" 2>&1; then status=0; else status=1; fi
cat "$out/part${part}_summary.md" 2>/dev/null || echo "FAILED: no summary was written"
cat "$work/verdict.txt"
grep -q '^gpu check: ' "$work/verdict.txt" || { echo "gpu check: FAILED (the summary could not be computed)"; status=1; }
echo "part $part took $((SECONDS - start)) s of a ${budget} s budget; raw run directories (with every case's log): $work"
finish $status
