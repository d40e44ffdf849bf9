"""How long the README's main job takes, on this CPU as it is and with its bf16/fp16 instructions
hidden from oneDNN (ONEDNN_MAX_CPU_ISA=AVX2: what a Zen 2 or an older Xeon has), and what it
printed as its headline. Targets (a first run a new user can wait for): under 3 minutes without bf16
instructions, under 2.5 minutes with them, every figure labelled honestly.

    python benchmarks/main_job.py                  # both settings
    python benchmarks/main_job.py --only native    # or: --only avx2
    python benchmarks/main_job.py --burner         # the same with one busy-looping neighbour process
    python benchmarks/main_job.py --write          # and put each result in docs/timings.md's table

The time is the whole `python -m amp_bench run suites/resnet50.yaml` command (probe, every case,
the report), not the pip install before it.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from timings_page import machine, write_row  # benchmarks/, this script's folder

HEADLINE = re.compile(r"^\S+ bs \d+ .* on [^:]+: ")


def run(label: str, env_extra: dict[str, str], burner: bool, write: bool = False) -> None:
    neighbour = None
    if burner:
        neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200", **env_extra}
            started = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "amp_bench", "run", "suites/resnet50.yaml",
                                   "--results-dir", f"{tmp}/results", "--reports-dir", f"{tmp}/reports"],
                                  cwd=ROOT, env=env, capture_output=True, text=True)
            wall = time.monotonic() - started
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()
    # the run's closing sentence per model ("resnet50 bs 8 224px on AMD EPYC: bf16 autocast is ..."); a case
    # line or a not-run note may also say "slower than", and is not one
    headline = [line for line in proc.stdout.splitlines() if HEADLINE.match(line)]
    print(f"{label}: exit {proc.returncode}, {wall:.0f} s wall ({wall / 60:.1f} min)"
          + (" beside one busy-looping process" if burner else ""))
    for line in headline:
        print(f"    {line.strip()}")
    if proc.returncode != 0:
        print(proc.stdout[-2000:], proc.stderr[-2000:])
    if write:
        setting = label + (", beside one busy-looping process" if burner else "")
        write_row("main_job", {"machine": machine(), "setting": setting,
                               "wall": f"{wall:.0f} s" + ("" if proc.returncode == 0 else f" (exit {proc.returncode})"),
                               "headline": " / ".join(line.strip() for line in headline),
                               "date": f"{dt.date.today()}"}, ("machine", "setting"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("native", "avx2"))
    parser.add_argument("--burner", action="store_true")
    parser.add_argument("--write", action="store_true", help="put each result in docs/timings.md (main job table)")
    args = parser.parse_args()
    print(f"machine: {machine()}; python {platform.python_version()}")
    if args.only in (None, "native"):
        run("this CPU as it is", {}, args.burner, args.write)
    if args.only in (None, "avx2"):
        run("ONEDNN_MAX_CPU_ISA=AVX2 (no bf16/fp16 instructions)", {"ONEDNN_MAX_CPU_ISA": "AVX2"}, args.burner,
            args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
