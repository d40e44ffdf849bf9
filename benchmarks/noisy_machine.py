"""Issue 31's targets on a noisy machine, measured from this checkout (prints the figures; no assertion):

    python benchmarks/noisy_machine.py main       # three back-to-back main jobs: wall time, bf16 speedup,
                                                  # its 95% interval, the three speedups' spread about their mean
    python benchmarks/noisy_machine.py smoke      # two back-to-back smoke runs and `compare`: exit code, decision
    python benchmarks/noisy_machine.py busy       # the smoke suite beside three busy processes: time, statuses,
                                                  # evidence; `compare` against a quiet smoke run
    python benchmarks/noisy_machine.py blip       # the main job with a 3-second burner started in its third repeat:
                                                  # the headline's figure, the pairs dropped and run again, its interval
    python benchmarks/noisy_machine.py all

Targets (a noisy shared VM must not move the headline): the main job <= 120 s, its bf16 interval within
+-10% of its point and three runs within +-5% of their mean; two same-code smoke runs exit 0 (decided by
the speedups when the step times are unstable);
beside three busy processes the smoke suite ends in under 4 minutes with no timeout and every
measured case contended, and compare against a quiet run exits 3 naming contention; a torchvision
worker's launch to first step <= 1 s. Issue 47's: with a 3-second burner in its third repeat, the main job still
prints a figure from the clean pairs, names what was dropped and run again, and its interval is within +-10%.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
ENV.pop("AMP_BENCH_ON_CONTENTION", None)  # a user's default: starved cases stop
ENV.pop("OMP_WAIT_POLICY", None)


def run_suite(suite: str, results: Path, *extra: str) -> tuple[float, Path, str]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "amp_bench", "run", suite, "--results-dir", str(results),
                           "--no-report", *extra], cwd=ROOT, env=ENV, capture_output=True, text=True)
    took = time.monotonic() - started
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:])
        raise SystemExit(f"{suite} failed: exit {proc.returncode}")
    return took, next(results.iterdir()), proc.stdout


def bf16(run_dir: Path) -> tuple[float, float, float]:
    import amp_bench
    from amp_bench.analysis.speedups import summarize
    summary = summarize(amp_bench.load_results(run_dir)).set_index("precision")
    row = summary.loc["amp_bf16"]
    return float(row["speedup_vs_fp32"]), float(row["speedup_vs_fp32_ci_low"]), float(row["speedup_vs_fp32_ci_high"])


def main_job(tmp: Path, runs: int = 3) -> None:
    points = []
    for n in range(runs):
        took, run_dir, _ = run_suite("suites/resnet50.yaml", tmp / f"main{n}")
        point, low, high = bf16(run_dir)
        points.append(point)
        print(f"main job {n + 1}: {took:.0f} s; bf16 {point:.2f}x, 95% CI {low:.2f}-{high:.2f}x "
              f"({low / point - 1:+.1%} / {high / point - 1:+.1%})", flush=True)
    mean = sum(points) / len(points)
    print(f"main jobs: speedups {', '.join(f'{p:.3f}' for p in points)}; largest deviation from their mean "
          f"{max(abs(p / mean - 1) for p in points):.1%}")


def compare(base: Path, cand: Path, out: Path) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "amp_bench", "compare", str(base), str(cand), "-o", str(out)],
                          cwd=ROOT, env=ENV, capture_output=True, text=True)
    return proc.returncode, json.loads(out.with_suffix(".json").read_text())


def smoke_pair(tmp: Path) -> Path:
    dirs = []
    for n in range(2):
        took, run_dir, _ = run_suite("suites/smoke.yaml", tmp / f"smoke{n}")
        dirs.append(run_dir)
        print(f"smoke run {n + 1}: {took:.0f} s", flush=True)
    code, verdict = compare(dirs[0], dirs[1], tmp / "smoke-compare")
    print(f"compare same-code smoke runs: exit {code}; {verdict['decision']}")
    for r in verdict["results"]:
        if r["metric"] in ("speedup", "step_time"):
            print(f"  {r['case_id']} {r['metric']}: {r['verdict']} ({r['ci_low'] or 0:.3f}-{r['ci_high'] or 0:.3f})")
    worker_start(dirs[0])
    for run_dir in dirs:
        pair_scatter(run_dir)
    return dirs[0]


def pair_scatter(run_dir: Path) -> None:
    """Each model's per-repeat log ratio fp32 / amp_bf16: its standard deviation, how the pairs ran."""
    import numpy as np

    import amp_bench
    rows = amp_bench.load_results(run_dir)
    ok = rows[(rows["status"] == "ok") & rows["precision"].isin(["fp32", "amp_bf16"])]
    for model, group in ok.groupby("model_label"):
        medians = group.pivot_table(index="repeat", columns="precision", values="step_time_ms_median").dropna()
        if {"fp32", "amp_bf16"} <= set(medians.columns) and len(medians) > 2:
            logs = np.log(medians["fp32"] / medians["amp_bf16"])
            print(f"  {run_dir.name} {model}: {len(logs)} pairs ({', '.join(group['interleave'].dropna().unique())}), "
                  f"log-ratio SD {logs.std(ddof=1):.3f}")


def worker_start(run_dir: Path) -> None:
    import amp_bench
    rows = amp_bench.load_results(run_dir)
    ok = rows[rows["status"] == "ok"]
    for model, group in ok.groupby("model_label"):
        print(f"worker start ({group['worker_start'].iloc[0]}), launch to first step, {model}: "
              f"median {group['worker_start_s'].median():.2f} s, max {group['worker_start_s'].max():.2f} s")


def busy(tmp: Path, quiet_run: Path | None) -> None:
    import amp_bench
    from amp_bench.store.flags import text_column
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        took, run_dir, _ = run_suite("suites/smoke.yaml", tmp / "busy")
    finally:
        for burner in burners:
            burner.kill()
    rows = amp_bench.load_results(run_dir)  # typed: contended a bool, contention a text column
    measured = rows[rows["status"] != "unsupported"]
    finished = measured[measured["status"] == "ok"]
    flagged = int(finished["contended"].sum())
    print(f"smoke beside three busy processes: {took:.0f} s; statuses {measured['status'].value_counts().to_dict()} "
          f"({flagged} of the {len(finished)} that finished flagged contended); "
          f"timeouts {int((rows['status'] == 'timeout').sum())}")
    for reason in [r for r in text_column(finished, "contention").unique() if r][:2]:
        print(f"  finished, flagged: {reason}")
    for reason in measured["reason"].dropna().unique()[:3]:
        print(f"  evidence: {reason}")
    if quiet_run is None:
        _, quiet_run, _ = run_suite("suites/smoke.yaml", tmp / "quiet")
    code, verdict = compare(quiet_run, run_dir, tmp / "busy-compare")
    print(f"compare quiet vs busy: exit {code}; {verdict['verdict']}; {verdict['decision']}")


def blip(tmp: Path, burn_s: float = 3.0) -> None:
    """The main job, and a process spinning one core for `burn_s` once the third repeat's parts start."""
    import amp_bench
    from amp_bench.analysis.headline import headlines
    from amp_bench.analysis.speedups import summarize
    results = tmp / "blip"
    started = time.monotonic()
    run = subprocess.Popen([sys.executable, "-m", "amp_bench", "run", "suites/resnet50.yaml", "--results-dir",
                            str(results), "--no-report"], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True)
    burned_at = None
    while run.poll() is None and burned_at is None:
        time.sleep(0.2)
        if len([p for p in results.glob("*/parts/*-r1.json")]) >= 2:  # the second repeat's pair is saved
            burned_at = time.monotonic() - started
            code = f"import time\nend = time.time() + {burn_s}\nwhile time.time() < end: pass\n"
            subprocess.Popen([sys.executable, "-c", code])
    out, _ = run.communicate()
    took = time.monotonic() - started
    run_dir = next(results.iterdir())
    rows = amp_bench.load_results(run_dir)
    again = rows[rows["rerun_reason"].fillna("") != ""]
    point, low, high = bf16(run_dir)
    print(f"main job with a {burn_s:g} s burner at {burned_at or float('nan'):.0f} s: {took:.0f} s; bf16 {point:.2f}x, "
          f"95% CI {low:.2f}-{high:.2f}x ({low / point - 1:+.1%} / {high / point - 1:+.1%}); rows run again: "
          f"{len(again)} ({', '.join(sorted(set(again['rerun_reason'].str[:60])))})")
    for line in out.splitlines():
        if "disturbed pair" in line or "dropped" in line or "contended" in line:
            print(f"  console: {line.strip()}")
    for sentence in headlines(summarize(rows)):
        print(f"  headline: {sentence}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("main", "smoke", "busy", "blip", "all"))
    parser.add_argument("--keep", type=Path, help="keep the runs in this (new) folder instead of a temporary one")
    args = parser.parse_args(argv)
    print(f"{os.uname().nodename}: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}", flush=True)
    if args.keep:
        args.keep.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as folder:
        tmp = args.keep or Path(folder)
        quiet = None
        if args.what in ("smoke", "all"):
            quiet = smoke_pair(tmp)
        if args.what in ("busy", "all"):
            busy(tmp, quiet)
        if args.what in ("main", "all"):
            main_job(tmp)
        if args.what in ("blip", "all"):
            blip(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
