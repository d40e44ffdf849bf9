"""How long the README's test command takes on this machine, from a fresh clone (the README's
target: under 10 minutes on 2 cores, install included; it must also pass with one core busy).

    python benchmarks/time_tests.py [--no-bf16] [--busy-core] [--keep] [--write]

It clones HEAD into a temporary folder and runs the README's test command there: a fresh venv,
`pip install -e '.[test]'` and the tests. It prints the wall time, the exit code and the machine.
- `--no-bf16` runs it under ONEDNN_MAX_CPU_ISA=AVX2, so a CPU with bf16 instructions behaves, and is
  gated, like one without them.
- `--busy-core` keeps one core busy for the whole run with a spinning process in its own session,
  as a neighbour's job would be (Linux shares the CPU out per session first).
- `--write` puts the result in this machine's row of docs/timings.md's test table.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from timings_page import machine, write_row  # benchmarks/, this script's folder


def readme_test_command() -> str:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", text, re.S)
    lines = [line.strip() for block in blocks for line in block.splitlines()]
    return next(line for line in lines if "pytest" in line and "pip install" in line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-bf16", action="store_true", help="ONEDNN_MAX_CPU_ISA=AVX2")
    parser.add_argument("--busy-core", action="store_true", help="one core kept busy by another process")
    parser.add_argument("--keep", action="store_true", help="keep the clone and its log (kept anyway on a failure)")
    parser.add_argument("--write", action="store_true", help="put the result in docs/timings.md (its tests table)")
    args = parser.parse_args()
    command = readme_test_command()
    work = Path(tempfile.mkdtemp(prefix="amp_bench_test_time_"))
    clone = work / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {**os.environ, "CI": "true"}
    if args.no_bf16:
        env["ONEDNN_MAX_CPU_ISA"] = "AVX2"
    burner = None
    if args.busy_core:
        burner = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    log = work / "tests.log"
    started = time.monotonic()
    try:
        with open(log, "w") as out:
            code = subprocess.run(["bash", "-c", command], cwd=clone, env=env, stdout=out,
                                  stderr=subprocess.STDOUT).returncode
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    took = time.monotonic() - started
    text = log.read_text(errors="replace").splitlines()
    summary = [line for line in text if re.search(r"\d+ (passed|failed)", line) or line.startswith("FAILED ")]
    setting = (f"bf16 instructions {'hidden (ONEDNN_MAX_CPU_ISA=AVX2)' if args.no_bf16 else 'as the CPU has them'}; "
               f"{'one core kept busy' if args.busy_core else 'no other load started'}")
    print(f"machine: {machine()}; {setting}")
    print(f"command: {command}")
    for line in summary:
        print(f"  {line.strip('= ')}")
    print(f"README test command: exit {code} in {took:.0f} s ({took / 60:.1f} min; target < 10 min)")
    if args.write:
        counts = "; ".join(line.strip("= ") for line in summary if "passed" in line or "failed" in line)  # both parts
        write_row("tests", {"machine": machine(), "setting": setting, "wall": f"{took / 60:.1f} min",
                            "result": f"exit {code}; {counts}", "date": f"{dt.date.today()}"}, ("machine", "setting"))
    if args.keep or code:
        print(f"clone and log: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
