"""Score the advice that `run --try` measured (prints the figures; no assertion):

    python benchmarks/advice_scores.py results/try-runs/ [more folders ...]

Reads every try run's advice.csv under the folders and prints one markdown row per item tried (case, rule, its
verdict as it was printed: advice, uncertain or slower; predicted gain with its interval, measured gain with its
interval, pairs, error), then per rule and in all: the median |predicted - measured| / measured, how many
measured gains fell inside the predicted interval (the coverage), and how many items printed as advice measured
below 0.98x. docs/advice.md keeps the tables.
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


LOSS = 0.98  # an item printed as advice that measures below this is a slowdown advised


def rows(advice: pd.DataFrame) -> list[str]:
    lines = ["| case | rule | verdict | predicted | measured | pairs | error |", "|---|---|---|---|---|---|---|"]
    for r in advice.itertuples():
        measured = (f"{r.measured_speedup:.2f}x ({r.measured_low:.2f}-{r.measured_high:.2f}x)"
                    if pd.notna(r.measured_low) else f"{r.measured_speedup:.2f}x")
        lines.append(f"| {r.case_id} | {r.rule} | {r.verdict if pd.notna(r.verdict) else '-'} | "
                     f"{r.predicted_speedup:.2f}x ({r.predicted_low:.2f}-{r.predicted_high:.2f}x) | {measured} | "
                     f"{r.pairs} | {r.error:+.0%} |")
    return lines


def summary(name: str, group: pd.DataFrame, inside: pd.Series) -> str:
    held = int(inside[group.index].sum())
    advised = group[group["verdict"] == "advice"]
    lost = int((advised["measured_speedup"] < LOSS).sum())
    return (f"{name}: {len(group)} items, median |error| {group['error'].abs().median():.1%}, {held} of {len(group)} "
            f"measured inside the predicted interval ({held / len(group):.0%}); {len(advised)} printed as advice, "
            f"{lost} of them measured below {LOSS}x")


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
        print(summary(rule, group, inside))
    print(summary("all", scored, inside))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
