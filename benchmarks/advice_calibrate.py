"""Calibrate the advice rules' intervals on measured items (prints the figures; no assertion):

    python benchmarks/advice_calibrate.py TRY_FOLDER... --runs RUN_FOLDER... [--reprice-from RUN_FOLDER...]

Reads every try run's advice.csv under the TRY_FOLDERs, finds the run each tried (its manifest's `tried_run`,
under the RUN_FOLDERs) and prices each item again with the rules as they are now (analysis/advice/rules.py),
so a change of pricing is calibrated on the same measurements. With --reprice-from, each item is priced from
the latest run under those folders that holds its case instead (the same cases explained again: a new shape
probe's readings beside the measurements already taken). Per item: the measured step (the step over the
measured speedup) against the predicted one, and the spread its interval would need to hold it: what is left
of the miss beyond NOISE_SHARE of the step, over the time the change acts on (Advice.touched_ms). Per rule:
the items, the median |predicted / measured - 1|, how many the current SPREAD holds, and the smallest spread
that holds at least 80% and 90% of them. Calibrate on one set, freeze SPREAD, then score a fresh set once
(benchmarks/advice_scores.py); docs/advice.md keeps both.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd


def tried_runs(folders: list[str]) -> dict[str, Path]:
    from amp_bench.store.results import find_run_dirs
    return {Path(d).name: Path(d) for folder in folders for d in find_run_dirs(folder)}


def latest_by_case(folders: list[str]) -> dict[str, Path]:
    """case_id -> the latest run (by its id, a timestamp) under the folders that holds it."""
    from amp_bench.store.results import load_results
    found: dict[str, Path] = {}
    for _, run in sorted(tried_runs(folders).items()):
        for case_id in load_results(run)["case_id"].dropna().unique():
            found[str(case_id)] = run
    return found


def repriced(row, runs: dict[str, Path], cache: dict, by_case: dict[str, Path] | None = None):
    """The advice item `row` (of an advice.csv) priced again from its tried run's saved files (or the latest
    run holding its case, `by_case`); None where the run or the item is gone."""
    from amp_bench.analysis.advice.for_run import run_advice
    from amp_bench.analysis.advice.rules import Advice
    from amp_bench.store.results import load_results
    run = by_case.get(str(row.case_id)) if by_case else runs.get(str(row.tried_run))
    if run is None:
        return None
    if run not in cache:
        cache[run] = run_advice(load_results(run), [run])
    return next((item for case, item in cache[run] if isinstance(item, Advice) and case["case_id"] == row.case_id
                 and item.rule == row.rule), None)


FLOORS = (0.02, 0.04, 0.06, 0.08, 0.10)  # noise floors (shares of the step) the spreads are printed for


def needed_spread(item, measured_speedup: float, floor: float) -> float:
    """The spread that would have held the measured step beyond a noise floor of `floor` of the step (0 where
    the floor does)."""
    miss = abs(item.step_ms / measured_speedup - item.predicted_ms) - floor * item.step_ms
    return max(0.0, miss) / item.touched_ms if item.touched_ms else math.inf


def quantile_cover(values: list[float], share: float) -> float:
    """The smallest value that is at least `share` of `values`."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)] if ordered else float("nan")


def table(try_folders: list[str], run_folders: list[str], reprice_from: list[str] | None = None) -> pd.DataFrame:
    from amp_bench.analysis.advice.rules import NOISE_SHARE
    from amp_bench.store.results import read_table
    advice = read_table([p.parent for f in try_folders for p in sorted(Path(f).rglob("advice.csv"))], "advice")
    runs, cache, rows = tried_runs(run_folders), {}, []
    by_case = latest_by_case(reprice_from) if reprice_from else None
    for row in advice[advice["measured_speedup"].notna()].itertuples():
        item = repriced(row, runs, cache, by_case)
        if item is None:
            print(f"{row.case_id} {row.rule}: its tried run {row.tried_run} is not under the run folders; left out")
            continue
        rows.append({"case_id": row.case_id, "rule": row.rule, "verdict": item.verdict,
                     "predicted": item.speedup, "low": item.low_speedup, "high": item.high_speedup,
                     "measured": row.measured_speedup, "error": item.speedup / row.measured_speedup - 1,
                     "inside": item.low_speedup <= row.measured_speedup <= item.high_speedup,
                     "touched": item.touched_ms / item.step_ms,
                     "needed": needed_spread(item, row.measured_speedup, NOISE_SHARE),
                     **{f"needed_{round(f * 100)}": needed_spread(item, row.measured_speedup, f) for f in FLOORS}})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    from amp_bench.analysis.advice.rules import NOISE_SHARE, SPREAD
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("try_folders", nargs="+")
    parser.add_argument("--runs", nargs="+", required=True, help="folders holding the runs that were tried")
    parser.add_argument("--reprice-from", nargs="+", help="price each item from the latest run of its case here")
    args = parser.parse_args(argv)
    found = table(args.try_folders, args.runs, args.reprice_from)
    if found.empty:
        print("no measured advice item under those folders")
        return 1
    for r in found.itertuples():
        print(f"{r.case_id} {r.rule} {r.verdict}: predicted {r.predicted:.3f}x ({r.low:.3f}-{r.high:.3f}x), measured "
              f"{r.measured:.3f}x, error {r.error:+.1%}, {'inside' if r.inside else 'OUTSIDE'}; touches "
              f"{r.touched:.0%} of the step, would need spread {r.needed:.2f} above the {NOISE_SHARE:.0%} floor")
    print()
    for rule, group in found.groupby("rule"):
        print(f"{rule}: {len(group)} items, median |error| {group['error'].abs().median():.1%}, "
              f"{int(group['inside'].sum())} inside at spread {SPREAD.get(rule, 'model')}; the spread holding 80% and "
              "90% of them above a noise floor of " + ", ".join(
                  f"{f:.0%}: {quantile_cover(list(group[f'needed_{round(f * 100)}']), 0.8):.2f}/"
                  f"{quantile_cover(list(group[f'needed_{round(f * 100)}']), 0.9):.2f}" for f in FLOORS))
    print(f"all: {len(found)} items, median |error| {found['error'].abs().median():.1%}, "
          f"{int(found['inside'].sum())} inside ({found['inside'].mean():.0%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
