"""How long `predict SUITE` takes on this machine: cold (an empty inventory cache: the suite's GPU cases are
recorded on fake tensors in a worker) and warm (the cache holds them), with the CPU's bf16/fp16 instructions
hidden as on most CI runners (ONEDNN_MAX_CPU_ISA=AVX2), and whether every (GPU, mode) row was answered.
Targets: at most 60 s cold and 5 s warm on a 2-core CPU.

    python benchmarks/predict_timing.py                     # suites/resnet50.yaml on V100, A100, L4, H100
    python benchmarks/predict_timing.py --write             # and put the result in docs/timings.md
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timings_page import machine, write_row  # benchmarks/, this script's folder

ROOT = Path(__file__).resolve().parent.parent
TARGETS = "v100-sxm2,a100-80gb,l4,h100-sxm"


def _predict(suite: str, cache: str) -> tuple[float, subprocess.CompletedProcess]:
    env = {**os.environ, "AMP_BENCH_CACHE": cache, "ONEDNN_MAX_CPU_ISA": "AVX2", "HF_HUB_OFFLINE": "1",
           "COLUMNS": "250"}
    env.pop("AMP_BENCH_FORK_ZYGOTE", None)  # a user's command: no test zygote's imports to lean on
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "amp_bench", "predict", suite, "--target", TARGETS], cwd=ROOT,
                          env=env, capture_output=True, text=True)
    return time.monotonic() - started, proc


def _answered(output: str) -> tuple[int, int]:
    """(rows with a prediction, rows that say why not): every (GPU, mode) row is one or the other."""
    modes = ("fp32", "tf32", "amp_fp16", "amp_bf16", "fp8")
    rows = [line for line in output.splitlines() if line.startswith("│") and line.split("│")[2].strip() in modes]
    reasons = sum(1 for line in rows if "unsupported:" in line or "no prediction:" in line)
    return len(rows) - reasons, reasons


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="suites/resnet50.yaml")
    parser.add_argument("--write", action="store_true", help="put the result in docs/timings.md (predict table)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        cold, first = _predict(args.suite, cache)
        warm, second = _predict(args.suite, cache)
    predicted, said = _answered(second.stdout)
    print(f"machine: {machine()}; {args.suite} on {TARGETS}, ONEDNN_MAX_CPU_ISA=AVX2")
    print(f"cold: {cold:.1f} s (exit {first.returncode}); warm: {warm:.1f} s (exit {second.returncode}); "
          f"{predicted} rows predicted, {said} saying why not")
    if first.returncode or second.returncode:
        print(first.stderr[-1500:], second.stderr[-1500:])
    if args.write:
        write_row("predict", {"machine": machine(), "suite": args.suite, "cold": f"{cold:.1f} s",
                              "warm": f"{warm:.1f} s", "rows": f"{predicted} predicted, {said} why not",
                              "date": f"{dt.date.today()}"}, ("machine", "suite"))
    return 0 if not (first.returncode or second.returncode) else 1


if __name__ == "__main__":
    sys.exit(main())
