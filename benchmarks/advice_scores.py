"""Score the advice that `run --try` measured (prints the figures; no assertion):

    python benchmarks/advice_scores.py results/try-runs/ [more folders ...]

Reads every try run's advice.csv under the folders and prints one markdown row per item tried (case, mode,
rule, predicted gain with its interval, measured gain with its interval, pairs, error), then the median
|predicted - measured| / measured, by rule and in all, and how many measured gains fell inside the predicted
interval. docs/advice.md keeps the table.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd


def load(folders: list[str]) -> pd.DataFrame:
    """Every try run's advice table under the folders, typed through the store's one reader."""
    from amp_bench.store.results import read_table
    runs = [path.parent for folder in folders for path in sorted(Path(folder).rglob("advice.csv"))]
    return read_table(runs, "advice")


def rows(advice: pd.DataFrame) -> list[str]:
    lines = ["| case | rule | predicted | measured | pairs | error |", "|---|---|---|---|---|---|"]
    for r in advice.itertuples():
        measured = (f"{r.measured_speedup:.2f}x ({r.measured_low:.2f}-{r.measured_high:.2f}x)"
                    if pd.notna(r.measured_low) else f"{r.measured_speedup:.2f}x")
        lines.append(f"| {r.case_id} | {r.rule} | {r.predicted_speedup:.2f}x ({r.predicted_low:.2f}-"
                     f"{r.predicted_high:.2f}x) | {measured} | {r.pairs} | {r.error:+.0%} |")
    return lines


def main(argv: list[str]) -> int:
    advice = load(argv)
    if advice.empty:
        print("no advice.csv under those folders (run `python -m amp_bench run --try RULE RUN_DIR` first)")
        return 1
    print("\n".join(rows(advice)))
    scored = advice[advice["measured_speedup"].notna()]
    inside = ((scored["measured_speedup"] >= scored["predicted_low"])
              & (scored["measured_speedup"] <= scored["predicted_high"]))
    print()
    for rule, group in scored.groupby("rule"):
        print(f"{rule}: {len(group)} items, median |error| {group['error'].abs().median():.1%}, "
              f"{int(inside[group.index].sum())} measured inside the predicted interval")
    print(f"all: {len(scored)} items, median |error| {scored['error'].abs().median():.1%}, "
          f"{int(inside.sum())} inside the predicted interval")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
