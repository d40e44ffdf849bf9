"""A run's advice: every case whose first repeat has a breakdown, its items ranked, as rows for the report and
lines for the console (after the breakdown, with how to try each: `run --try RULE RUN_DIR`). Torch-free."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from amp_bench.analysis.advice.evidence import from_row
from amp_bench.analysis.advice.rules import Advice, assess, intrinsic
from amp_bench.analysis.advice.targets import on_gpus
from amp_bench.identity import case_label
from amp_bench.store.results import read_table

GPU_TABLE = "predicted_advice"  # the store's name for what studies/gpu_advice.py writes


def run_advice(results: pd.DataFrame, run_dirs) -> list[tuple[dict, Advice | str]]:
    """(row, an item of any verdict or a by-design note) for every first-repeat row with a breakdown, in row order.
    A step is
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
        found += [(row, item) for item in assess(evidence) + (intrinsic(evidence) if evidence else [])]
    return found


def advice_lines(results: pd.DataFrame, run_dir) -> list[str]:
    """The console's advice: per case, its advice ranked (each with how to try it), then the items that are not
    advice (uncertain: how to settle them; expected slower: said as such), then what is by design."""
    lines, by_case = [], {}
    for row, item in run_advice(results, [run_dir]):
        by_case.setdefault(f"{case_label(row)} {row.get('precision')}", []).append((row, item))
    gpus = read_table([run_dir], GPU_TABLE)  # each change priced on GPUs (studies/gpu_advice.py), where it was
    for label, pairs in by_case.items():
        items = [item for _, item in pairs]
        advice = [(row, i) for row, i in pairs if isinstance(i, Advice) and i.verdict == "advice"]
        lines += [f"{label}: {n}. {item.line()}{_tried(item, run_dir)}{_on_gpus(gpus, row, item)}"
                  for n, (row, item) in enumerate(advice, 1)]
        lines += [f"{label}: {item.line()}{_tried(item, run_dir)}{_on_gpus(gpus, row, item)}" for row, item in pairs
                  if isinstance(item, Advice) and item.verdict != "advice"]
        lines += [f"{label}: by design: {item}" for item in items if isinstance(item, str)]
    return lines


def _on_gpus(gpus: pd.DataFrame, row: dict, item: Advice) -> str:
    return on_gpus(gpus, row.get("model_label"), row.get("precision"), item.rule) if not gpus.empty else ""


def _tried(item: Advice, run_dir) -> str:
    return f" (`run --try {item.rule} {run_dir}` measures it)" if item.variant else ""


def advice_table(results: pd.DataFrame, run_dirs) -> pd.DataFrame:
    """One row per case and item for the report: the change, predicted step and speedup with intervals, how;
    advice first, then the uncertain items (said in their change); an item expected slower is no row."""
    found = sorted(run_advice(results, run_dirs), key=lambda pair: isinstance(pair[1], Advice)
                   and pair[1].verdict != "advice")
    rows = [{"case": f"{case_label(row)} {row.get('precision')}", "rule": item.rule,
             "change": item.change if item.verdict == "advice" else f"uncertain ({item.reason()}): {item.change}",
             "evidence": item.evidence, "step ms": item.step_ms, "predicted ms": item.predicted_ms,
             "low ms": item.low_ms, "high ms": item.high_ms, "speedup": item.speedup, "how": item.how,
             "source": item.source} for row, item in found if isinstance(item, Advice) and item.verdict != "slower"]
    return pd.DataFrame(rows)
