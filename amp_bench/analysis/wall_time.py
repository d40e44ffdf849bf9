"""Where a run's worker time went, from the rows' phase columns (stats.WORKER_PHASES): the whole run's time
per phase, and the slowest workers with their largest phases. A lockstep member's waits are its partners'
turns, so they are left out of its own time. Torch-free; the console and the report both read it."""
from __future__ import annotations

import pandas as pd

from amp_bench.identity import case_label
from amp_bench.stats import WORKER_PHASES, phase_column

OWN_PHASES = [name for name in WORKER_PHASES if name != "wait"]


def phase_frame(results: pd.DataFrame) -> pd.DataFrame:
    """One row per result row that recorded its phases: its label, repeat, own seconds, each own phase, and
    whether it is its worker's first window (a later one's phases are its window alone)."""
    columns = [phase_column(name) for name in OWN_PHASES]
    if "worker_wall_s" not in results or not set(columns) <= set(results.columns):
        return pd.DataFrame(columns=["label", "repeat", "own_s", *OWN_PHASES, "first_window"])
    # a worker stopped or killed before its result has a wall time but no phases: nothing to break down
    timed = results[results["worker_wall_s"].notna() & results[columns].notna().any(axis=1)]
    frame = timed[columns].fillna(0.0).set_axis(OWN_PHASES, axis=1)
    frame.insert(0, "own_s", frame.sum(axis=1))
    # a later repeat measured by the same worker (repeats_per_worker) is a row, not a worker of its own
    windows = timed["worker_window"] if "worker_window" in timed else pd.Series(0, index=timed.index)
    frame["first_window"] = (windows.fillna(0).astype(float) == 0).to_numpy()
    frame.insert(0, "repeat", timed["repeat"].to_numpy())
    frame.insert(0, "label", [f"{case_label(row)} {row.get('precision')}" for row in timed.to_dict("records")])
    return frame.reset_index(drop=True)


def _largest(phases: pd.Series, n: int) -> str:
    top = phases[phases > 0].sort_values(ascending=False).head(n)
    return ", ".join(f"{name.replace('_', ' ')} {seconds:.1f} s" for name, seconds in top.items())


def run_lines(results: pd.DataFrame, slowest: int = 3) -> list[str]:
    """Two lines for the console: the run's worker time by phase, and its slowest workers' largest phases."""
    frame = phase_frame(results)
    if frame.empty:
        return []
    totals = frame[OWN_PHASES].sum()
    whole = float(totals.sum())
    shares = ", ".join(f"{name.replace('_', ' ')} {seconds / whole:.0%}"
                       for name, seconds in totals.sort_values(ascending=False).head(5).items() if seconds > 0)
    workers = int(frame["first_window"].sum())
    lines = [f"worker time: {whole:.1f} s in {workers} workers ({shares})"]
    worst = frame.sort_values("own_s", ascending=False).head(slowest)
    lines.append("slowest: " + "; ".join(f"{row['label']} r{int(row['repeat'])} {row['own_s']:.1f} s "
                                           f"({_largest(frame.loc[i, OWN_PHASES], 3)})"
                                           for i, row in worst.iterrows()))
    return lines
