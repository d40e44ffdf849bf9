"""The smoke suite here and through a SLURM partition, alternately (prints the figures; no assertion):

    python benchmarks/slurm_smoke.py [--pairs 2] [--partition gpu-a]

Each pair runs `amp_bench run suites/smoke.yaml` locally, then the same with `--executor slurm
--slurm-partition P` on the one-node cluster of scripts/slurm_local.sh (start it first), and prints each
run's wall time, how its workers started (fork or spawn) and how its CPU repeats ran (lockstep sets or one
worker after another), and the SLURM run's time over the local one's. Target (a job pays no more than a
local run): a SLURM job forks its workers as a local run does, and the smoke suite takes at most 1.5x its
local time per partition.
Alternating keeps the VM's drift (10-40% within an hour) out of the ratio.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}


def run(results: Path, *extra: str) -> tuple[float, Path]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "amp_bench", "run", "suites/smoke.yaml", "--device", "cpu",
                           "--on-contention", "flag",  # both runs do all their work, whatever the machine does
                           "--results-dir", str(results), "--no-report", *extra], cwd=ROOT, env=ENV,
                          capture_output=True, text=True)
    took = time.monotonic() - started
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:])
        raise SystemExit(f"smoke run failed: exit {proc.returncode}")
    return took, next(results.iterdir())


def how(run_dir: Path) -> str:
    import amp_bench
    rows = amp_bench.load_results(run_dir)
    ran = rows[rows["status"] == "ok"]
    starts = ran["worker_start"].value_counts().to_dict()
    interleave = ran["interleave"].value_counts().to_dict()
    flagged = int(ran["contended"].fillna(False).sum())
    return f"{len(ran)} ok rows ({flagged} flagged contended); workers {starts}; repeats {interleave}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--partition", default="gpu-a")
    args = parser.parse_args(argv)
    print(f"{os.uname().nodename}: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}", flush=True)
    ratios = []
    with tempfile.TemporaryDirectory() as folder:
        for n in range(args.pairs):
            local, local_dir = run(Path(folder) / f"local{n}")
            slurm, slurm_dir = run(Path(folder) / f"slurm{n}", "--executor", "slurm", "--slurm-partition",
                                   args.partition)
            ratios.append(slurm / local)
            print(f"pair {n + 1}: local {local:.0f} s ({how(local_dir)})", flush=True)
            print(f"        slurm {args.partition} {slurm:.0f} s ({how(slurm_dir)}): {slurm / local:.2f}x local",
                  flush=True)
    print(f"slurm over local: {', '.join(f'{r:.2f}x' for r in ratios)} (target: at most 1.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
