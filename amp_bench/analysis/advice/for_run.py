"""A run's advice: every case whose first repeat has a breakdown, its items ranked, as rows for the report and
lines for the console (after the breakdown, with how to try each: `run --try RULE RUN_DIR`). Torch-free."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from amp_bench.analysis.advice.evidence import from_row
from amp_bench.analysis.advice.rules import Advice, advise, intrinsic
from amp_bench.identity import case_label


def run_advice(results: pd.DataFrame, run_dirs) -> list[tuple[dict, Advice | str]]:
    """(row, an Advice or a by-design note) for every first-repeat row with a breakdown, in row order. A step is
    the case's median over its ok repeats, the figure its table prints: the profiled repeat alone may have run
    on a slower or faster machine (the saving's share of the step is the profile's either way)."""
    by_run = {Path(d).name: Path(d) for d in run_dirs}
    found = []
    if results.empty or "explain_status" not in results:
        return found
    ok = results[results["status"] == "ok"]
    medians = ok.groupby(["run_id", "case_id"])["step_time_ms_median"].median()
    for row in ok[ok["repeat"] == 0].to_dict("records"):
        row["step_time_ms_median"] = medians.get((row["run_id"], row["case_id"]), row["step_time_ms_median"])
        evidence = from_row(row, by_run.get(str(row.get("run_id"))))
        found += [(row, item) for item in advise(evidence) + (intrinsic(evidence) if evidence else [])]
    return found


def advice_lines(results: pd.DataFrame, run_dir) -> list[str]:
    """The console's advice: per case, its items ranked (each with how to try it), then what is by design."""
    lines, last, number = [], None, 0
    for row, item in run_advice(results, [run_dir]):
        label = f"{case_label(row)} {row.get('precision')}"
        if isinstance(item, str):
            lines.append(f"{label}: by design: {item}")
            continue
        number = 1 if label != last else number + 1
        last = label
        tried = f" (`run --try {item.rule} {run_dir}` measures it)" if item.variant else ""
        lines.append(f"{label}: {number}. {item.line()}{tried}")
    return lines


def advice_table(results: pd.DataFrame, run_dirs) -> pd.DataFrame:
    """One row per case and item for the report: the change, predicted step and speedup with intervals, how."""
    rows = [{"case": f"{case_label(row)} {row.get('precision')}", "rule": item.rule, "change": item.change,
             "evidence": item.evidence, "step ms": item.step_ms, "predicted ms": item.predicted_ms,
             "low ms": item.low_ms, "high ms": item.high_ms, "speedup": item.speedup, "how": item.how,
             "source": item.source} for row, item in run_advice(results, run_dirs) if isinstance(item, Advice)]
    return pd.DataFrame(rows)
