"""`amp_bench history RESULTS`: the nightly series of each case on each machine, and the changes
in it that persisted.

A series is keyed by case and machine fingerprint (host, GPU, driver, CUDA, torch), so results from
different hardware or software never form one series. Each run contributes its median across
repeats. Changes come from amp_bench.changepoints (confirmed only when they persist; spikes that
reverse are ignored). An annotations file marks accepted changes (a new driver, an intended
trade-off), which then stop alerting.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from amp_bench.changepoints import detect
from amp_bench.errors import UserError
from amp_bench.summary import headline_memory

# metric -> (column of the per-run table, True when higher is worse)
METRICS = {"step_time_ms": True, "throughput": False, "peak_mem_bytes": True}
ANNOTATION_KEYS = ("case", "fingerprint", "run", "metric", "note")


@dataclass
class Change:
    case_id: str
    fingerprint: str
    metric: str
    run_id: str  # first run of the new level
    confirmed_by: str  # the run that confirmed it
    before: float
    after: float
    ratio: float
    kind: str  # regression | improvement
    accepted: bool = False
    note: str = ""


def run_series(results: pd.DataFrame) -> pd.DataFrame:
    """One row per (case, fingerprint, run): medians across the run's ok repeats, in time order."""
    ok = results[results["status"] == "ok"].copy()
    if ok.empty:
        return pd.DataFrame(columns=["case_id", "fingerprint", "run_id", "timestamp", *METRICS])
    ok["fingerprint"] = ok["fingerprint"].fillna("unknown") if "fingerprint" in ok else "unknown"
    ok["peak_mem_bytes"] = headline_memory(ok)
    ok["step_time_ms"] = ok["step_time_ms_median"]
    table = ok.groupby(["case_id", "fingerprint", "run_id"], as_index=False).agg(
        timestamp=("timestamp", "min"), step_time_ms=("step_time_ms", "median"),
        throughput=("throughput", "median"), peak_mem_bytes=("peak_mem_bytes", "median"))
    return table.sort_values(["case_id", "fingerprint", "timestamp", "run_id"]).reset_index(drop=True)


def load_annotations(path: Path | None) -> list[dict]:
    if path is None or not Path(path).exists():
        return []
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or []
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        raise UserError(f"{path}{where}: invalid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, list):
        raise UserError(f"{path}: expected a list of annotations, got {type(data).__name__}")
    problems = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict):
            problems.append(f"{path}: [{i}]: expected a mapping with run and note, got {entry!r}")
            continue
        for key in entry:
            if key not in ANNOTATION_KEYS:
                problems.append(f"{path}: [{i}].{key}: unknown key (expected one of: {', '.join(ANNOTATION_KEYS)})")
        if not entry.get("run"):
            problems.append(f"{path}: [{i}].run: missing (the run id where the accepted change starts)")
        if entry.get("metric") not in (None, *METRICS):
            problems.append(f"{path}: [{i}].metric: expected one of {', '.join(METRICS)}, got {entry['metric']!r}")
    if problems:
        raise UserError(problems)
    return data


def _accepting(annotations: list[dict], change: Change) -> dict | None:
    for entry in annotations:
        if str(entry["run"]) != change.run_id:
            continue
        if entry.get("case", "*") not in ("*", change.case_id):
            continue
        if entry.get("fingerprint") not in (None, "*", change.fingerprint):
            continue
        if entry.get("metric") not in (None, change.metric):
            continue
        return entry
    return None


def analyse(results: pd.DataFrame, annotations: list[dict] | None = None,
            thresholds: dict[str, float] | None = None) -> tuple[pd.DataFrame, list[Change]]:
    thresholds = {"step_time_ms": 0.03, "throughput": 0.03, "peak_mem_bytes": 0.02, **(thresholds or {})}
    series = run_series(results)
    changes: list[Change] = []
    for (case_id, fingerprint), group in series.groupby(["case_id", "fingerprint"], sort=False):
        runs = list(group["run_id"])
        for metric, higher_is_worse in METRICS.items():
            values = group[metric].to_numpy(float)
            if np.isnan(values).any():
                continue
            for point in detect(values, threshold=thresholds[metric]):
                worse = point.after > point.before if higher_is_worse else point.after < point.before
                change = Change(case_id, fingerprint, metric, runs[point.index], runs[point.confirmed_at],
                                point.before, point.after, point.ratio, "regression" if worse else "improvement")
                entry = _accepting(annotations or [], change)
                if entry is not None:
                    change.accepted, change.note = True, str(entry.get("note", ""))
                changes.append(change)
    return series, changes


def alerts(changes: list[Change]) -> list[Change]:
    return [c for c in changes if c.kind == "regression" and not c.accepted]


def to_json(series: pd.DataFrame, changes: list[Change]) -> str:
    import json
    return json.dumps({"alerts": len(alerts(changes)), "changes": [asdict(c) for c in changes],
                       "series": json.loads(series.to_json(orient="records"))}, indent=2)


def to_markdown(series: pd.DataFrame, changes: list[Change]) -> str:
    lines = [f"# amp_bench history: {len(alerts(changes))} alert(s)", "",
             f"{series[['case_id', 'fingerprint']].drop_duplicates().shape[0]} series, "
             f"{series['run_id'].nunique()} runs.", ""]
    if changes:
        lines += ["| case | machine | metric | from run | before | after | change | kind | accepted |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for c in changes:
            lines.append(f"| {c.case_id} | {c.fingerprint} | {c.metric} | {c.run_id} | {c.before:.4g} | "
                         f"{c.after:.4g} | {c.ratio - 1:+.1%} | {c.kind} | {'yes: ' + c.note if c.accepted else 'no'} |")
    else:
        lines.append("No persistent change in any series.")
    return "\n".join(lines) + "\n"
